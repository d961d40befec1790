"""Changing a tool's policy with four eyes, shared by the Policies page, the API (`PUT
/api/policies/<tool>`, `POST /api/policy-changes/<id>`), the operators' page and the command line.

A change that lets no call wait less than before is in force at once (`policy_changed`). One that
does (`agent/gate.loosenings`: a looser rule, a higher threshold, fewer approvals, a limit
raised or cleared) waits as a PolicyChange for a second admin of the tenant, or an operator
(`policy_change_requested`); the admin who asked cannot decide it. Approved, it is in force
(`policy_change_decided`, then `policy_changed` naming both people); rejected or withdrawn, the
policy stays as it was. A newer request for the same tool supersedes an older one, and a change asked
against a policy that changed since is not applied (it would undo the newer change). Each step is
audited in its own transaction and committed."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.accounts import four_eyes
from webapp.agent import gate, policies
from webapp.agent.policies import Policy
from webapp.models import PolicyChange, User, utcnow
from webapp.runtime.services import services
from webapp.settings import SettingsRefused
from webapp.tools.registry import Tool

PENDING = four_eyes.PENDING
ONE_ADMIN = "Your organisation has one admin, so the desk's operator decides it."


@dataclass(frozen=True)
class Saved:
    """What a save did: `policy` is in force now; `change`, when set, waits for a second admin (the
    policy in force is then the one before); `unchanged` when the save asked for what is in force."""

    policy: Policy | None  # None: the tool is gone
    change: PolicyChange | None = None
    unchanged: bool = False


def change_policy(session: Session, actor: User, tool: Tool, **values) -> Saved:
    """Save the tool's policy as asked (proposed_policy's keyword arguments): in force at once unless
    it loosens the gate, then waiting for a second admin. PolicyError (rolled back) says what to fix."""
    try:
        before, after = policies.proposed_policy(session, actor.tenant_id, tool, **values)
    except policies.PolicyError:
        session.rollback()
        raise
    if policies.settings(before) == policies.settings(after):
        return Saved(before, unchanged=True)
    loosens = gate.loosenings(before, after)
    if loosens:
        return Saved(before, request_loosening(session, actor.tenant_id, actor, before, after, loosens))
    applied = policies.apply_policy(session, actor.tenant_id, after, actor.id)
    _audit_changed(session, actor.tenant_id, actor, before, applied)
    session.commit()
    return Saved(applied)


def request_loosening(
    session: Session,
    tenant_id: int,
    actor: User | None,
    before: Policy,
    after: Policy,
    loosens: list[str],
    source: str = "policy",
) -> PolicyChange:
    """Keep `after` as a change waiting for a second admin (older pending changes of the tool are
    superseded), audited and committed. `actor` None: the operator's command line."""
    superseded = []
    for older in session.scalars(_pending(tenant_id).where(PolicyChange.tool_name == before.tool_name)):
        older.status, older.decided_at = "superseded", utcnow()
        superseded.append(older.id)
    change = PolicyChange(
        tenant_id=tenant_id,
        tool_name=before.tool_name,
        proposed=policies.settings(after),
        before=before.snapshot(),
        base_version=before.version,
        loosens=loosens,
        source=source,
    )
    four_eyes.asked(
        session,
        change,
        actor,
        "policy_change_requested",
        tool_name=before.tool_name,
        source=source,
        loosens=loosens,
        before=before.snapshot(),
        after=after.snapshot(),
        supersedes=superseded,
    )
    session.commit()
    return change


def decide(
    session: Session,
    decider: User | None,
    change_id: int,
    decision: str,
    reason: str | None = None,
    *,
    actor_label: str | None = None,
) -> Saved:
    """A second admin's (or an operator's) decision on a waiting change: "approve" puts it in force,
    "reject" (with a reason) leaves the policy as it is. `decider` None is the operator's command
    line. SettingsRefused: missing, another tenant's or no such change; forbidden, the admin who asked;
    conflict, decided already or the policy changed since; invalid, a rejection without a reason or a
    change that no longer passes the policy's checks (an operator lowered the ceiling since)."""
    change = find_change(session, decider, change_id, lock=True)
    four_eyes.still_waiting(change, already_said, SettingsRefused)
    if decider is not None and decider.id == change.requested_by_id:
        raise SettingsRefused(
            "forbidden",
            "not_allowed",
            "You asked for this change, so another admin of your organisation decides it (four eyes). "
            + (ONE_ADMIN if admin_count(session, change.tenant_id) < 2 else ""),
        )
    if decider is not None and decision == "approve":  # a loosening: never by an account the asker may hold
        refused = four_eyes.why_not_decide(session, decider, change.requested_by_id)
        if refused:
            raise SettingsRefused("forbidden", "not_allowed", refused)
    reason = four_eyes.checked_reason(decision, reason, SettingsRefused)
    tool = services().tools_for(session, change.tenant_id).get(change.tool_name)
    if decision == "approve" and tool is None:
        _close(session, change, "superseded", decider, actor_label, "The tool is gone.")
        session.commit()
        raise SettingsRefused(
            "conflict", "tool_gone", f"The tool {change.tool_name} is no longer there; nothing was changed."
        )
    before = policies.policy_for(session, change.tenant_id, tool) if tool else None
    if decision == "approve" and before.version != change.base_version:
        _close(session, change, "superseded", decider, actor_label, "The policy changed since it was asked.")
        session.commit()
        raise SettingsRefused(
            "conflict",
            "policy_changed_since",
            f"The policy of {change.tool_name} changed since this change was asked (version {change.base_version} "
            f"then, {before.version} now), so approving it could undo the newer change. Nothing was changed; "
            "ask for it again if it is still wanted.",
        )
    if decision == "reject":
        _close(session, change, "rejected", decider, actor_label, reason)
        session.commit()
        return Saved(before, change)
    try:
        before, after = policies.proposed_policy(
            session, change.tenant_id, tool, **policies.from_settings(change.proposed)
        )
    except policies.PolicyError as exc:
        session.rollback()
        raise SettingsRefused(
            "invalid", "invalid_policy", f"{exc} Reject this change, and ask for one that fits."
        ) from None
    applied = policies.apply_policy(session, change.tenant_id, after, change.requested_by_id)
    change.applied_version = applied.version
    _close(session, change, "approved", decider, actor_label, reason)
    _audit_changed(
        session,
        change.tenant_id,
        decider,
        before,
        applied,
        actor_label=actor_label,
        change=change,
    )
    session.commit()
    return Saved(applied, change)


def withdraw(session: Session, actor: User, change_id: int) -> PolicyChange:
    """The admin who asked takes a waiting change back."""
    change = find_change(session, actor, change_id, lock=True)
    four_eyes.withdrawable(change, actor, already_said, SettingsRefused)
    _close(session, change, "withdrawn", actor, None, None)
    session.commit()
    return change


def find_change(session: Session, person: User | None, change_id: int, *, lock: bool = False) -> PolicyChange:
    """The change, if `person` may see it (four_eyes.find)."""
    return four_eyes.find(session, PolicyChange, person, change_id, SettingsRefused, lock=lock)


def changes(session: Session, tenant_id: int | None, status: str | None = PENDING, limit: int = 200):
    """The tenant's changes (None: every tenant's), newest first."""
    return four_eyes.listed(session, PolicyChange, tenant_id, status, limit)


def asked_for(change: PolicyChange) -> str:
    """The rule a change asks for, in words."""
    return Policy(change.tool_name, **policies.from_settings(change.proposed)).describe()


def admin_count(session: Session, tenant_id: int) -> int:
    """The tenant's active admins (with one, the desk's operator is the second pair of eyes)."""
    people = session.scalars(select(User).where(User.tenant_id == tenant_id, User.active.is_(True)))
    return sum(1 for person in people if person.has_role("admin"))


def already_said(change: PolicyChange) -> str:
    """Why a change can no longer be decided, in words whose "{at}" is when it was (the refusal's `at`)."""
    who = change.decided_by.label if change.decided_by else (change.decided_by_label or "the desk")
    at = " at {at}" if change.decided_at else ""
    if change.status == "superseded":
        return f"This change was superseded ({change.reason or 'a newer change of the same tool was asked'}){at}."
    if change.status == "withdrawn":
        return f"This change was withdrawn by the admin who asked for it{at}."
    return f"This change was already {change.status} by {who}{at}."


def _pending(tenant_id: int):
    return select(PolicyChange).where(PolicyChange.tenant_id == tenant_id, PolicyChange.status == PENDING)


def _close(
    session: Session,
    change: PolicyChange,
    status: str,
    decider: User | None,
    actor_label: str | None,
    reason: str | None,
) -> None:
    four_eyes.close(
        session,
        change,
        status,
        decider,
        actor_label,
        reason,
        "policy_change_decided",
        tool_name=change.tool_name,
        loosens=change.loosens,
    )


def _audit_changed(
    session: Session,
    tenant_id: int,
    actor: User | None,
    before: Policy,
    after: Policy,
    *,
    actor_label: str | None = None,
    change: PolicyChange | None = None,
) -> None:
    data = {"before": before.snapshot(), "after": after.snapshot()}
    if change is not None:  # in force after four eyes: both names
        data |= {
            "change_id": change.id,
            "requested_by": change.requested_by.email if change.requested_by else None,
            "approved_by": actor.email if actor else (actor_label or "command line"),
        }
    audit_chain.record(
        session,
        "policy_changed",
        tenant_id=tenant_id,
        actor=actor,
        actor_label=None if actor else (actor_label or "command line"),
        tool_name=after.tool_name,
        data=data,
    )
