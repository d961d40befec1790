"""What people do to conversations, shared by the pages and the API: each action checks who may
do it, changes state through the loop's domain, audits, commits, and only then enqueues."""

from __future__ import annotations

from datetime import datetime

from blinker import Namespace
from sqlalchemy import select
from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.agent import moves, outside
from webapp.agent.loop import ConversationBusy
from webapp.agent.states import IDLE, ConversationStatus
from webapp.models import Conversation, ToolCall, User
from webapp.refusals import Refusal
from webapp.runtime.queue import QueueUnavailable
from webapp.runtime.services import services
from webapp.tools.tasks import MAX_INPUT_CHARS
from webapp.web.pagination import Page, keyset_page


class ConversationRefused(Refusal):
    """What the conversations refuse: a message, a stop, a retry, a budget or an input that cannot be taken."""


MAX_MESSAGE_CHARS = 20_000
SUPERVISING = ("reviewer", "auditor", "admin")  # see every conversation of their tenant
# a conversation's status in words for people (the list, the chat page, the home page)
STATUS_LABELS = {
    "queued": "working",
    "running": "working",
    "awaiting_approval": "waiting for approval",
    "awaiting_task": "waiting on a task",
    "awaiting_batch": "waiting for its batch",
    "completed": "completed",
    "cancelled": "stopped",
    "failed": "failed",
    "budget_exhausted": "budget exhausted",
}


def visible_to(user: User):
    """A filter for the conversations this person may see: their tenant's, and only their own for agents;
    never an outside agent's call (webapp/agent/outside.py), which is no chat with the assistant."""
    condition = (Conversation.tenant_id == user.tenant_id) & Conversation.source.is_(None)
    if not any(user.has_role(role) for role in SUPERVISING):
        condition = condition & (Conversation.user_id == user.id)
    return condition


def listing(
    session: Session,
    user: User,
    *,
    status: str | None = None,
    started_by: str | None = None,
    since: datetime | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> Page:
    """A page of the conversations this person may see, newest first, filtered by status, the email of
    who started them and the moment they started; its rows are (conversation, that email). Raises
    BadCursor for a cursor that is not a next_cursor of ours."""
    statement = select(Conversation, User.email).join(User, User.id == Conversation.user_id).where(visible_to(user))
    if status is not None:
        statement = statement.where(Conversation.status == status)
    if started_by is not None:
        statement = statement.where(User.email == started_by.strip().lower())  # stored lowercased
    if since is not None:
        statement = statement.where(Conversation.created_at >= since)
    return keyset_page(
        session, statement, [Conversation.id], cursor, limit, key_values=lambda row: (row[0].id,), scalars=False
    )


def find(session: Session, user: User, conversation_id: int) -> Conversation:
    """The conversation if this person may see it; another tenant's id is simply not found."""
    conversation = session.scalar(
        select(Conversation).where(Conversation.id == conversation_id, Conversation.tenant_id == user.tenant_id)
    )
    if conversation is None:
        raise ConversationRefused("missing", "not_found", f"No conversation {conversation_id} in your account.")
    if conversation.source is not None:
        raise ConversationRefused(
            "missing",
            "not_found",
            f"{conversation_id} holds a call of the outside agent {conversation.source}, not a conversation with the "
            "assistant: reviewers find it in the approval inbox, programs at /api/calls/<id>.",
        )
    if conversation.user_id != user.id and not any(user.has_role(role) for role in SUPERVISING):
        raise ConversationRefused("forbidden", "forbidden", "This conversation belongs to another agent.")
    return conversation


def check_message(text: object) -> str:
    if not isinstance(text, str) or not text.strip():
        raise ConversationRefused("invalid", "invalid_field", "Write a message first.")
    if len(text) > MAX_MESSAGE_CHARS:
        raise ConversationRefused("invalid", "invalid_field", f"A message is at most {MAX_MESSAGE_CHARS:,} characters.")
    return text


def start(session: Session, user: User, text: object) -> Conversation:
    """A new conversation with its first question, queued for the assistant."""
    text = check_message(text)
    config = services().config
    conversation = Conversation(
        tenant_id=user.tenant_id,
        user_id=user.id,
        status="queued",
        move_budget=config.move_budget,
        token_budget=config.token_budget,
    )
    session.add(conversation)
    session.flush()
    services().loop(session, conversation).ask_later(text)
    version = moves.start_run(session, conversation)
    commit_change(
        session,
        "conversation_started",
        user,
        conversation,
        version,
        data={"message": text},
    )
    return conversation


def post_message(session: Session, user: User, conversation: Conversation, text: object) -> None:
    """A follow-up question; refused while the assistant works or a call waits."""
    text = check_message(text)
    if conversation.user_id != user.id:
        raise ConversationRefused(
            "forbidden", "forbidden", "Only the agent who started this conversation may write in it."
        )
    try:
        services().loop(session, conversation).ask_later(text)
    except ConversationBusy as exc:
        raise ConversationRefused("conflict", "conversation_busy", str(exc)) from None
    version = moves.start_run(session, conversation)
    commit_change(
        session,
        "message_sent",
        user,
        conversation,
        version,
        data={"message": text},
    )


def cancel(session: Session, user: User, conversation: Conversation) -> None:
    """Ask the conversation to stop; it settles its open calls with results."""
    _may_steer(user, conversation)
    try:
        version = moves.request_cancel(session, conversation, user.id)
    except ValueError:
        raise ConversationRefused(
            "conflict", "not_running", f"The conversation is {conversation.status}; nothing to stop."
        ) from None
    commit_change(
        session,
        "cancel_requested",
        user,
        conversation,
        version,
        data={"status": conversation.status},
    )


def stop_all_of(session: Session, actor: User, owner: User, reason: str) -> list[tuple[Conversation, int | None]]:
    """Ask every conversation of `owner` that is moving or waiting to stop, `reason` said to people
    and to the model (their waiting calls settle as cancelled). Audited per conversation; the caller
    commits, then hands the returned list to after_commit()."""
    stopping = session.scalars(
        select(Conversation)
        .where(
            Conversation.user_id == owner.id,
            Conversation.status.not_in(list(IDLE - {ConversationStatus.BUDGET_EXHAUSTED})),
            Conversation.cancel_requested_at.is_(None),
        )
        .order_by(Conversation.id)
    ).all()
    stopped = []
    for conversation in stopping:
        if conversation.source is not None:  # an outside agent's call: no move to stop, the call settles here
            for call in session.scalars(select(ToolCall).where(ToolCall.conversation_id == conversation.id)):
                outside.cancel(session, call, actor, reason)
            stopped.append((conversation, None))
            continue
        status = conversation.status
        version = moves.request_cancel(session, conversation, actor.id, reason)
        audit_chain.record(
            session,
            "cancel_requested",
            tenant_id=conversation.tenant_id,
            actor=actor,
            conversation_id=conversation.id,
            data={"status": status, "reason": reason},
        )
        stopped.append((conversation, version))
    return stopped


def after_commit(changed: list[tuple[Conversation, int | None]]) -> None:
    """Enqueue the moves committed changes queued, and tell the pages showing those conversations."""
    for conversation, version in changed:
        if version is not None:
            enqueue_after_commit(conversation.id, version)
        services().live_events.changed(conversation.tenant_id, conversation.id)


def retry(session: Session, user: User, conversation: Conversation) -> None:
    """Queue a failed conversation again."""
    _may_steer(user, conversation)
    error = conversation.error_message
    version = moves.retry(session, conversation)
    if version is None:
        raise ConversationRefused(
            "conflict", "not_failed", f"The conversation is {conversation.status}; only a failed one is retried."
        )
    commit_change(
        session,
        "retry_requested",
        user,
        conversation,
        version,
        data={"error": error},
    )


def extend_budget(session: Session, user: User, conversation: Conversation, extra_moves: object) -> None:
    """Give a budget-exhausted conversation more moves (reviewers and admins)."""
    if not (user.has_role("reviewer") or user.has_role("admin")):
        raise ConversationRefused("forbidden", "forbidden", "Only reviewers and admins extend budgets.")
    if not isinstance(extra_moves, int) or isinstance(extra_moves, bool) or not 1 <= extra_moves <= 1000:
        raise ConversationRefused("invalid", "invalid_field", "Extra moves must be a whole number from 1 to 1000.")
    before = conversation.move_budget
    version = moves.extend_budget(session, conversation, moves=extra_moves)
    if version is None:
        raise ConversationRefused(
            "conflict", "not_exhausted", f"The conversation is {conversation.status}, not out of budget."
        )
    commit_change(
        session,
        "budget_extended",
        user,
        conversation,
        version,
        data={"before": before, "after": conversation.move_budget},
    )


def give_input(session: Session, user: User, tool_call_id: int, text: object) -> ToolCall:
    """What a person types for a task waiting on input (a verification code, say)."""
    call = session.scalar(select(ToolCall).where(ToolCall.id == tool_call_id, ToolCall.tenant_id == user.tenant_id))
    if call is None:
        raise ConversationRefused("missing", "not_found", f"No tool call {tool_call_id} in your account.")
    conversation = find(session, user, call.conversation_id)
    _may_steer(user, conversation)
    if not isinstance(text, str) or not text.strip():
        raise ConversationRefused("invalid", "invalid_field", "Type the input first.")
    if len(text) > MAX_INPUT_CHARS:
        raise ConversationRefused("invalid", "invalid_field", f"The input is at most {MAX_INPUT_CHARS} characters.")
    try:
        version = moves.give_input(session, call, text.strip())
    except moves.InputRefused as exc:
        raise ConversationRefused("conflict", "not_waiting_for_input", str(exc)) from None
    # what was typed stays out of the log: it may be a secret such as a code
    commit_change(
        session,
        "task_input_given",
        user,
        conversation,
        version,
        tool_call_id=call.id,
        tool_name=call.name,
        data={"chars": len(text.strip())},
    )
    return call


def _may_steer(user: User, conversation: Conversation) -> None:
    if user.id == conversation.user_id or user.has_role("reviewer") or user.has_role("admin"):
        return
    raise ConversationRefused(
        "forbidden", "forbidden", "Only the conversation's agent, reviewers and admins may do this."
    )


def commit_change(
    session: Session, action: str, actor: User, conversation: Conversation, version: int | None, **event
) -> None:
    """The ending every action shares: audit what the person did (in the same transaction as the
    change), commit, and only then enqueue the move the change queued (if any) and tell the pages
    showing the conversation and the tenant's approvals."""
    audit_chain.record(
        session, action, tenant_id=conversation.tenant_id, actor=actor, conversation_id=conversation.id, **event
    )
    session.commit()
    after_commit([(conversation, version)])


# Sent (with the conversation's id) when a person's change is saved but its move could not be queued
# because Redis is away: the sweeper queues it once Redis is back. The pages say so (web/pages.py).
saved_while_queue_down = Namespace().signal("saved-while-queue-down")


def enqueue_after_commit(conversation_id: int, version: int) -> None:
    """Enqueue a committed move that follows a person's act, on the people queue (ahead of the moves
    already in flight). With Redis down the change stays saved and the sweeper enqueues it once Redis
    is back (saved_while_queue_down; an API caller sees the conversation still queued)."""
    try:
        services().dispatcher.enqueue_move(conversation_id, version, people=True)
    except QueueUnavailable:
        saved_while_queue_down.send(conversation_id)
