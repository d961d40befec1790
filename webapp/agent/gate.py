"""The one gate: whether a tool call runs at once or waits, and for how many people; and whether a
change to the rules is looser.

Every door asks here: the assistant's calls (agent/calls.py), outside agents' calls (agent/outside.py),
a reviewer's edit (agent/decisions.py), the calls of a bulk run and of a task (they are the assistant's),
and every path that changes what waits (policies, outside tools' declarations, MCP hints and mappings)
asks `loosenings`. No other module compares an amount with a threshold, a ceiling or a limit
(tests/agent/test_gate.py reads the code to hold that).

Amounts are money: a non-negative whole number of minor units (cents) up to MAX_MONEY_CENTS. A call
whose amount argument holds anything else is refused before it is weighed, with the argument named.

Nothing here loads Flask, RQ or Redis.
"""

from __future__ import annotations

import zlib
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.agent.policies import (
    MODE_WORDS,
    SCOPES,
    Policy,
    dollars,
    policy_for,
    policy_from_settings,
    release_default,
    settings,
)
from webapp.agent.states import CallStatus
from webapp.models import MAX_MONEY_CENTS, Tenant, ToolCall, ToolDefault, utcnow
from webapp.tools.registry import RETRY_HINT, InvalidInput, Tool, ToolContext, ToolRegistry

# What counts as having run (or being about to run) without a person: calls the policy let through,
# not the ones that failed their checks or were stopped.
_RAN = (CallStatus.PENDING, CallStatus.RUNNING, CallStatus.AWAITING_TASK, CallStatus.SUCCEEDED)
# ... and an outside call let through, whatever its agent reports of it afterwards: a report that it
# failed is the agent's word, and would free the limits for its next calls.
_COUNTED = or_(ToolCall.status.in_(_RAN), and_(ToolCall.status == CallStatus.FAILED, ToolCall.source.is_not(None)))
# How strict each rule is, for telling a loosening from a tightening.
_STRICTNESS = {"never": 0, "above_amount": 1, "always": 2}
MONEY_WORDS = f"a whole number of cents from 0 to {MAX_MONEY_CENTS:,} (dollars: at most two decimals)"


class MoneyProblem(ValueError):
    """A call whose amount is not money; `argument` names the argument that holds it (None: unknown)."""

    def __init__(self, message: str, argument: str | None) -> None:
        super().__init__(message)
        self.argument = argument


# --- what a call may be --------------------------------------------------------------------------


def money_problem(tool: Tool | None, raw_input: Any) -> MoneyProblem | None:
    """Why the call's amount is not money (None: it is, or the tool moves none, or it sends none and so
    waits under any amount rule). Arguments its schema refuses are the schema's to say."""
    if tool is None or not tool.moves_money():
        return None
    try:
        parsed = tool.parse(raw_input)
    except InvalidInput:
        return None
    argument = tool.money_argument()
    sent = raw_input.get(argument) if argument and isinstance(raw_input, dict) else None
    amount = tool.amount(parsed)
    if amount is None and sent is None:
        return None
    if isinstance(amount, int) and not isinstance(amount, bool) and 0 <= amount <= MAX_MONEY_CENTS:
        return None
    where = argument or "the amount"
    return MoneyProblem(f"{where}: must be {MONEY_WORDS}; got {str(sent)[:40]!r}", argument)


def check(tools: ToolRegistry, name: str, raw_input: Any) -> str | None:
    """None when a call with these arguments may be weighed; otherwise what is wrong, in the words the
    model is given (an unknown tool, arguments its schema refuses, an amount that is not money)."""
    problem = tools.check(name, raw_input)
    if problem:
        return problem
    money = money_problem(tools.get(name), raw_input)
    return f"Invalid input for {name}: {money}.{RETRY_HINT}" if money else None


# --- a call weighed ------------------------------------------------------------------------------


def waits(policy: Policy, amount: int | None) -> bool:
    """Whether a call that moves `amount` cents (as its tool says; None: it says none) must wait for
    people. Under an amount rule or a ceiling, a call whose amount cannot be told waits."""
    if policy.mode == "always":
        return True
    if amount is not None and not 0 <= amount <= MAX_MONEY_CENTS:
        return True  # never reached through `check`; a call that is not money never runs alone
    if policy.ceiling_cents is not None and (amount is None or amount > policy.ceiling_cents):
        return True
    if policy.mode == "above_amount":
        return amount is None or amount > (policy.amount_threshold_cents or 0)
    return False


def limit_reached(session: Session, policy: Policy, call: ToolCall) -> str | None:
    """Which limit this call, which the rule alone would let run, would pass (in words), or None.
    Counts the tool's earlier calls that ran with no person, the call's own round included, by the
    amount and subject their tool gave them (`money_cents`, `subject`)."""
    limits = policy.limits
    if not limits.any():
        return None
    if session.get_bind().dialect.name == "postgresql":  # one check at a time per tenant and tool
        session.execute(select(func.pg_advisory_xact_lock(zlib.crc32(f"{call.tenant_id}:{call.name}".encode()))))
    session.flush()  # the calls of this round so far, and this one (left out below)
    amount = max(call.money_cents or 0, 0)
    day = utcnow() - timedelta(days=1)
    scopes = {
        "conversation": (ToolCall.conversation_id == call.conversation_id,),
        "subject_day": (ToolCall.subject == call.subject, ToolCall.created_at >= day),
        "tenant_day": (ToolCall.created_at >= day,),
        "person_day": (ToolCall.acting_user_id == call.acting_user_id, ToolCall.created_at >= day),
    }
    for scope, words in SCOPES:
        most_calls, most_cents = getattr(limits, f"{scope}_count"), getattr(limits, f"{scope}_cents")
        if most_calls is None and most_cents is None:
            continue
        if scope == "subject_day" and call.subject is None:  # nothing to count it against: when unsure, it waits
            return "It names nothing it acts on, so the limit per subject cannot be counted for it."
        if scope == "subject_day":  # "for customer 4471 in 24 hours"
            words = f"for {call.subject.replace(':', ' ', 1)} in 24 hours"
        # A total only grows: an amount below zero (stored before amounts were money) adds nothing.
        ran_cents = func.coalesce(func.sum(func.greatest(ToolCall.money_cents, 0)), 0)
        if session.get_bind().dialect.name == "sqlite":
            ran_cents = func.coalesce(func.sum(func.max(ToolCall.money_cents, 0)), 0)
        calls, cents = session.execute(
            select(func.count(ToolCall.id), ran_cents).where(
                ToolCall.tenant_id == call.tenant_id,
                ToolCall.name == call.name,
                ToolCall.id != call.id,
                ToolCall.requires_approval.is_(False),
                _COUNTED,
                *scopes[scope],
            )
        ).one()
        if most_calls is not None and calls + 1 > most_calls:
            ran = f"{calls} {call.name} call{' already ran' if calls == 1 else 's already ran'}"
            return f"{ran} without a person {words}; the limit is {most_calls}."
        if most_cents is not None and cents + amount > most_cents:
            return (
                f"With this one, {dollars(cents + amount)} of {call.name} would run without a person {words}; "
                f"the limit is {dollars(most_cents)}."
            )
    return None


def weigh(session: Session, call: ToolCall, tools: ToolRegistry, context: ToolContext) -> None:
    """Weigh a new call that may run (it passed `check`) against its tool's policy, the operator's
    ceiling and the limits: it keeps the money it moves and what it acts on, and waits for people (with
    the policy it was flagged under, its expiry, reminder and escalation) when they say so; else it
    stays pending."""
    tool = tools.get(call.name)
    policy = policy_for(session, call.tenant_id, tool)
    call.money_cents = tools.amount_of(call.name, call.input)
    call.subject = tools.subject_of(call.name, call.input, context)
    wait = waits(policy, call.money_cents)
    limit = None if wait else limit_reached(session, policy, call)
    if limit or wait:
        call.requires_approval = True
        call.approvals_required = max(policy.approvals_required, 1)
        call.policy = {**policy.snapshot(), "limit": limit, "reading": tool.reading()}
        call.expires_at = policy.expires_at()
        call.remind_at, call.escalate_at = policy.notice_times(call.expires_at)
        call.status = CallStatus.AWAITING_APPROVAL


def threshold_passed(call: ToolCall) -> int | None:
    """The amount rule's threshold a waiting call's amount is above, under the policy it was flagged
    under (None: no amount rule, or not above it), for a page that asks before approving it."""
    policy, amount = call.policy or {}, call.money_cents
    threshold = policy.get("amount_threshold_cents")
    if policy.get("mode") != "above_amount" or not isinstance(amount, int) or not isinstance(threshold, int):
        return None
    return threshold if amount > threshold else None


def edit_widens(tools: ToolRegistry, call: ToolCall, edited: dict, context: ToolContext) -> list[str]:
    """What a reviewer's edit widens of the call as it stands, in sentences for people (empty: it only
    narrows or rewords): a higher amount, or one that can no longer be told; another subject; an
    argument that was not asked. A widened call is a new request: its editor counts as the one who
    asked, so another reviewer's approval is needed."""
    said = []
    was, now = tools.amount_of(call.name, call.input), tools.amount_of(call.name, edited)
    subjects = [tools.subject_of(call.name, arguments, context) for arguments in (call.input, edited)]
    tool = tools.get(call.name)
    read_then = (call.policy or {}).get("reading")
    if (was, subjects[0]) != (call.money_cents, call.subject) or (tool is not None and tool.reading() != read_then):
        # the tool reads its calls otherwise since it was asked: whatever the edit, weigh it as new
        return ["What the desk reads of this call as its amount or subject changed since it was asked."]
    if was is not None and (now is None or now > was):
        said.append(f"The amount goes from {dollars(was)} to {dollars(now) or 'an amount not told'}.")
    elif was is None and now is not None:
        said.append(f"The amount goes from none told to {dollars(now)}.")
    if subjects[0] != subjects[1]:
        said.append(f"What it acts on goes from {subjects[0] or 'nothing named'} to {subjects[1] or 'nothing named'}.")
    added = sorted(set(edited) - set(call.input or {}))
    if added:
        said.append(f"It adds what was not asked: {', '.join(added)}.")
    return said


# --- the rules changed ---------------------------------------------------------------------------


def loosenings(before: Policy, after: Policy) -> list[str]:
    """What in `after` lets some call wait less, or for fewer people, than under `before`, in sentences
    for people (empty: nothing does, so the change may take effect at once). A limit raised or cleared
    counts even where the rule makes every call wait, since a later rule would bring it into force."""
    said = []
    if _STRICTNESS[after.mode] < _STRICTNESS[before.mode]:
        said.append(f"The rule goes from “{MODE_WORDS[before.mode]}” to “{MODE_WORDS[after.mode]}”.")
    elif before.mode == after.mode == "above_amount" and (after.amount_threshold_cents or 0) > (
        before.amount_threshold_cents or 0
    ):
        said.append(
            f"The amount above which calls wait goes from {dollars(before.amount_threshold_cents or 0)} "
            f"to {dollars(after.amount_threshold_cents)}."
        )
    if after.mode != "never" and 0 < after.approvals_required < before.approvals_required:
        said.append(f"Approvals needed go from {before.approvals_required} to {after.approvals_required}.")
    for scope, words in SCOPES:
        for kind in ("count", "cents"):
            was, now = getattr(before.limits, f"{scope}_{kind}"), getattr(after.limits, f"{scope}_{kind}")
            if was is None or (now is not None and now <= was):
                continue
            what = f"The most {'calls' if kind == 'count' else 'money'} without a person {words}"
            shown = (lambda v: f"{v:,}") if kind == "count" else dollars
            said.append(f"{what} goes from {shown(was)} to {shown(now) if now is not None else 'no limit'}.")
    return said


def reads_money(policy: Policy) -> bool:
    """Whether some call runs or waits by the money it moves under `policy` (an amount rule, a money
    limit, the operator's ceiling), so that what is read as its amount may not change under it alone.
    Under a rule that makes every call wait, nothing does now, and the next looser rule waits for a
    second admin."""
    return policy.mode != "always" and (policy.weighs_money() or policy.ceiling_cents is not None)


def reads_subject(policy: Policy) -> bool:
    """Whether some call runs or waits by what it acts on under `policy` (a limit per subject)."""
    return policy.mode != "always" and policy.weighs_subject()


def reading_loosenings(before: dict, after: dict, policy: Policy) -> list[str]:
    """What a change to how a tool's calls are read (which argument is the money and in what unit, which
    names the subject) loosens under `policy`, in sentences (empty: nothing). Any change of what the
    policy reads is looser, since some call would then be weighed on other numbers: when unsure, looser.
    A reading unknown before (a tool that disappears and comes back) is `{}`."""
    said = []
    unknown = not before  # nothing to compare with: whatever it reads now is new
    if reads_money(policy):
        for key, words in (("amount", "the argument read as the amount"), ("amount_unit", "the amount's unit")):
            if unknown or before.get(key) != after.get(key):
                said.append(f"The policy weighs money, and {words} goes from {before.get(key)} to {after.get(key)}.")
    if reads_subject(policy) and (unknown or before.get("subject") != after.get("subject")):
        said.append(
            f"The policy has a limit per subject, and the argument read as the subject goes from "
            f"{before.get('subject')} to {after.get('subject')}."
        )
    return said


# --- a release's defaults ------------------------------------------------------------------------


def pin_defaults(session: Session, tools: ToolRegistry) -> None:
    """Keep in force, for each of the packs' tools, the default recorded before when this release's
    own default is looser (`Tool.default_in_force`); a stricter or equal one is in force at once. Reads
    only (the sweep records, `record_defaults`); a tool never recorded has its own default."""
    kept = {row.tool_name: row for row in session.scalars(select(ToolDefault))}
    for name in tools.names():
        tool, row = tools.get(name), kept.get(name)
        tool.default_in_force = None
        if row is not None:
            recorded = policy_from_settings(name, row.settings)
            if loosenings(recorded, release_default(tool)):
                tool.default_in_force = recorded


def record_defaults(session: Session, tools: ToolRegistry) -> list[str]:
    """Record each pack tool's default in force (new ones as they are; a stricter or equal one of this
    release at once), and hold a looser one, audited once on the desk's own chain; the names of the
    tools whose release default is held. The caller commits."""
    kept = {row.tool_name: row for row in session.scalars(select(ToolDefault))}
    held = []
    for name in tools.names():
        release, row = release_default(tools.get(name)), kept.get(name)
        if row is None:
            session.add(ToolDefault(tool_name=name, settings=settings(release), updated_at=utcnow()))
            continue
        recorded = policy_from_settings(name, row.settings)
        loosens = loosenings(recorded, release)
        if not loosens:
            if row.settings != settings(release) or row.held is not None:
                row.settings, row.held, row.updated_at = settings(release), None, utcnow()
            continue
        held.append(name)
        if row.held != settings(release):
            row.held, row.updated_at = settings(release), utcnow()
            audit_chain.record(
                session,
                "tool_default_held",
                tenant_id=None,
                actor_label="approval desk",
                tool_name=name,
                data={"in_force": row.settings, "release": settings(release), "loosens": loosens},
            )
    session.flush()
    return held


def accept_default(session: Session, tools: ToolRegistry, name: str, by_label: str) -> list[str]:
    """Put a held release default in force (the operator's choice: it loosens); what it loosens, in
    sentences. Every tenant's tools are read again. ValueError says what is wrong."""
    tool = tools.get(name)
    row = session.get(ToolDefault, name) if tool is not None else None
    if row is None or row.held is None:
        raise ValueError(f"{name} has no release default waiting: nothing to accept.")
    release = release_default(tool)
    loosens = loosenings(policy_from_settings(name, row.settings), release)
    before = row.settings
    row.settings, row.held, row.updated_at = settings(release), None, utcnow()
    audit_chain.record(
        session,
        "tool_default_accepted",
        tenant_id=None,
        actor_label=by_label,
        tool_name=name,
        data={"before": before, "after": row.settings, "loosens": loosens},
    )
    session.execute(update(Tenant).values(tools_version=Tenant.tools_version + 1))
    session.flush()
    return loosens
