"""Declaring the tools that agents running elsewhere ask about (webapp/tools/external.py), shared by
the API (PUT/GET/DELETE /api/external-tools) and the Policies page."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.agent import gate, policies
from webapp.models import ExternalTool, User
from webapp.runtime.services import services
from webapp.settings import SettingsRefused, policy_actions
from webapp.tools import external


@dataclass(frozen=True)
class Declared:
    row: ExternalTool
    saved: policy_actions.Saved | None  # the policy asked for with it, if one was


def declare(
    session: Session,
    admin: User,
    name: str,
    declaration: external.Declaration,
    policy: Callable[[policies.Policy], dict] | None,
) -> Declared:
    """Declare (or declare again) a tool of the tenant's outside agents, with the policy asked for:
    change_policy's keyword arguments from the policy in force (a loosening waits for a second admin,
    as on the Policies page). Commits; nothing is kept when any of it is refused (DeclarationError,
    PolicyError)."""
    registry = services().tools_for(session, admin.tenant_id)
    taken = {tool for tool in registry.names() if registry.get(tool).runs_here}
    external.check(name, declaration, taken, set(registry.names()) - taken)
    before = external.find(session, admin.tenant_id, name)
    created = before is None
    was_read = {} if before is None else external.reading(before)
    row = external.declare(session, admin.tenant_id, name, declaration, admin.id)
    _refuse_a_reading_that_loosens(session, admin, external.OutsideTool(row), was_read, external.reading(row), policy)
    audit_chain.record(
        session,
        "external_tool_declared",
        tenant_id=admin.tenant_id,
        actor=admin,
        tool_name=name,
        data={
            "created": created,
            "description": row.description,
            "input_schema": row.input_schema,
            "amount": row.amount_argument,
            "amount_unit": row.amount_unit,
            "subject": row.subject_argument,
        },
    )
    saved = None
    if policy is not None:
        tool = external.OutsideTool(row)
        saved = policy_actions.change_policy(
            session, admin, tool, **policy(policies.policy_for(session, admin.tenant_id, tool))
        )
    session.commit()  # (a policy that took effect or waits committed already; an unchanged one did not)
    return Declared(row, saved)


def _refuse_a_reading_that_loosens(
    session: Session,
    admin: User,
    tool: external.OutsideTool,
    was_read: dict,
    now_read: dict,
    policy: Callable[[policies.Policy], dict] | None,
) -> None:
    """SettingsRefused (a conflict, nothing kept) when the declaration changes what the tool's policy reads (the
    amount's argument or unit, the subject) while that policy lets some calls run by what it reads: a
    call would then run on other numbers with no second admin. The policy that counts is the one in
    force after this request: one asked with it that tightens at once (always wait) lets it through."""
    in_force = policies.policy_for(session, admin.tenant_id, tool)
    if policy is not None:
        asked_before, asked = policies.proposed_policy(session, admin.tenant_id, tool, **policy(in_force))
        in_force = in_force if gate.loosenings(asked_before, asked) else asked
    loosens = gate.reading_loosenings(was_read, now_read, in_force)
    if loosens:
        session.rollback()
        raise SettingsRefused(
            "conflict",
            "loosens_alone",
            f"{' '.join(loosens)} That would let some {tool.name} calls run on other numbers with no second admin. "
            f'Declare it again with the policy {{"mode": "always"}} (in force at once), then ask for the rule '
            "you want: a looser rule waits for a second admin.",
        )


def remove(session: Session, admin: User, name: str) -> ExternalTool:
    """Take a declared tool away: outside agents can no longer ask for it (its calls so far stay)."""
    row = find_tool(session, admin, name)
    audit_chain.record(session, "external_tool_removed", tenant_id=admin.tenant_id, actor=admin, tool_name=name)
    session.delete(row)
    session.commit()
    return row


def find_tool(session: Session, admin: User, name: str) -> ExternalTool:
    row = external.find(session, admin.tenant_id, name)
    if row is None:
        raise SettingsRefused("missing", "not_found", f"No tool named {name[:128]} is declared for outside agents.")
    return row
