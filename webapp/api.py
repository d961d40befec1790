"""The JSON API: bearer tokens, the same actions the pages have, errors as {"error", "message"}."""

from __future__ import annotations

from functools import wraps

from flask import Blueprint, g, jsonify, request
from sqlalchemy import func, select
from werkzeug.exceptions import HTTPException

from webapp.accounts import user_for_token
from webapp.agent import moves
from webapp.agent.decisions import DecisionError, arguments_hash, decide
from webapp.agent.loop import ConversationBusy
from webapp.agent.states import CallStatus
from webapp.agent.transcript import api_messages
from webapp.errors import ApiError, json_error
from webapp.extensions import db
from webapp.models import Conversation, Message, ModelCall, ToolCall
from webapp.services import services

bp = Blueprint("api", __name__, url_prefix="/api")

MAX_MESSAGE_CHARS = 20_000
MAX_REASON_CHARS = 2_000


@bp.errorhandler(ApiError)
def _api_error(exc: ApiError):
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


def token_required(view):
    @wraps(view)
    def wrapper(*args, **kwargs):
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        user = user_for_token(db.session, token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            raise ApiError(401, "unauthorized", "Send a valid API token: Authorization: Bearer <token>.")
        g.user = user
        return view(*args, **kwargs)

    return wrapper


def require_role(*roles: str) -> None:
    if not any(g.user.has_role(role) for role in roles):
        raise ApiError(403, "forbidden", f"This action needs the {' or '.join(roles)} role.")


def json_body() -> dict:
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_json", "Send a JSON object with Content-Type: application/json.")
    return body


def text_field(body: dict, name: str, max_chars: int, required: bool = True) -> str:
    value = body.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise ApiError(422, "invalid_field", f'"{name}" must be a non-empty string.')
    if len(value) > max_chars:
        raise ApiError(422, "invalid_field", f'"{name}" must be at most {max_chars} characters.')
    return value


def conversation_or_404(conversation_id: int) -> Conversation:
    conversation = db.session.scalar(
        select(Conversation).where(
            Conversation.id == conversation_id, Conversation.tenant_id == g.user.tenant_id
        )
    )
    if conversation is None:
        raise ApiError(404, "not_found", f"No conversation {conversation_id} in your account.")
    return conversation


def enqueue(conversation_id: int, version: int | None) -> None:
    if version is not None:
        services().dispatcher.enqueue_move(conversation_id, version)


# --- conversations ------------------------------------------------------------------------------


@bp.post("/conversations")
@token_required
def create_conversation():
    require_role("agent")
    text = text_field(json_body(), "message", MAX_MESSAGE_CHARS)
    config = services().config
    conversation = Conversation(
        tenant_id=g.user.tenant_id,
        user_id=g.user.id,
        status="queued",
        move_budget=config.move_budget,
        token_budget=config.token_budget,
    )
    db.session.add(conversation)
    db.session.flush()
    services().loop(db.session, conversation).ask_later(text)
    version = moves.start_run(db.session, conversation)
    db.session.commit()
    enqueue(conversation.id, version)
    return jsonify(id=conversation.id, status=conversation.status), 201


@bp.post("/conversations/<int:conversation_id>/messages")
@token_required
def post_message(conversation_id: int):
    require_role("agent")
    text = text_field(json_body(), "message", MAX_MESSAGE_CHARS)
    conversation = conversation_or_404(conversation_id)
    if conversation.user_id != g.user.id:
        raise ApiError(403, "forbidden", "Only the agent who started this conversation may write in it.")
    try:
        services().loop(db.session, conversation).ask_later(text)
    except ConversationBusy as exc:
        raise ApiError(409, "conversation_busy", str(exc)) from None
    version = moves.start_run(db.session, conversation)
    db.session.commit()
    enqueue(conversation.id, version)
    return jsonify(id=conversation.id, status=conversation.status), 202


@bp.get("/conversations/<int:conversation_id>")
@token_required
def get_conversation(conversation_id: int):
    return jsonify(serialize_conversation(conversation_or_404(conversation_id)))


@bp.post("/conversations/<int:conversation_id>/cancel")
@token_required
def cancel_conversation(conversation_id: int):
    require_role("agent", "reviewer", "admin")
    conversation = conversation_or_404(conversation_id)
    try:
        version = moves.request_cancel(db.session, conversation, g.user.id)
    except ValueError:
        raise ApiError(
            409, "not_running", f"The conversation is {conversation.status}; nothing to stop."
        ) from None
    db.session.commit()
    enqueue(conversation.id, version)
    return jsonify(id=conversation.id, status=conversation.status, cancel_requested=True), 202


@bp.post("/conversations/<int:conversation_id>/retry")
@token_required
def retry_conversation(conversation_id: int):
    require_role("agent", "reviewer", "admin")
    conversation = conversation_or_404(conversation_id)
    version = moves.retry(db.session, conversation)
    if version is None:
        raise ApiError(
            409, "not_failed", f"The conversation is {conversation.status}; only a failed one is retried."
        )
    db.session.commit()
    enqueue(conversation.id, version)
    return jsonify(id=conversation.id, status=conversation.status), 202


@bp.post("/conversations/<int:conversation_id>/budget")
@token_required
def extend_budget(conversation_id: int):
    require_role("reviewer", "admin")
    body = json_body()
    extra = body.get("moves", 10)
    if not isinstance(extra, int) or isinstance(extra, bool) or not 1 <= extra <= 1000:
        raise ApiError(422, "invalid_field", '"moves" must be a whole number from 1 to 1000.')
    conversation = conversation_or_404(conversation_id)
    version = moves.extend_budget(db.session, conversation, moves=extra)
    if version is None:
        raise ApiError(409, "not_exhausted", f"The conversation is {conversation.status}, not out of budget.")
    db.session.commit()
    enqueue(conversation.id, version)
    return jsonify(id=conversation.id, status=conversation.status, move_budget=conversation.move_budget), 202


# --- approvals ----------------------------------------------------------------------------------


@bp.get("/approvals")
@token_required
def list_approvals():
    require_role("reviewer")
    calls = db.session.scalars(
        select(ToolCall)
        .where(ToolCall.tenant_id == g.user.tenant_id, ToolCall.status == CallStatus.AWAITING_APPROVAL)
        .order_by(ToolCall.created_at, ToolCall.id)
        .limit(200)
    )
    return jsonify(approvals=[serialize_call(call) for call in calls])


@bp.post("/approvals/<int:tool_call_id>")
@token_required
def decide_approval(tool_call_id: int):
    require_role("reviewer")
    body = json_body()
    decision = body.get("decision")
    if decision not in ("approve", "reject"):
        raise ApiError(422, "invalid_field", '"decision" must be "approve" or "reject".')
    reason = text_field(body, "reason", MAX_REASON_CHARS, required=False)
    call = db.session.scalar(
        select(ToolCall).where(ToolCall.id == tool_call_id, ToolCall.tenant_id == g.user.tenant_id)
    )
    if call is None:
        raise ApiError(404, "not_found", f"No tool call {tool_call_id} in your account.")
    seen = body.get("arguments_hash") or arguments_hash(call.input)
    try:
        version = decide(
            db.session, call, g.user, approve=decision == "approve", arguments_seen=seen, reason=reason
        )
    except DecisionError as exc:
        status = {"not_allowed": 403, "reason_required": 422}.get(exc.code, 409)
        raise ApiError(status, exc.code, exc.message) from None
    db.session.commit()
    enqueue(call.conversation_id, version)
    return jsonify(serialize_call(call))


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
        "created_at": call.created_at.isoformat(),
    }


def serialize_conversation(conversation: Conversation) -> dict:
    rows = db.session.scalars(
        select(Message).where(Message.conversation_id == conversation.id).order_by(Message.seq)
    )
    calls = db.session.scalars(
        select(ToolCall).where(ToolCall.conversation_id == conversation.id).order_by(ToolCall.id)
    )
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
