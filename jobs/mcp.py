"""The periodic check of MCP servers' tools (every MCP_CHECK_SECONDS, enqueued by the sweep): a tool
changed since an admin accepted it is held at once, so the model is no longer offered it, and one
changed back is released; each is audited. What counts as changed is webapp/tools/mcp/'s rule;
this job asks each server with no transaction open, then locks the server's row to record it."""

from __future__ import annotations

import logging

from sqlalchemy import select

from webapp import audit_chain
from webapp.models import McpServer
from webapp.runtime.extensions import db
from webapp.runtime.job_logs import bind_job
from webapp.runtime.services import services
from webapp.tools import mcp

log = logging.getLogger(__name__)


@bind_job
def check_servers() -> str:
    """Hold every MCP tool whose server changed it since an admin accepted it (release one changed
    back). A server that cannot be reached is left as it is until the next check (a call of its tools
    says it cannot be reached)."""
    desk = services()
    held = released = 0
    try:
        servers = [(server.id, mcp.Access.of(server, desk.config)) for server in db.session.scalars(select(McpServer))]
        db.session.rollback()  # no transaction stays open while the servers are asked
        for server_id, access in servers:
            try:
                listing = mcp.fetch_tools(access)
            except mcp.McpError as exc:
                log.warning("MCP check skipped a server: %s", exc)
                continue
            # Locked (on PostgreSQL; SQLite's transactions take its one write lock at BEGIN), so two
            # checks that overlap (a slow server outlasting its interval) hold a tool once, not twice.
            server = db.session.get(McpServer, server_id, with_for_update=True)
            if server is None:  # removed meanwhile
                continue
            newly_held, back = mcp.check_server(db.session, server, listing)
            _audit(server, newly_held, back)
            db.session.commit()
            held, released = held + len(newly_held), released + len(back)
    finally:
        db.session.remove()
    return f"{len(servers)} server(s) checked: {held} tool(s) held, {released} released"


def _audit(server: McpServer, held: list[str], released: list[str]) -> None:
    """One audit event per tool the check held or released, in the check's transaction."""
    for action, names in (("mcp_tool_held", held), ("mcp_tool_released", released)):
        for name in names:
            audit_chain.record(
                db.session,
                action,
                tenant_id=server.tenant_id,
                actor_label="scheduled check",
                tool_name=name,
                data={"server": server.name},
            )
