"""The event types (a contract: docs/api.md) and an audit event read as the webhook event it is."""

from __future__ import annotations

import json

from webapp.agent.decisions import arguments_hash
from webapp.models import AuditEvent

# The event types (a contract: names integrators subscribe to), each with what it says.
EVENT_TYPES = {
    "approval.requested": "A tool call waits for a decision.",
    "approval.decided": "A person approved (perhaps with edited arguments) or rejected a call, or it expired.",
    "approval.reminder": "A call has waited past its policy's reminder time.",
    "approval.escalated": "A call's time to decide has nearly run out.",
    "conversation.awaiting_approval": "A conversation stopped to wait for decisions on its calls.",
    "conversation.completed": "The assistant answered and the conversation is done until someone writes again.",
    "conversation.failed": "A conversation failed; `error` says why.",
    "task.finished": "A long-running task of a tool call ended (done, failed or timed out).",
    "policy.changed": "A tool's policy changed (in force now).",
}
# The audit actions that are events; the rest of the chain is read past.
ACTIONS = frozenset(
    {
        "approval_requested",
        "approval_decided",
        "approval_expired",
        "approval_reminded",
        "approval_escalated",
        "conversation_waiting",
        "conversation_completed",
        "conversation_failed",
        "task_finished",
        "policy_changed",
    }
)


def event_of(event: AuditEvent) -> tuple[str, dict] | None:
    """The webhook event an audit event is (its type and its data), or None when it is none."""
    data = event.data or {}
    call = {
        "call_id": event.tool_call_id,
        "conversation_id": event.conversation_id,
        "tool": event.tool_name,
        "source": data.get("source"),  # the outside agent that asked (webapp/agent/outside.py); None: the assistant
    }
    if event.action == "approval_requested":
        asked = data.get("input") or {}
        return "approval.requested", call | {"input": asked, "arguments_hash": arguments_hash(asked)}
    if event.action in ("approval_decided", "approval_expired"):
        edited = data.get("edited_to")
        return "approval.decided", call | {
            "decision": data.get("decision") or "expired",
            "decided_by": event.actor_label if event.action == "approval_decided" else None,
            "reason": data.get("reason") or None,
            "input": edited if edited is not None else data.get("input"),
            "edited": edited is not None,
            "status": event.outcome,  # approved, rejected, expired; awaiting_approval while more must approve
            "approvals": data.get("approvals"),
            "approvals_required": data.get("approvals_required"),
        }
    if event.action in ("approval_reminded", "approval_escalated"):
        kind = "approval.reminder" if event.action == "approval_reminded" else "approval.escalated"
        return kind, call | {"expires_at": data.get("expires_at")}
    if event.action == "conversation_waiting":
        if event.outcome != "awaiting_approval":
            return None
        return "conversation.awaiting_approval", {"conversation_id": event.conversation_id}
    if event.action == "conversation_completed":
        return "conversation.completed", {
            "conversation_id": event.conversation_id,
            "stop_reason": data.get("stop_reason"),
        }
    if event.action == "conversation_failed":
        return "conversation.failed", {
            "conversation_id": event.conversation_id,
            "error": {"code": data.get("code"), "message": data.get("message")},
        }
    if event.action == "task_finished":
        return "task.finished", call | {"status": event.outcome}
    if event.action == "policy_changed":
        after = data.get("after") or {}
        return "policy.changed", {
            "tool": event.tool_name,
            "policy": after,
            "changed_by": event.actor_label,
            "change_id": data.get("change_id"),
        }
    return None


def envelope(event_type: str, event: AuditEvent, data: dict) -> str:
    """The body as sent: {"type", "timestamp", "data"}."""
    return json.dumps(
        {"type": event_type, "timestamp": event.created_at.isoformat(), "data": data},
        separators=(",", ":"),
        sort_keys=True,
    )


def event_id(event: AuditEvent) -> str:
    return f"evt_{event.id}"
