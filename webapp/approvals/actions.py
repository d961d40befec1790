"""What reviewers do to tool calls waiting for a person, shared by the inbox pages and the API (the
inbox's queries are approvals/queries.py)."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from webapp.agent import decisions
from webapp.agent.states import CallStatus
from webapp.conversations import actions as conversations
from webapp.models import Conversation, ToolCall, User, utcnow
from webapp.refusals import Refusal
from webapp.runtime.services import services
from webapp.tools.registry import Review, ToolContext


class ApprovalRefused(Refusal):
    """What the approvals refuse: a decision, a claim, an edit or a call that cannot be taken or shown."""


MAX_REASON_CHARS = 2_000
DECISION_KIND = {"not_allowed": "forbidden", "reason_required": "invalid", "invalid_input": "invalid"}


class EditRefused(ApprovalRefused):
    """Edited arguments the tool would refuse; `problems` says what is wrong, by argument (None: the
    arguments as a whole)."""

    def __init__(self, problems: dict[str | None, str]) -> None:
        super().__init__("invalid", "invalid_input", " ".join(problems.values()) + " Nothing was approved.")
        self.problems = problems


def find_call(session: Session, user: User, tool_call_id: int) -> ToolCall:
    call = session.scalar(select(ToolCall).where(ToolCall.id == tool_call_id, ToolCall.tenant_id == user.tenant_id))
    if call is None:
        raise ApprovalRefused("missing", "not_found", f"No tool call {tool_call_id} in your account.")
    return call


def _context(session: Session, call: ToolCall) -> ToolContext:
    """The call's tool context for reading: as the person the call acts for, in their tenant."""
    return ToolContext(session, call.acting_user_id, call.tenant_id, call.id, f"toolcall-{call.id}")


def review(session: Session, call: ToolCall) -> Review:
    """What the call's tool says about it now, for its reviewer: the records it would change, and why
    it would fail as asked."""
    return services().tools_for(session, call.tenant_id).review(call.name, call.input, _context(session, call))


def edit_problems(session: Session, call: ToolCall, edited: dict) -> dict[str | None, str]:
    """Why the tool would refuse these edited arguments (its schema, then its own checks), by
    argument; empty when it would run them."""
    concerns = services().tools_for(session, call.tenant_id).review(call.name, edited, _context(session, call)).concerns
    return {concern.field: concern.message for concern in concerns}


def holder(call: ToolCall, now: datetime | None = None) -> User | None:
    """Who is reviewing the call now (their claim has not run out), if anyone."""
    if call.claimed_by_id is None or call.claimed_until is None or call.claimed_until <= (now or utcnow()):
        return None
    return call.claimed_by


def claim(session: Session, reviewer: User, tool_call_id: int, take_over: bool = False) -> ToolCall:
    """Hold a waiting call for CLAIM_MINUTES, so other reviewers see who is on it; again by its
    holder, the time starts over. Someone else's claim is refused in words unless `take_over`.
    Commits, and tells the pages showing the tenant's approvals."""
    call = find_call(session, reviewer, tool_call_id)
    if call.status != CallStatus.AWAITING_APPROVAL:
        raise ApprovalRefused(
            "conflict", "not_waiting", f"This call no longer waits for a decision (it is {call.status})."
        )
    if session.get(Conversation, call.conversation_id).user_id == reviewer.id:
        raise ApprovalRefused(
            "forbidden", "not_allowed", "This call comes from your own conversation; another reviewer must take it."
        )
    now = utcnow()
    free = or_(ToolCall.claimed_until.is_(None), ToolCall.claimed_until <= now, ToolCall.claimed_by_id == reviewer.id)
    taken = session.execute(
        update(ToolCall)
        .where(ToolCall.id == call.id, ToolCall.status == CallStatus.AWAITING_APPROVAL, *(() if take_over else (free,)))
        .values(claimed_by_id=reviewer.id, claimed_until=now + timedelta(minutes=services().config.claim_minutes))
        .execution_options(synchronize_session=False)
    ).rowcount
    session.refresh(call)
    if not taken:
        session.rollback()
        raise (
            _held_by_another(call)
            if holder(call)
            else ApprovalRefused("conflict", "not_waiting", "This call no longer waits.")
        )
    session.commit()
    services().live_events.changed(call.tenant_id)
    return call


def release(session: Session, reviewer: User, tool_call_id: int) -> ToolCall:
    """Give up one's claim on a call (nothing to do when there is none); someone else's is refused."""
    call = find_call(session, reviewer, tool_call_id)
    held = holder(call)
    if held is not None and held.id != reviewer.id:
        raise _held_by_another(call)
    if call.claimed_by_id == reviewer.id:
        call.claimed_by_id = call.claimed_until = None
        session.commit()
        services().live_events.changed(call.tenant_id)
    return call


def _held_by_another(call: ToolCall) -> ApprovalRefused:
    return ApprovalRefused(
        "conflict",
        "claimed",
        f"Being reviewed by {decisions.who(call.claimed_by)} until {{at}}; take it over to review it yourself.",
        at=call.claimed_until,
    )


def _expire(session: Session, call: ToolCall) -> None:
    version = decisions.expire(session, call, utcnow())
    session.commit()
    if version is not None:
        conversations.enqueue_after_commit(call.conversation_id, version)
    services().live_events.changed(call.tenant_id, call.conversation_id)


def decide(
    session: Session,
    reviewer: User,
    tool_call_id: int,
    decision: object,
    reason: object = "",
    arguments_seen: object = None,
    edited_input: object = None,
) -> ToolCall:
    """Approve or reject the call once; commits, then wakes its conversation. Bad input is refused
    before anything is looked up."""
    if decision not in ("approve", "reject"):
        raise ApprovalRefused("invalid", "invalid_field", 'The decision must be "approve" or "reject".')
    if reason is None:
        reason = ""
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        raise ApprovalRefused(
            "invalid", "invalid_field", f"The reason must be text of at most {MAX_REASON_CHARS} characters."
        )
    if edited_input is not None and not isinstance(edited_input, dict):
        raise ApprovalRefused("invalid", "invalid_input", "Edited arguments must be a JSON object.")
    if arguments_seen is not None and not isinstance(arguments_seen, str):
        raise ApprovalRefused("invalid", "invalid_field", "arguments_hash must be the hash string shown with the call.")
    call = find_call(session, reviewer, tool_call_id)
    editable = call.status == CallStatus.AWAITING_APPROVAL and decision == "approve"
    own = session.get(Conversation, call.conversation_id).user_id == reviewer.id  # refused below: four-eyes
    if edited_input is not None and editable and not own:
        problems = edit_problems(session, call, edited_input)
        if problems:
            raise EditRefused(problems)
    if not arguments_seen and call.original_input is not None and decision == "approve":
        # an approval that names no arguments approves only the ones the call was asked with
        raise ApprovalRefused(
            "conflict",
            "arguments_changed",
            "A reviewer edited this call's arguments since it was asked: send the arguments_hash of the "
            "arguments you approve (read the call again to see them).",
        )
    seen = arguments_seen or decisions.arguments_hash(call.input)
    asked = call.input
    try:
        version = decisions.decide(
            session,
            call,
            reviewer,
            approve=decision == "approve",
            arguments_seen=seen,
            reason=reason,
            edited_input=edited_input,
            tools=services().tools_for(session, call.tenant_id),
        )
    except decisions.DecisionError as exc:
        session.rollback()
        if exc.code == "expired":  # settle it now rather than leave it to the sweeper
            _expire(session, call)
        raise ApprovalRefused(DECISION_KIND.get(exc.code, "conflict"), exc.code, exc.words, at=exc.at) from None
    if call.claimed_by_id == reviewer.id:  # decided: the claim has done its work
        call.claimed_by_id = call.claimed_until = None
    conversations.commit_change(
        session,
        "approval_decided",
        reviewer,
        session.get(Conversation, call.conversation_id),  # locked by the decision already
        version,
        tool_call_id=call.id,
        tool_name=call.name,
        outcome=call.status,
        data={
            "decision": decision,
            "reason": reason,
            "input": asked,
            "edited_to": call.input if call.input != asked else None,
            "policy_version": (call.policy or {}).get("version"),
            "approvals": len(decisions.approvals_so_far(session, call)),
            "approvals_required": call.approvals_required,
            "widened_by": call.widened_by_id,  # an edit that widened the call: its editor's approval counts not
            **decisions.source_of(call),
        },
    )
    return call
