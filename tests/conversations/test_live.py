"""The live streams (Server-Sent Events fed by Redis pub/sub) on a real Redis."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from tests.clients import session_as
from tests.conftest import wait_until
from webapp.config import Config
from webapp.runtime.live_events import LiveEvents
from webapp.runtime.services import services

AGENT = "agent@acme.test"


def same_server_other_database(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme == "unix":  # the embedded server: unix:///path?db=N
        query = dict(parse_qsl(parts.query))
        query["db"] = str((int(query.get("db", 0)) + 1) % 16)
        return f"unix://{parts.path}?{urlencode(query)}"
    return urlunsplit(parts._replace(path=f"/{(int(parts.path.strip('/') or 0) + 1) % 16}"))


def test_a_live_stream_hears_its_own_redis_database_only(app, api, env):
    """Pub/sub channels span a Redis server's databases: a deployment on database 1 must never
    stream another's conversation 1 (staging beside production, or parallel test runs)."""
    conversation_id = api.as_(AGENT).post("/api/conversations", json={"message": "hello"}).json["id"]
    ours = services().live_events
    neighbour = LiveEvents(Config.from_env({**env, "REDIS_URL": same_server_other_database(env["REDIS_URL"])}))

    stream = session_as(app, AGENT).get(f"/live/conversations/{conversation_id}", buffered=False)
    events = iter(stream.response)
    assert next(events) == b"retry: 3000\n\n"
    channel = ours.conversation_channel(conversation_id)
    wait_until(lambda: dict(ours.redis.pubsub_numsub(channel)).get(channel.encode()), 10, "the stream to subscribe")
    neighbour.publish(conversation_id, {"type": "text", "text": "a refund of another deployment"})
    ours.publish(conversation_id, {"type": "text", "text": "the words of this conversation"})
    first = next(event for event in events if not event.startswith(b":"))  # past keepalives
    stream.close()
    assert first == b"event: text\ndata: the words of this conversation\n\n"


def test_a_tasks_progress_reaches_the_stream_as_its_cards_markup_with_the_text_escaped(app, api):
    conversation_id = api.as_(AGENT).post("/api/conversations", json={"message": "hello"}).json["id"]
    live = services().live_events
    stream = session_as(app, AGENT).get(f"/live/conversations/{conversation_id}", buffered=False)
    events = iter(stream.response)
    assert next(events) == b"retry: 3000\n\n"
    channel = live.conversation_channel(conversation_id)
    subscribed = lambda: dict(live.redis.pubsub_numsub(channel)).get(channel.encode())  # noqa: E731
    wait_until(subscribed, 10, "the stream to subscribe")
    live.task_progress(conversation_id, 77, "working", "Exported <b>invoices</b> (2 of 3).", 0.5)
    event = next(event for event in events if not event.startswith(b":")).decode()
    stream.close()
    assert event.startswith("event: task-77\n")
    assert "Exported &lt;b&gt;invoices&lt;/b&gt; (2 of 3)." in event and "<b>" not in event
    assert '<progress max="1" value="0.5"' in event and "50%" in event
    assert live.live_tasks([77, 78]) == {
        77: {
            "type": "task",
            "tool_call_id": 77,
            "status": "working",
            "message": "Exported <b>invoices</b> (2 of 3).",
            "progress": 0.5,
        }
    }
