"""Signing out, a password reset or disabling end a session for good, and no session lasts for ever."""

from __future__ import annotations

import time

from tests.accounts.people import new_user
from tests.clients import sign_in
from webapp.runtime.extensions import db


def test_a_cookie_copied_before_signing_out_gets_the_sign_in_page_afterwards(app):
    browser = sign_in(app, "auditor@acme.test")
    copied = browser.client.get_cookie("session").value
    assert browser.post("/logout").status_code == 302
    thief = app.test_client()
    for _ in range(3):  # replayed now and again: it never comes back
        thief.set_cookie("session", copied)
        page = thief.get("/")
        db.session.remove()
        assert page.status_code == 302 and "/login" in page.location
        time.sleep(0.2)
    # The person's other sessions (another browser) are not touched by this one signing out.
    other = sign_in(app, "auditor@acme.test")
    assert other.get("/").status_code == 200


def test_a_busy_session_still_ends_after_the_longest_a_session_may_last(app):
    app.config["SESSION_MAX_SECONDS"] = 2  # SESSION_MAX_HOURS, in seconds
    browser = sign_in(app, "auditor@acme.test")
    statuses = []
    for _ in range(7):  # a request every half second: never idle, yet signed out after 2 s
        statuses.append(browser.get("/").status_code)
        time.sleep(0.5)
    assert statuses[0] == 200 and statuses[-1] == 302
    assert "/login" in browser.get("/").location


def test_a_password_reset_or_disabling_ends_the_persons_sessions_for_good(app):
    person = new_user()
    theirs = sign_in(app, person.email)
    copied = theirs.client.get_cookie("session").value
    admin = sign_in(app, "admin@acme.test")
    assert admin.post(f"/admin/users/{person.id}/disable").status_code == 303
    assert admin.post(f"/admin/users/{person.id}/enable").status_code == 303
    replay = app.test_client()
    replay.set_cookie("session", copied)
    assert replay.get("/").status_code == 302  # enabling again brings no old session back
    assert theirs.get("/").status_code == 302
