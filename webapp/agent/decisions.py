"""A person's decision on a sensitive tool call: bound to the call by id and to its exact arguments,
made once (compare-and-set on the call's state), and never by the person whose conversation asked."""

from __future__ import annotations

import hashlib
import json

from sqlalchemy import update
from sqlalchemy.orm import Session

from webapp.agent.moves import wake
from webapp.agent.states import CallStatus
from webapp.models import Conversation, ToolCall, User, utcnow

RESULT_REJECTED = "Declined by a person ({who}): {reason}. Nothing was done. Do not retry this action."


class DecisionError(Exception):
    """A decision that cannot be taken; `code` is stable for the API, `message` is for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def arguments_hash(arguments: dict) -> str:
    """A stable hash of a call's arguments, so a decision is bound to exactly what the person saw."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def decide(
    session: Session,
    call: ToolCall,
    reviewer: User,
    *,
    approve: bool,
    arguments_seen: str,
    reason: str = "",
) -> int | None:
    """Record the decision; returns the conversation version to enqueue (the caller commits first).

    Raises DecisionError: not_allowed (four-eyes, role, tenant), reason_required, already_decided,
    arguments_changed."""
    conversation = session.get(Conversation, call.conversation_id)
    if not reviewer.has_role("reviewer") or reviewer.tenant_id != call.tenant_id:
        raise DecisionError("not_allowed", "Only reviewers of this tenant may decide tool calls.")
    if reviewer.id == conversation.user_id:
        raise DecisionError(
            "not_allowed",
            "You asked for this call in your conversation; another reviewer must decide it (four-eyes rule).",
        )
    reason = (reason or "").strip()
    if not approve and not reason:
        raise DecisionError("reason_required", "Say why you reject this call; the model is told your reason.")
    if arguments_seen != arguments_hash(call.input):
        raise DecisionError("arguments_changed", "The call's arguments changed since you looked; reload it.")
    now = utcnow()
    values = {"decided_by_id": reviewer.id, "decided_at": now, "decision_reason": reason or None}
    if approve:
        values["status"] = CallStatus.APPROVED
    else:
        values.update(
            status=CallStatus.REJECTED,
            result=RESULT_REJECTED.format(who=who(reviewer), reason=reason),
            is_error=True,
            finished_at=now,
        )
    won = session.execute(
        update(ToolCall)
        .where(ToolCall.id == call.id, ToolCall.status == CallStatus.AWAITING_APPROVAL)
        .values(**values)
        .execution_options(synchronize_session=False)
    ).rowcount
    session.refresh(call)
    if not won:
        raise already_decided(call)
    return wake(session, conversation)


def already_decided(call: ToolCall) -> DecisionError:
    if call.decided_by is not None:
        when = call.decided_at.strftime("%Y-%m-%d %H:%M:%S UTC")
        return DecisionError("already_decided", f"Already decided by {who(call.decided_by)} at {when}.")
    return DecisionError("already_decided", f"This call no longer waits for a decision (it is {call.status}).")


def who(user: User) -> str:
    return f"{user.display_name} ({user.email})" if user.display_name else user.email
