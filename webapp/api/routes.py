"""The JSON API: bearer tokens, the same actions the pages have, errors as {"error", "message"} (with
"fields" when a request's fields are wrong). Bodies in and out are the models of webapp/api/schemas.py."""

from __future__ import annotations

from flask import Blueprint, current_app, g, jsonify, request
from pydantic import BaseModel
from sqlalchemy import func, select
from werkzeug.exceptions import HTTPException

from webapp.accounts import actions as accounts
from webapp.agent.states import CallStatus
from webapp.agent.transcript import api_messages
from webapp.api.schemas import (
    ApprovalList,
    ApprovalView,
    BudgetExtended,
    CancelRequested,
    ConversationState,
    ConversationView,
    DecideApproval,
    ExtendBudget,
    GiveInput,
    InvalidFields,
    PostMessage,
    RevokeToken,
    StartConversation,
    TokenList,
    TokenView,
    ToolCallView,
    Usage,
    body,
)
from webapp.approvals import actions as approvals
from webapp.audit import queries as audit_queries
from webapp.conversations import actions as conversations
from webapp.identity import token_state
from webapp.models import ROLES, Conversation, Message, ModelCall, ToolCall
from webapp.runtime.extensions import db
from webapp.web.errors import Refused, json_error
from webapp.web.security import api_roles

bp = Blueprint("api", __name__, url_prefix="/api")


def answer(view: BaseModel, status: int = 200):
    """A response body model as JSON."""
    return jsonify(view.model_dump(mode="json")), status


@bp.errorhandler(InvalidFields)
def _invalid_fields(exc: InvalidFields):
    db.session.rollback()
    return answer(exc.view(), exc.status)


@bp.errorhandler(Refused)
def _api_error(exc: Refused):
    db.session.rollback()
    if isinstance(exc, approvals.EditRefused):  # which argument to change, for programs
        fields = [{"field": f"input.{name}" if name else "input", "problem": p} for name, p in exc.problems.items()]
        return jsonify(error=exc.code, message=exc.message, fields=fields), exc.status
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
    current_app.logger.exception("unexpected API error")
    return json_error(500, "internal_error", "Something went wrong on our side; nothing was changed.")


def conversation_or_404(conversation_id: int) -> Conversation:
    return conversations.find(db.session, g.user, conversation_id)


# --- conversations ------------------------------------------------------------------------------


@bp.post("/conversations")
@api_roles("agent")
def create_conversation():
    sent = body(StartConversation)
    conversation = conversations.start(db.session, g.user, sent.message)
    return answer(ConversationState.of(conversation), 201)


@bp.post("/conversations/<int:conversation_id>/messages")
@api_roles("agent")
def post_message(conversation_id: int):
    sent = body(PostMessage)
    conversation = conversation_or_404(conversation_id)
    conversations.post_message(db.session, g.user, conversation, sent.message)
    return answer(ConversationState.of(conversation), 202)


@bp.get("/conversations/<int:conversation_id>")
@api_roles(*ROLES)
def get_conversation(conversation_id: int):
    return answer(conversation_view(conversation_or_404(conversation_id)))


@bp.post("/conversations/<int:conversation_id>/cancel")
@api_roles("agent", "reviewer", "admin")
def cancel_conversation(conversation_id: int):
    conversation = conversation_or_404(conversation_id)
    conversations.cancel(db.session, g.user, conversation)
    return answer(CancelRequested.of(conversation), 202)


@bp.post("/conversations/<int:conversation_id>/retry")
@api_roles("agent", "reviewer", "admin")
def retry_conversation(conversation_id: int):
    conversation = conversation_or_404(conversation_id)
    conversations.retry(db.session, g.user, conversation)
    return answer(ConversationState.of(conversation), 202)


@bp.post("/conversations/<int:conversation_id>/budget")
@api_roles("reviewer", "admin")
def extend_budget(conversation_id: int):
    sent = body(ExtendBudget)
    conversation = conversation_or_404(conversation_id)
    conversations.extend_budget(db.session, g.user, conversation, sent.moves)
    return answer(BudgetExtended.of(conversation, move_budget=conversation.move_budget), 202)


# --- approvals ----------------------------------------------------------------------------------


@bp.get("/approvals")
@api_roles("reviewer")
def list_approvals():
    calls = db.session.scalars(approvals.pending(g.user).limit(200))
    return answer(ApprovalList(approvals=[ToolCallView.of(call) for call in calls]))


@bp.get("/approvals/<int:tool_call_id>")
@api_roles("reviewer")
def get_approval(tool_call_id: int):
    call = approvals.find_call(db.session, g.user, tool_call_id)
    waiting = call.status == CallStatus.AWAITING_APPROVAL
    return answer(ApprovalView.of_call(call, approvals.review(db.session, call) if waiting else None))


@bp.post("/approvals/<int:tool_call_id>")
@api_roles("reviewer")
def decide_approval(tool_call_id: int):
    sent = body(DecideApproval)
    call = approvals.decide(
        db.session,
        g.user,
        tool_call_id,
        sent.decision,
        sent.reason,
        arguments_seen=sent.arguments_hash,
        edited_input=sent.edited(),
    )
    return answer(ToolCallView.of(call))


# --- tasks --------------------------------------------------------------------------------------


@bp.post("/tool-calls/<int:tool_call_id>/input")
@api_roles("agent", "reviewer", "admin")
def give_input(tool_call_id: int):
    sent = body(GiveInput)
    call = conversations.give_input(db.session, g.user, tool_call_id, sent.input)
    return answer(ToolCallView.of(call), 202)


# --- audit log ----------------------------------------------------------------------------------


@bp.get("/audit")
@api_roles("auditor", "admin")
def audit_events():
    return jsonify(audit_queries.api_page(db.session, g.user, request.args))


# --- API tokens ---------------------------------------------------------------------------------


@bp.get("/tokens")
@api_roles(*ROLES)
def list_tokens():
    """The caller's own tokens; an admin may ask for a person of their tenant's with ?user_id=."""
    user_id = request.args.get("user_id", "").strip()
    if user_id and not user_id.isdigit():
        raise Refused(422, "invalid_field", '"user_id" must be the number of a person of your organisation.')
    owner = accounts.tenant_user(db.session, g.user, int(user_id)) if user_id else g.user
    return answer(TokenList(tokens=[TokenView.of(row, token_state(row)) for row in accounts.tokens(db.session, owner)]))


@bp.delete("/tokens/<int:token_id>")
@api_roles(*ROLES)
def revoke_token(token_id: int):
    """Revoke one of the caller's tokens (admins: of their tenant's people) for good; revoking one that is
    revoked already answers the same."""
    if request.get_data():
        body(RevokeToken)
    row, _ = accounts.revoke(db.session, g.user, token_id)
    return answer(TokenView.of(row, token_state(row)))


# --- shapes -------------------------------------------------------------------------------------


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
    )
