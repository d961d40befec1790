"""MCP tools behind the approval gate, end to end: the warehouse MCP server over the real streamable
HTTP transport, registered with the command line, its tools offered to the model (the test model
server) by a real worker, run by the MCP client in the worker's thread."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, select, text

from tests.clients import sign_in
from tests.conftest import wait_until
from tests.integration.test_workers import AGENT, REVIEWER, assert_valid_transcript, start, state, wait_status
from tests.model_server import Reply
from tests.replies import reply, tool_use
from webapp.models import AuditEvent, McpTool, ToolCall

pytestmark = pytest.mark.slow

LOOKUP, RESERVE = "mcp_warehouse__lookup_stock", "mcp_warehouse__reserve_stock"
QUICK_RETRIES = {"MCP_RETRY_SECONDS": "0.2", "MCP_TIMEOUT_SECONDS": "10"}


def add_warehouse(cli, warehouse, tenant: str = "acme") -> str:
    result = cli("mcp", "add", "warehouse", "--url", warehouse.url, "--tenant", tenant)
    assert result.exit_code == 0, result.output
    return result.output


def offered(request: dict | None) -> list[str]:
    return [tool["name"] for tool in (request or {}).get("tools", [])]


def ask(api, model, message: str, *calls: dict) -> int:
    model.enqueue(Reply.message(reply(*calls)), match=message)
    return start(api, message)


def newest_event_id(read) -> int:
    """Where the audit log stands now: it outlives tests, so a test reads only the events after this."""
    return read(lambda s: s.scalar(select(func.max(AuditEvent.id)))) or 0


def events_since(read, since: int, action: str) -> list[AuditEvent]:
    return read(lambda s: s.scalars(select(AuditEvent).where(AuditEvent.action == action, AuditEvent.id > since)).all())


def the_call(read, conversation_id: int) -> ToolCall:
    return read(lambda s: s.scalar(select(ToolCall).where(ToolCall.conversation_id == conversation_id)))


def test_the_read_only_tool_runs_at_once_and_the_destructive_one_waits_and_runs_once(
    cli, api, workers, model, warehouse, read
):
    said = add_warehouse(cli, warehouse)
    assert f"{LOOKUP} (lookup_stock): runs at once (read-only)" in said
    assert f"{RESERVE} (reserve_stock): waits for one approval" in said
    workers()

    looked = ask(api, model, "how many SKU-1 are there", tool_use(LOOKUP, {"sku": "SKU-1"}))
    done = wait_status(api, looked, "completed", timeout=60)
    call = done["tool_calls"][0]
    assert (call["name"], call["status"]) == (LOOKUP, "succeeded")
    assert '"on_hand": 12' in call["result"] and call["result"].startswith(f'<tool_output tool="{LOOKUP}"')
    first = model.requests[0]
    assert {LOOKUP, RESERVE} <= set(offered(first))
    definition = next(tool for tool in first["tools"] if tool["name"] == LOOKUP)
    assert "MCP server warehouse" in definition["description"]
    assert definition["input_schema"]["required"] == ["sku"]
    assert_valid_transcript(done)

    reserving = ask(api, model, "reserve 2 of SKU-1", tool_use(RESERVE, {"sku": "SKU-1", "quantity": 2}))
    waiting = wait_status(api, reserving, "awaiting_approval", timeout=60)
    call = waiting["tool_calls"][0]
    assert call["status"] == "awaiting_approval" and warehouse.received() == 0
    assert "Every mcp_warehouse__reserve_stock call needs one approval" in read(
        lambda s: s.get(ToolCall, call["id"]).policy["rule"]
    )
    response = api.as_(REVIEWER).post(f"/api/approvals/{call['id']}", json={"decision": "approve"})
    assert response.status_code == 200, response.json
    done = wait_status(api, reserving, "completed", timeout=60)
    assert done["tool_calls"][0]["status"] == "succeeded"
    assert "Reserved 2 of SKU-1." in done["tool_calls"][0]["result"]
    assert warehouse.reserved() == [{"sku": "SKU-1", "quantity": 2}]  # exactly once
    assert_valid_transcript(done)


def test_arguments_are_checked_against_the_servers_schema_before_anything_is_sent(cli, api, workers, model, warehouse):
    add_warehouse(cli, warehouse)
    workers()
    conversation = ask(api, model, "reserve some", tool_use(RESERVE, {"sku": "SKU-1", "quantity": "2", "rush": True}))
    done = wait_status(api, conversation, "completed", timeout=60)
    call = done["tool_calls"][0]
    assert call["status"] == "failed"  # refused at once: nobody is asked to approve what cannot run
    assert "quantity: '2' is not of type 'integer'" in call["result"]
    assert "'rush' was unexpected" in call["result"]
    assert warehouse.received() == 0


def test_a_server_that_is_down_is_tried_again_then_the_call_fails_saying_so(
    app, cli, api, workers, model, warehouse, read
):
    add_warehouse(cli, warehouse)
    warehouse.stop()
    workers(**QUICK_RETRIES)
    conversation = ask(api, model, "how many SKU-3", tool_use(LOOKUP, {"sku": "SKU-3"}))
    done = wait_status(api, conversation, "completed", timeout=60)
    call = done["tool_calls"][0]
    assert call["status"] == "failed"
    assert "The MCP server warehouse could not be reached after 3 tries" in call["result"]
    assert "nothing was done" in call["result"]
    assert read(lambda s: s.get(ToolCall, call["id"]).duration_ms) >= 600  # backoff: 0.2 s, then 0.4 s
    html = sign_in(app, AGENT).get(f"/conversations/{conversation}").text  # the chat page says it in words
    assert "Failed: The MCP server warehouse could not be reached after 3 tries" in html
    assert "&lt;tool_output" not in html and "<tool_output" not in html


def test_a_tool_whose_server_changes_it_is_held_until_an_admin_accepts_the_change(
    app, cli, api, workers, model, warehouse, read
):
    add_warehouse(cli, warehouse)
    warehouse.stop()
    warehouse.start(variant=2)  # reserve_stock now wants a reason, and says it also emails the buyer
    workers()

    # Before anyone syncs: the call is approved, but the server's listing no longer matches what was
    # accepted, so nothing is sent.
    before = ask(api, model, "reserve 1 of SKU-3", tool_use(RESERVE, {"sku": "SKU-3", "quantity": 1}))
    call = wait_status(api, before, "awaiting_approval", timeout=60)["tool_calls"][0]
    assert api.as_(REVIEWER).post(f"/api/approvals/{call['id']}", json={"decision": "approve"}).status_code == 200
    done = wait_status(api, before, "completed", timeout=60)
    assert done["tool_calls"][0]["status"] == "failed"
    assert (
        "changed reserve_stock" in done["tool_calls"][0]["result"]
        and "it was not called" in done["tool_calls"][0]["result"]
    )
    assert warehouse.received() == 0

    synced = cli("mcp", "sync", "warehouse", "--tenant", "acme")
    assert synced.exit_code == 0 and f"held (changed since accepted): {RESERVE}" in synced.output
    held = ask(api, model, "reserve 3 of SKU-3 now", tool_use(RESERVE, {"sku": "SKU-3", "quantity": 3}))
    done = wait_status(api, held, "completed", timeout=60)
    asked = next(r for r in model.requests if r and "reserve 3 of SKU-3 now" in str(r["messages"]))
    assert RESERVE not in offered(asked) and LOOKUP in offered(asked)  # held: not offered
    assert done["tool_calls"][0]["status"] == "failed" and "is held" in done["tool_calls"][0]["result"]
    assert warehouse.received() == 0

    admin = sign_in(app, "admin@acme.test")
    page = admin.get("/admin/mcp").text
    assert "Held" in page and "also email the buyer" in page and "&#34;reason&#34;" in page
    response = admin.post(f"/admin/mcp/tools/{RESERVE}/accept")
    assert response.status_code == 303
    row = read(lambda s: s.scalar(select(McpTool).where(McpTool.registry_name == RESERVE)))
    assert not row.held and "reason" in row.input_schema["required"]
    newest = select(AuditEvent).where(AuditEvent.action == "mcp_tool_accepted").order_by(AuditEvent.id.desc())
    event = read(lambda s: s.scalar(newest.limit(1)))
    assert event.actor_label == "admin@acme.test" and event.tool_name == RESERVE
    assert "reason" in str(event.data["after"]) and "reason" not in str(event.data["before"]["input_schema"])

    accepted = ask(
        api, model, "reserve 4 of SKU-1 please", tool_use(RESERVE, {"sku": "SKU-1", "quantity": 4, "reason": "order 7"})
    )
    call = wait_status(api, accepted, "awaiting_approval", timeout=60)["tool_calls"][0]
    asked = next(r for r in model.requests if r and "reserve 4 of SKU-1 please" in str(r["messages"]))
    schema = next(t for t in asked["tools"] if t["name"] == RESERVE)["input_schema"]
    assert "reason" in schema["required"]
    assert api.as_(REVIEWER).post(f"/api/approvals/{call['id']}", json={"decision": "approve"}).status_code == 200
    assert wait_status(api, accepted, "completed", timeout=60)["tool_calls"][0]["status"] == "succeeded"
    assert warehouse.reserved() == [{"sku": "SKU-1", "quantity": 4, "reason": "order 7"}]


def test_the_periodic_check_holds_a_changed_tool_before_any_call_and_releases_it_when_changed_back(
    app, cli, api, workers, model, warehouse, read
):
    since = newest_event_id(read)
    add_warehouse(cli, warehouse)
    warehouse.stop()
    warehouse.start(variant=2)  # reserve_stock now wants a reason, and says it also emails the buyer
    workers(MCP_CHECK_SECONDS="1")

    def row() -> McpTool:
        return read(lambda s: s.scalar(select(McpTool).where(McpTool.registry_name == RESERVE)))

    wait_until(lambda: row().held, 30, "the periodic check to hold the changed tool")
    assert not read(lambda s: s.scalar(select(McpTool).where(McpTool.registry_name == LOOKUP))).held
    held = events_since(read, since, "mcp_tool_held")
    assert [(e.tool_name, e.actor_label, e.data["server"]) for e in held] == [(RESERVE, "scheduled check", "warehouse")]
    home = sign_in(app, "admin@acme.test").get("/").text  # the admin's checklist says so
    assert "1 MCP tool held: its server changed what it does" in home and 'href="/admin/mcp"' in home

    # Held before anyone called it or synced: the model is no longer offered it.
    conversation = ask(api, model, "check stock of SKU-3 first", tool_use(LOOKUP, {"sku": "SKU-3"}))
    wait_status(api, conversation, "completed", timeout=60)
    asked = next(r for r in model.requests if r and "check stock of SKU-3 first" in str(r["messages"]))
    assert RESERVE not in offered(asked) and LOOKUP in offered(asked)

    warehouse.stop()
    warehouse.start()  # back to what the admin accepted
    wait_until(lambda: not row().held, 30, "the periodic check to release the tool")
    assert [e.tool_name for e in events_since(read, since, "mcp_tool_released")] == [RESERVE]
    assert "All 2 MCP tools do what an admin accepted." in sign_in(app, "admin@acme.test").get("/").text
    assert warehouse.received() == 0


def test_checks_that_overlap_hold_a_changed_tool_once(app, cli, warehouse, read, engine):
    from jobs import mcp as mcp_jobs

    since = newest_event_id(read)
    add_warehouse(cli, warehouse)
    warehouse.stop()
    warehouse.start(variant=2)

    def check(_) -> str:
        with app.app_context():  # a session of its own, as each worker's job has
            return mcp_jobs.check_servers()

    # Four checks at once (a slow check still running when the next starts), all kept from writing
    # the tool until each has read it: the tool's row is locked meanwhile (on SQLite, the database).
    with ThreadPoolExecutor(4) as checks:
        with engine.begin() as blocker:
            blocker.execute(select(McpTool.id).where(McpTool.registry_name == RESERVE).with_for_update())
            running = [checks.submit(check, n) for n in range(4)]
            time.sleep(2)
        outcomes = [each.result(timeout=60) for each in running]
    assert sorted(outcomes) == ["1 server(s) checked: 0 tool(s) held, 0 released"] * 3 + [
        "1 server(s) checked: 1 tool(s) held, 0 released"
    ]
    assert [event.tool_name for event in events_since(read, since, "mcp_tool_held")] == [RESERVE]


def test_another_tenant_never_sees_the_tools(app, cli, api, workers, model, warehouse):
    add_warehouse(cli, warehouse)
    workers()
    model.enqueue(Reply.message(reply(tool_use(LOOKUP, {"sku": "SKU-1"}))), match="globex stock")
    response = api.as_("agent@globex.test").post("/api/conversations", json={"message": "globex stock please"})
    conversation = response.json["id"]
    done = wait_until(
        lambda: (
            (s := api.as_("agent@globex.test").get(f"/api/conversations/{conversation}").json)["status"] == "completed"
            and s
        ),
        60,
        "the globex conversation",
    )
    asked = next(r for r in model.requests if r and "globex stock please" in str(r["messages"]))
    assert not [name for name in offered(asked) if name.startswith("mcp_")]
    assert done["tool_calls"][0]["status"] == "failed" and "Unknown tool" in done["tool_calls"][0]["result"]
    assert LOOKUP not in done["tool_calls"][0]["result"].split("Available tools:")[1]
    assert warehouse.received() == 0

    # (the demo seed has no admin for globex; people stay between tests, so one made earlier is fine)
    cli("create-user", "admin@globex.test", "--role", "admin", "--tenant", "globex", "--password", "demo-password")
    globex = sign_in(app, "admin@globex.test")
    assert "warehouse" not in globex.get("/admin/mcp").text
    assert LOOKUP not in globex.get("/admin/policies").text
    refused = globex.post("/admin/mcp/warehouse/sync")
    assert refused.status_code == 422 and "no MCP server named" in refused.text
    assert globex.post("/admin/mcp/warehouse/remove").status_code == 422
    assert LOOKUP in sign_in(app, "admin@acme.test").get("/admin/policies").text


def test_a_call_found_running_after_a_crash_is_not_sent_again(app, cli, api, workers, model, warehouse, read):
    add_warehouse(cli, warehouse)
    warehouse.hold.touch()  # reserve_stock waits inside the server until the test lets it go
    # The call must still be in flight when the worker is killed: on a loaded machine the test saw the
    # server's count only after the worker's 30 s MCP timeout had settled the call itself.
    first = workers(MCP_TIMEOUT_SECONDS="600")
    conversation = ask(api, model, "reserve 5 of SKU-3", tool_use(RESERVE, {"sku": "SKU-3", "quantity": 5}))
    call = wait_status(api, conversation, "awaiting_approval", timeout=60)["tool_calls"][0]
    assert api.as_(REVIEWER).post(f"/api/approvals/{call['id']}", json={"decision": "approve"}).status_code == 200
    wait_until(lambda: warehouse.received() == 1, 60, "the call to reach the server")
    # while the server holds the call, the desk still writes: the call holds no transaction (on SQLite,
    # no write lock), so a reviewer's claim on another page does not wait for the server
    assert read(lambda s: s.execute(text("UPDATE tenants SET name = name")).rowcount) >= 1  # (else: locked)
    first.kill()
    warehouse.hold.unlink()
    wait_until(lambda: len(warehouse.reserved()) == 1, 30, "the server to finish the call it was sent")
    workers()  # the lease runs out; the sweeper hands the move on
    done = wait_status(api, conversation, "completed", timeout=60)
    settled = done["tool_calls"][0]
    assert settled["status"] == "failed" and settled["result"].startswith("Outcome unknown:")
    assert "may or may not have taken effect" in settled["result"]
    assert read(lambda s: s.get(ToolCall, call["id"]).attempts) == 2
    assert warehouse.received() == 1  # not sent again
    html = sign_in(app, REVIEWER).get(f"/approvals/{call['id']}").text
    assert "Outcome unknown: a worker stopped while this call was being carried out" in html
    assert_valid_transcript(done)
    assert state(api, conversation)["status"] == "completed"
