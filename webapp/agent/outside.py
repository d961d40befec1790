"""Calls that agents running elsewhere ask about: the same gate as the assistant's own calls.

An outside agent (a person with the agent role, through an API token) asks before it runs a tool an
admin declared (webapp/tools/external.py). The call becomes a tool call like any other, in a
conversation of its own that names the agent (`source`) and has no model and no moves: the policy,
the ceiling and the limits weigh it as they weigh the assistant's calls, so it is approved at once or
waits in the inbox, where it is claimed, edited, decided by as many people as its policy asks (never by
the person whose token asked), reminded, escalated and expired like the rest, every step in the audit
chain. Once settled, its conversation is done (webapp/agent/moves.py `wake`); the agent reads the
decision (GET /api/calls/<id>, or the approval.decided event), runs the call itself with the
arguments it was given, and reports what happened.

Nothing here loads Flask, RQ or Redis.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.agent import gate
from webapp.agent.states import CallStatus, ConversationStatus
from webapp.models import Conversation, ExternalCall, Message, ToolCall, User, utcnow
from webapp.tools.registry import InvalidInput, ToolContext, ToolRegistry

# What an outside call's status is, as its agent reads it: the decision, not the run.
STATUS = {
    CallStatus.AWAITING_APPROVAL: "waiting",
    CallStatus.PENDING: "approved",  # let through by its policy, no person needed
    CallStatus.APPROVED: "approved",
    CallStatus.SUCCEEDED: "approved",  # ... and the agent reported it ran
    CallStatus.FAILED: "approved",
    CallStatus.REJECTED: "rejected",
    CallStatus.EXPIRED: "expired",
    CallStatus.CANCELLED: "cancelled",
}
MAY_RUN = (CallStatus.PENDING, CallStatus.APPROVED)
MAX_OUTPUT_CHARS = 64_000  # of a reported output, as JSON


class OutsideError(Exception):
    """An outside call that cannot be taken; `code` is stable for the API, `message` is for people,
    `field` the request field to change (when one is to blame)."""

    def __init__(self, code: str, message: str, field: str | None = None, problems: dict | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.field = code, message, field
        self.problems = problems or {}


def request_hash(source: str, tool: str, arguments: dict, context: str, facts: list[dict]) -> str:
    """What a request asked, hashed: the same idempotency key with another request is refused."""
    canonical = json.dumps([source, tool, arguments, context, facts], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def ask(
    session: Session,
    asker: User,
    tools: ToolRegistry,
    *,
    source: str,
    tool: str,
    arguments: dict,
    context: str,
    facts: list[dict],
    idempotency_key: str,
) -> tuple[ToolCall, bool]:
    """The call this request names: the one made before under the same idempotency key (False), or a
    new one, weighed by its policy and audited (True). The caller commits. OutsideError:
    idempotency_conflict, unknown_tool, invalid_input."""
    asked = request_hash(source, tool, arguments, context, facts)
    before = _by_key(session, asker, idempotency_key)
    if before is not None:
        return _same_request(session, before, asked), False
    declared = tools.get(tool)
    if declared is None or declared.runs_here:
        names = sorted(name for name in tools.names() if not tools.get(name).runs_here)
        known = ", ".join(names) if names else "none yet: an admin declares them with PUT /api/external-tools/<name>"
        raise OutsideError(
            "unknown_tool", f"No tool named {tool[:128]} is declared for outside agents. Declared: {known}.", "tool"
        )
    try:
        declared.parse(arguments)
    except InvalidInput as exc:
        problems = {concern.field: concern.message for concern in exc.concerns}
        raise OutsideError(
            "invalid_input", f"The input does not fit {tool}'s schema: {exc.summary}.", "input", problems
        ) from None
    if money := gate.money_problem(declared, arguments):
        raise OutsideError(
            "invalid_input", f"The input's amount is not money: {money}.", "input", {money.argument: str(money)}
        )
    now = utcnow()
    try:
        with session.begin_nested():  # a request with the same key a moment ago wins; this one returns it
            call = _new_call(session, asker, tools, source, tool, arguments, now)
            session.add(
                ExternalCall(
                    tool_call_id=call.id,
                    tenant_id=asker.tenant_id,
                    asked_by_id=asker.id,
                    source=source,
                    context=context,
                    facts=facts,
                    idempotency_key=idempotency_key,
                    request_hash=asked,
                    created_at=now,
                )
            )
            session.flush()
    except IntegrityError:
        before = _by_key(session, asker, idempotency_key)
        if before is None:
            raise
        return _same_request(session, before, asked), False
    _audit(session, call, asker, "tool_call_requested", {"input": arguments, "context": context, "facts": facts})
    if call.status == CallStatus.AWAITING_APPROVAL:
        _audit(session, call, asker, "approval_requested", {"input": arguments})
    return call, True


def _new_call(
    session: Session, asker: User, tools: ToolRegistry, source: str, tool: str, arguments: dict, now
) -> ToolCall:
    conversation = Conversation(
        tenant_id=asker.tenant_id,
        user_id=asker.id,
        title=f"{source}: {tool}"[:200],
        status=ConversationStatus.COMPLETED,
        source=source,
        move_budget=0,
        created_at=now,
        updated_at=now,
    )
    session.add(conversation)
    session.flush()
    tool_use_id = f"ext_{secrets.token_hex(12)}"
    message = Message(
        conversation_id=conversation.id,
        seq=1,
        role="assistant",
        content=[{"type": "tool_use", "id": tool_use_id, "name": tool, "input": arguments}],
        created_at=now,
    )
    session.add(message)
    session.flush()
    call = ToolCall(
        conversation_id=conversation.id,
        tenant_id=asker.tenant_id,
        message_id=message.id,
        position=0,
        tool_use_id=tool_use_id,
        name=tool,
        input=arguments,
        acting_user_id=asker.id,
        status=CallStatus.PENDING,
        source=source,
        created_at=now,
    )
    session.add(call)
    session.flush()
    gate.weigh(session, call, tools, ToolContext(session, asker.id, asker.tenant_id, call.id, f"toolcall-{call.id}"))
    if call.status == CallStatus.AWAITING_APPROVAL:
        conversation.status = ConversationStatus.AWAITING_APPROVAL
    session.flush()
    return call


def _by_key(session: Session, asker: User, key: str) -> ExternalCall | None:
    """The call this person asked for under the key before: keys are each asker's own, so the same key
    from another agent of the tenant is a new call and tells nothing of theirs."""
    return session.scalar(
        select(ExternalCall).where(
            ExternalCall.tenant_id == asker.tenant_id,
            ExternalCall.asked_by_id == asker.id,
            ExternalCall.idempotency_key == key,
        )
    )


def _same_request(session: Session, before: ExternalCall, asked: str) -> ToolCall:
    if before.request_hash != asked:
        raise OutsideError(
            "idempotency_conflict",
            f"This idempotency key was used for another request (call {before.tool_call_id}); send that request "
            "again unchanged to read its call, or use a new key for a new call.",
            "idempotency_key",
        )
    return session.get(ToolCall, before.tool_call_id)


def details(session: Session, call: ToolCall) -> ExternalCall | None:
    """What the agent sent with the call (None: the call is the desk's assistant's)."""
    return session.get(ExternalCall, call.id) if call.source is not None else None


def report(session: Session, reporter: User, call: ToolCall, *, ok: bool, summary: str, output: Any) -> bool:
    """Keep what the agent says happened when it ran the call (the call succeeded or failed); False
    when the same report was kept before. The caller commits. OutsideError: not_yours, not_approved,
    already_reported, too_large."""
    asked = details(session, call)
    if asked is None or call.acting_user_id != reporter.id:
        raise OutsideError("not_yours", "Only the agent whose token asked for this call reports what it did.")
    if asked.outcome_ok is not None:
        if (asked.outcome_ok, asked.outcome_summary, asked.outcome_output) == (ok, summary, output):
            return False
        raise OutsideError(
            "already_reported", f"What this call did was reported at {asked.outcome_at:%Y-%m-%d %H:%M:%S} UTC."
        )
    if call.status not in MAY_RUN:
        raise OutsideError(
            "not_approved",
            f"This call is {STATUS.get(call.status, call.status)}: it may not run, so nothing is reported.",
        )
    if output is not None and len(json.dumps(output, ensure_ascii=False)) > MAX_OUTPUT_CHARS:
        raise OutsideError("too_large", f"output is at most {MAX_OUTPUT_CHARS:,} characters as JSON.", "output")
    now = utcnow()
    status = CallStatus.SUCCEEDED if ok else CallStatus.FAILED
    done = session.execute(
        update(ToolCall)
        .where(ToolCall.id == call.id, ToolCall.status.in_(MAY_RUN))
        .values(status=status, result=summary, is_error=not ok, started_at=now, finished_at=now, attempts=1)
        .execution_options(synchronize_session=False)
    ).rowcount
    session.refresh(call)
    if not done:
        raise OutsideError("not_approved", f"This call is {STATUS.get(call.status, call.status)}; nothing is reported.")
    asked.outcome_ok, asked.outcome_summary, asked.outcome_output, asked.outcome_at = ok, summary, output, now
    _audit(session, call, reporter, "call_outcome_reported", {"input": call.input, "ok": ok, "summary": summary})
    return True


def cancel(session: Session, call: ToolCall, actor: User, reason: str) -> bool:
    """Settle a waiting outside call as cancelled, for `reason` (its agent gave up, its person was
    disabled); False when it no longer waited. Audited; the caller commits."""
    now = utcnow()
    done = session.execute(
        update(ToolCall)
        .where(ToolCall.id == call.id, ToolCall.status == CallStatus.AWAITING_APPROVAL)
        .values(status=CallStatus.CANCELLED, result=reason, is_error=True, finished_at=now)
        .execution_options(synchronize_session=False)
    ).rowcount
    session.refresh(call)
    if not done:
        return False
    session.execute(
        update(Conversation)
        .where(Conversation.id == call.conversation_id)
        .values(status=ConversationStatus.CANCELLED, cancel_reason=reason[:200], version=Conversation.version + 1)
        .execution_options(synchronize_session=False)
    )
    _audit(session, call, actor, "call_cancelled", {"input": call.input, "reason": reason})
    return True


def _audit(session: Session, call: ToolCall, actor: User, action: str, data: dict) -> None:
    audit_chain.record(
        session,
        action,
        tenant_id=call.tenant_id,
        actor=actor,
        conversation_id=call.conversation_id,
        tool_call_id=call.id,
        tool_name=call.name,
        outcome=call.status,
        data={**data, "source": call.source},
    )
