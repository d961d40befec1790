"""Registering MCP servers: the command line (names are a contract), the admin page, headers that are
sealed or read from the environment and never shown back, names the Messages API accepts, schemas
checked before use, and a server started by the desk over stdio."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from sqlalchemy import select

from tests.clients import sign_in
from tests.loops import in_own_thread
from tests.mcp.conftest import events, newest_event, stdio_command
from webapp.models import McpServer, McpTool, Tenant
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.tools import mcp
from webapp.tools.registry import ToolContext

LOOKUP = "mcp_warehouse__lookup_stock"


def test_the_command_line_adds_lists_syncs_and_removes_a_server(cli, warehouse, monkeypatch):
    monkeypatch.setenv("MCP_TEST_TEAM", "support")
    since = newest_event()
    added = cli(
        "mcp", "add", "warehouse", "--url", warehouse.url, "--tenant", "acme",
        "--header", "Authorization: Bearer s3cret-value", "--header", "X-Team: $MCP_TEST_TEAM",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    assert added.output.splitlines()[0] == "Added MCP server warehouse to acme, with 2 tools:"
    assert f"  {LOOKUP} (lookup_stock): runs at once (read-only)" in added.output

    listed = cli("mcp", "list", "--tenant", "acme")
    assert listed.exit_code == 0
    assert (
        f"acme warehouse: {warehouse.url}; headers: Authorization (stored encrypted), X-Team (from $MCP_TEST_TEAM)"
        in (listed.output)
    )
    assert "s3cret" not in listed.output and "s3cret" not in json.dumps(events("mcp_server_added", since)[0].data)
    stored = db.session.scalar(select(McpServer)).headers
    assert "s3cret" not in json.dumps(stored)
    assert stored[1] == {"name": "X-Team", "env": "MCP_TEST_TEAM", "operator": True}  # the command line set it
    assert cli("mcp", "list", "--tenant", "globex").output == "No MCP servers.\n"
    assert "acme warehouse" in cli("mcp", "list").output

    synced = cli("mcp", "sync", "warehouse", "--tenant", "acme")
    assert synced.exit_code == 0 and f"unchanged: {LOOKUP}, mcp_warehouse__reserve_stock" in synced.output

    removed = cli("mcp", "remove", "warehouse", "--tenant", "acme")
    assert removed.exit_code == 0 and "its tools: mcp_warehouse__lookup_stock, mcp_warehouse__reserve_stock" in (
        removed.output
    )
    db.session.remove()
    assert db.session.scalar(select(McpTool.id)) is None
    assert [e.actor_label for e in events("mcp_server_removed", since)] == ["command line"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["add", "w", "--url", "ftp://example.com", "--tenant", "acme"], "'ftp://example.com' is not a server URL"),
        (["add", "w", "--url", "not a url", "--tenant", "acme"], "is not a server URL: give one like"),
        (["add", "w", "--url", "http://[::1/mcp", "--tenant", "acme"], "is not a server URL: give one like"),
        (["add", "w", "--url", "http://127.0.0.1:1/mcp", "--tenant", "acme"], "refused: private address (127.0.0.1"),
        (["add", "w", "--url", "http://127.0.0.1:1/mcp", "--tenant", "nowhere"], "There is no tenant 'nowhere'"),
        (["add", "w", "--url", "http://127.0.0.1:1/mcp", "--tenant", "~operations"], "There is no tenant"),
        (["add", "Big Name", "--url", "http://127.0.0.1:1/mcp", "--tenant", "acme"], "is not a server name"),
        (["add", "w", "--tenant", "acme"], "Give the server's URL (streamable HTTP) or the command"),
        (["add", "w", "--url", "http://x/mcp", "--command", "x", "--tenant", "acme"], "one of the two"),
        (["add", "w", "--url", "http://x/mcp", "--header", "no colon", "--tenant", "acme"], 'type it as "Name: value"'),
        (["add", "w", "--command", "python 'unclosed", "--tenant", "acme"], "is not a command (No closing quotation)"),
        (
            ["add", "w", "--url", "http://x/mcp", "--env", "A=1", "--tenant", "acme"],
            "Variables and a working directory go",
        ),
        (["add", "w", "--url", "http://x/mcp", "--cwd", "/tmp", "--tenant", "acme"], "a server at a URL gets none"),
        (["add", "w", "--command", "x", "--env", "TOKEN s3cret", "--tenant", "acme"], 'A variable has no "="'),
        (["add", "w", "--command", "x", "--env", "1X=y", "--tenant", "acme"], "'1X' is not a variable's name"),
        (["add", "w", "--command", "x", "--env", "A=", "--tenant", "acme"], "The variable A has no value"),
        (["add", "w", "--command", "x", "--env", "A=1", "--env", "A=2", "--tenant", "acme"], "A is given twice"),
        (
            ["add", "w", "--command", "x", "--cwd", "relative/dir", "--tenant", "acme"],
            "is not a working directory here",
        ),
        (["add", "w", "--command", "x", "--cwd", "/no/such/dir", "--tenant", "acme"], "absolute path of a directory"),
        (["sync", "nothing", "--tenant", "acme"], "There is no MCP server named 'nothing'"),
        (["remove", "nothing", "--tenant", "acme"], "There is no MCP server named 'nothing'"),
    ],
)
def test_the_command_line_says_what_to_fix(cli, args, says):
    since = newest_event()
    result = cli("mcp", *args)
    assert result.exit_code == 2 and says in result.output, result.output
    db.session.remove()
    assert db.session.scalar(select(McpServer.id)) is None  # nothing half-written
    if args[0] == "add":  # and the attempt is audited, in words, never a value
        (refused,) = events("mcp_server_add_refused", since)
        assert says in refused.data["reason"] and refused.actor_label == "command line"
        assert refused.data["server"] == args[1] and "s3cret" not in json.dumps(refused.data)


def test_a_duplicate_name_is_refused_and_another_tenant_may_use_it(cli, warehouse):
    assert cli("mcp", "add", "warehouse", "--url", warehouse.url, "--tenant", "acme").exit_code == 0
    again = cli("mcp", "add", "warehouse", "--url", warehouse.url, "--tenant", "acme")
    assert again.exit_code == 2 and "An MCP server named warehouse already exists here" in again.output
    assert cli("mcp", "add", "warehouse", "--url", warehouse.url, "--tenant", "globex").exit_code == 0
    db.session.remove()
    tenants = db.session.execute(select(Tenant.slug).join(McpServer, McpServer.tenant_id == Tenant.id)).scalars()
    assert sorted(tenants) == ["acme", "globex"]


def test_headers_are_sent_sealed_or_from_the_environment(cli, tmp_path, warehouse, monkeypatch):
    warehouse.stop()
    warehouse.start(token="t0ken")
    refused = cli("mcp", "add", "warehouse", "--url", warehouse.url, "--tenant", "acme")
    assert refused.exit_code == 2 and "could not be reached (it answered HTTP 401)" in refused.output
    sealed = cli(
        "mcp", "add", "warehouse", "--url", warehouse.url, "--tenant", "acme", "--header", "Authorization: Bearer t0ken"
    )
    assert sealed.exit_code == 0, sealed.output
    monkeypatch.setenv("WAREHOUSE_AUTH", "Bearer t0ken")
    from_env = cli(
        "mcp", "add", "w2", "--url", warehouse.url, "--tenant", "acme", "--header", "Authorization: $WAREHOUSE_AUTH"
    )
    assert from_env.exit_code == 0, from_env.output
    monkeypatch.setenv("WAREHOUSE_AUTH", "Bearer wrong")
    assert "it answered HTTP 401" in cli("mcp", "sync", "w2", "--tenant", "acme").output  # read at each use


def test_the_admin_page_adds_syncs_and_removes_and_keeps_what_was_typed(app, warehouse):
    since = newest_event()
    admin = sign_in(app, "admin@acme.test")
    assert "MCP servers" in admin.get("/").text  # in the navigation
    typed = {"name": "warehouse", "url": "http://127.0.0.1:1/mcp", "headers": "Authorization: Bearer abc"}
    refused = admin.post("/admin/mcp", typed)
    assert refused.status_code == 422
    assert "The address http://127.0.0.1:1 was refused: private address (127.0.0.1, loopback)" in refused.text
    assert 'value="http://127.0.0.1:1/mcp"' in refused.text and "Authorization: Bearer abc</textarea>" in refused.text

    added = admin.post("/admin/mcp", {"name": "warehouse", "url": warehouse.url, "headers": "X-Key: k3y-value"})
    assert added.status_code == 303
    page = admin.get("/admin/mcp").text
    assert "Added warehouse with 2 tools." in page
    assert "Runs at once (its server marks it read-only)." in page and "Waits for one approval." in page
    assert "X-Key (stored encrypted)" in page and "k3y-value" not in page
    assert LOOKUP in admin.get("/admin/policies").text  # the policies page lists the tenant's MCP tools

    assert admin.post("/admin/mcp/warehouse/sync").status_code == 303
    assert "Synced warehouse. Nothing changed." in admin.get("/admin/mcp").text
    assert admin.post("/admin/mcp/warehouse/remove").status_code == 303
    assert "No MCP servers yet." in admin.get("/admin/mcp").text
    assert [e.actor_label for e in events("mcp_server_added", since)] == ["admin@acme.test"]
    assert [e.data["server"] for e in events("mcp_server_synced", since)] == ["warehouse"]
    assert events("mcp_server_removed", since)[0].data["tools"] == [LOOKUP, "mcp_warehouse__reserve_stock"]


def test_only_admins_use_the_page(app):
    for email in ("agent@acme.test", "reviewer@acme.test", "auditor@acme.test"):
        browser = sign_in(app, email)
        assert browser.get("/admin/mcp").status_code == 403
        assert browser.post("/admin/mcp", {"name": "x", "url": "http://x/mcp"}).status_code == 403


def test_an_admin_sets_an_mcp_tools_policy_like_a_built_in_tools(app, cli, warehouse):
    assert cli("mcp", "add", "warehouse", "--url", warehouse.url, "--tenant", "acme").exit_code == 0
    admin = sign_in(app, "admin@acme.test")
    saved = admin.post(f"/admin/policies/{LOOKUP}", {"mode": "always", "approvals_required": "2", "ttl_hours": "4"})
    assert saved.status_code == 303
    assert f"Every {LOOKUP} call needs 2 approvals within 4 hours" in admin.get("/admin/policies").text
    never = admin.post(
        "/admin/policies/mcp_warehouse__reserve_stock", {"mode": "never", "approvals_required": "1", "ttl_hours": "4"}
    )
    assert never.status_code == 422  # not read-only: it must wait for someone


def test_registry_names_fit_the_api_and_never_collide():
    assert mcp.registry_name("warehouse", "lookup.stock v2", set()) == "mcp_warehouse__lookup_stock_v2"
    long = mcp.registry_name("warehouse", "x" * 300, set())
    assert len(long) == 128 and long.startswith("mcp_warehouse__xxx")
    taken = {"mcp_a__b_c"}
    other = mcp.registry_name("a", "b.c", taken)
    assert other != "mcp_a__b_c" and other.startswith("mcp_a__b_c_") and len(other) <= 128


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": "array"}, "not a JSON schema of an object"),
        ("object", "not a JSON schema of an object"),
        ({"type": "object", "properties": {"a": {"type": "nonsense"}}}, "not valid JSON schema"),
    ],
)
def test_schemas_that_cannot_be_used_are_refused(schema, says):
    assert says in mcp.schema_problem(schema)


def test_a_server_started_by_the_desk_over_stdio(app, cli, tmp_path):
    reservations = tmp_path / "stdio.jsonl"
    added = cli("mcp", "add", "local", "--command", stdio_command(reservations), "--tenant", "acme")
    assert added.exit_code == 0, added.output
    assert "mcp_local__lookup_stock (lookup_stock): runs at once (read-only)" in added.output
    tenant_id = db.session.scalar(select(Tenant.id).where(Tenant.slug == "acme"))
    registry = services().tools_for(db.session, tenant_id)
    assert "mcp_local__lookup_stock" in registry.names()
    context = ToolContext(db.session, 1, tenant_id, 1, "toolcall-1")
    outcome = registry.run("mcp_local__reserve_stock", {"sku": "SKU-2", "quantity": 1}, context, 8000)
    assert not outcome.is_error and "Reserved 1 of SKU-2." in outcome.content
    assert [json.loads(line) for line in reservations.read_text().splitlines()] == [{"sku": "SKU-2", "quantity": 1}]
    failed = registry.run("mcp_local__lookup_stock", {"sku": "SKU-404"}, context, 8000)
    assert failed.is_error and failed.content.startswith("The MCP server local reported an error:\n<tool_output")
    assert os.environ.get("WAREHOUSE_TOKEN") is None


def test_a_server_is_reached_from_a_thread_that_already_runs_an_event_loop(warehouse):
    # Playwright's sync API (the browser tests) leaves one running in a test process's thread, and
    # anyio.run refuses to nest a loop: the MCP client then runs in a thread of its own.
    access = mcp.Access(server="warehouse", url=warehouse.url, command=None, allow=(f"127.0.0.1:{warehouse.port}",))

    async def inside_a_loop():
        return mcp.fetch_tools(access)

    listed = in_own_thread(lambda: asyncio.run(inside_a_loop()))
    assert {tool["name"] for tool in listed} == {"lookup_stock", "reserve_stock"}
