"""The support agent's pages: the conversations list and the chat page.

One rendering path: the pages include their fragments, and htmx requests get the same fragments.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Callable

from flask import Blueprint, abort, flash, has_request_context, redirect, request, send_file, url_for
from flask_login import current_user
from sqlalchemy import select

from webapp.agent.loop import KNOWN_STOPS
from webapp.agent.states import IDLE
from webapp.conversations import actions as conversations
from webapp.conversations.cards import card
from webapp.conversations.transcript import transcript
from webapp.models import Conversation, ToolCall, User
from webapp.refusals import Refusal
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.tools.files import tool_file_path
from webapp.web import htmx
from webapp.web.errors import status_of
from webapp.web.pagination import keyset_page, page_or_problem
from webapp.web.security import roles_required

bp = Blueprint("conversations", __name__, url_prefix="/conversations")

QUEUE_DOWN = (
    "Saved. The assistant's work queue cannot be reached right now; the assistant picks this up by "
    "itself as soon as the queue is back, so there is no need to send it again."
)


@conversations.saved_while_queue_down.connect
def _say_the_queue_is_down(conversation_id: int) -> None:
    """A person's change was saved but its move waits for Redis: every page says so (the chat's, the
    decision page's); the API's callers see the conversation still queued."""
    if has_request_context() and request.blueprint != "api":
        flash(QUEUE_DOWN, "info")


EVERYONE = ("agent", "reviewer", "auditor", "admin")
PAGE_SIZE = 25
STATUS_LABELS = conversations.STATUS_LABELS


def _conversation(conversation_id: int) -> Conversation:
    try:
        return conversations.find(db.session, current_user, conversation_id)
    except Refusal as exc:
        abort(status_of(exc), description=exc.message)


def _render_conversation(
    conversation: Conversation,
    status: int = 200,
    keep_draft: bool = True,
    draft: str = "",
    composer_error: str | None = None,
):
    """The chat page, or for htmx only the conversation fragment (same template either way). `draft`
    and `composer_error`: a refused message, kept in the composer with the reason beside it."""
    entries = transcript(conversation)
    working = [entry.call.id for entry in entries if entry.kind == "tool" and entry.call.status == "awaiting_task"]
    context = {
        "keep_draft": keep_draft,
        "draft": draft,
        "composer_error": composer_error,
        "conversation": conversation,
        "entries": entries,
        "live_tasks": services().live_events.live_tasks(working),
        "status_labels": STATUS_LABELS,
        "unknown_stop": conversation.stop_reason not in KNOWN_STOPS | {None},
        "tools": services().tools_for(db.session, conversation.tenant_id),
        "owner": db.session.get(User, conversation.user_id),
        "composer_open": conversation.status in IDLE and conversation.user_id == current_user.id,
        "partial_answer": services().live_events.partial_answer(conversation.id)
        if conversation.status in ("queued", "running")
        else "",
        "stopped_by": db.session.get(User, conversation.cancel_requested_by_id)
        if conversation.cancel_requested_by_id
        else None,
        "task_forms": True,
    }
    return htmx.render("conversations/show.html", "conversations/_conversation.html", status, **context)


def _refused_here(conversation: Conversation, exc: Refusal):
    db.session.rollback()
    return htmx.refused(
        exc,
        lambda status: _render_conversation(conversation, status),
        url_for("conversations.show", conversation_id=conversation.id),
    )


@bp.get("")
@roles_required(*EVERYONE)
def index():
    return _render_index()


def _render_index(status: int = 200, draft: str = "", composer_error: str | None = None):
    """The conversations list; `draft` and `composer_error`: a refused first message, kept in the box
    with the reason beside it."""
    query = (request.args.get("q") or "").strip()[:200]
    # (a bulk run's conversations are on its own page: a run of thousands would bury the rest)
    statement = select(Conversation).where(conversations.visible_to(current_user), Conversation.run_id.is_(None))
    if query:
        statement = statement.where(Conversation.title.icontains(query, autoescape=True))
    page, problem = page_or_problem(
        lambda: keyset_page(
            db.session,
            statement,
            (Conversation.updated_at, Conversation.id),
            request.args.get("cursor"),
            PAGE_SIZE,
            key_values=lambda conversation: (conversation.updated_at, conversation.id),
        )
    )
    return htmx.render(
        "conversations/index.html",
        "conversations/_list.html",
        status,
        conversations=page.rows,
        query=query,
        next_cursor=page.next_cursor,
        problem=problem,
        status_labels=STATUS_LABELS,
        draft=draft,
        composer_error=composer_error,
    )


@bp.post("")
@roles_required("agent")
def create():
    text = request.form.get("message", "")
    try:
        conversation = conversations.start(db.session, current_user, text)
    except Refusal as exc:
        db.session.rollback()
        return _render_index(status_of(exc), draft=text, composer_error=exc.message)
    return redirect(url_for("conversations.show", conversation_id=conversation.id), code=303)


@bp.get("/<int:conversation_id>")
@roles_required(*EVERYONE)
def show(conversation_id: int):
    return _render_conversation(_conversation(conversation_id))


@bp.post("/<int:conversation_id>/messages")
@roles_required("agent")
def post_message(conversation_id: int):
    conversation = _conversation(conversation_id)
    text = request.form.get("message", "")
    try:
        conversations.post_message(db.session, current_user, conversation, text)
    except Refusal as exc:
        # The message stays in the composer with the reason beside it, for htmx and a plain post alike
        # (a redirect would lose it).
        db.session.rollback()
        return _render_conversation(conversation, status_of(exc), draft=text, composer_error=exc.message)
    return _after_action(conversation, keep_draft=False)  # sent: the box empties


@bp.post("/<int:conversation_id>/cancel")
@roles_required("agent", "reviewer", "admin")
def cancel(conversation_id: int):
    return _change(
        conversation_id,
        lambda conversation: conversations.cancel(db.session, current_user, conversation),
        "Stopping: open tool calls are settled as cancelled.",
    )


@bp.get("/<int:conversation_id>/tool-calls/<int:tool_call_id>/file")
@roles_required(*EVERYONE)
def download(conversation_id: int, tool_call_id: int):
    """The file a call made (an export), for whoever may see its conversation. Anything else is not
    found: another tenant's conversation or call, a conversation this person may not see, a call that
    made no file, a file gone. The path comes from the call's own result, never from the request."""
    try:
        conversation = conversations.find(db.session, current_user, conversation_id)
    except Refusal:
        abort(404, description="No such file in your account.")
    call = db.session.scalar(
        select(ToolCall).where(ToolCall.id == tool_call_id, ToolCall.conversation_id == conversation.id)
    )
    name = card(call, [], services().tools_for(db.session, conversation.tenant_id)).file if call is not None else None
    path = tool_file_path(services().config.export_dir, conversation.tenant_id, name) if name else None
    if path is None or not path.is_file():
        abort(404, description="No such file in your account; it may have been removed.")
    return send_file(
        path,
        mimetype=mimetypes.guess_type(name)[0] or "application/octet-stream",
        as_attachment=True,
        download_name=name,
    )


@bp.post("/<int:conversation_id>/retry")
@roles_required("agent", "reviewer", "admin")
def retry(conversation_id: int):
    return _change(conversation_id, lambda conversation: conversations.retry(db.session, current_user, conversation))


@bp.post("/<int:conversation_id>/budget")
@roles_required("reviewer", "admin")
def extend_budget(conversation_id: int):
    try:
        extra = int(request.form.get("moves", "10"))
    except ValueError:
        extra = -1
    return _change(
        conversation_id,
        lambda conversation: conversations.extend_budget(db.session, current_user, conversation, extra),
        lambda conversation: f"Budget extended to {conversation.move_budget} moves.",
    )


@bp.post("/<int:conversation_id>/tool-calls/<int:tool_call_id>/input")
@roles_required("agent", "reviewer", "admin")
def give_input(conversation_id: int, tool_call_id: int):
    def give(conversation: Conversation) -> None:
        if db.session.scalar(select(ToolCall.conversation_id).where(ToolCall.id == tool_call_id)) != conversation.id:
            abort(404, description=f"No tool call {tool_call_id} in this conversation.")
        conversations.give_input(db.session, current_user, tool_call_id, request.form.get("input", ""))

    return _change(conversation_id, give, "Sent; the tool is checking it.")


def _change(
    conversation_id: int,
    change: Callable[[Conversation], object],
    done: str | Callable[[Conversation], str] = "",
):
    """Makes `change` to the conversation. Refused: the reason on its page; done: `done` (words, or
    the words for the conversation as it is now) flashed, and the page after it."""
    conversation = _conversation(conversation_id)
    try:
        change(conversation)
    except Refusal as exc:
        return _refused_here(conversation, exc)
    words = done(conversation) if callable(done) else done
    if words:
        flash(words, "info")
    return _after_action(conversation)


def _after_action(conversation: Conversation, keep_draft: bool = True):
    if htmx.is_htmx():
        return _render_conversation(conversation, keep_draft=keep_draft)
    return redirect(url_for("conversations.show", conversation_id=conversation.id), code=303)
