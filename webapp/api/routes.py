"""The JSON API: bearer tokens, the same actions the pages have, errors as {"error", "message"}."""

from __future__ import annotations

from flask import Blueprint, g, jsonify, request
from sqlalchemy import func, select
from werkzeug.exceptions import HTTPException

from webapp.agent.decisions import arguments_hash
from webapp.agent.states import CallStatus
from webapp.agent.transcript import api_messages
from webapp.approvals import actions as approvals
from webapp.audit import pages as audit_log
from webapp.conversations import actions as conversations
from webapp.models import ROLES, Conversation, Message, ModelCall, ToolCall
from webapp.runtime.extensions import db
from webapp.tools.tasks import INPUT_REQUIRED
from webapp.web.errors import Refused, json_error
from webapp.web.security import api_roles

bp = Blueprint("api", __name__, url_prefix="/api")

MAX_MESSAGE_CHARS = 20_000
SUPERVISING = ("reviewer", "auditor", "admin")  # see every conversation of their tenant
MAX_REASON_CHARS = 2_000


@bp.errorhandler(Refused)
def _api_error(exc: Refused):
    db.session.rollback()
    return json_error(exc.status, exc.code, exc.message)


@bp.errorhandler(HTTPException)
def _http_error(exc: HTTPException):
    db.session.rollback()
    messages = {
        400: ("bad_request", "The request could not be read; send a JSON object."),
        404: ("not_found", "There is no such resource."),
        405: ("method_not_allowed", "This URL does not accept that method."),
        413: ("too_large", "The request body is too large."),
    }
    code, message = messages.get(exc.code, ("http_error", exc.description or "Request failed."))
    return json_error(exc.code or 500, code, message)


@bp.errorhandler(Exception)
def _unexpected(exc: Exception):
    db.session.rollback()
    bp_logger().exception("unexpected API error")
    return json_error(500, "internal_error", "Something went wrong on our side; nothing was changed.")


def bp_logger():
    from flask import current_app

    return current_app.logger


def json_body() -> dict:
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise Refused(400, "invalid_json", "Send a JSON object with Content-Type: application/json.")
    return body


def text_field(body: dict, name: str, max_chars: int, required: bool = True) -> str:
    value = body.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise Refused(422, "invalid_field", f'"{name}" must be a non-empty string.')
    if len(value) > max_chars:
        raise Refused(422, "invalid_field", f'"{name}" must be at most {max_chars} characters.')
    return value


def conversation_or_404(conversation_id: int) -> Conversation:
    return conversations.find(db.session, g.user, conversation_id)


# --- conversations ------------------------------------------------------------------------------


@bp.post("/conversations")
@api_roles("agent")
def create_conversation():
    conversation = conversations.start(db.session, g.user, json_body().get("message"))
    return jsonify(id=conversation.id, status=conversation.status), 201


@bp.post("/conversations/<int:conversation_id>/messages")
@api_roles("agent")
def post_message(conversation_id: int):
    text = json_body().get("message")
    conversation = conversation_or_404(conversation_id)
    conversations.post_message(db.session, g.user, conversation, text)
    return jsonify(id=conversation.id, status=conversation.status), 202


@bp.get("/conversations/<int:conversation_id>")
@api_roles(*ROLES)
def get_conversation(conversation_id: int):
    return jsonify(serialize_conversation(conversation_or_404(conversation_id)))


@bp.post("/conversations/<int:conversation_id>/cancel")
@api_roles("agent", "reviewer", "admin")
def cancel_conversation(conversation_id: int):
    conversation = conversation_or_404(conversation_id)
    conversations.cancel(db.session, g.user, conversation)
    return jsonify(id=conversation.id, status=conversation.status, cancel_requested=True), 202


@bp.post("/conversations/<int:conversation_id>/retry")
@api_roles("agent", "reviewer", "admin")
def retry_conversation(conversation_id: int):
    conversation = conversation_or_404(conversation_id)
    conversations.retry(db.session, g.user, conversation)
    return jsonify(id=conversation.id, status=conversation.status), 202


@bp.post("/conversations/<int:conversation_id>/budget")
@api_roles("reviewer", "admin")
def extend_budget(conversation_id: int):
    extra = json_body().get("moves", 10)
    conversation = conversation_or_404(conversation_id)
    conversations.extend_budget(db.session, g.user, conversation, extra)
    return jsonify(id=conversation.id, status=conversation.status, move_budget=conversation.move_budget), 202


# --- approvals ----------------------------------------------------------------------------------


@bp.get("/approvals")
@api_roles("reviewer")
def list_approvals():
    calls = db.session.scalars(approvals.pending(g.user).limit(200))
    return jsonify(approvals=[serialize_call(call) for call in calls])


@bp.post("/approvals/<int:tool_call_id>")
@api_roles("reviewer")
def decide_approval(tool_call_id: int):
    body = json_body()
    call = approvals.decide(
        db.session, g.user, tool_call_id, body.get("decision"), body.get("reason"), body.get("arguments_hash")
    )
    return jsonify(serialize_call(call))


# --- tasks --------------------------------------------------------------------------------------


@bp.post("/tool-calls/<int:tool_call_id>/input")
@api_roles("agent", "reviewer", "admin")
def give_input(tool_call_id: int):
    text = json_body().get("input")
    call = conversations.give_input(db.session, g.user, tool_call_id, text)
    return jsonify(serialize_call(call)), 202


# --- audit log ----------------------------------------------------------------------------------


@bp.get("/audit")
@api_roles("auditor", "admin")
def audit_events():
    return jsonify(audit_log.api_page(g.user, request.args))


# --- shapes -------------------------------------------------------------------------------------


def serialize_call(call: ToolCall) -> dict:
    return {
        "id": call.id,
        "conversation_id": call.conversation_id,
        "tool_use_id": call.tool_use_id,
        "name": call.name,
        "input": call.input,
        "arguments_hash": arguments_hash(call.input),
        "status": call.status,
        "requires_approval": call.requires_approval,
        "result": call.result,
        "is_error": call.is_error,
        "decided_by": call.decided_by.email if call.decided_by else None,
        "decided_at": call.decided_at.isoformat() if call.decided_at else None,
        "decision_reason": call.decision_reason,
        "task": serialize_task(call),
        "created_at": call.created_at.isoformat(),
    }


def serialize_task(call: ToolCall) -> dict | None:
    """The call's task as people may see it (the tool's own data stays private)."""
    task = call.task
    if not task:
        return None
    waiting_for_input = call.status == CallStatus.AWAITING_TASK and task.get("status") == INPUT_REQUIRED
    return {
        "tool_call_id": call.id,
        "tool": call.name,
        "status": task.get("status"),
        "message": task.get("message"),
        "progress": task.get("progress"),
        "input_required": (
            {
                "prompt": task.get("input_prompt") or "Input",
                "pending": call.task_input is not None,
                "url": f"/api/tool-calls/{call.id}/input",
            }
            if waiting_for_input
            else None
        ),
        "last_progress_at": call.task_progress_at.isoformat() if call.task_progress_at else None,
        "next_check_at": call.task_due_at.isoformat() if call.task_due_at else None,
    }


def serialize_conversation(conversation: Conversation) -> dict:
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
    return {
        "id": conversation.id,
        "title": conversation.title,
        "status": conversation.status,
        "stop_reason": conversation.stop_reason,
        "error": (
            {"code": conversation.error_code, "message": conversation.error_message}
            if conversation.error_code
            else None
        ),
        "cancel_requested": conversation.cancel_requested_at is not None,
        "moves_used": conversation.moves_used,
        "move_budget": conversation.move_budget,
        "messages": api_messages(rows),
        "tool_calls": [serialize_call(call) for call in calls],
        "tasks": [serialize_task(call) for call in calls if call.status == CallStatus.AWAITING_TASK],
        "usage": {
            "input_tokens": int(usage[0]),
            "output_tokens": int(usage[1]),
            "cache_read_input_tokens": int(usage[2]),
            "cache_creation_input_tokens": int(usage[3]),
            "model_calls": int(usage[4]),
        },
        "created_at": conversation.created_at.isoformat(),
        "updated_at": conversation.updated_at.isoformat(),
    }
