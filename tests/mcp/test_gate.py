"""MCP changes keep the gate (issue 25, finding 6): accepting a changed tool keeps its policy (a writing
tool whose server now says it only reads goes on waiting, and letting it run at once is a policy change
for a second admin); a change found at call time holds the tool at once, so its other waiting calls
cannot be approved; and what a server says of a tool (read-only, destructive) is shown where admins
decide."""

from __future__ import annotations

import re
from html import unescape

from sqlalchemy import select

from tests.clients import second_admin_approves, sign_in
from tests.mcp.test_mcp_tools import LOOKUP, RESERVE, add_warehouse, offered
from tests.model_server import Reply
from tests.replies import reply, tool_use
from webapp.agent import policies
from webapp.models import AuditEvent, Conversation, McpServer, McpTool, PolicyChange, ToolCall
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.tools import mcp

REVIEWER = "reviewer@acme.test"


def converse(api, model, message: str, *calls: dict) -> list[ToolCall]:
    """A conversation of the demo agent whose model asks for these calls, moved in this process until it
    waits or ends (the MCP tools run here, against the warehouse server)."""
    model.enqueue(Reply.message(reply(*calls)), match=message)
    created = api.as_("agent@acme.test").post("/api/conversations", json={"message": message}).json
    move_on(created["id"])
    return calls_of(created["id"])


def move_on(conversation_id: int) -> None:
    services().loop(db.session, db.session.get(Conversation, conversation_id)).complete()
    db.session.remove()


def calls_of(conversation_id: int) -> list[ToolCall]:
    calls = list(db.session.scalars(select(ToolCall).where(ToolCall.conversation_id == conversation_id)))
    db.session.remove()
    return calls


def words(html: str) -> str:
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def test_accepting_a_writing_tool_that_now_says_it_only_reads_keeps_it_waiting(app, cli, api, model, warehouse):
    add_warehouse(cli, warehouse)
    warehouse.stop()
    warehouse.start(variant=3)  # a proxy flips reserve_stock's hints to read-only, nothing else changes
    assert f"held (changed since accepted): {RESERVE}" in cli("mcp", "sync", "warehouse", "--tenant", "acme").output

    admin = sign_in(app, "admin@acme.test")
    page = words(admin.get("/admin/mcp").text)
    assert "For the approval gate It said: Its server says it may destroy or overwrite data." in page
    assert "Now: Its server says it only reads." in page
    assert (
        f"Accepting keeps its policy (Every {RESERVE} call needs one approval within 24 hours.). Letting its calls "
        "run at once, as its new hints would by default, is then a policy change that another admin has to approve."
    ) in page
    accepted = admin.post(f"/admin/mcp/tools/{RESERVE}/accept")
    assert accepted.status_code == 303
    assert "waits for another admin" in unescape(admin.get("/admin/mcp").text)

    (call,) = converse(api, model, "reserve 2 of SKU-1", tool_use(RESERVE, {"sku": "SKU-1", "quantity": 2}))
    assert call.status == "awaiting_approval" and warehouse.received() == 0  # the gate held
    change = db.session.scalar(select(PolicyChange))
    assert (change.status, change.source, change.loosens) == (
        "pending",
        "mcp_change",
        ["The rule goes from “always waits” to “runs at once”."],
    )
    event = db.session.scalar(
        select(AuditEvent).where(AuditEvent.action == "mcp_tool_accepted").order_by(AuditEvent.id.desc())
    )
    assert event.data["policy_kept"]["mode"] == "always" and event.data["policy_change_asked"]
    db.session.remove()

    second_admin_approves(app, RESERVE)  # four eyes: now it may run at once
    (ran,) = converse(api, model, "reserve 1 of SKU-3", tool_use(RESERVE, {"sku": "SKU-3", "quantity": 1}))
    assert ran.status == "succeeded" and warehouse.reserved()[-1] == {"sku": "SKU-3", "quantity": 1}


def test_a_change_found_at_call_time_holds_the_tool_and_its_other_waiting_calls(app, cli, api, model, warehouse):
    add_warehouse(cli, warehouse)
    (first,) = converse(api, model, "reserve one", tool_use(RESERVE, {"sku": "SKU-1", "quantity": 1}))
    (second,) = converse(api, model, "reserve two", tool_use(RESERVE, {"sku": "SKU-3", "quantity": 2}))
    assert first.status == second.status == "awaiting_approval"
    warehouse.stop()
    warehouse.start(variant=2)  # reserve_stock changed behind the desk's back

    assert api.as_(REVIEWER).post(f"/api/approvals/{first.id}", json={"decision": "approve"}).status_code == 200
    move_on(first.conversation_id)
    (failed,) = calls_of(first.conversation_id)
    assert failed.status == "failed" and "it was not called, and the tool is held" in failed.result
    assert warehouse.received() == 0
    row = db.session.scalar(select(McpTool).where(McpTool.registry_name == RESERVE))
    assert row.held and row.current_fingerprint != row.fingerprint  # held at once: no sync needed
    held_event = db.session.scalar(
        select(AuditEvent).where(AuditEvent.action == "mcp_tool_held").order_by(AuditEvent.id.desc())
    )
    assert (held_event.tool_name, held_event.actor_label, held_event.tool_call_id) == (RESERVE, "call time", first.id)
    db.session.remove()

    # Its other waiting call: reviewers are told, and cannot approve it until an admin accepts.
    reviewer = sign_in(app, REVIEWER)
    panel = words(reviewer.get(f"/approvals/{second.id}").text)
    assert "This call is held: its definition changed after this call was made." in panel
    assert 'id="approve-form"' not in reviewer.get(f"/approvals/{second.id}").text
    refused = api.as_(REVIEWER).post(f"/api/approvals/{second.id}", json={"decision": "approve"})
    assert refused.status_code == 409 and refused.json["error"] == "held"
    assert api.as_(REVIEWER).get(f"/api/approvals/{second.id}").json["held"].startswith("held: its definition")
    assert "Held" in sign_in(app, "admin@acme.test").get("/admin/mcp").text  # listed as held, not as fine

    # Not offered to the model any more.
    converse(api, model, "look up SKU-1", tool_use(LOOKUP, {"sku": "SKU-1"}))
    asked = next(r for r in model.requests if r and "look up SKU-1" in str(r["messages"]))
    assert RESERVE not in offered(asked) and LOOKUP in offered(asked)

    assert sign_in(app, "admin@acme.test").post(f"/admin/mcp/tools/{RESERVE}/accept").status_code == 303
    assert api.as_(REVIEWER).get(f"/api/approvals/{second.id}").json["held"] is None
    rejected = api.as_(REVIEWER).post(f"/api/approvals/{second.id}", json={"decision": "reject", "reason": "old"})
    assert rejected.status_code == 200


def test_what_a_server_says_of_its_tools_shows_where_admins_decide(app, cli, warehouse):
    add_warehouse(cli, warehouse)
    admin = sign_in(app, "admin@acme.test")
    for page in ("/admin/mcp", "/admin/policies"):
        html = words(admin.get(page).text)
        assert "Its server says it only reads." in html, page  # lookup_stock
        assert "Its server says it may destroy or overwrite data." in html, page  # reserve_stock


def test_a_tool_its_server_calls_destructive_always_waits_by_default(app):
    server = db.session.scalar(select(McpServer)) or McpServer(name="probe", url="http://example.com/mcp", headers=[])
    access = mcp.Access.of(server, services().config)
    for hints, waits in (
        ({"readOnlyHint": True}, False),
        ({"readOnlyHint": True, "destructiveHint": True}, True),  # says both: the worse is believed
        ({"readOnlyHint": False, "destructiveHint": False}, True),
        ({}, True),
    ):
        row = McpTool(
            registry_name="mcp_probe__t", remote_name="t", description="", input_schema={"type": "object"},
            annotations=hints, fingerprint="x", held=False,
        )  # fmt: skip
        tool = mcp.McpRemoteTool(row, access)
        default = policies.default_policy(tool)
        assert (default.mode == "always") == waits, hints
    db.session.remove()


def test_a_writing_tool_dropped_and_listed_again_as_read_only_is_held_and_keeps_waiting(
    app, cli, api, model, warehouse
):
    add_warehouse(cli, warehouse)
    warehouse.stop()
    warehouse.start(variant=4)  # the server drops reserve_stock ...
    assert f"removed (gone from the server): {RESERVE}" in cli("mcp", "sync", "warehouse", "--tenant", "acme").output
    warehouse.stop()
    warehouse.start(variant=3)  # ... and lists it again, saying it only reads
    cli("mcp", "sync", "warehouse", "--tenant", "acme")  # back as a new tool, taken as a writing one
    assert f"held (changed since accepted): {RESERVE}" in cli("mcp", "sync", "warehouse", "--tenant", "acme").output
    admin = sign_in(app, "admin@acme.test")
    assert admin.post(f"/admin/mcp/tools/{RESERVE}/accept").status_code == 303
    (call,) = converse(api, model, "reserve 2 of SKU-1", tool_use(RESERVE, {"sku": "SKU-1", "quantity": 2}))
    assert call.status == "awaiting_approval" and warehouse.received() == 0  # the gate held
    change = db.session.scalar(select(PolicyChange).where(PolicyChange.tool_name == RESERVE))
    assert change.status == "pending" and change.source == "mcp_change"
