"""The operators' MCP servers page (/ops/mcp): every tenant's servers, adding a server the desk starts
for a tenant (the same checks and messages as `flask mcp add --command`, a refused form keeping what
was typed, every refusal audited), removing one; a tenant's admin cannot reach it, but syncs the
server on their own page."""

from __future__ import annotations

import sys
from html import unescape

from tests.clients import sign_in
from tests.mcp.conftest import SURROUNDINGS, acme, events, newest_event, servers, surroundings

ADMIN, OPERATOR = "admin@acme.test", "operator@desk.test"


def test_an_operator_adds_a_started_server_for_a_tenant_whose_admin_then_syncs_it(app, tmp_path):
    since = newest_event()
    operator = sign_in(app, OPERATOR)
    assert 'href="/ops/mcp"' in operator.get("/").text  # beside the model endpoints

    typed = {
        "tenant": "acme",
        "name": "inventory",
        "command": "python 'unclosed",
        "environment": "INVENTORY_TOKEN=n0te-value",
        "working_directory": "",
    }
    refused = operator.post("/ops/mcp", typed)
    assert refused.status_code == 422 and "is not a command (No closing quotation)" in unescape(refused.text)
    kept = unescape(refused.text)
    assert 'value="inventory"' in kept and "INVENTORY_TOKEN=n0te-value</textarea>" in kept
    assert '<option value="acme" selected>' in kept and 'value="python \'unclosed"' in kept
    nowhere = operator.post("/ops/mcp", {**typed, "tenant": "~operations"})
    assert nowhere.status_code == 422
    assert "Choose the tenant whose assistant gets the server's tools." in unescape(nowhere.text)
    extra = operator.post("/ops/mcp", {**typed, "url": "http://127.0.0.1:1/mcp"})
    assert extra.status_code == 422 and "This form has no field url; reload the page." in extra.text
    assert len(events("mcp_server_add_refused", since)) == 3 and servers() == []

    command = f"{sys.executable} {SURROUNDINGS}"
    added = operator.post("/ops/mcp", {**typed, "command": command, "working_directory": str(tmp_path)})
    assert added.status_code == 303, unescape(added.text)
    page = unescape(operator.get("/ops/mcp").text)
    assert "Added inventory to acme with 1 tool." in page
    assert command in page and "Variables: INVENTORY_TOKEN (stored encrypted)" in page and "n0te-value" not in page
    (event,) = events("mcp_server_added", since)
    assert (event.actor_label, event.tenant_id, event.data["environment"]) == (OPERATOR, acme(), ["INVENTORY_TOKEN"])
    seen = surroundings("mcp_inventory__surroundings", "INVENTORY_TOKEN")
    assert seen["values"] == {"INVENTORY_TOKEN": "n0te-value"} and seen["working_directory"] == str(tmp_path)

    admin = sign_in(app, ADMIN)
    assert admin.get("/ops/mcp").status_code == 403
    assert admin.post("/ops/mcp", {**typed, "command": command}).status_code == 403
    listed = unescape(admin.get("/admin/mcp").text)
    assert "Started by the desk, as the desk's operator set it up" in listed and "INVENTORY_TOKEN" in listed
    synced = admin.post("/admin/mcp/inventory/sync")  # the operator's command: the admin may sync it
    assert synced.status_code == 303 and "Synced inventory. Nothing changed." in admin.get("/admin/mcp").text

    removed = operator.post("/ops/mcp/acme/inventory/remove")
    assert removed.status_code == 303 and "Removed inventory of acme and its 1 tool" in operator.get("/ops/mcp").text
    assert servers() == []
    assert [e.actor_label for e in events("mcp_server_removed", since)] == [OPERATOR]
