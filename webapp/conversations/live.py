"""Server-sent events: pages follow a conversation or their tenant's approvals live.

Redis pub/sub carries small signals ("text", "changed", "approvals-changed"); the page re-fetches
the fragment a signal concerns, so the stream itself renders nothing but a task's progress (the
card's small template, from the event alone: it reads no database). Every stream of a process
shares one subscription (webapp/runtime/live_hub.py), capped per person and per process. A stream
touches the database only to ask, every CHECK_SECONDS, whether its person is still signed in (not
disabled, sessions not ended), and ends when they are not.
"""

from __future__ import annotations

import html
import json
import re
import time

import redis
from flask import Blueprint, Flask, Response, abort, current_app
from flask_login import current_user
from sqlalchemy.exc import SQLAlchemyError

from webapp.conversations import actions as conversations
from webapp.refusals import Refusal
from webapp.runtime.extensions import db
from webapp.runtime.live_hub import INTERRUPTED, TooManyStreams
from webapp.runtime.services import services
from webapp.web.errors import status_of
from webapp.web.security import session_key, signed_in, still_signed_in

bp = Blueprint("live", __name__, url_prefix="/live")

STREAM_SECONDS = 300  # then the browser reconnects (EventSource does so by itself)
KEEPALIVE_SECONDS = 5  # also how soon a closed page is noticed and its place under the caps freed
CHECK_SECONDS = 3  # how soon a stream ends once its person is disabled or their sessions ended
TASK_PROGRESS = "conversations/_task_progress.html"  # a task's progress on its card, live or drawn


@bp.get("/tenant")
@signed_in
def tenant():
    return _stream([services().live_events.tenant_channel(current_user.tenant_id)])


@bp.get("/conversations/<int:conversation_id>")
@signed_in
def conversation(conversation_id: int):
    try:
        found = conversations.find(db.session, current_user, conversation_id)
    except Refusal as exc:
        abort(status_of(exc), description=exc.message)
    return _stream([services().live_events.conversation_channel(found.id)])


def _stream(channels: list[str]) -> Response:
    app, user_id, session_id, key = (
        current_app._get_current_object(),
        current_user.id,
        current_user.get_id(),
        session_key(),
    )
    # A stream lives for minutes: it must not hold a database session, nor SQLite's write lock while
    # it waits for Redis to confirm its subscription (every other request would wait behind it).
    db.session.remove()
    try:
        listener = services().live_events.hub.listen(user_id, channels)
    except TooManyStreams as exc:  # EventSource does not retry a 429: the page stays as it is
        return Response(f"{exc}\n", status=429, mimetype="text/plain", headers={"Retry-After": "60"})
    except (redis.RedisError, OSError):
        return Response(
            "event: unavailable\ndata: live updates are unavailable\n\n", mimetype="text/event-stream", status=200
        )

    def events():
        yield "retry: 3000\n\n"
        now = time.monotonic()
        deadline, keepalive_at, check_at = now + STREAM_SECONDS, now + KEEPALIVE_SECONDS, now + CHECK_SECONDS
        try:
            while now < deadline:
                message = listener.get(timeout=max(0.0, min(keepalive_at, check_at) - now))
                now = time.monotonic()
                if message is INTERRUPTED:
                    yield "event: unavailable\ndata: live updates were interrupted\n\n"
                    return
                if message is not None:
                    yield sse_event(json.loads(message), app)
                    keepalive_at = now + KEEPALIVE_SECONDS
                elif now >= keepalive_at:
                    yield ": keepalive\n\n"
                    keepalive_at = now + KEEPALIVE_SECONDS
                if now >= check_at:
                    if not _still_signed_in(app, session_id, key):
                        return  # the browser reconnects, and is sent to sign in
                    check_at = now + CHECK_SECONDS
        finally:
            listener.close()

    return Response(
        events(), mimetype="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


def _still_signed_in(app: Flask, session_id: str, key: str | None) -> bool:
    """Whether the stream's person may still read it, asked as every request asks, on a short
    transaction of its own (the stream holds no session in between); no answer ends the stream too."""
    with app.app_context():
        try:
            return still_signed_in(session_id, key)
        except SQLAlchemyError:
            return False
        finally:
            db.session.remove()


def sse_event(event: dict, app: Flask | None = None) -> str:
    """One SSE message named by the event type. Text deltas and tool starts travel as escaped HTML for
    htmx to put in the page, and a task's progress as its card's markup, named for its call
    ("task-<id>", rendered with `app`'s templates); other events are signals with a JSON body.

    A reader ends a line at CRLF, LF or a lone CR, so text from the model (which may hold any of them)
    must never start a line of its own: "\r\nevent: tool_start" would be an event. A carriage return
    travels as the character reference &#13; (the page gets it back), and each remaining line is a
    `data:` line of the same event (the reader joins them with LF)."""
    name = event.get("type", "message")
    if name == "text":
        data = _html(event["text"])
    elif name == "tool_start":
        data = f"calling {_html(event['name'])}…"
    elif name == "task" and app is not None:
        name = f"task-{int(event['tool_call_id'])}"
        data = app.jinja_env.get_template(TASK_PROGRESS).render(task=event).replace("\r", "&#13;")
    else:
        data = json.dumps(event)
    lines = "".join(f"data: {line}\n" for line in _LINE_END.split(data))
    return f"event: {name}\n{lines}\n"


_LINE_END = re.compile(r"\r\n|\r|\n")  # every line end of the SSE format


def _html(text: str) -> str:
    return html.escape(text).replace("\r", "&#13;")
