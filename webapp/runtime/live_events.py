"""Live events: what the pages open now hear through Redis pub/sub (the streamed answer, a call's
status, a task's progress, "changed" after a commit), the answer streamed so far and the tasks'
last progress kept for a page drawn mid-way, and the channels' names. All of it is best effort: a
page that misses an event catches up from the database. The process's one subscription that feeds
the live pages is live_hub.py; the queue is queue.py."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import cached_property

import redis

from webapp.config import Config
from webapp.runtime.live_hub import LiveHub
from webapp.runtime.queue import redis_connection

log = logging.getLogger(__name__)


def _partial_key(conversation_id: int) -> str:
    """Where the answer streaming now is kept, so a page opened mid-answer shows it so far."""
    return f"desk:partial:{conversation_id}"


def _task_key(tool_call_id: int) -> str:
    """Where a background job's last progress is kept, so a page drawn between two of the loop's looks
    at the task shows the progress its live events already showed."""
    return f"desk:task:{tool_call_id}"


class LiveEvents:
    """Publishes one app's live events and keeps what a page opened late shows. `connect` gives the
    process's Redis (the dispatcher's, so both share one pool); by default a connection of its own."""

    def __init__(self, config: Config, connect: Callable[[], redis.Redis] | None = None) -> None:
        self.config = config
        self._connect = connect or (lambda: redis_connection(config))

    @cached_property
    def redis(self) -> redis.Redis:
        return self._connect()

    @cached_property
    def hub(self) -> LiveHub:
        """The process's one subscription for its live pages."""
        return LiveHub(lambda: self.redis, self.config.live_streams_per_user, self.config.live_streams_per_process)

    @cached_property
    def _channel_prefix(self) -> str:
        """Pub/sub channels are shared by every database of a Redis server, unlike keys: apps on
        one server with different database numbers (staging beside production, parallel test runs)
        would hear each other's live events, so a channel's name carries the database number."""
        return f"desk:{self.redis.connection_pool.connection_kwargs.get('db', 0)}:"

    def conversation_channel(self, conversation_id: int) -> str:
        return f"{self._channel_prefix}conversation:{conversation_id}"

    def tenant_channel(self, tenant_id: int) -> str:
        return f"{self._channel_prefix}tenant:{tenant_id}"

    def publish(self, conversation_id: int, *events: dict) -> None:
        """Best effort: a page that misses an event catches up from the database. Several events go
        in one round trip, in order."""
        pipe = self.redis.pipeline(transaction=False)
        for event in events:
            if event.get("type") == "text":  # so a page opened mid-answer can show the answer so far
                key = _partial_key(conversation_id)
                pipe.append(key, event["text"]).expire(key, 600)
            pipe.publish(self.conversation_channel(conversation_id), json.dumps(event))
        self._send(pipe)

    def partial_answer(self, conversation_id: int) -> str:
        """The text streamed so far by the move in flight ("" when none or Redis is away)."""
        try:
            value = self.redis.get(_partial_key(conversation_id))
        except (redis.RedisError, OSError):
            return ""
        return value.decode("utf-8", errors="replace") if value else ""

    def task_progress(
        self, conversation_id: int, tool_call_id: int, status: str, message: str, progress: float
    ) -> None:
        """Tell the conversation's live pages where a call's background work stands (its job says so as
        it goes; the loop's own look at the task still settles the call). Best effort, like publish."""
        event = {
            "type": "task",
            "tool_call_id": tool_call_id,
            "status": status,
            "message": message,
            "progress": progress,
        }
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(_task_key(tool_call_id), json.dumps(event), ex=3600)
        self._send(pipe.publish(self.conversation_channel(conversation_id), json.dumps(event)))

    def live_tasks(self, tool_call_ids: list[int]) -> dict[int, dict]:
        """The last progress the background jobs of these calls told ({} when none or Redis is away)."""
        if not tool_call_ids:
            return {}
        try:
            values = self.redis.mget([_task_key(call_id) for call_id in tool_call_ids])
        except (redis.RedisError, OSError):
            return {}
        return {call_id: json.loads(value) for call_id, value in zip(tool_call_ids, values, strict=True) if value}

    def changed(self, tenant_id: int, conversation_id: int | None = None, move_done: bool = False) -> None:
        """Signal, after a commit, that a conversation or the tenant's approvals changed. Only the
        worker that finished a move says move_done: the answer it streamed is now in the database
        (a web request saying so could race a worker that already started the next answer)."""
        pipe = self.redis.pipeline(transaction=False)  # one round trip for all of it
        if conversation_id is not None:
            if move_done:
                pipe.delete(_partial_key(conversation_id))
            pipe.publish(self.conversation_channel(conversation_id), json.dumps({"type": "changed"}))
        self._send(pipe.publish(self.tenant_channel(tenant_id), json.dumps({"type": "approvals-changed"})))

    @staticmethod
    def _send(pipe) -> None:
        """Send a pipeline of publishes (and the partial answer's upkeep): best effort."""
        try:
            pipe.execute()
        except (redis.RedisError, OSError) as exc:
            log.warning("could not publish live events: %s", exc)
