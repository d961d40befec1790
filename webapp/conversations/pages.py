"""The support agent's pages: the conversations list and the chat page.

One rendering path: the pages include their fragments, and htmx requests get the same fragments.
"""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, request, url_for
from flask_login import current_user
from sqlalchemy import select

from webapp.agent.loop import KNOWN_STOPS
from webapp.agent.states import IDLE
from webapp.conversations import actions as conversations
from webapp.conversations.transcript import transcript
from webapp.models import Conversation, ToolCall, User
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.web import htmx
from webapp.web.errors import Refused
from webapp.web.pagination import BadCursor, Page, keyset_page
from webapp.web.security import roles_required

bp = Blueprint("conversations", __name__, url_prefix="/conversations")

EVERYONE = ("agent", "reviewer", "auditor", "admin")
PAGE_SIZE = 25
STATUS_LABELS = {
    "queued": "working",
    "running": "working",
    "awaiting_approval": "waiting for approval",
    "awaiting_task": "waiting on a task",
    "completed": "completed",
    "cancelled": "stopped",
    "failed": "failed",
    "budget_exhausted": "budget exhausted",
}


def _conversation(conversation_id: int) -> Conversation:
    try:
        return conversations.find(db.session, current_user, conversation_id)
    except Refused as exc:
        abort(exc.status, description=exc.message)


def _render_conversation(conversation: Conversation, status: int = 200, keep_draft: bool = True):
    """The chat page, or for htmx only the conversation fragment (same template either way)."""
    context = {
        "keep_draft": keep_draft,
        "conversation": conversation,
        "entries": transcript(conversation),
        "status_labels": STATUS_LABELS,
        "unknown_stop": conversation.stop_reason not in KNOWN_STOPS | {None},
        "tools": services().tools_for(db.session, conversation.tenant_id),
        "owner": db.session.get(User, conversation.user_id),
        "composer_open": conversation.status in IDLE and conversation.user_id == current_user.id,
        "partial_answer": services().dispatcher.partial_answer(conversation.id)
        if conversation.status in ("queued", "running")
        else "",
        "stopped_by": db.session.get(User, conversation.cancel_requested_by_id)
        if conversation.cancel_requested_by_id
        else None,
        "task_forms": True,
    }
    return htmx.render("conversations/show.html", "conversations/_conversation.html", status, **context)


def _refused_here(conversation: Conversation, exc: Refused):
    db.session.rollback()
    return htmx.refused(
        exc,
        lambda status: _render_conversation(conversation, status),
        url_for("conversations.show", conversation_id=conversation.id),
    )


@bp.get("")
@roles_required(*EVERYONE)
def index():
    query = (request.args.get("q") or "").strip()[:200]
    statement = select(Conversation).where(conversations.visible_to(current_user))
    if query:
        statement = statement.where(Conversation.title.icontains(query, autoescape=True))
    problem = None
    try:
        page = keyset_page(
            db.session,
            statement,
            (Conversation.updated_at, Conversation.id),
            request.args.get("cursor"),
            PAGE_SIZE,
            key_values=lambda conversation: (conversation.updated_at, conversation.id),
        )
    except BadCursor as exc:
        problem, page = str(exc), Page([], None)
    return htmx.render(
        "conversations/index.html",
        "conversations/_list.html",
        conversations=page.rows,
        query=query,
        next_cursor=page.next_cursor,
        problem=problem,
        status_labels=STATUS_LABELS,
    )


@bp.post("")
@roles_required("agent")
def create():
    try:
        conversation = conversations.start(db.session, current_user, request.form.get("message", ""))
    except Refused as exc:
        db.session.rollback()
        flash(exc.message, "error")
        return redirect(url_for("conversations.index"), code=303)
    return redirect(url_for("conversations.show", conversation_id=conversation.id), code=303)


@bp.get("/<int:conversation_id>")
@roles_required(*EVERYONE)
def show(conversation_id: int):
    return _render_conversation(_conversation(conversation_id))


@bp.post("/<int:conversation_id>/messages")
@roles_required("agent")
def post_message(conversation_id: int):
    conversation = _conversation(conversation_id)
    try:
        conversations.post_message(db.session, current_user, conversation, request.form.get("message", ""))
    except Refused as exc:
        return _refused_here(conversation, exc)
    return _after_action(conversation, keep_draft=False)  # sent: the box empties


@bp.post("/<int:conversation_id>/cancel")
@roles_required("agent", "reviewer", "admin")
def cancel(conversation_id: int):
    conversation = _conversation(conversation_id)
    try:
        conversations.cancel(db.session, current_user, conversation)
    except Refused as exc:
        return _refused_here(conversation, exc)
    flash("Stopping: open tool calls are settled as cancelled.", "info")
    return _after_action(conversation)


@bp.post("/<int:conversation_id>/retry")
@roles_required("agent", "reviewer", "admin")
def retry(conversation_id: int):
    conversation = _conversation(conversation_id)
    try:
        conversations.retry(db.session, current_user, conversation)
    except Refused as exc:
        return _refused_here(conversation, exc)
    return _after_action(conversation)


@bp.post("/<int:conversation_id>/budget")
@roles_required("reviewer", "admin")
def extend_budget(conversation_id: int):
    conversation = _conversation(conversation_id)
    try:
        extra = int(request.form.get("moves", "10"))
    except ValueError:
        extra = -1
    try:
        conversations.extend_budget(db.session, current_user, conversation, extra)
    except Refused as exc:
        return _refused_here(conversation, exc)
    flash(f"Budget extended to {conversation.move_budget} moves.", "info")
    return _after_action(conversation)


@bp.post("/<int:conversation_id>/tool-calls/<int:tool_call_id>/input")
@roles_required("agent", "reviewer", "admin")
def give_input(conversation_id: int, tool_call_id: int):
    conversation = _conversation(conversation_id)
    if db.session.scalar(select(ToolCall.conversation_id).where(ToolCall.id == tool_call_id)) != conversation.id:
        abort(404, description=f"No tool call {tool_call_id} in this conversation.")
    try:
        conversations.give_input(db.session, current_user, tool_call_id, request.form.get("input", ""))
    except Refused as exc:
        return _refused_here(conversation, exc)
    flash("Sent; the tool is checking it.", "info")
    return _after_action(conversation)


def _after_action(conversation: Conversation, keep_draft: bool = True):
    if htmx.is_htmx():
        return _render_conversation(conversation, keep_draft=keep_draft)
    return redirect(url_for("conversations.show", conversation_id=conversation.id), code=303)
