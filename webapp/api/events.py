"""The bodies the desk sends of each event: to the event webhooks (the OpenAPI document's `webhooks`;
webapp/webhooks/ builds them) and down a conversation's event stream (GET
/api/conversations/{id}/events), as `{type, timestamp, data}`."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from webapp.agent.states import CallStatus
from webapp.api.bodies import Timestamp, ToolArguments
from webapp.webhooks import EVENT_TYPES


# Why a conversation failed: in its conversation.failed event, and in the conversation as read.
class ConversationError(BaseModel):
    code: str
    message: str | None


class _EventData(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _CallEventData(_EventData):
    call_id: int
    conversation_id: int
    tool: str = Field(description="The tool's name.")
    source: str | None = Field(
        description="The outside agent that asked for the call (POST /api/calls); null: the desk's assistant."
    )


class ApprovalRequestedData(_CallEventData):
    input: ToolArguments = Field(description="The arguments the model asked for.")
    arguments_hash: str = Field(description="Send it with a decision (POST /api/approvals/{id}).")


class ApprovalDecidedData(_CallEventData):
    decision: Literal["approve", "reject", "expired"]
    decided_by: str | None = Field(description="The reviewer's email; null when it expired.")
    reason: str | None
    input: ToolArguments = Field(description="The arguments the call runs with: the reviewer's edit, if any.")
    edited: bool = Field(description="The reviewer changed the arguments.")
    status: CallStatus = Field(description="The call's state after it: awaiting_approval while more must approve.")
    approvals: int | None = Field(description="Approvals so far.")
    approvals_required: int | None


class ApprovalNoticeData(_CallEventData):
    expires_at: str | None = Field(description="When the call expires undecided (RFC 3339), if it does.")


class ConversationEventData(_EventData):
    conversation_id: int


class ConversationCompletedData(ConversationEventData):
    stop_reason: str | None = Field(description="The last model call's stop reason.")


class ConversationFailedData(ConversationEventData):
    error: ConversationError


class TaskFinishedData(_CallEventData):
    status: CallStatus = Field(description="The call's state once its task ended.")


class PolicyChangedData(_EventData):
    tool: str
    policy: dict[str, Any] = Field(description="The policy in force now, as GET /api/policies shows its fields.")
    changed_by: str | None = Field(description="Who put it in force (the second admin of a loosening).")
    change_id: int | None = Field(description="The policy change it came from, when it waited for a second admin.")


def _event(event_type: str, data: type[BaseModel]) -> type[BaseModel]:
    name = "".join(part.title() for part in re.split(r"[._]", event_type)) + "Event"
    fields: dict[str, Any] = {
        "type": (Literal[event_type], ...),
        "timestamp": (Timestamp, Field(description="When it happened (the audit event's time).")),
        "data": (data, ...),
    }
    return create_model(name, __doc__=EVENT_TYPES[event_type], __config__=ConfigDict(extra="forbid"), **fields)


EVENT_MODELS: dict[str, type[BaseModel]] = {
    event_type: _event(event_type, data)
    for event_type, data in (
        ("approval.requested", ApprovalRequestedData),
        ("approval.decided", ApprovalDecidedData),
        ("approval.reminder", ApprovalNoticeData),
        ("approval.escalated", ApprovalNoticeData),
        ("conversation.awaiting_approval", ConversationEventData),
        ("conversation.completed", ConversationCompletedData),
        ("conversation.failed", ConversationFailedData),
        ("task.finished", TaskFinishedData),
        ("policy.changed", PolicyChangedData),
    )
}
