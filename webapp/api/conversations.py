"""/api/conversations: starting one, writing in it, reading it and following its events, stopping,
retrying and giving it more moves; with the bodies those routes take and answer."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, date, datetime, time
from typing import Annotated, Any, Literal

from flask import current_app, g, request
from pydantic import BaseModel, BeforeValidator, Field, WithJsonSchema
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from webapp.agent.states import CallStatus, ConversationStatus
from webapp.agent.transcript import api_messages
from webapp.api.base import OTHER_AGENTS, answer, bp, documented, tenant_tools
from webapp.api.bodies import NO_NUL, QueryParameters, RequestBody, Rule, Timestamp, ToolArguments, required_text
from webapp.api.events import ConversationError
from webapp.api.paging import Cursor, NextCursor, a_page, page_limit
from webapp.api.reading import body, optional_body, query
from webapp.api.tool_calls import TaskView, ToolCallView
from webapp.conversations import actions as conversations
from webapp.conversations import event_stream
from webapp.conversations.actions import MAX_MESSAGE_CHARS
from webapp.models import ROLES, Conversation, Message, ModelCall, ToolCall, User
from webapp.runtime.extensions import db
from webapp.tools.registry import ToolRegistry
from webapp.web.security import api_roles

# --- requests -----------------------------------------------------------------------------------------

MessageText = required_text(
    MAX_MESSAGE_CHARS, "The support agent's question or instruction for the assistant.", "Write a message first."
)


class StartConversation(RequestBody):
    """Start a conversation with its first message; the assistant answers in the background."""

    message: MessageText


class PostMessage(RequestBody):
    """A follow-up message in a conversation whose assistant is not working."""

    message: MessageText


class ExtendBudget(RequestBody):
    """Give a conversation that ran out of moves some more (reviewers and admins)."""

    moves: Annotated[
        int,
        Field(
            ge=1,
            le=1000,
            description="How many more moves (model calls or tool calls) the conversation's run may use.",
        ),
        Rule("must be a whole number from 1 to 1000"),
    ] = 10


class CancelConversation(RequestBody):
    """Stopping a conversation takes no fields; a body, if sent, must be an empty JSON object."""


def _moment(value: object) -> object:
    """A query parameter that is an ISO 8601 moment with its offset (2026-12-04T09:30:00Z) or a day
    (2026-12-04: its midnight, UTC), as an aware datetime; anything else as sent (and refused)."""
    if not isinstance(value, str) or not _MOMENT.match(value):
        return value
    try:
        if len(value) == 10:
            return datetime.combine(date.fromisoformat(value), time(), UTC)
        return datetime.fromisoformat(value).astimezone(UTC)
    except ValueError:  # a month 13, a 25th hour
        return value


_MOMENT = re.compile(r"\d{4}-\d{2}-\d{2}([Tt]\d{2}:\d{2}:\d{2}(\.\d{1,6})?([Zz]|[+-]\d{2}:\d{2}))?\Z")  # RFC 3339


class ConversationsQuery(QueryParameters):
    """Which conversations to list, newest first (agents: their own)."""

    status: Annotated[
        ConversationStatus | None,
        BeforeValidator(lambda value: ConversationStatus(value) if value in set(ConversationStatus) else value),
        Field(description="Only conversations in this state."),
        Rule("must be one of " + ", ".join(f'"{status}"' for status in ConversationStatus)),
    ] = None
    started_by: Annotated[
        str | None,
        Field(min_length=1, max_length=254, pattern=NO_NUL, description="Only those started by this email."),
        Rule("must be an email address"),
    ] = None
    since: Annotated[
        datetime | None,
        BeforeValidator(_moment),
        WithJsonSchema({"anyOf": [{"type": "string", "format": "date-time"}, {"type": "string", "format": "date"}]}),
        Field(description="Only those started at or after this moment (ISO 8601 with its offset, or a day, UTC)."),
        Rule("must be a moment like 2026-12-04T09:30:00Z or a day like 2026-12-04"),
    ] = None
    cursor: Cursor = None
    limit: page_limit("Conversations", 50) = None


# --- answers ------------------------------------------------------------------------------------------


class TextBlock(BaseModel):
    """Words: a person's message, or the assistant's."""

    type: Literal["text"]
    text: str


class ToolUseBlock(BaseModel):
    """The assistant asks for a tool call; the call itself is in `tool_calls` under `tool_call_id`."""

    type: Literal["tool_use"]
    id: str = Field(description="The block's id, as its tool_result names it (tool_use_id).")
    name: str = Field(description="The tool's name.")
    input: ToolArguments = Field(description="The arguments as the model asked for them (before any edit).")
    tool_call_id: int | None = Field(description="The call in `tool_calls` (and in the inbox) it became.")


class ToolResultBlock(BaseModel):
    """The answer to a tool_use block, as people read it: the tool's structured output is the call's
    `output` in `tool_calls`, and the text the model was given stays out of the API."""

    type: Literal["tool_result"]
    tool_use_id: str
    tool_call_id: int | None
    is_error: bool
    summary: str = Field(description="What the call did, or why it did nothing, in a sentence for people.")


class OtherBlock(BaseModel):
    """A block of a kind the desk keeps but does not describe (a model's thinking, say)."""

    type: Literal["other"]
    kind: str = Field(description="Its type as the Messages API names it.")


ContentBlock = Annotated[TextBlock | ToolUseBlock | ToolResultBlock | OtherBlock, Field(discriminator="type")]


class MessageView(BaseModel):
    """One turn of the conversation, in content blocks."""

    role: Literal["user", "assistant"]
    content: list[ContentBlock]

    @classmethod
    def of(cls, message: dict, calls: dict[str, ToolCall], summaries: dict[int, str]) -> MessageView:
        """`calls`: the conversation's calls by tool_use id; `summaries`: their sentences by call id."""
        return cls(
            role=message["role"], content=[_content_block(block, calls, summaries) for block in message["content"]]
        )


def _content_block(block: dict, calls: dict[str, ToolCall], summaries: dict[int, str]) -> Any:
    """One block of a turn as people read it: a tool_use or tool_result block with the call it belongs to."""
    kind = block.get("type")
    if kind == "text":
        return TextBlock(type="text", text=block.get("text", ""))
    if kind not in ("tool_use", "tool_result"):
        return OtherBlock(type="other", kind=str(kind))
    use_id = block.get("id" if kind == "tool_use" else "tool_use_id", "")
    call = calls.get(use_id)
    call_id = call.id if call else None
    if kind == "tool_use":
        name, arguments = block.get("name", ""), block.get("input") or {}
        return ToolUseBlock(type="tool_use", id=use_id, name=name, input=arguments, tool_call_id=call_id)
    summary = summaries.get(call.id, "") if call else ""
    return ToolResultBlock(
        type="tool_result",
        tool_use_id=use_id,
        tool_call_id=call_id,
        is_error=bool(block.get("is_error")),
        summary=summary,
    )


class Usage(BaseModel):
    """Tokens used by all of the conversation's model calls."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    model_calls: int


class ConversationView(BaseModel):
    """A conversation: its state, its messages, its tool calls, its open tasks and its usage."""

    id: int
    title: str
    status: ConversationStatus
    stop_reason: str | None = Field(description="The stop reason of the last model call.")
    error: ConversationError | None = Field(description="Why a failed conversation failed.")
    cancel_requested: bool
    cancel_reason: str | None = Field(
        description="Why it was stopped when no one pressed Stop (e.g. its owner's account was disabled)."
    )
    moves_used: int = Field(description="Moves (model calls or tool calls) used by the current run.")
    move_budget: int = Field(description="Moves the current run may use before it pauses as budget_exhausted.")
    messages: list[MessageView]
    tool_calls: list[ToolCallView]
    tasks: list[TaskView] = Field(description="The open tasks (calls awaiting a task), with what they wait for.")
    usage: Usage
    created_at: Timestamp
    updated_at: Timestamp

    @classmethod
    def of(
        cls, conversation: Conversation, messages: list[dict], calls: list[ToolCall], usage: Usage, tools: ToolRegistry
    ) -> ConversationView:
        views = [ToolCallView.of(call, tools) for call in calls]
        by_use_id = {call.tool_use_id: call for call in calls}
        summaries = {view.id: view.summary for view in views}
        return cls(
            id=conversation.id,
            title=conversation.title,
            status=conversation.status,
            stop_reason=conversation.stop_reason,
            error=(
                ConversationError(code=conversation.error_code, message=conversation.error_message)
                if conversation.error_code
                else None
            ),
            cancel_requested=conversation.cancel_requested_at is not None,
            cancel_reason=conversation.cancel_reason,
            moves_used=conversation.moves_used,
            move_budget=conversation.move_budget,
            messages=[MessageView.of(message, by_use_id, summaries) for message in messages],
            tool_calls=views,
            tasks=[TaskView.of(call) for call in calls if call.status == CallStatus.AWAITING_TASK and call.task],
            usage=usage,
            created_at=conversation.created_at,
            updated_at=conversation.updated_at,
        )


class ConversationSummary(BaseModel):
    """A conversation as a list shows it: what it is, who started it and where it stands."""

    id: int
    title: str
    status: ConversationStatus
    started_by: str = Field(description="The email of the agent who started it.")
    cancel_requested: bool
    created_at: Timestamp
    updated_at: Timestamp

    @classmethod
    def of(cls, conversation: Conversation, started_by: str) -> ConversationSummary:
        return cls(
            id=conversation.id,
            title=conversation.title,
            status=conversation.status,
            started_by=started_by,
            cancel_requested=conversation.cancel_requested_at is not None,
            created_at=conversation.created_at,
            updated_at=conversation.updated_at,
        )


class ConversationList(BaseModel):
    """A page of the conversations the caller may see, newest first."""

    conversations: list[ConversationSummary]
    next_cursor: NextCursor


class ConversationState(BaseModel):
    """A conversation's id and status after a change (201 when created, 202 when its work was queued)."""

    id: int
    status: ConversationStatus

    @classmethod
    def of(cls, conversation: Conversation, **more: Any) -> ConversationState:
        return cls(id=conversation.id, status=conversation.status, **more)


class CancelRequested(ConversationState):
    cancel_requested: Literal[True] = True


class BudgetExtended(ConversationState):
    move_budget: int = Field(description="The run's move budget, extension included.")

    @classmethod
    def of(cls, conversation: Conversation, **more: Any) -> BudgetExtended:
        return super().of(conversation, move_budget=conversation.move_budget, **more)


# --- routes -------------------------------------------------------------------------------------------


@bp.post("/conversations")
@documented("Start a conversation", body=StartConversation, responses={201: ConversationState})
@api_roles("agent")
def create_conversation():
    sent = body(StartConversation)
    conversation = conversations.start(db.session, g.user, sent.message)
    return answer(ConversationState.of(conversation), 201)


@bp.get("/conversations")
@documented("List conversations", query=ConversationsQuery, responses={200: ConversationList})
@api_roles(*ROLES)
def list_conversations():
    """The conversations the caller may see (agents: their own), newest first, a page at a time."""
    asked = query(ConversationsQuery)
    page = a_page(
        lambda: conversations.listing(
            db.session,
            g.user,
            status=asked.status,
            started_by=asked.started_by,
            since=asked.since,
            cursor=asked.cursor,
            limit=asked.limit or 50,
        )
    )
    return answer(
        ConversationList(
            conversations=[ConversationSummary.of(row, email) for row, email in page.rows], next_cursor=page.next_cursor
        )
    )


@bp.post("/conversations/<int:conversation_id>/messages")
@documented(
    "Write in a conversation",
    body=PostMessage,
    responses={202: ConversationState},
    errors={
        403: "forbidden: only the agent who started the conversation writes in it.",
        409: "conversation_busy: the assistant is working or a call waits for a decision.",
    },
)
@api_roles("agent")
def post_message(conversation_id: int):
    message = body(PostMessage).message
    return _changed(
        conversation_id, lambda session, user, found: conversations.post_message(session, user, found, message)
    )


@bp.get("/conversations/<int:conversation_id>")
@documented("Read a conversation", responses={200: ConversationView}, errors={403: OTHER_AGENTS})
@api_roles(*ROLES)
def get_conversation(conversation_id: int):
    return answer(conversation_view(conversation_or_404(conversation_id)))


@bp.get("/conversations/<int:conversation_id>/events")
@documented(
    "Follow a conversation's events",
    responses={},
    stream=(
        "Server-sent events: each of the conversation's events as the event webhooks send it (`id` its "
        "webhook-id, `event` its type, `data` its JSON body: {type, timestamp, data}), then `text` events "
        '({"text"}: the reply being written, no id). Resumable: send the last id seen as Last-Event-ID. '
        "The stream ends after five minutes; reconnect with Last-Event-ID."
    ),
    errors={
        403: OTHER_AGENTS,
        422: "invalid_field: a Last-Event-ID this stream did not send.",
        429: "too_many_streams: too many live streams open for you or this server.",
        503: "unavailable: live events cannot be had now.",
    },
)
@api_roles(*ROLES)
def conversation_events(conversation_id: int):
    """The conversation's events from the start (or after Last-Event-ID), then live."""
    conversation = conversation_or_404(conversation_id)
    after = event_stream.last_seen(request.headers.get("Last-Event-ID"))
    token = request.headers.get("Authorization", "").partition(" ")[2].strip()
    return event_stream.stream(current_app._get_current_object(), conversation, g.user.id, token, after)


@bp.post("/conversations/<int:conversation_id>/cancel")
@documented(
    "Stop a conversation",
    body=CancelConversation,
    body_required=False,
    responses={202: CancelRequested},
    errors={403: OTHER_AGENTS, 409: "not_running: the conversation has stopped already."},
)
@api_roles("agent", "reviewer", "admin")
def cancel_conversation(conversation_id: int):
    optional_body(CancelConversation)  # (it takes no field: only an empty body, or {})
    return _changed(conversation_id, conversations.cancel, CancelRequested)


@bp.post("/conversations/<int:conversation_id>/retry")
@documented(
    "Retry a failed conversation",
    responses={202: ConversationState},
    errors={403: OTHER_AGENTS, 409: "not_failed: only a failed conversation is retried."},
)
@api_roles("agent", "reviewer", "admin")
def retry_conversation(conversation_id: int):
    return _changed(conversation_id, conversations.retry)


@bp.post("/conversations/<int:conversation_id>/budget")
@documented(
    "Give a conversation more moves",
    body=ExtendBudget,
    responses={202: BudgetExtended},
    errors={409: "not_exhausted: the conversation is not out of budget."},
)
@api_roles("reviewer", "admin")
def extend_budget(conversation_id: int):
    moves = body(ExtendBudget).moves
    return _changed(
        conversation_id,
        lambda session, user, found: conversations.extend_budget(session, user, found, moves),
        BudgetExtended,
    )


def conversation_or_404(conversation_id: int) -> Conversation:
    """The caller's conversation of that id (404 when there is none, 403 when it is another agent's)."""
    return conversations.find(db.session, g.user, conversation_id)


def _changed(
    conversation_id: int,
    change: Callable[[Session, User, Conversation], object],
    state: type[ConversationState] = ConversationState,
):
    """Make `change` to the caller's conversation, then answer its state: 202, its work is queued."""
    conversation = conversation_or_404(conversation_id)
    change(db.session, g.user, conversation)
    return answer(state.of(conversation), 202)


def conversation_view(conversation: Conversation) -> ConversationView:
    rows = db.session.scalars(select(Message).where(Message.conversation_id == conversation.id).order_by(Message.seq))
    calls = db.session.scalars(
        select(ToolCall).where(ToolCall.conversation_id == conversation.id).order_by(ToolCall.id)
    ).all()
    usage = db.session.execute(
        select(
            func.coalesce(func.sum(ModelCall.input_tokens), 0),
            func.coalesce(func.sum(ModelCall.output_tokens), 0),
            func.coalesce(func.sum(ModelCall.cache_read_input_tokens), 0),
            func.coalesce(func.sum(ModelCall.cache_creation_input_tokens), 0),
            func.count(ModelCall.id),
        ).where(ModelCall.conversation_id == conversation.id)
    ).one()
    return ConversationView.of(
        conversation,
        api_messages(rows),
        list(calls),
        Usage(
            input_tokens=int(usage[0]),
            output_tokens=int(usage[1]),
            cache_read_input_tokens=int(usage[2]),
            cache_creation_input_tokens=int(usage[3]),
            model_calls=int(usage[4]),
        ),
        tenant_tools(),
    )
