"""Redis for the queue and live events: the connection (embedded or real), enqueueing moves with
job ids unique to the move, and publishing events. Redis never holds state that matters."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property

import redis
from redis.exceptions import LockError
from redis.lock import Lock
from rq import Queue, Retry
from rq.exceptions import DuplicateJobError, NoSuchJobError
from rq.job import Job, JobStatus
from rq.utils import str_to_date

from webapp.config import Config
from webapp.runtime import embedded_redis
from webapp.runtime.live_hub import LiveHub

log = logging.getLogger(__name__)

# Jobs are named by their dotted path (RQ imports them in the worker), so nothing here imports jobs/.
MOVE_JOB = "jobs.moves.advance_conversation"
SWEEP_JOB = "jobs.moves.sweep"
WAKE_JOB = "jobs.moves.wake_for_tasks"
NOTICE_JOB = "jobs.notify.deliver"
WEBHOOKS_JOB = "jobs.webhooks.deliver"
MCP_CHECK_JOB = "jobs.mcp.check_servers"
BATCH_PUMP_JOB = "jobs.batches.pump"
RUN_START_JOB = "jobs.runs.start"
TOOL_WORK_JOB = "jobs.tools.run"  # a tool's background work (Dispatcher.start_work)
LIVE_JOB_STATES = {JobStatus.QUEUED, JobStatus.STARTED, JobStatus.SCHEDULED, JobStatus.DEFERRED}


REDIS_CONNECTIONS = 10_000  # per process: a busy slot or request holds one for a moment (live pages share one)
REDIS_WAIT_SECONDS = 30  # past the cap, a request or a move waits this long for a connection, then fails


def redis_connection(config: Config) -> redis.Redis:
    """The process's Redis: REDIS_URL, or the embedded server of this checkout's instance folder,
    started by whichever process needs it first and shared by all (webapp/runtime/embedded_redis.py).
    Its pool grows to REDIS_CONNECTIONS and then makes callers wait (redis-py's default pool refuses
    past 100: two hundred slots finishing their model calls together lost enqueues to it)."""
    url = config.redis_url or embedded_redis.ensure_running(config.instance_path)
    pool = redis.BlockingConnectionPool.from_url(
        url, max_connections=REDIS_CONNECTIONS, timeout=REDIS_WAIT_SECONDS, health_check_interval=30
    )
    return redis.Redis(connection_pool=pool)


class QueueUnavailable(redis.ConnectionError):
    """Redis could not take a job. What the job was for is committed; the sweeper enqueues it later."""


def move_job_id(conversation_id: int, version: int, recovery: int = 0) -> str:
    base = f"move-{conversation_id}-v{version}"
    return f"{base}-r{recovery}" if recovery else base


def _partial_key(conversation_id: int) -> str:
    """Where the answer streaming now is kept, so a page opened mid-answer shows it so far."""
    return f"desk:partial:{conversation_id}"


def _task_key(tool_call_id: int) -> str:
    """Where a background job's last progress is kept, so a page drawn between two of the loop's looks
    at the task shows the progress its live events already showed."""
    return f"desk:task:{tool_call_id}"


WEBHOOKS_FLAG_SECONDS = 60  # a queued webhooks job whose flag outlives this is not waited for


def _webhooks_key(subscription_id: int, what: str = "queued") -> str:
    """queued: set while a job sending the subscription's deliveries is queued and not yet started;
    sending: the lock of the job sending them; again: another job asked it for one more pass."""
    return f"desk:webhooks-{what}:{subscription_id}"


class Dispatcher:
    """Enqueues moves and publishes live events for one app."""

    def __init__(self, config: Config) -> None:
        self.config = config

    @cached_property
    def redis(self) -> redis.Redis:
        return redis_connection(self.config)

    @cached_property
    def live(self) -> LiveHub:
        """The process's one subscription for its live pages."""
        return LiveHub(lambda: self.redis, self.config.live_streams_per_user, self.config.live_streams_per_process)

    @cached_property
    def queue(self) -> Queue:
        return Queue(self.config.queue_name, connection=self.redis)

    @cached_property
    def people_queue(self) -> Queue:
        """The moves that follow a person's act (a decision, a new message, stop, retry, budget): served
        before every other move, with slots of their own in each worker (WORKER_PEOPLE_SLOTS)."""
        return Queue(f"{self.config.queue_name}-people", connection=self.redis)

    @cached_property
    def events_queue(self) -> Queue:
        """The jobs that send event webhooks: short, and waited for by integrators, so workers take
        them after people's moves and before the rest (a burst of moves must not hold events back)."""
        return Queue(f"{self.config.queue_name}-events", connection=self.redis)

    @property
    def move_queues(self) -> list[Queue]:
        """Where moves wait (and the events that tell of them), in the order workers take them."""
        return [self.people_queue, self.events_queue, self.queue]

    @cached_property
    def background_queue(self) -> Queue:
        """Tools' long jobs (exports): workers take them only when no move is waiting."""
        return Queue(f"{self.config.queue_name}-background", connection=self.redis)

    def enqueue_move(
        self, conversation_id: int, version: int, recovery: int = 0, *, people: bool = False, delay: float = 0
    ) -> bool:
        """Enqueue the conversation's move for this version; False if that job already exists. `people`:
        the move follows a person's act, and goes on the people queue, ahead of the rest; `delay`: it is
        due that many seconds from now (RQ's scheduler enqueues it then).

        Raises QueueUnavailable when Redis cannot be reached: the state is committed already, and the
        sweeper enqueues the move once Redis is back."""
        config = self.config
        retries = config.move_retries
        queue = self.people_queue if people else self.queue
        job = dict(
            job_id=move_job_id(conversation_id, version, recovery),
            unique=True,
            retry=Retry(max=retries, interval=list(config.move_retry_intervals)) if retries else None,
            # a job makes up to MOVE_CHAIN_SECONDS of moves, and then finishes the one it is making
            job_timeout=max(600, int(config.model_timeout_seconds * 4 + config.move_chain_seconds)),
            result_ttl=0,  # nothing reads a move's result: the database holds it; failures are kept
            failure_ttl=7 * 24 * 3600,
        )
        try:
            if delay > 0:
                queue.enqueue_in(timedelta(seconds=delay), MOVE_JOB, conversation_id, version, **job)
            else:
                queue.enqueue(MOVE_JOB, conversation_id, version, **job)
        except DuplicateJobError:
            return False
        except (redis.RedisError, OSError) as exc:
            log.warning("could not enqueue the move of conversation %s; the sweeper will: %s", conversation_id, exc)
            raise QueueUnavailable(str(exc)) from exc
        return True

    def enqueue_sweep(self, bucket: int) -> bool:
        try:
            self.queue.enqueue(
                SWEEP_JOB, job_id=f"sweep-{bucket}", unique=True, at_front=True, result_ttl=60, job_timeout=300
            )
        except DuplicateJobError:
            return False
        return True

    def enqueue_mcp_check(self, bucket: int) -> bool:
        """Enqueue the check of every MCP server's tools, once per bucket of MCP_CHECK_SECONDS, on the
        background queue (it waits on the servers; moves go first)."""
        try:
            self.background_queue.enqueue(
                MCP_CHECK_JOB,
                job_id=f"mcp-check-{bucket}",
                unique=True,
                result_ttl=3600,
                job_timeout=max(300, int(self.config.mcp_timeout_seconds * 10)),
            )
        except DuplicateJobError:
            return False
        except (redis.RedisError, OSError) as exc:  # the next sweep tries again
            log.warning("could not enqueue the check of the MCP servers: %s", exc)
            return False
        return True

    def enqueue_batch_pump(self, at: datetime | None = None) -> bool:
        """Enqueue the pump of the batch runs' requests (send, poll, settle: webapp/runtime/work.py), now
        or at `at`, once per second at most; False if that second's pump is queued already, or Redis is
        away (the sweep enqueues one while any request is open)."""
        stamp = math.ceil((at or datetime.now(UTC)).timestamp())
        job = dict(job_id=f"batch-pump-{stamp}", unique=True, result_ttl=60, job_timeout=600)
        try:
            if at is None:
                self.queue.enqueue(BATCH_PUMP_JOB, **job)
            else:
                self.queue.enqueue_at(datetime.fromtimestamp(stamp, UTC), BATCH_PUMP_JOB, **job)
        except DuplicateJobError:
            return False
        except (redis.RedisError, OSError) as exc:
            log.warning("could not enqueue the batch pump: %s", exc)
            return False
        return True

    def enqueue_run_start(self, run_id: int) -> bool:
        """Enqueue the start of a bulk run's items as conversations (webapp/runs/actions.py); False if it
        is queued already, or Redis is away (the sweep enqueues it for any run with items left)."""
        try:
            self.queue.enqueue(
                RUN_START_JOB, run_id, job_id=f"run-start-{run_id}", unique=True, result_ttl=0, job_timeout=3600
            )
        except DuplicateJobError:
            return False
        except (redis.RedisError, OSError) as exc:
            log.warning("could not enqueue the start of run %s: %s", run_id, exc)
            return False
        return True

    def enqueue_notice(self, channel_id: int, tool_call_id: int, kind: str) -> bool:
        """Enqueue the delivery of a call's reminder or escalation through one channel, retried with
        NOTIFY_RETRY_INTERVALS; False if that job exists already or Redis cannot take it (the notice is
        then not sent: the call was marked reminded, and the inbox still shows it)."""
        intervals = list(self.config.notify_retry_intervals)
        try:
            self.queue.enqueue(
                NOTICE_JOB,
                channel_id,
                tool_call_id,
                kind,
                job_id=f"notice-{kind}-{tool_call_id}-{channel_id}",
                unique=True,
                retry=Retry(max=len(intervals), interval=intervals) if intervals else None,
                job_timeout=max(60, int(self.config.notify_timeout_seconds * 3)),
                result_ttl=0,  # the deliveries table holds the outcome
                failure_ttl=7 * 24 * 3600,
            )
        except DuplicateJobError:
            return False
        except (redis.RedisError, OSError) as exc:
            log.warning("could not enqueue the %s of tool call %s: %s", kind, tool_call_id, exc)
            return False
        return True

    def enqueue_webhooks(self, subscription_id: int, at: datetime | None = None) -> bool:
        """Enqueue the job that sends a webhook subscription's deliveries (webapp/webhooks/): now,
        unless one is queued and not yet started (a flag in Redis, which the job clears as it starts,
        so an event committed after it started gets a job of its own); or at `at`, a retry's time
        (RQ's scheduler enqueues it then). False when one is queued already, or when Redis cannot take it
        (the next sweep does)."""
        try:
            if at is None:
                if not self.redis.set(_webhooks_key(subscription_id), 1, nx=True, ex=WEBHOOKS_FLAG_SECONDS):
                    return False  # one is queued: it sends this too
                try:
                    self.events_queue.enqueue(WEBHOOKS_JOB, subscription_id, **self._webhook_job())
                except (redis.RedisError, OSError):
                    self.redis.delete(_webhooks_key(subscription_id))  # no job is queued: the sweep's may be
                    raise
            else:
                self.events_queue.enqueue_at(at, WEBHOOKS_JOB, subscription_id, **self._webhook_job())
        except (redis.RedisError, OSError) as exc:
            log.warning("could not enqueue the deliveries of webhook %s: %s", subscription_id, exc)
            return False
        return True

    def _webhook_job(self) -> dict:
        return dict(
            job_timeout=max(300, int(self.config.notify_timeout_seconds * 30)),
            result_ttl=0,  # webhook_deliveries holds what happened
            failure_ttl=7 * 24 * 3600,
        )

    def webhooks_started(self, subscription_id: int) -> None:
        """The subscription's job starts: a commit from now on enqueues another."""
        self.redis.delete(_webhooks_key(subscription_id))

    def webhooks_sending(self, subscription_id: int) -> Lock | None:
        """Become the one job sending a subscription's deliveries (its lock), or None: another job is,
        and is told to make one more pass (webhooks_again). One sender at a time keeps two jobs from
        sending one delivery twice, or locking its rows in two orders."""
        lock = self.redis.lock(_webhooks_key(subscription_id, "sending"), timeout=self._webhook_job()["job_timeout"])
        if lock.acquire(blocking=False):
            return lock
        self.redis.set(_webhooks_key(subscription_id, "again"), 1, ex=WEBHOOKS_FLAG_SECONDS)
        # The sender may have let go just now, having found no word: then this job is the sender.
        return lock if lock.acquire(blocking=False) else None

    def webhooks_again(self, subscription_id: int) -> bool:
        """Whether a job asked the sender for one more pass since it last looked (the word is taken)."""
        return bool(self.redis.getdel(_webhooks_key(subscription_id, "again")))

    def webhooks_done(self, subscription_id: int, lock: Lock) -> None:
        """The sender lets go; a word that came meanwhile gets a job of its own."""
        try:
            lock.release()
        except LockError:  # held past its time: another job may be the sender now
            pass
        if self.webhooks_again(subscription_id):
            self.enqueue_webhooks(subscription_id)

    def waiting_move_ids(self) -> set[str]:
        """The ids of the jobs waiting on the move queues now: one read for a sweep, instead of a
        search of the queues for each stalled conversation."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in self.move_queues:
            pipe.lrange(queue.key, 0, -1)
        return {job_id.decode() for ids in pipe.execute() for job_id in ids}

    def job_alive(self, job_id: str, waiting: set[str] | None = None) -> bool:
        """Whether a job will still run the move. A worker killed after taking a job off the queue
        leaves it "queued" (in RQ's intermediate list) or "started" for minutes; a live worker claims
        the conversation's lease at once, so a job started, or taken, longer than a lease ago is dead.
        Guessing dead wrongly costs a duplicate job: it finds nothing to claim while the original
        runs, but after a transient failure (the lease released for RQ's retry) it is an attempt more
        than MOVE_RETRIES allows, so a job just taken by a worker counts as alive. `waiting`: the
        move queues' job ids read once before (waiting_move_ids), for many questions in a row."""
        return job_id in self.alive_jobs([job_id], waiting)

    def alive_jobs(self, job_ids, waiting: set[str] | None = None) -> set[str]:
        """Of these jobs, the ones that will still run their move (job_alive), read in one round trip:
        a sweep asks of hundreds at once when a backlog is queued (a fetch of each job cost a round
        trip and the parsing of the whole job)."""
        ids = list(dict.fromkeys(job_ids))
        pipe = self.redis.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(Job.key_for(job_id), "status", "started_at", "enqueued_at")
        lease = timedelta(seconds=self.config.lease_seconds)
        alive = set()
        for job_id, (status, started_at, enqueued_at) in zip(ids, pipe.execute(), strict=True):
            if status is None:  # no such job
                continue
            status = JobStatus(status.decode())
            if status == JobStatus.STARTED and started_at:
                if _since(str_to_date(started_at)) < lease:
                    alive.add(job_id)
            elif status == JobStatus.QUEUED:
                in_a_queue = (job_id in waiting) if waiting is not None else self._waiting(job_id)
                # Not in the queue: a worker popped it and marks it started a moment later (or died in
                # that moment). Enqueued (or re-enqueued for a retry) less than a lease ago, it is alive.
                if in_a_queue or (enqueued_at and _since(str_to_date(enqueued_at)) < lease):
                    alive.add(job_id)
            elif status in LIVE_JOB_STATES:
                alive.add(job_id)
        return alive

    def _waiting(self, job_id: str) -> bool:
        return any(self.redis.lpos(queue.key, job_id) is not None for queue in self.move_queues)

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
        self._publish(pipe)

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
        self._publish(pipe.publish(self.conversation_channel(conversation_id), json.dumps(event)))

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
        self._publish(pipe.publish(self.tenant_channel(tenant_id), json.dumps({"type": "approvals-changed"})))

    @staticmethod
    def _publish(pipe) -> None:
        """Send a pipeline of publishes (and the partial answer's upkeep): best effort."""
        try:
            pipe.execute()
        except (redis.RedisError, OSError) as exc:
            log.warning("could not publish live events: %s", exc)

    # --- tasks: waking a parked conversation when a task is due, and tools' background jobs -------

    def schedule_wake(self, conversation_id: int, at: datetime) -> None:
        """Wake the conversation at `at` to hand its due tasks back to their tools (RQ's scheduler runs
        it; the sweeper wakes any conversation whose wake-up Redis lost)."""
        # RQ's scheduler keeps whole seconds and runs what is due in the current second: round up, or
        # the wake-up runs before its task is due and finds nothing to do.
        stamp = math.ceil(at.timestamp())
        try:
            self.queue.enqueue_at(
                datetime.fromtimestamp(stamp, UTC),
                WAKE_JOB,
                conversation_id,
                job_id=f"wake-{conversation_id}-{stamp}",
                unique=True,
                result_ttl=0,
            )
        except DuplicateJobError:
            pass
        except (redis.RedisError, OSError) as exc:
            log.warning("could not schedule the task wake-up of conversation %s: %s", conversation_id, exc)

    def start_work(self, target: str, *args, job_id: str, timeout: int = 3600, meta: dict | None = None) -> None:
        """Start a tool's background work once: `target` is "package.module:function", called in a worker
        as function(BackgroundWork, *args) (webapp/tools/tasks.py); see start_background for the rest."""
        self.start_background(TOOL_WORK_JOB, target, *args, job_id=job_id, timeout=timeout, meta=meta)

    def start_background(self, func, *args, job_id: str, timeout: int = 3600, meta: dict | None = None) -> None:
        """Start a tool's background job once: a second start under the same id changes nothing. `meta`
        starts the job's meta (the conversation and call it works for, whose page it tells its progress)."""
        try:
            self.background_queue.enqueue(
                func,
                *args,
                job_id=job_id,
                unique=True,
                job_timeout=timeout,
                result_ttl=86400,
                failure_ttl=86400,
                meta=meta,
            )
        except DuplicateJobError:
            pass

    def background_state(self, job_id: str) -> BackgroundState | None:
        """Where a background job stands; None when Redis no longer knows it."""
        try:
            job = Job.fetch(job_id, connection=self.redis)
        except NoSuchJobError:
            return None
        status = job.get_status(refresh=False)
        error = None
        if status == JobStatus.FAILED:
            result = job.latest_result()
            error = (result.exc_string or "").strip().splitlines()[-1:] if result else []
            error = error[0] if error else "the job failed"
        return BackgroundState(
            status=str(status.value if hasattr(status, "value") else status),
            meta=dict(job.meta or {}),
            result=job.return_value() if status == JobStatus.FINISHED else None,
            error=error,
        )

    def background_cancelled(self, job_id: str) -> bool:
        """Whether a tool asked its background job to stop (the job checks between its steps)."""
        return bool(self.redis.exists(background_cancel_key(job_id)))

    def cancel_background(self, job_id: str) -> None:
        """Stop a background job: a waiting one is cancelled, a running one is asked to stop."""
        self.redis.set(background_cancel_key(job_id), "1", ex=86400)
        try:
            job = Job.fetch(job_id, connection=self.redis)
        except NoSuchJobError:
            return
        if job.get_status(refresh=False) in (JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.DEFERRED):
            job.cancel()


@dataclass(frozen=True)
class BackgroundState:
    status: str  # queued | started | finished | failed | ... (RQ's job statuses)
    meta: dict
    result: object = None
    error: str | None = None


def _since(moment: datetime | None) -> timedelta:
    """How long ago an RQ timestamp was (RQ stores them naive, in UTC); forever when unknown."""
    if moment is None:
        return timedelta.max
    return datetime.now(UTC) - (moment if moment.tzinfo else moment.replace(tzinfo=UTC))


def background_cancel_key(job_id: str) -> str:
    return f"desk:cancel:{job_id}"
