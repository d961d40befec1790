"""/api/policies and /api/policy-changes: when a tool's calls wait for people, set by an admin, and the
changes that let calls wait less, waiting for a second admin; with the bodies those routes take and
answer (a declared outside tool's policy is set with the same body: external_tools.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Annotated, Any, Literal

from flask import g
from pydantic import BaseModel, Field

from webapp.agent import policies as policy_rules
from webapp.api.base import answer, bp, documented, refused_with_fields, tenant_tools
from webapp.api.bodies import QueryParameters, RequestBody, Rule, Timestamp, decision_field, optional_text
from webapp.api.reading import FieldProblem, InvalidFields, body, query
from webapp.runtime.extensions import db
from webapp.settings import policy_actions
from webapp.web.errors import Refused
from webapp.web.security import api_roles

# --- requests -----------------------------------------------------------------------------------------

LimitCount = Annotated[
    int | None,
    Field(ge=1, le=100_000, description="The most calls; null: no limit."),
    Rule("must be a whole number from 1 to 100,000, or null"),
]
LimitCents = Annotated[
    int | None,
    Field(ge=1, le=10_000_000, description="The most money, in cents; null: no limit."),
    Rule("must be a whole number of cents from 1 to 10,000,000, or null"),
]


class PolicyLimits(RequestBody):
    """How much of a tool may run with no person, added up, as calls (`_count`) and money in cents
    (`_cents`): per conversation, per subject (what a call acts on, as its tool says: a customer, an
    order), for the whole tenant and per acting person, the last three over 24 hours. A limit left out
    or null is no limit. Past a limit a call waits for a person."""

    conversation_count: LimitCount = None
    conversation_cents: LimitCents = None
    subject_day_count: LimitCount = None
    subject_day_cents: LimitCents = None
    tenant_day_count: LimitCount = None
    tenant_day_cents: LimitCents = None
    person_day_count: LimitCount = None
    person_day_cents: LimitCents = None


class SetPolicy(RequestBody):
    """A tool's policy as an admin sets it. A change that lets any call wait less than before (a looser
    mode, a higher threshold, fewer approvals, a limit raised or cleared) is not in force until another
    admin approves it (202); a stricter one is in force at once (200)."""

    mode: Annotated[
        Literal["never", "always", "above_amount"],
        Field(
            description="never: runs at once; always: every call waits; above_amount: calls above threshold_cents wait."
        ),
        Rule('must be "never", "always" or "above_amount"'),
    ]
    threshold_cents: Annotated[
        int | None,
        Field(ge=0, le=10_000_000, description="With above_amount: calls above this many cents wait for people."),
        Rule("must be a whole number of cents from 0 to 10,000,000 (with above_amount), or null"),
    ] = None
    approvals: Annotated[
        int | None,
        Field(ge=1, le=5, description="How many people must approve a waiting call; left out: as now (at least 1)."),
        Rule("must be a whole number from 1 to 5, or null"),
    ] = None
    limits: Annotated[
        PolicyLimits | None,
        Field(description="What may run with no person, added up; left out: the limits stay as they are."),
        Rule("must be an object of limits (conversation_count, tenant_day_cents, ...), or null"),
    ] = None
    ttl_seconds: Annotated[
        int | None,
        Field(ge=300, le=30 * 24 * 3600, description="How long people have to decide; left out: as now."),
        Rule("must be a whole number of seconds from 300 to 2,592,000, or null"),
    ] = None
    remind_after_seconds: Annotated[
        int | None,
        Field(ge=60, description="When a waiting call reminds the channels; null: the default; left out: as now."),
        Rule("must be a whole number of seconds of at least 60 (less than ttl_seconds), or null"),
    ] = None


class DecidePolicyChange(RequestBody):
    """A second admin's decision on a policy change that waits for one."""

    decision: decision_field("Put the change in force (approve) or leave the policy as it is (reject).")
    reason: optional_text(2000, "Why; required to reject (the admin who asked reads it).") = None


class PolicyChangesQuery(QueryParameters):
    """Which policy changes to list."""

    status: Annotated[
        Literal["pending", "approved", "rejected", "withdrawn", "superseded", "all"] | None,
        Field(description="Only changes in this state; left out: pending."),
        Rule('must be one of "pending", "approved", "rejected", "withdrawn", "superseded", "all"'),
    ] = None


# --- answers ------------------------------------------------------------------------------------------


class PolicyView(BaseModel):
    """A tool's policy in force: when its calls wait for people, how many, and what may run without one."""

    tool: str
    mode: Literal["never", "always", "above_amount"]
    threshold_cents: int | None = Field(description="With above_amount: calls above this wait.")
    approvals: int = Field(description="People who must approve a waiting call (0 with never).")
    limits: PolicyLimits
    ttl_seconds: int = Field(description="How long people have to decide.")
    remind_after_seconds: int | None = Field(description="When a waiting call reminds; null: the default.")
    ceiling_cents: int | None = Field(
        description="The desk operator's ceiling: above it every call waits, whatever the policy; null: none."
    )
    version: int = Field(description="0: the tool's built-in default, never edited.")
    rule: str = Field(description="The policy in words.")
    pending_changes: list[int] = Field(description="Changes of this policy waiting for a second admin.")

    @classmethod
    def of(cls, policy: Any, pending: list[int] = ()) -> PolicyView:
        return cls(
            tool=policy.tool_name,
            mode=policy.mode,
            threshold_cents=policy.amount_threshold_cents,
            approvals=policy.approvals_required,
            limits=PolicyLimits(**dataclasses.asdict(policy.limits)),
            ttl_seconds=policy.ttl_seconds,
            remind_after_seconds=policy.remind_after_seconds,
            ceiling_cents=policy.ceiling_cents,
            version=policy.version,
            rule=policy.describe(),
            pending_changes=list(pending),
        )


class PolicyList(BaseModel):
    """Every tool's policy in the tenant, by tool name."""

    policies: list[PolicyView]


class PolicyChangeView(BaseModel):
    """A change to a policy that lets calls wait less, and where it stands."""

    id: int
    tool: str
    status: Literal["pending", "approved", "rejected", "withdrawn", "superseded"]
    source: Literal["policy", "mcp_change"] = Field(
        description="policy: an admin asked; mcp_change: an accepted MCP change loosens the tool's hints."
    )
    loosens: list[str] = Field(description="What would let calls wait less, in sentences for people.")
    before: dict[str, Any] = Field(description="The policy in force when it was asked (with `rule` in words).")
    after: dict[str, Any] = Field(description="The policy asked for.")
    requested_by: str | None = Field(description="The e-mail of the admin who asked.")
    requested_at: Timestamp
    decided_by: str | None = Field(description="Who approved, rejected or withdrew it.")
    decided_at: Timestamp | None
    reason: str | None

    @classmethod
    def of(cls, change: Any) -> PolicyChangeView:
        return cls(
            id=change.id,
            tool=change.tool_name,
            status=change.status,
            source=change.source,
            loosens=change.loosens,
            before=change.before,
            after=change.proposed,
            requested_by=change.requested_by.email if change.requested_by else None,
            requested_at=change.requested_at,
            decided_by=change.decided_by.email if change.decided_by else change.decided_by_label,
            decided_at=change.decided_at,
            reason=change.reason,
        )


class PolicyChangeList(BaseModel):
    """Policy changes, newest first (at most 200)."""

    changes: list[PolicyChangeView]


class PolicySaved(BaseModel):
    """The policy in force now (a stricter change, or one that changed nothing)."""

    policy: PolicyView


class PolicyChangeWaiting(BaseModel):
    """The change lets calls wait less: it waits for another admin of the tenant (or, with one admin, the
    desk's operator); until then the policy stays as it was."""

    change: PolicyChangeView


class PolicyChangeDecided(BaseModel):
    """The decided change and the policy in force now."""

    change: PolicyChangeView
    policy: PolicyView | None


# --- routes -------------------------------------------------------------------------------------------

# The policy form's fields, as the API names them (a PolicyError names the form's).
_POLICY_FIELDS = {
    "mode": "mode",
    "amount_threshold": "threshold_cents",
    "approvals_required": "approvals",
    "ttl_hours": "ttl_seconds",
    "remind_after_minutes": "remind_after_seconds",
}


@bp.get("/policies")
@documented("List the tools' policies", responses={200: PolicyList})
@api_roles("admin")
def list_policies():
    """Every tool of the tenant (built-in and MCP) with the policy in force."""
    tools = tenant_tools()
    pending = pending_changes(g.user.tenant_id)
    views = []
    for name in sorted(tools.names()):
        policy = policy_rules.policy_for(db.session, g.user.tenant_id, tools.get(name))
        views.append(PolicyView.of(policy, pending.get(name, [])))
    return answer(PolicyList(policies=views))


@bp.put("/policies/<tool>")
@documented(
    "Set a tool's policy",
    body=SetPolicy,
    responses={200: PolicySaved, 202: PolicyChangeWaiting},
    errors={422: "invalid_policy: a policy the tool cannot have (the message says why, `fields` which field)."},
)
@api_roles("admin")
def set_policy(tool: str):
    """Stricter (or unchanged): in force at once (200). Looser: waits for another admin (202)."""
    sent = body(SetPolicy)
    found = tenant_tools().get(tool)
    if found is None:
        raise Refused(404, "not_found", f"There is no tool named {tool[:128]} in your organisation.")
    values = policy_values(sent)(policy_rules.policy_for(db.session, g.user.tenant_id, found))
    try:
        saved = policy_actions.change_policy(db.session, g.user, found, **values)
    except policy_rules.PolicyError as exc:
        return policy_refused(exc)
    if saved.change is not None:
        return answer(PolicyChangeWaiting(change=PolicyChangeView.of(saved.change)), 202)
    return answer(PolicySaved(policy=PolicyView.of(saved.policy)))


def policy_values(sent: SetPolicy) -> Callable[[policy_rules.Policy], dict]:
    """The policy a request sets, as change_policy's keyword arguments, from the policy in force now
    (what the request leaves out stays as it is)."""
    if sent.mode == "above_amount" and sent.threshold_cents is None:
        raise InvalidFields([FieldProblem(field="threshold_cents", problem="is required with above_amount")], [])

    def values(now: policy_rules.Policy) -> dict:
        limits = sent.limits.model_dump() if sent.limits is not None else None
        asked = {
            "mode": sent.mode,
            "amount_threshold_cents": sent.threshold_cents,
            "approvals_required": sent.approvals or max(now.approvals_required, 1),
            "ttl_seconds": sent.ttl_seconds or now.ttl_seconds,
            "limits": policy_rules.Limits(**limits) if limits is not None else None,
        }
        if "remind_after_seconds" in sent.model_fields_set:
            asked["remind_after_seconds"] = sent.remind_after_seconds
        return asked

    return values


def policy_refused(exc: policy_rules.PolicyError, prefix: str = ""):
    """A 422 naming the request field the policy's problem is in."""
    field = _POLICY_FIELDS.get(exc.field or "") or (
        "limits." + exc.field.removeprefix("limit_") if (exc.field or "").startswith("limit_") else None
    )
    fields = [{"field": prefix + field, "problem": str(exc)}] if field else []
    return refused_with_fields(422, "invalid_policy", str(exc), fields)


def pending_changes(tenant_id: int) -> dict[str, list[int]]:
    """The ids of the tenant's policy changes waiting for a second admin, by tool name."""
    pending: dict[str, list[int]] = {}
    for change in policy_actions.changes(db.session, tenant_id):
        pending.setdefault(change.tool_name, []).append(change.id)
    return pending


@bp.get("/policy-changes")
@documented("List policy changes", query=PolicyChangesQuery, responses={200: PolicyChangeList})
@api_roles("admin")
def list_policy_changes():
    """The tenant's policy changes, newest first; pending ones unless `status` says otherwise."""
    status = query(PolicyChangesQuery).status or "pending"
    rows = policy_actions.changes(db.session, g.user.tenant_id, None if status == "all" else status)
    return answer(PolicyChangeList(changes=[PolicyChangeView.of(change) for change in rows]))


@bp.post("/policy-changes/<int:change_id>")
@documented(
    "Approve or reject a policy change",
    body=DecidePolicyChange,
    responses={200: PolicyChangeDecided},
    errors={
        403: "not_allowed: the admin who asked for the change cannot decide it (four eyes).",
        409: "already_decided, or policy_changed_since: the policy changed after the change was asked.",
        422: "reason_required: a rejection needs a reason; invalid_policy: the change no longer fits the rules.",
    },
)
@api_roles("admin")
def decide_policy_change(change_id: int):
    sent = body(DecidePolicyChange)
    saved = policy_actions.decide(db.session, g.user, change_id, sent.decision, sent.reason)
    policy = PolicyView.of(saved.policy) if saved.policy is not None else None
    return answer(PolicyChangeDecided(change=PolicyChangeView.of(saved.change), policy=policy))
