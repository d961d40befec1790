"""API tokens: listed, named, expiring and revocable on the page, the command line and the API;
revoked by a password reset and staying revoked across disabling and enabling."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update

from tests.accounts.people import actions_logged, last_event, new_user, works
from tests.clients import sign_in
from webapp.models import ApiToken
from webapp.runtime.extensions import db

TOKEN = re.compile(r"<code>(adk_[A-Za-z0-9_-]{40,})</code>")


def cli_token(cli, email: str, *options: str) -> str:
    result = cli("create-token", email, *options)
    assert result.exit_code == 0, result.output
    return result.output.strip().splitlines()[-1]


def test_a_person_makes_a_named_token_sees_it_once_and_revokes_it_on_the_tokens_page(app):
    browser = sign_in(app, "agent@acme.test")
    wrong = browser.post("/account/tokens", {"name": "  ", "expires_in_days": "soon"})
    assert wrong.status_code == 422
    assert "Name the token" in wrong.text and "whole number of days from 1 to 3650" in wrong.text
    assert 'value="soon"' in wrong.text  # what was typed stays
    made = browser.post("/account/tokens", {"name": "billing sync", "expires_in_days": "30"})
    assert made.status_code == 201 and "shown this once" in made.text
    token = TOKEN.search(made.text).group(1)
    assert works(app.test_client(), token)
    listed = browser.get("/account/tokens").text
    assert "billing sync" in listed and token[:12] in listed and token not in listed  # never shown again
    row = db.session.scalar(select(ApiToken).where(ApiToken.name == "billing sync"))
    assert row.expires_at is not None and row.prefix == token[:12]
    revoked = browser.post(f"/account/tokens/{row.id}/revoke")
    assert revoked.status_code == 303
    assert "is revoked" in browser.get(revoked.location).text
    assert not works(app.test_client(), token)
    assert {"api_token_created", "api_token_revoked"} <= set(actions_logged())


def test_an_admin_revokes_a_token_of_their_tenants_people_but_never_another_tenants(app, cli):
    person = new_user()
    token = cli_token(cli, person.email, "--name", "nightly export")
    row = db.session.scalar(select(ApiToken).where(ApiToken.prefix == token[:12]))
    outsider = new_user(("admin",), tenant="globex")
    stranger = sign_in(app, outsider.email)
    assert stranger.get(f"/admin/users/{person.id}/tokens").status_code == 404
    assert stranger.post(f"/account/tokens/{row.id}/revoke").status_code == 404
    assert works(app.test_client(), token)
    admin = sign_in(app, "admin@acme.test")
    page = admin.get(f"/admin/users/{person.id}/tokens").text
    assert "nightly export" in page and token[:12] in page
    assert admin.post(f"/account/tokens/{row.id}/revoke").status_code == 303
    assert not works(app.test_client(), token)
    event = last_event("api_token_revoked")
    assert event.actor_label == "admin@acme.test" and event.data["token_id"] == row.id


def test_a_password_reset_revokes_the_persons_tokens(app, api):
    person = new_user()
    token = api.token(person.email)
    assert works(app.test_client(), token)
    admin = sign_in(app, "admin@acme.test")
    reset = admin.post(f"/admin/users/{person.id}/password", {"password": "another-password"})
    assert reset.status_code == 303
    assert not works(app.test_client(), token)
    assert "1 API token revoked" in admin.get(reset.location).text


def test_tokens_stay_revoked_when_a_disabled_person_is_enabled_again(app, api):
    person = new_user()
    token = api.token(person.email)
    admin = sign_in(app, "admin@acme.test")
    admin.post(f"/admin/users/{person.id}/disable")
    assert not works(app.test_client(), token)
    admin.post(f"/admin/users/{person.id}/enable")
    assert not works(app.test_client(), token)  # enabling them brings no token back


def test_an_expired_token_is_refused(app, cli):
    person = new_user()
    token = cli_token(cli, person.email, "--expires-days", "1")
    assert works(app.test_client(), token)
    db.session.execute(
        update(ApiToken)
        .where(ApiToken.prefix == token[:12])
        .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
    )
    db.session.commit()
    assert not works(app.test_client(), token)


def test_revoke_token_on_the_command_line_by_number_or_first_characters(app, cli):
    person = new_user()
    first = cli_token(cli, person.email, "--name", "ci")
    second = cli_token(cli, person.email)
    by_prefix = cli("revoke-token", first[:12])
    assert by_prefix.exit_code == 0 and "Revoked API token" in by_prefix.output and "(ci)" in by_prefix.output
    assert not works(app.test_client(), first) and works(app.test_client(), second)
    number = db.session.scalar(select(ApiToken.id).where(ApiToken.prefix == second[:12]))
    assert cli("revoke-token", str(number)).exit_code == 0
    assert not works(app.test_client(), second)
    assert "already revoked" in cli("revoke-token", str(number)).output
    unknown = cli("revoke-token", "987654")
    assert unknown.exit_code == 2 and "there is no API token number 987654" in unknown.output
    nonsense = cli("revoke-token", "xy")
    assert nonsense.exit_code == 2 and "give a token's number or its first 12 characters" in nonsense.output
    assert cli("revoke-token", "adk_nothing1").exit_code == 2
    assert "api_token_revoked" in actions_logged()


def test_the_api_lists_and_revokes_tokens_and_refuses_what_it_does_not_take(app, api, cli):
    person = new_user()
    mine = api.token(person.email)
    spare = cli_token(cli, person.email, "--name", "spare")
    client = app.test_client()
    headers = {"Authorization": f"Bearer {mine}"}
    listed = client.get("/api/tokens", headers=headers).json["tokens"]
    spare_row = next(t for t in listed if t["name"] == "spare")
    assert spare_row["state"] == "active" and spare_row["prefix"] == spare[:12] and "token" not in spare_row
    refused = client.delete(f"/api/tokens/{spare_row['id']}", headers=headers, json={"reason": "leaked"})
    assert refused.status_code == 422 and '"reason" is not a field of this request' in refused.json["message"]
    assert works(client, spare)
    gone = client.delete(f"/api/tokens/{spare_row['id']}", headers=headers)
    assert gone.status_code == 200 and gone.json["state"] == "revoked"
    assert not works(client, spare)
    other = api.token("agent@acme.test")  # not an admin: someone else's token is not theirs to see
    missing = client.delete(f"/api/tokens/{spare_row['id']}", headers={"Authorization": f"Bearer {other}"})
    assert missing.status_code == 404 and "no such API token" in missing.json["message"]
    assert client.get("/api/tokens?user_id=x", headers=headers).status_code == 422
