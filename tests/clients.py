"""Test clients signed in as a demo person: through the real sign-in form, or by setting the session
directly (for walking many routes quickly)."""

from __future__ import annotations

import re

from sqlalchemy import select

from webapp.identity import open_session
from webapp.models import User
from webapp.runtime.extensions import db
from webapp.web.security import SESSION_KEY

PASSWORD = "demo-password"
# Demo people of the acme tenant, by the email they sign in with.
AGENT, REVIEWER, REVIEWER2, ADMIN, ADMIN2 = (
    "agent@acme.test",
    "reviewer@acme.test",
    "reviewer2@acme.test",
    "admin@acme.test",
    "admin2@acme.test",
)
CSRF = re.compile(r'name="csrf_token"[^>]*value="([^"]+)"')


class Browser:
    """A test client signed in through the real /login form. Every request ends the app's database
    session, because the test holds the app context open and on SQLite that session keeps the lock."""

    def __init__(self, app) -> None:
        self.client = app.test_client()

    def get(self, url: str, **kw):
        return self._done(self.client.get(url, **kw))

    def post(self, url: str, data: dict | None = None, htmx: bool = False, csrf: bool = True):
        data = dict(data or {})
        if csrf and "csrf_token" not in data:
            data["csrf_token"] = self.csrf_token()
        headers = {"HX-Request": "true"} if htmx else {}
        return self._done(self.client.post(url, data=data, headers=headers))

    def csrf_token(self, page: str = "/") -> str:
        return CSRF.search(self.get(page).text).group(1)

    @staticmethod
    def _done(response):
        db.session.remove()
        return response


def try_sign_in(app, email: str, password: str = PASSWORD):
    """(browser, response) of a sign-in through the real form."""
    browser = Browser(app)
    token = browser.csrf_token("/login")
    return browser, browser.post("/login", {"csrf_token": token, "email": email, "password": password})


def sign_in(app, email: str, password: str = PASSWORD) -> Browser:
    browser, response = try_sign_in(app, email, password)
    assert response.status_code == 302, response.text
    return browser


def session_as(app, email: str):
    """A test client whose session belongs to this user (for walking many routes quickly)."""
    client = app.test_client()
    user = db.session.scalar(select(User).where(User.email == email))
    key = open_session(db.session, user)  # the server-side session the cookie names
    db.session.commit()
    with client.session_transaction() as session:
        session["_user_id"] = user.get_id()
        session["_fresh"] = True
        session[SESSION_KEY] = key
        session.permanent = True
    db.session.remove()
    return client


def second_admin_approves(app, tool_name: str, email: str = "admin2@acme.test") -> None:
    """The tenant's other admin approves, on the Policies page, the change of the tool's policy that waits
    for a second pair of eyes (a change that lets calls wait less is not in force before)."""
    other = sign_in(app, email)
    page = other.get("/admin/policies").text
    found = re.search(rf'id="change-(\d+)">\s*<h3><code>{re.escape(tool_name)}</code>', page)
    assert found, f"no change of {tool_name} waits for a second admin"
    answer = other.post(f"/admin/policies/changes/{found.group(1)}", {"decision": "approve"})
    assert answer.status_code == 303, answer.text


def open_call(client, call_id: int) -> str:
    """What a reviewer's browser does with a decision page: load it (which writes nothing), then send the
    page's own "opened" request, which holds the call and records that they saw it. The page's HTML."""
    html = client.get(f"/approvals/{call_id}").get_data(as_text=True)
    token = CSRF.search(html).group(1)
    said = client.post(f"/approvals/{call_id}/opened", headers={"X-CSRFToken": token, "HX-Request": "true"})
    assert said.status_code in (200, 204), said.get_data(as_text=True)
    return html
