"""Server-sent events: pages follow a conversation or their tenant's approvals live.

Redis pub/sub carries small signals ("text", "changed", "approvals-changed"); the page re-fetches
the fragment a signal concerns, so the stream itself never renders or touches the database. Every
stream of a process shares one subscription (webapp/runtime/live_hub.py), capped per person and per
process.
"""

from __future__ import annotations

import html
import json
import time

import redis
from flask import Blueprint, Response, abort
from flask_login import current_user

from webapp.conversations import actions as conversations
from webapp.runtime.extensions import db
from webapp.runtime.live_hub import INTERRUPTED, TooManyStreams
from webapp.runtime.services import services
from webapp.web.errors import Refused
from webapp.web.security import signed_in

bp = Blueprint("live", __name__, url_prefix="/live")

STREAM_SECONDS = 300  # then the browser reconnects (EventSource does so by itself)
KEEPALIVE_SECONDS = 5  # also how soon a closed page is noticed and its place under the caps freed


@bp.get("/tenant")
@signed_in
def tenant():
    return _stream([services().dispatcher.tenant_channel(current_user.tenant_id)])


@bp.get("/conversations/<int:conversation_id>")
@signed_in
def conversation(conversation_id: int):
    try:
        found = conversations.find(db.session, current_user, conversation_id)
    except Refused as exc:
        abort(exc.status, description=exc.message)
    return _stream([services().dispatcher.conversation_channel(found.id)])


def _stream(channels: list[str]) -> Response:
    user_id = current_user.id
    # A stream lives for minutes: it must not hold a database session, nor SQLite's write lock while
    # it waits for Redis to confirm its subscription (every other request would wait behind it).
    db.session.remove()
    try:
        listener = services().dispatcher.live.listen(user_id, channels)
    except TooManyStreams as exc:  # EventSource does not retry a 429: the page stays as it is
        return Response(f"{exc}\n", status=429, mimetype="text/plain", headers={"Retry-After": "60"})
    except (redis.RedisError, OSError):
        return Response(
            "event: unavailable\ndata: live updates are unavailable\n\n", mimetype="text/event-stream", status=200
        )

    def events():
        yield "retry: 3000\n\n"
        deadline = time.monotonic() + STREAM_SECONDS
        try:
            while time.monotonic() < deadline:
                message = listener.get(timeout=KEEPALIVE_SECONDS)
                if message is None:
                    yield ": keepalive\n\n"
                elif message is INTERRUPTED:
                    yield "event: unavailable\ndata: live updates were interrupted\n\n"
                    return
                else:
                    yield sse_event(json.loads(message))
        finally:
            listener.close()

    return Response(
        events(), mimetype="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


def sse_event(event: dict) -> str:
    """One SSE message named by the event type. Text deltas and tool starts travel as escaped HTML for
    htmx to put in the page; other events are signals with a JSON body."""
    name = event.get("type", "message")
    if name == "text":
        data = html.escape(event["text"])
    elif name == "tool_start":
        data = f"calling {html.escape(event['name'])}…"
    else:
        data = json.dumps(event)
    lines = "".join(f"data: {line}\n" for line in data.split("\n"))
    return f"event: {name}\n{lines}\n"
