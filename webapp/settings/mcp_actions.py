"""What people do with a tenant's MCP servers, shared by the tenant admins' MCP servers page, the
operators' page (/ops/mcp) and the command line (`flask mcp ...`): add a server, sync it, accept a
held tool's change, remove it. Each change is audited on the tenant's chain in the same transaction
and committed; an McpError (a sentence saying what to fix) leaves nothing written. A refused or
failed add is rolled back and then audited (`mcp_server_add_refused`) in a transaction of its own,
so an attempt to open a door of the operator's leaves its trace. Who may give a command, its
variables, or name any $VARIABLE is decided here from the actor: the command line (no actor) and
operators only; a tenant's admin names only the secrets the operator granted to the tenant
(webapp/secrets/secret_grants.py), and a header naming one that is not granted (any more) fails a sync in
words, audited (`mcp_secret_refused`) with nothing sent. The catalogue itself is webapp/tools/mcp/."""

from __future__ import annotations

import re
from dataclasses import replace

from sqlalchemy import select
from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.agent import gate, policies
from webapp.models import McpServer, McpTool, PolicyChange, ToolPolicy, User
from webapp.runtime.services import services
from webapp.settings import policy_actions
from webapp.settings.outbound_refusals import audit_refused_address
from webapp.tools import mcp
from webapp.tools.mcp import McpError, SyncReport

_NAME_BEFORE = re.compile(r"^\s*([A-Za-z0-9!#$%&'*+.^_`|~-]+)\s*[:=]")


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


def by_operator(actor: User | None) -> bool:
    """The command line (no actor) or an operator: who may open the desk's own doors."""
    return actor is None or actor.is_operator


def add(
    session: Session,
    tenant_id: int,
    actor: User | None,
    name: str,
    *,
    url: str | None = None,
    command: str | None = None,
    headers: list[str] = (),
    environment: list[str] = (),
    working_directory: str | None = None,
) -> tuple[McpServer, SyncReport]:
    """Register a server from what a person typed (headers as "Name: value" lines, a started server's
    variables as NAME=value lines) and take its tools. A command (even an empty one), its variables or
    working directory from anyone but an operator is refused. On McpError nothing of the server is
    written and the refusal is audited."""

    def work():
        if not by_operator(actor) and (command is not None or environment or working_directory is not None):
            raise McpError(mcp.ONLY_OPERATORS_START)
        pairs = [mcp.parse_header(line) for line in headers if line.strip()]
        variables = [mcp.parse_variable(line) for line in environment if line.strip()]
        server, report = mcp.add_server(
            session,
            services().config,
            tenant_id,
            name,
            url=url,
            command=command,
            headers=pairs,
            environment=variables,
            working_directory=working_directory,
            reserved=set(services().tools.names()),
            by_user_id=actor.id if actor else None,
            by_operator=by_operator(actor),
        )
        data = {
            "server": server.name,
            "url": server.url,
            "command": server.command,
            "headers": [h["name"] for h in server.headers],  # names only: never a value
            "environment": [v["name"] for v in server.environment],
            "working_directory": server.working_directory,
            **report.data(),
        }
        _audit(session, "mcp_server_added", tenant_id, actor, data)
        session.commit()
        return server, report

    attempt = {"url": url, "command": command, "headers": headers, "environment": environment}
    try:
        return work()
    except McpError as exc:
        session.rollback()
        secret = exc.variable if isinstance(exc, mcp.SecretRefused) else None
        refused_add(session, tenant_id, actor, name, str(exc), secret=secret, **attempt)
        audit_refused_address(session, exc, "mcp server", tenant_id, actor, None if actor else "command line")
        raise
    except (IntegrityError, DataError) as error:
        session.rollback()
        if isinstance(error, IntegrityError):  # another request added the same name meanwhile
            said = f"An MCP server named {name.strip().lower()} already exists here; pick another name, or sync it."
        else:  # PostgreSQL refuses a NUL character in text
            said = "What was typed holds a character that cannot be stored (a NUL); type it again without it."
        refused_add(session, tenant_id, actor, name, said, **attempt)
        raise McpError(said) from None


def refused_add(
    session: Session,
    tenant_id: int | None,
    actor: User | None,
    name: str,
    reason: str,
    *,
    url: str | None = None,
    command: str | None = None,
    headers: list[str] = (),
    environment: list[str] = (),
    tenant: str | None = None,
    secret: str | None = None,
) -> None:
    """Audit an add that was refused or failed, in a transaction of its own (the caller rolled the
    attempt back): who, the name, the URL or command, the names of the headers and variables (never
    a value) and why. `tenant_id` None: no such tenant (`tenant` is what was typed), the global chain.
    `secret`: the variable a header named that is not granted to the tenant (its name only)."""
    data = {
        "server": _storable((name or "").strip()),
        "url": _storable((url or "").strip()) or None,
        "command": _storable(command),
        "headers": _names(headers),
        "environment": _names(environment),
        "reason": _storable(reason),
    }
    if tenant is not None:
        data["tenant"] = _storable(tenant)
    if secret is not None:
        data["secret"] = secret
    _audit(session, "mcp_server_add_refused", tenant_id, actor, data)
    session.commit()


def _storable(typed: str | None) -> str | None:
    """What was typed, as the audit log can keep it: PostgreSQL's JSON refuses a NUL character, and a
    refusal must be recorded whatever was typed."""
    return typed.replace("\x00", "\\x00") if typed else typed


def _names(lines: list[str]) -> list[str]:
    """The names in "Name: value" or NAME=value lines; a line without one is left out (it may be all value)."""
    return [found.group(1) for line in lines if (found := _NAME_BEFORE.match(line))]


def sync(session: Session, tenant_id: int, actor: User | None, name: str) -> SyncReport:
    """Read the server's tools again (audited). A header that names a secret not granted to the tenant
    fails it before anything is sent, audited as `mcp_secret_refused` in a transaction of its own."""

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

    try:
        return _undone(session, work)
    except mcp.SecretRefused as refused:
        _audit(session, "mcp_secret_refused", tenant_id, actor, refused.audit_data("sync"))
        session.commit()
        raise


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
                loosens = gate.loosenings(before, default)
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


def map_tool(
    session: Session,
    tenant_id: int,
    actor: User | None,
    tool_name: str,
    *,
    amount: str | None = None,
    unit: str = "cents",
    subject: str | None = None,
    facts_tool: str | None = None,
    facts_arguments: dict[str, str] | None = None,
) -> dict | None:
    """Map an MCP tool's arguments for the desk (mcp.set_mapping), audited; the mapping now. What its
    policy weighs (the amount, the subject) cannot be remapped under it."""

    def work():
        tool = services().tools_for(session, tenant_id).get(tool_name)
        policy = policies.policy_for(session, tenant_id, tool) if tool is not None else None
        before, after = mcp.set_mapping(
            session,
            tenant_id,
            tool_name,
            amount=amount,
            unit=unit,
            subject=subject,
            facts_tool=facts_tool,
            facts_arguments=facts_arguments,
            weighs_money=policy is not None and gate.reads_money(policy),
            weighs_subject=policy is not None and gate.reads_subject(policy),
        )
        _audit(session, "mcp_tool_mapped", tenant_id, actor, {"before": before, "after": after}, tool_name)
        session.commit()
        return after

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
    elif gate.loosenings(before, default):
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
