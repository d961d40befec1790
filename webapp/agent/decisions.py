"""People's decisions on tool calls that wait for them.

A decision names the call by id and carries the hash of the exact arguments the person saw; it is
refused if they changed since. It is never taken by the person whose conversation asked (four-eyes),
each person decides a call once, and a policy can require N distinct approvals. The call's state
changes by compare-and-set, so a double click, a second reviewer or a stale tab gets
"already decided by X at T". Expired calls settle with a truthful result.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.agent import gate, wording
from webapp.agent.moves import lock_conversation, wake
from webapp.agent.states import CallStatus
from webapp.models import Conversation, Decision, ToolCall, User, utcnow
from webapp.refusals import at_moment
from webapp.tools.registry import ToolContext, ToolRegistry


class DecisionError(Exception):
    """A decision that cannot be taken; `code` is stable for the API, `message` is for people. A
    `words` with "{at}" names the moment `at` (shown in the viewer's own time on pages)."""

    def __init__(self, code: str, words: str, at: datetime | None = None) -> None:
        self.code, self.words, self.at = code, words, at
        self.message = at_moment(words, at)
        super().__init__(self.message)


def arguments_hash(arguments: dict) -> str:
    """A stable hash of a call's arguments, so a decision is bound to exactly what the person saw."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def who(user: User) -> str:
    return wording.person(user.display_name, user.email)


def approvals_so_far(session: Session, call: ToolCall) -> list[Decision]:
    """The approvals that count: those given to the call's current arguments, by anyone but the
    reviewer whose edit widened it (they count as the one who asked)."""
    return list(
        session.scalars(
            select(Decision)
            .where(
                Decision.tool_call_id == call.id,
                Decision.decision == "approve",
                Decision.arguments_hash == arguments_hash(call.input),
                Decision.reviewer_id != (call.widened_by_id or 0),
            )
            .order_by(Decision.id)
        )
    )


def held_words(tool_name: str) -> str:
    """What a reviewer is told of a waiting call whose tool is held (its MCP server changed it)."""
    return (
        f"held: its definition changed after this call was made. {tool_name} cannot be approved until an admin "
        "accepts the change on the MCP servers page; you can still reject it."
    )


def decide(
    session: Session,
    call: ToolCall,
    reviewer: User,
    *,
    approve: bool,
    arguments_seen: str,
    reason: str = "",
    edited_input: dict | None = None,
    tools: ToolRegistry | None = None,
) -> int | None:
    """Record one person's decision; returns the conversation version to enqueue when the call is
    settled (approved by enough people, or rejected), else None. The caller commits, then enqueues.

    Raises DecisionError: not_allowed, reason_required, invalid_input, already_decided, expired,
    arguments_changed, held (an approval while the call's tool is held)."""
    conversation = session.get(Conversation, call.conversation_id)
    if not reviewer.has_role("reviewer") or reviewer.tenant_id != call.tenant_id:
        raise DecisionError("not_allowed", "Only reviewers of this tenant may decide tool calls.")
    if reviewer.id == conversation.user_id:
        raise DecisionError(
            "not_allowed", "This call comes from your own conversation; another reviewer must decide it (four-eyes)."
        )
    reason = (reason or "").strip()
    if not approve and not reason:
        raise DecisionError("reason_required", "Say why you reject this call; the model is told your reason.")
    # Decisions take turns with each other and with the move that parks the conversation (row locks
    # on PostgreSQL, conversation first; SQLite's BEGIN IMMEDIATE already serializes writers). Two
    # people approving at once must not each count only their own approval; and a decision must not
    # commit between a parking move's check for decided calls and its commit, where neither the move
    # (it saw the call waiting) nor the decision (it saw the conversation running) would wake it.
    lock_conversation(session, conversation)
    session.execute(select(ToolCall.id).where(ToolCall.id == call.id).with_for_update())
    session.refresh(call)
    if call.status != CallStatus.AWAITING_APPROVAL:
        raise already_decided(session, call)
    if call.expires_at is not None and call.expires_at <= utcnow():  # the sweeper has not come by yet
        raise DecisionError(
            "expired",
            "The time to decide this call ran out at {at}; it has expired, nothing was done, "
            "and the assistant is told so.",
            at=call.expires_at,
        )
    if arguments_seen != arguments_hash(call.input):
        raise DecisionError("arguments_changed", "The call's arguments changed since you looked; reload it.")
    if approve and tools is not None and (tool := tools.get(call.name)) is not None and tool.unavailable():
        raise DecisionError("held", held_words(call.name))
    if edited_input is not None:
        if not approve:
            raise DecisionError("invalid_input", "Edited arguments go with an approval, not a rejection.")
        problem = gate.check(tools, call.name, edited_input) if tools else "no tool registry to check the edit"
        if problem:
            raise DecisionError("invalid_input", problem)
        if edited_input == call.input:
            edited_input = None
    widened = None
    if edited_input is not None:
        context = ToolContext(session, call.acting_user_id, call.tenant_id, call.id, f"toolcall-{call.id}")
        widened = gate.edit_widens(tools, call, edited_input, context) or None
    mine = session.scalar(select(Decision).where(Decision.tool_call_id == call.id, Decision.reviewer_id == reviewer.id))
    if mine is not None:
        raise DecisionError(
            "already_decided",
            f"You already {mine.decision}d this call at {{at}}; it needs another reviewer.",
            at=mine.created_at,
        )
    now = utcnow()
    try:
        with session.begin_nested():
            session.add(
                Decision(
                    tool_call_id=call.id,
                    tenant_id=call.tenant_id,
                    reviewer_id=reviewer.id,
                    decision="approve" if approve else "reject",
                    reason=reason or None,
                    arguments_hash=arguments_hash(edited_input if edited_input is not None else call.input),
                    edited_input=edited_input,
                    policy_version=(call.policy or {}).get("version"),
                    created_at=now,
                )
            )
    except IntegrityError:  # the same person decided in another tab a moment ago
        session.refresh(call)
        raise already_decided(session, call) from None

    if not approve:
        result = wording.RESULT_REJECTED.format(who=who(reviewer), reason=reason)
        finished = {"result": result, "is_error": True, "finished_at": now}
        settled = _settle(session, call, reviewer, now, CallStatus.REJECTED, reason, **finished)
    else:
        if edited_input is not None:
            _compare_and_set(
                session,
                call,
                input=edited_input,
                original_input=call.original_input or call.input,
                money_cents=tools.amount_of(call.name, edited_input),  # the inbox shows what it moves now
                subject=tools.subject_of(call.name, edited_input, context),  # ... and what it acts on
                status=CallStatus.AWAITING_APPROVAL,
                **({"widened_by_id": reviewer.id} if widened else {}),
            )
        needed = max(call.approvals_required, 1)
        if len(approvals_so_far(session, call)) < needed:
            return None  # waits for more people
        settled = _settle(session, call, reviewer, now, CallStatus.APPROVED, reason or None)
    if not settled:
        raise already_decided(session, call)
    return wake(session, conversation)


def _settle(
    session: Session, call: ToolCall, reviewer: User, now: datetime, status: str, reason: str | None, **values
) -> bool:
    """Mark the waiting call decided by the reviewer (with any other values); False if it was decided
    meanwhile."""
    return _compare_and_set(
        session, call, status, decided_by_id=reviewer.id, decided_at=now, decision_reason=reason, **values
    )


def _compare_and_set(session: Session, call: ToolCall, status: str, **values) -> bool:
    """Change the call only if it still waits (and still has the arguments we looked at)."""
    done = session.execute(
        update(ToolCall)
        .where(ToolCall.id == call.id, ToolCall.status == CallStatus.AWAITING_APPROVAL)
        .values(status=status, **values)
        .execution_options(synchronize_session=False)
    ).rowcount
    session.refresh(call)
    return bool(done)


def already_decided(session: Session, call: ToolCall) -> DecisionError:
    if call.decided_by is not None:
        return DecisionError(
            "already_decided",
            f"Already decided by {who(call.decided_by)} at {{at}} ({call.status}).",
            at=call.decided_at,
        )
    return DecisionError("already_decided", f"This call no longer waits for a decision (it is {call.status}).")


def expire_due(session: Session, limit: int = 500) -> list[tuple[int, int, int]]:
    """Settle calls whose time to decide ran out; returns (conversation id, version, tenant id) to
    enqueue after commit."""
    now = utcnow()
    due = list(
        session.scalars(
            select(ToolCall)
            .where(ToolCall.status == CallStatus.AWAITING_APPROVAL, ToolCall.expires_at < now)
            .order_by(ToolCall.expires_at)
            .limit(limit)
        )
    )
    wakeups = []
    for call in due:
        version = expire(session, call, now)
        if version is not None:
            wakeups.append((call.conversation_id, version, call.tenant_id))
    return wakeups


def expire(session: Session, call: ToolCall, now: datetime) -> int | None:
    """Settle one waiting call whose time to decide ran out (audited); returns the conversation
    version to enqueue after commit, None when there is nothing to wake (or it no longer waited)."""
    hours = (call.policy or {}).get("ttl_seconds", 0) / 3600
    if not _compare_and_set(
        session,
        call,
        status=CallStatus.EXPIRED,
        finished_at=now,
        is_error=True,
        result=wording.RESULT_EXPIRED.format(hours=hours),
    ):
        return None
    audit_chain.record(
        session,
        "approval_expired",
        tenant_id=call.tenant_id,
        actor_label="approval desk",
        conversation_id=call.conversation_id,
        tool_call_id=call.id,
        tool_name=call.name,
        outcome="expired",
        data={"input": call.input, "expired_at": now.isoformat(), **source_of(call)},
    )
    return wake(session, session.get(Conversation, call.conversation_id))


def source_of(call: ToolCall) -> dict:
    """What an audit event of the call says of the outside agent that asked for it (nothing for the
    desk's own assistant's calls)."""
    return {"source": call.source} if call.source is not None else {}
