"""A process keeps a tenant's tools and who may use them while the tenant's tools version holds; the
database moves that version on with every change to either, so a kept copy never outlives a change."""

from __future__ import annotations

from sqlalchemy import event, select

from webapp.agent import access, moves
from webapp.conversations import actions as conversations
from webapp.models import McpServer, McpTool, Tenant, User
from webapp.runtime.extensions import db
from webapp.runtime.services import services

ACME = "acme"


def versions(session) -> dict[str, int]:
    return dict(session.execute(select(Tenant.slug, Tenant.tools_version)).all())


def test_every_change_to_tool_access_or_mcp_servers_moves_its_tenants_tools_version_and_no_other(session):
    acme = session.scalar(select(Tenant).where(Tenant.slug == ACME))
    admin = session.scalar(select(User).where(User.email == "admin@acme.test"))
    seen = [versions(session)]

    def changed(change) -> None:
        change()
        session.commit()
        now = versions(session)
        assert now[ACME] > seen[-1][ACME], "acme's tools version did not move"
        assert {slug: v for slug, v in now.items() if slug != ACME} == {
            slug: v for slug, v in seen[-1].items() if slug != ACME
        }, "another tenant's version moved"
        seen.append(now)

    changed(lambda: access.save_access(session, acme.id, "issue_refund", who="nobody", by_user_id=admin.id))
    changed(lambda: access.save_access(session, acme.id, "issue_refund", who="everyone", by_user_id=admin.id))
    server = McpServer(tenant_id=acme.id, name="shop", url="https://shop.example/mcp")
    changed(lambda: session.add(server))
    schema = {"type": "object", "properties": {}}
    tool = McpTool(
        server_id=server.id,
        tenant_id=acme.id,
        registry_name="mcp_shop__look",
        remote_name="look",
        input_schema=schema,
        current_input_schema=schema,
        fingerprint="a",
        current_fingerprint="a",
    )
    changed(lambda: session.add(tool))

    def hold() -> None:
        tool.held = True

    changed(hold)
    changed(lambda: session.delete(tool))

    def bump() -> None:
        server.version += 1

    changed(bump)
    changed(lambda: session.delete(server))


def test_a_tool_an_admin_disables_is_not_offered_at_the_next_move_of_a_process_that_kept_the_tools(app, model):
    desk = services()
    agent = db.session.scalar(select(User).where(User.email == "agent@acme.test"))
    admin = db.session.scalar(select(User).where(User.email == "admin@acme.test"))

    def first_move_offers() -> set[str]:
        conversation = conversations.start(db.session, agent, "Show invoices for customer 4471")
        cid, version = conversation.id, conversation.version
        db.session.remove()
        result = moves.advance(db.session, cid, version, owner="test", make_loop=desk.loop, lease_seconds=30)
        db.session.remove()
        assert result.outcome == "generate"
        return {tool["name"] for tool in model.requests[-1]["tools"]}

    assert "lookup_invoices" in first_move_offers()
    read: list[str] = []
    note = lambda conn, cursor, statement, *args: read.append(statement)  # noqa: E731
    event.listen(db.engine, "before_cursor_execute", note)
    try:
        assert "lookup_invoices" in first_move_offers()
    finally:
        event.remove(db.engine, "before_cursor_execute", note)
    # kept: the move read neither who may use the tools nor the MCP servers
    assert not [s for s in read if "FROM tool_access" in s or "FROM mcp_servers" in s]
    kept = desk.tenant_tools(db.session, agent.tenant_id)
    assert desk.tenant_tools(db.session, agent.tenant_id) is kept  # kept while the version holds
    access.save_access(db.session, agent.tenant_id, "lookup_invoices", who="nobody", by_user_id=admin.id)
    db.session.commit()
    assert "lookup_invoices" not in first_move_offers()
    assert desk.tenant_tools(db.session, agent.tenant_id) is not kept
