"""What admins do with their tenant's MCP servers, shared by the MCP servers page and the command
line (`flask mcp ...`): add a server, sync it, accept a held tool's change, remove it. Each change is
audited on the tenant's chain in the same transaction and committed; an McpError (a sentence saying
what to fix) leaves nothing written. The catalogue itself is webapp/tools/mcp.py."""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import select
from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.accounts import policy_actions
from webapp.agent import policies
from webapp.models import McpServer, McpTool, PolicyChange, ToolPolicy, User
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

    return _undone(session, work)


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


def accept(session: Session, tenant_id: int, actor: User | None, tool_name: str) -> PolicyChange | None:
    """Accept what a held tool now says it does (the before and after are audited), keeping the gate:
    the tool keeps the policy it had, so new hints never let its calls wait less by themselves (a
    writing tool that now says it only reads goes on waiting); letting them wait less is a policy
    change for a second admin, returned. Hints that make it stricter are in force at once."""

    def work():
        registry = services().tools_for(session, tenant_id)
        accepted = registry.get(tool_name)
        before = policies.policy_for(session, tenant_id, accepted) if accepted is not None else None
        stored = session.scalar(
            select(ToolPolicy.id).where(ToolPolicy.tenant_id == tenant_id, ToolPolicy.tool_name == tool_name)
        )
        old, new = mcp.accept_tool(session, tenant_id, tool_name, actor.id if actor else None)
        data = {"before": old, "after": new}
        kept, loosens = None, []
        if before is not None:
            changed = _changed_tool(session, tenant_id, tool_name)
            if stored is not None:  # an admin's policy: it stays, unless the tool now changes things
                if changed.sensitive and before.mode == "never":
                    stricter = replace(before, mode="always", approvals_required=1, version=before.version + 1)
                    data["policy_tightened"] = policies.apply_policy(session, tenant_id, stricter, None).snapshot()
            else:  # the tool's default: keep the one in force if the new default would let calls wait less
                default = policies.default_policy(changed, before.ceiling_cents)
                loosens = policies.loosenings(before, default)
                if loosens:
                    kept = policies.apply_policy(session, tenant_id, replace(before, version=1), _id(actor))
                    data |= {"policy_kept": kept.snapshot(), "policy_change_asked": loosens}
        _audit(session, "mcp_tool_accepted", tenant_id, actor, data, tool_name)
        change = None
        if kept is not None:
            after = replace(default, version=kept.version + 1)
            change = policy_actions.request_loosening(session, tenant_id, actor, kept, after, loosens, "mcp_change")
        session.commit()
        return change

    return _undone(session, work)


def gate_preview(session: Session, tenant_id: int, row: McpTool) -> list[str]:
    """What accepting a held tool's change would do to the gate, in words for the admin who decides."""
    said = mcp.hint_changes(row.annotations, row.current_annotations)
    accepted = services().tools_for(session, tenant_id).get(row.registry_name)
    if not said or accepted is None:
        return said
    before = policies.policy_for(session, tenant_id, accepted)
    changed = mcp.McpRemoteTool(row, mcp.Access.of(row.server, services().config), as_changed=True)
    default = policies.default_policy(changed, before.ceiling_cents)
    if changed.sensitive and before.mode == "never":
        said.append("Accepting makes every call of it wait for one approval from then on.")
    elif policies.loosenings(before, default):
        said.append(
            f"Accepting keeps its policy ({before.describe()}). Letting its calls run at once, as its new hints "
            "would by default, is then a policy change that another admin has to approve."
        )
    else:
        said.append(f"Its policy stays as it is: {before.describe()}")
    return said


def _id(actor: User | None) -> int | None:
    return actor.id if actor else None


def _changed_tool(session: Session, tenant_id: int, tool_name: str) -> mcp.McpRemoteTool:
    row = session.scalar(select(McpTool).where(McpTool.tenant_id == tenant_id, McpTool.registry_name == tool_name))
    return mcp.McpRemoteTool(row, mcp.Access.of(row.server, services().config))


def remove(session: Session, tenant_id: int, actor: User | None, name: str) -> list[str]:
    def work():
        names = mcp.remove_server(session, tenant_id, name)
        _audit(session, "mcp_server_removed", tenant_id, actor, {"server": name.strip(), "tools": names})
        session.commit()
        return names

    return _undone(session, work)
