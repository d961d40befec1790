"""Secrets belong to a tenant (issue 42, finding 3): the operator grants an environment variable to a
tenant (`flask secret grant|revoke|list`, /ops/secrets), and a tenant's admin may name in an MCP
server's header only the secrets granted to their tenant. Anything else is refused in words, audited,
and nothing is sent: when the header is saved, and again at every use (a sync, a call), so a grant
revoked since stops the header at once. The admins' form and GET /api/secrets name the granted
secrets, never a value. Headers an operator set need no grant."""

from __future__ import annotations

import json
import uuid
from html import unescape

import pytest
from sqlalchemy import select

from tests.clients import sign_in
from tests.mcp.conftest import acme, events, newest_event, run, servers
from webapp.identity import create_user, get_or_create_tenant
from webapp.models import SecretGrant, Tenant
from webapp.runtime.extensions import db

ADMIN, OPERATOR = "admin@acme.test", "operator@desk.test"
ACME_KEY, GLOBEX_KEY = "MCP_SECRET_ACME_KEY", "MCP_SECRET_GLOBEX_KEY"
ACME_VALUE, GLOBEX_VALUE = "acme-s3cret-value", "globex-s3cret-value"


@pytest.fixture
def secrets(cli, monkeypatch) -> None:
    """Each demo tenant has a secret of its own, set in the desk's environment and granted to it."""
    monkeypatch.setenv(ACME_KEY, ACME_VALUE)
    monkeypatch.setenv(GLOBEX_KEY, GLOBEX_VALUE)
    for name, tenant in ((ACME_KEY, "acme"), (GLOBEX_KEY, "globex")):
        granted = cli("secret", "grant", name, "--tenant", tenant)
        assert granted.exit_code == 0, granted.output


def tenant_id(slug: str) -> int:
    return db.session.scalar(select(Tenant.id).where(Tenant.slug == slug))


def grants() -> set[tuple[str, str]]:
    db.session.remove()
    query = select(Tenant.slug, SecretGrant.name).join(Tenant, Tenant.id == SecretGrant.tenant_id)
    return {tuple(row) for row in db.session.execute(query)}


def values_received(warehouse) -> list[str]:
    """The X-Key header of every request the server received."""
    return [request.get("x-key") for request in warehouse.requests_headers()]


# --- the finding ------------------------------------------------------------------------------------


def test_another_tenants_secret_named_by_an_admin_is_refused_in_words_audited_and_never_reaches_the_server(
    app, secrets, warehouse
):
    since = newest_event()
    admin = sign_in(app, ADMIN)
    typed = {"name": "mine", "url": warehouse.url, "headers": f"X-Key: ${GLOBEX_KEY}"}
    refused = admin.post("/admin/mcp", typed)

    said = unescape(refused.text)
    assert refused.status_code == 422
    assert f'"X-Key: ${GLOBEX_KEY}" would send the desk\'s environment variable {GLOBEX_KEY} to the server' in said
    assert "has not granted it to this tenant" in said
    assert f"(granted to it: {ACME_KEY})" in said  # the secrets it may name, by name
    assert f"X-Key: ${GLOBEX_KEY}</textarea>" in said  # kept, to fix
    assert GLOBEX_VALUE not in said
    assert servers() == []
    assert warehouse.requests_headers() == []  # not even the URL was asked: nothing was sent
    (event,) = events("mcp_server_add_refused", since)
    assert (event.actor_label, event.tenant_id) == (ADMIN, acme())
    assert event.data["headers"] == ["X-Key"] and event.data["secret"] == GLOBEX_KEY
    assert "has not granted it to this tenant" in event.data["reason"]
    assert GLOBEX_VALUE not in json.dumps(event.data)


def test_a_secret_granted_to_the_tenant_is_sent_and_once_revoked_is_not_sent_at_the_next_sync_nor_call(
    app, cli, secrets, warehouse
):
    admin = sign_in(app, ADMIN)
    added = admin.post("/admin/mcp", {"name": "warehouse", "url": warehouse.url, "headers": f"X-Key: ${ACME_KEY}"})
    assert added.status_code == 303, unescape(added.text)
    assert set(values_received(warehouse)) == {ACME_VALUE}
    assert not run("mcp_warehouse__lookup_stock", {"sku": "SKU-1"}).is_error
    sent = len(warehouse.requests_headers())

    revoked = cli("secret", "revoke", ACME_KEY, "--tenant", "acme")
    assert revoked.exit_code == 0, revoked.output
    assert f"Revoked {ACME_KEY} from acme." in revoked.output
    assert "Its MCP servers warehouse name it in a header" in revoked.output
    page = admin.get("/admin/mcp").text
    assert f"X-Key (from ${ACME_KEY}, a secret not granted to this tenant: not sent)" in page

    since = newest_event()
    synced = admin.post("/admin/mcp/warehouse/sync")
    said = unescape(synced.text)
    assert synced.status_code == 422
    assert f"The X-Key header of the MCP server warehouse reads ${ACME_KEY} from the desk's environment" in said
    assert "a secret the desk's operator has not granted to this tenant (no secret is granted to it)" in said
    assert "nothing was sent" in said
    (refusal,) = events("mcp_secret_refused", since)
    assert (refusal.actor_label, refusal.tenant_id) == (ADMIN, acme())
    assert refusal.data == {"server": "warehouse", "header": "X-Key", "secret": ACME_KEY, "moment": "sync"}
    assert events("mcp_server_synced", since) == []

    called = run("mcp_warehouse__lookup_stock", {"sku": "SKU-1"})
    assert called.is_error and f"reads ${ACME_KEY} from the desk's environment" in called.content
    db.session.commit()  # the call's own audit, as its move commits it
    (_, at_call) = events("mcp_secret_refused", since)
    assert (at_call.actor_label, at_call.data["moment"]) == ("call time", "call")
    assert len(warehouse.requests_headers()) == sent  # nothing more reached the server
    assert ACME_VALUE not in json.dumps([refusal.data, at_call.data])

    listed = cli("secret", "list", "--tenant", "acme").output
    assert f"acme warehouse: its X-Key header names ${ACME_KEY}, which is not granted to acme: not sent" in listed

    assert cli("secret", "grant", ACME_KEY, "--tenant", "acme").exit_code == 0  # granted again: sent again
    assert admin.post("/admin/mcp/warehouse/sync").status_code == 303
    assert values_received(warehouse)[-1] == ACME_VALUE


def test_a_header_an_operator_set_needs_no_grant(cli, warehouse, monkeypatch):
    monkeypatch.setenv("WAREHOUSE_KEY", "operators-own")
    added = cli(
        "mcp", "add", "warehouse", "--url", warehouse.url, "--tenant", "acme", "--header", "X-Key: $WAREHOUSE_KEY"
    )
    assert added.exit_code == 0, added.output
    assert cli("mcp", "sync", "warehouse", "--tenant", "acme").exit_code == 0
    assert not run("mcp_warehouse__lookup_stock", {"sku": "SKU-1"}).is_error
    assert set(values_received(warehouse)) == {"operators-own"}
    assert "X-Key (from $WAREHOUSE_KEY)" in cli("mcp", "list", "--tenant", "acme").output


# --- the operator's command line and page ------------------------------------------------------------


def test_operators_grant_list_and_revoke_secrets_on_the_command_line_audited_on_the_tenants_chain(cli, monkeypatch):
    monkeypatch.setenv(ACME_KEY, ACME_VALUE)
    monkeypatch.delenv("MCP_SECRET_NOT_SET", raising=False)
    since = newest_event()

    granted = cli("secret", "grant", ACME_KEY, "--tenant", "acme")
    assert granted.exit_code == 0 and granted.output == f"Granted {ACME_KEY} to acme.\n"
    again = cli("secret", "grant", ACME_KEY, "--tenant", "acme")
    assert again.exit_code == 0 and f"{ACME_KEY} is granted to acme already." in again.output
    unset = cli("secret", "grant", "MCP_SECRET_NOT_SET", "--tenant", "globex")
    assert unset.exit_code == 0, unset.output
    assert "Warning: MCP_SECRET_NOT_SET is not set in this process's environment" in unset.output
    assert grants() == {("acme", ACME_KEY), ("globex", "MCP_SECRET_NOT_SET")}

    listed = cli("secret", "list").output
    assert f"acme {ACME_KEY}: granted by the command line on " in listed
    assert "globex MCP_SECRET_NOT_SET: granted by the command line on " in listed
    assert "NOT SET in this environment" in listed and ACME_VALUE not in listed
    assert "globex" not in cli("secret", "list", "--tenant", "acme").output

    revoked = cli("secret", "revoke", ACME_KEY, "--tenant", "acme")
    assert revoked.exit_code == 0 and revoked.output == f"Revoked {ACME_KEY} from acme.\n"
    assert grants() == {("globex", "MCP_SECRET_NOT_SET")}
    assert "No secrets granted." in cli("secret", "list", "--tenant", "acme").output

    events_granted = events("secret_granted", since)
    assert [(e.tenant_id, e.actor_label, e.data) for e in events_granted] == [
        (acme(), "command line", {"name": ACME_KEY}),  # once: the second grant changed nothing
        (tenant_id("globex"), "command line", {"name": "MCP_SECRET_NOT_SET"}),
    ]
    (event_revoked,) = events("secret_revoked", since)
    assert (event_revoked.tenant_id, event_revoked.data) == (acme(), {"name": ACME_KEY, "servers": []})


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("grant", ACME_KEY, "--tenant", "nowhere"), "There is no tenant 'nowhere'"),
        (("grant", ACME_KEY, "--tenant", "~operations"), "There is no tenant '~operations'"),
        (
            ("grant", "MCP_SECRET_ACME-KEY", "--tenant", "acme"),
            "'MCP_SECRET_ACME-KEY' is not the name of an environment",
        ),
        (("grant", "SECRET_KEY", "--tenant", "acme"), "SECRET_KEY does not start with MCP_SECRET_PREFIX (MCP_SECRET_)"),
        (("revoke", ACME_KEY, "--tenant", "acme"), f"'{ACME_KEY}' is not granted to acme; no secret is granted to it."),
        (("list", "--tenant", "nowhere"), "There is no tenant 'nowhere'"),
    ],
)
def test_a_grant_or_revoke_the_command_line_cannot_do_says_why_and_changes_nothing(cli, args, says):
    since = newest_event()
    result = cli("secret", *args)
    assert result.exit_code == 2 and says in result.output, result.output
    assert grants() == set() and events("secret_granted", since) == events("secret_revoked", since) == []


def test_the_operators_page_grants_and_revokes_a_secret_and_a_tenant_admin_cannot_reach_it(app, monkeypatch):
    monkeypatch.setenv(ACME_KEY, ACME_VALUE)
    since = newest_event()
    operator = sign_in(app, OPERATOR)
    assert "secrets granted to their tenant" in operator.get("/ops/mcp").text  # linked from the MCP servers page

    refused = operator.post("/ops/secrets", {"tenant": "acme", "name": "SECRET_KEY"})
    assert refused.status_code == 422
    assert "SECRET_KEY does not start with MCP_SECRET_PREFIX (MCP_SECRET_)" in unescape(refused.text)
    assert 'value="SECRET_KEY"' in refused.text and grants() == set()
    assert operator.post("/ops/secrets", {"tenant": "", "name": ACME_KEY}).status_code == 422

    granted = operator.post("/ops/secrets", {"tenant": "acme", "name": ACME_KEY})
    assert granted.status_code == 303
    page = operator.get("/ops/secrets").text
    assert f"Granted {ACME_KEY} to acme" in page and f'id="grant-acme-{ACME_KEY}"' in page
    assert ACME_VALUE not in page
    assert grants() == {("acme", ACME_KEY)}

    assert sign_in(app, ADMIN).get("/ops/secrets").status_code == 403
    assert sign_in(app, ADMIN).post(f"/ops/secrets/acme/{ACME_KEY}/revoke").status_code == 403
    assert grants() == {("acme", ACME_KEY)}

    revoked = operator.post(f"/ops/secrets/acme/{ACME_KEY}/revoke")
    assert revoked.status_code == 303 and grants() == set()
    assert f"Revoked {ACME_KEY} from acme." in operator.get("/ops/secrets").text
    assert [(e.action, e.actor_label, e.tenant_id) for e in events("secret_granted", since)] == [
        ("secret_granted", OPERATOR, acme())
    ]
    assert [(e.actor_label, e.data["name"]) for e in events("secret_revoked", since)] == [(OPERATOR, ACME_KEY)]


# --- what the admin is told ---------------------------------------------------------------------------


def test_the_admins_form_and_the_api_name_only_the_tenants_own_secrets_never_a_value(app, api, secrets):
    page = unescape(sign_in(app, ADMIN).get("/admin/mcp").text)
    assert f"Secrets granted to Acme Corp: ${ACME_KEY}. Any other is refused." in page.replace("<code>", "").replace(
        "</code>", ""
    )
    assert GLOBEX_KEY not in page and ACME_VALUE not in page

    assert api.as_(ADMIN).get("/api/secrets").json == {"secrets": [ACME_KEY]}
    globex_admin = f"admin-{uuid.uuid4().hex[:8]}@globex.test"  # (people outlive a test; globex has no admin)
    create_user(db.session, globex_admin, "demo-password", ["admin"], get_or_create_tenant(db.session, "globex"))
    db.session.commit()
    assert api.as_(globex_admin).get("/api/secrets").json == {"secrets": [GLOBEX_KEY]}
    assert api.as_("reviewer@acme.test").get("/api/secrets").status_code == 403
