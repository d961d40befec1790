"""What admins do with their tenant's MCP servers, shared by the MCP servers page and the command
line (`flask mcp ...`): add a server, sync it, accept a held tool's change, remove it. Each change is
audited on the tenant's chain in the same transaction and committed; an McpError (a sentence saying
what to fix) leaves nothing written. The catalogue itself is webapp/tools/mcp.py."""

from __future__ import annotations

from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.accounts.actions import audit_refused_address
from webapp.models import McpServer, User
from webapp.runtime.services import services
from webapp.tools import mcp
from webapp.tools.mcp import McpError, SyncReport


def _audit(session: Session, action: str, tenant_id: int, actor: User | None, data: dict, tool_name=None) -> None:
    audit_chain.record(
        session,
        action,
        tenant_id=tenant_id,
        actor=actor,
        actor_label=None if actor else "command line",
        tool_name=tool_name,
        data=data,
    )


def _undone(session: Session, work):
    try:
        return work()
    except McpError:
        session.rollback()
        raise


def add(
    session: Session,
    tenant_id: int,
    actor: User | None,
    name: str,
    *,
    url: str | None = None,
    command: str | None = None,
    headers: list[str] = (),
) -> tuple[McpServer, SyncReport]:
    """Register a server from what an admin typed (headers as "Name: value" lines) and take its tools."""

    def work():
        pairs = [mcp.parse_header(line) for line in headers if line.strip()]
        server, report = mcp.add_server(
            session,
            services().config,
            tenant_id,
            name,
            url=url,
            command=command,
            headers=pairs,
            reserved=set(services().tools.names()),
            by_user_id=actor.id if actor else None,
        )
        data = {
            "server": server.name,
            "url": server.url,
            "command": server.command,
            "headers": [h["name"] for h in server.headers],  # names only: never a value
            **report.data(),
        }
        _audit(session, "mcp_server_added", tenant_id, actor, data)
        session.commit()
        return server, report

    try:
        return _undone(session, work)
    except McpError as exc:
        audit_refused_address(session, exc, "mcp server", tenant_id, actor, None if actor else "command line")
        raise


def sync(session: Session, tenant_id: int, actor: User | None, name: str) -> SyncReport:
    def work():
        report = mcp.sync_server(
            session,
            services().config,
            tenant_id,
            name,
            reserved=set(services().tools.names()),
            by_user_id=actor.id if actor else None,
        )
        _audit(session, "mcp_server_synced", tenant_id, actor, {"server": name.strip(), **report.data()})
        session.commit()
        return report

    return _undone(session, work)


def accept(session: Session, tenant_id: int, actor: User | None, tool_name: str) -> None:
    """Accept what a held tool now says it does (the before and after are audited)."""

    def work():
        before, after = mcp.accept_tool(session, tenant_id, tool_name, actor.id if actor else None)
        _audit(session, "mcp_tool_accepted", tenant_id, actor, {"before": before, "after": after}, tool_name)
        session.commit()

    _undone(session, work)


def remove(session: Session, tenant_id: int, actor: User | None, name: str) -> list[str]:
    def work():
        names = mcp.remove_server(session, tenant_id, name)
        _audit(session, "mcp_server_removed", tenant_id, actor, {"server": name.strip(), "tools": names})
        session.commit()
        return names

    return _undone(session, work)
