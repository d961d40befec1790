"""Sign-ins that do not tell which accounts exist, and admins unlocking an account that failed
sign-ins locked."""

from __future__ import annotations

from tests.accounts.people import last_event, new_user
from tests.clients import sign_in, try_sign_in


def test_an_unknown_email_costs_the_same_password_check_as_a_known_one(app, monkeypatch):
    import webapp.identity.people as identity

    checks = []
    real = identity.check_password_hash
    monkeypatch.setattr(
        identity, "check_password_hash", lambda stored, given: checks.append(stored) or real(stored, given)
    )
    _, unknown = try_sign_in(app, "nobody-at-all@acme.test", "whatever-password")
    _, known = try_sign_in(app, "agent@acme.test", "not-the-password")
    assert unknown.status_code == known.status_code == 401
    assert len(checks) == 2 and checks[0] == identity.DUMMY_PASSWORD_HASH  # one scrypt check each
    assert "Email or password is wrong." in unknown.text


def test_the_dummy_hash_is_made_the_way_real_passwords_are():
    from werkzeug.security import generate_password_hash

    from webapp.identity import DUMMY_PASSWORD_HASH, check_password

    assert DUMMY_PASSWORD_HASH.split("$")[0] == generate_password_hash("x").split("$")[0]
    assert check_password(None, "anything") is False


# --- (9) an admin unlocks an account that failed sign-ins locked ----------------------------------


def test_an_admin_unlocks_an_account_locked_by_failed_sign_ins(app):
    person = new_user()
    for _ in range(5):
        assert try_sign_in(app, person.email, "wrong-password")[1].status_code == 401
    assert try_sign_in(app, person.email)[1].status_code == 429
    admin = sign_in(app, "admin@acme.test")
    assert "Locked" in admin.get("/admin/users").text
    unlocked = admin.post(f"/admin/users/{person.id}/unlock", htmx=True)
    assert unlocked.status_code == 200 and "is unlocked and can sign in again now" in unlocked.text
    assert try_sign_in(app, person.email)[1].status_code == 302
    event = last_event("user_unlocked")
    assert event.actor_label == "admin@acme.test" and event.data["email"] == person.email and event.data["was_locked"]
    again = admin.post(f"/admin/users/{person.id}/unlock")
    assert again.status_code == 303 and "was not locked" in admin.get(again.location).text
