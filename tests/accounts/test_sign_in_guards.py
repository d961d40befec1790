"""Sign-ins that do not tell which accounts exist."""

from __future__ import annotations

from tests.clients import try_sign_in


def test_an_unknown_email_costs_the_same_password_check_as_a_known_one(app, monkeypatch):
    import webapp.identity as identity

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
