"""A tool call as the API shows it (in a conversation, in the inbox, as a task's state), and its one
door: POST /api/tool-calls/{id}/input, a person's input for a task that waits for it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from flask import g
from pydantic import BaseModel, Field, WithJsonSchema

from webapp.agent.decisions import arguments_hash
from webapp.agent.states import CallStatus
from webapp.api.base import OTHER_AGENTS, answer, bp, documented, tenant_tools
from webapp.api.bodies import RequestBody, Timestamp, ToolArguments, required_text
from webapp.api.reading import body
from webapp.approvals.actions import holder
from webapp.conversations import actions as conversations
from webapp.conversations import cards
from webapp.models import ToolCall
from webapp.runtime.extensions import db
from webapp.tools.registry import ToolRegistry
from webapp.tools.tasks import INPUT_REQUIRED, MAX_INPUT_CHARS
from webapp.web.security import api_roles

Progress = Annotated[
    int | float,  # as the tool reported it: 1 stays 1
    WithJsonSchema({"type": "number", "minimum": 0, "maximum": 1}),
]
TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]  # webapp.tools.tasks.STATUSES


class InputRequired(BaseModel):
    prompt: str = Field(description="What the task asks a person to type.")
    pending: bool = Field(description="Input was given and waits for the assistant's next move to read it.")
    url: str = Field(description='Where to POST it: {"input": "..."}.')


class TaskView(BaseModel):
    """A tool call's long-running task as people may see it (the tool's own data stays private)."""

    tool_call_id: int
    tool: str = Field(description="The tool's name.")
    status: TaskStatus
    message: str | None = Field(description='Where the task stands, in the tool\'s words, e.g. "Exported part 2 of 3".')
    progress: Progress | None = Field(description="How far along, from 0 to 1, when the tool says.")
    input_required: InputRequired | None = Field(
        description="Set while the task waits for a person's input, with what it asks and where to send it."
    )
    last_progress_at: Timestamp | None = Field(description="When the task last changed.")
    next_check_at: Timestamp | None = Field(description="When the assistant looks at it again.")

    @classmethod
    def of(cls, call: ToolCall) -> TaskView | None:
        task = call.task
        if not task:
            return None
        waiting_for_input = call.status == CallStatus.AWAITING_TASK and task.get("status") == INPUT_REQUIRED
        return cls(
            tool_call_id=call.id,
            tool=call.name,
            status=task.get("status"),
            message=task.get("message"),
            progress=task.get("progress"),
            input_required=(
                InputRequired(
                    prompt=task.get("input_prompt") or "Input",
                    pending=call.task_input is not None,
                    url=f"/api/tool-calls/{call.id}/input",
                )
                if waiting_for_input
                else None
            ),
            last_progress_at=call.task_progress_at,
            next_check_at=call.task_due_at,
        )


class ToolCallView(BaseModel):
    """One tool call the model asked for: its arguments, its state, who decided it and its result."""

    id: int
    conversation_id: int
    tool_use_id: str = Field(description="The id of the model's tool_use block.")
    name: str = Field(description="The tool's name.")
    source: str | None = Field(
        None, description="The outside agent that asked for the call (POST /api/calls); null: the desk's assistant."
    )
    input: ToolArguments = Field(description="The arguments the tool runs (or ran) with, after any edit.")
    arguments_hash: str = Field(description="The hash of `input`; send it with a decision.")
    status: CallStatus
    requires_approval: bool
    output: Any = Field(
        None,
        description=(
            "The tool's own output, once it ran: its JSON as the tool returned it (text when it returned text); "
            "null before it ran, or when the desk settled the call (rejected, expired, cancelled)."
        ),
    )
    summary: str = Field(description="Where the call stands and what it did, in a sentence for people.")
    result: str | None = Field(
        description=(
            "The text the model was given (the output fenced, with the desk's notes). Kept for earlier clients: "
            "read `output` and `summary` instead."
        ),
        json_schema_extra={"deprecated": True},
    )
    is_error: bool = Field(description="The result is an error (failed, rejected, expired...).")
    decided_by: str | None = Field(description="The email of the reviewer who settled the decision.")
    decided_at: Timestamp | None
    decision_reason: str | None
    claimed_by: str | None = Field(
        description="The email of the reviewer reviewing the call now (a claim, see POST .../claim), while it lasts."
    )
    claimed_until: Timestamp | None = Field(description="When that claim runs out.")
    task: TaskView | None = Field(description="The call's task, when its tool answered with one.")
    created_at: Timestamp

    @classmethod
    def of(cls, call: ToolCall, tools: ToolRegistry) -> ToolCallView:
        """`tools`: the registry of the call's tenant (for its sentence)."""
        return cls(
            id=call.id,
            conversation_id=call.conversation_id,
            tool_use_id=call.tool_use_id,
            name=call.name,
            source=call.source,
            input=call.input,
            arguments_hash=arguments_hash(call.input),
            status=call.status,
            requires_approval=call.requires_approval,
            output=cards.output(call),
            summary=cards.summary(call, tools),
            result=call.result,
            is_error=call.is_error,
            decided_by=call.decided_by.email if call.decided_by else None,
            decided_at=call.decided_at,
            decision_reason=call.decision_reason,
            claimed_by=held.email if (held := holder(call)) else None,
            claimed_until=call.claimed_until if held else None,
            task=TaskView.of(call),
            created_at=call.created_at,
        )


class GiveInput(RequestBody):
    """What a person types for a tool call whose task waits for input (a verification code, say)."""

    input: required_text(
        MAX_INPUT_CHARS,
        "The text the task asks for (its prompt is in the task's `input_required`).",
        "Type the input first.",
    )


def tool_call_view(call: ToolCall) -> ToolCallView:
    """The call as its tenant's tools describe it."""
    return ToolCallView.of(call, tenant_tools())


@bp.post("/tool-calls/<int:tool_call_id>/input")
@documented(
    "Give a waiting task its input",
    body=GiveInput,
    responses={202: ToolCallView},
    errors={
        403: OTHER_AGENTS,
        409: "not_waiting_for_input: the task does not wait for input, or still checks the last one.",
    },
)
@api_roles("agent", "reviewer", "admin")
def give_input(tool_call_id: int):
    sent = body(GiveInput)
    call = conversations.give_input(db.session, g.user, tool_call_id, sent.input)
    return answer(tool_call_view(call), 202)
