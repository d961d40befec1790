"""A conversation's events for programs, as server-sent events (`GET /api/conversations/<id>/events`):
the same events, with the same bodies and ids, as the tenant's event webhooks send (webapp/webhooks/),
for one conversation, and the assistant's reply as it is written.

Each event is the conversation's audit event read again, so a stream is resumable: its SSE `id` is
the webhook's `webhook-id` (`evt_<n>`), and a client that reconnects with `Last-Event-ID` (EventSource
does so by itself) gets every event after it, then the new ones. Without one, it gets the
conversation's events from the start. The reply's text travels as `text` events without an id: they
are what is being written now, never replayed (the conversation, read with GET, holds the reply).

The stream holds no database session while it waits. It listens to the conversation's live channel
(webapp/runtime/live_hub.py, the pages' own) and reads the audit log again when something changed, or
every KEEPALIVE_SECONDS in case a signal was lost; every CHECK_SECONDS it asks whether the token is
still good, and it ends after STREAM_SECONDS (the client reconnects where it was).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import redis
from flask import Flask, Response
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from webapp import webhooks
from webapp.conversations.actions import ConversationRefused
from webapp.identity import user_for_token
from webapp.models import AuditEvent, Conversation
from webapp.refusals import Refusal
from webapp.runtime.extensions import db
from webapp.runtime.live_hub import INTERRUPTED, Listener, TooManyStreams
from webapp.runtime.services import services

STREAM_SECONDS = 300
KEEPALIVE_SECONDS = 5
CHECK_SECONDS = 10
REPLAY_BATCH = 500
_EVENT_ID = re.compile(r"^evt_([0-9]{1,18})$")


def last_seen(header: str | None) -> int:
    """The audit event id a Last-Event-ID names (0: none, from the start); a 422 for one that is not
    an id this stream sends."""
    if header is None or header.strip() == "":
        return 0
    found = _EVENT_ID.match(header.strip())
    if found is None:
        raise ConversationRefused(
            "invalid", "invalid_field", "Last-Event-ID must be the id of an event this stream sent, like evt_42."
        )
    return int(found.group(1))


def events_after(session, tenant_id: int, conversation_id: int, after: int) -> list[tuple[int, str]]:
    """(audit event id, SSE message) of the conversation's events after `after`, oldest first."""
    rows = session.scalars(
        select(AuditEvent)
        .where(
            AuditEvent.chain == str(tenant_id),
            AuditEvent.conversation_id == conversation_id,
            AuditEvent.action.in_(webhooks.ACTIONS),
            AuditEvent.id > after,
        )
        .order_by(AuditEvent.id)
        .limit(REPLAY_BATCH)
    )
    found = []
    for event in rows:
        made = webhooks.event_of(event)
        if made is not None:
            event_type, data = made
            body = webhooks.envelope(event_type, event, data)
            found.append((event.id, f"id: {webhooks.event_id(event)}\nevent: {event_type}\ndata: {body}\n\n"))
    return found


def follow(user_id: int, conversation_id: int, too_many: Refusal) -> Listener:
    """A listener of the conversation's live channel (the pages' own); `too_many` is raised instead
    when a cap on open streams is reached. Redis errors pass through: what to do then is the caller's."""
    live = services().live_events
    try:
        return live.hub.listen(user_id, [live.conversation_channel(conversation_id)])
    except TooManyStreams:
        raise too_many from None


def stream(app: Flask, conversation: Conversation, user_id: int, token: str, after: int) -> Response:
    """The response that streams the conversation's events after the audit event `after`."""
    conversation_id, tenant_id = conversation.id, conversation.tenant_id
    db.session.remove()  # a stream lives for minutes: it holds no session (nor SQLite's write lock)
    too_many = "Too many live streams are open, yours or this server's; close one and try again."
    try:
        listener = follow(user_id, conversation_id, ConversationRefused("too_many", "too_many_streams", too_many))
    except (redis.RedisError, OSError):
        raise ConversationRefused(
            "unavailable", "unavailable", "Live events are unavailable now; try again in a minute."
        ) from None

    def read(since: int) -> list[tuple[int, str]]:
        """The events after `since` (none when the database cannot answer now: the next look will)."""
        with app.app_context():
            try:
                return events_after(db.session, tenant_id, conversation_id, since)
            except SQLAlchemyError:
                return []
            finally:
                db.session.remove()

    def token_holds() -> bool:
        with app.app_context():
            try:
                return user_for_token(db.session, token) is not None
            except SQLAlchemyError:
                return False
            finally:
                db.session.remove()

    def messages() -> Iterator[str]:
        nonlocal after
        yield "retry: 3000\n\n"
        now = time.monotonic()
        deadline, keepalive_at, check_at = now + STREAM_SECONDS, now + KEEPALIVE_SECONDS, now + CHECK_SECONDS
        look = True  # the audit log may hold something new
        try:
            while now < deadline:
                if look:
                    for event_id, message in read(after):
                        after = event_id
                        yield message
                    look = False
                    keepalive_at = time.monotonic() + KEEPALIVE_SECONDS
                signal = listener.get(timeout=max(0.0, min(keepalive_at, check_at) - time.monotonic()))
                now = time.monotonic()
                if signal is INTERRUPTED:
                    yield "event: unavailable\ndata: {}\n\n"
                    return
                if signal is not None:
                    event = json.loads(signal)
                    if event.get("type") == "text":
                        yield f"event: text\ndata: {json.dumps({'text': event['text']})}\n\n"
                    else:
                        look = True
                elif now >= keepalive_at:
                    yield ": keepalive\n\n"
                    look = True  # a lost signal costs at most this long
                if now >= check_at:
                    if not token_holds():
                        return
                    check_at = now + CHECK_SECONDS
        finally:
            listener.close()

    response = Response(
        messages(), mimetype="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
    response.call_on_close(listener.close)  # (a response closed before it was read never ran messages())
    return response
