"""Redis for the queue: the connection (embedded or real), the queues, enqueueing each job with a
job id unique to what it is for, and which moves' jobs are still alive. Redis never holds state that
matters. Live events are live_events.py; tools' background jobs as tools see them, background.py;
the webhook senders' lock, webhook_senders.py; what each job does, jobs/."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import cached_property

import redis
from rq import Queue, Retry
from rq.exceptions import DuplicateJobError
from rq.job import Job, JobStatus
from rq.utils import str_to_date

from webapp.config import Config
from webapp.runtime import embedded_redis
from webapp.runtime.webhook_senders import WEBHOOKS_FLAG_SECONDS, webhooks_job_timeout, webhooks_key

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
TOOL_WORK_JOB = "jobs.tools.run"  # a tool's background work (Dispatcher.enqueue_tool_work)
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


def _enqueued(what: str, enqueue: Callable[[], object]) -> bool:
    """Make one enqueue: False when that job exists already, or when Redis cannot take it (said in
    the log; what the job is for is committed, and the next sweep enqueues it again)."""
    try:
        enqueue()
    except DuplicateJobError:
        return False
    except (redis.RedisError, OSError) as exc:
        log.warning("could not enqueue %s: %s", what, exc)
        return False
    return True


class Dispatcher:
    """Connects one app to Redis and enqueues its jobs; says which moves' jobs are still alive."""

    def __init__(self, config: Config) -> None:
        self.config = config

    @cached_property
    def redis(self) -> redis.Redis:
        return redis_connection(self.config)

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
        """Enqueue the sweep of this bucket of SWEEP_INTERVAL_SECONDS (once for the whole fleet), ahead
        of the moves; False if it is queued already. Redis away raises: the ticker tries again."""
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
        return _enqueued(
            "the check of the MCP servers",
            lambda: self.background_queue.enqueue(
                MCP_CHECK_JOB,
                job_id=f"mcp-check-{bucket}",
                unique=True,
                result_ttl=3600,
                job_timeout=max(300, int(self.config.mcp_timeout_seconds * 10)),
            ),
        )

    def enqueue_batch_pump(self, at: datetime | None = None) -> bool:
        """Enqueue the pump of the batch runs' requests (send, poll, settle: jobs/batches.py), now or at
        `at`, once per second at most; False if that second's pump is queued already, or Redis is away
        (the sweep enqueues one while any request is open)."""
        stamp = math.ceil((at or datetime.now(UTC)).timestamp())
        job = dict(job_id=f"batch-pump-{stamp}", unique=True, result_ttl=60, job_timeout=600)
        if at is None:
            return _enqueued("the batch pump", lambda: self.queue.enqueue(BATCH_PUMP_JOB, **job))
        due = datetime.fromtimestamp(stamp, UTC)
        return _enqueued("the batch pump", lambda: self.queue.enqueue_at(due, BATCH_PUMP_JOB, **job))

    def enqueue_run_start(self, run_id: int) -> bool:
        """Enqueue the start of a bulk run's items as conversations (jobs/runs.py); False if it is
        queued already, or Redis is away (the sweep enqueues it for any run with items left)."""
        return _enqueued(
            f"the start of run {run_id}",
            lambda: self.queue.enqueue(
                RUN_START_JOB, run_id, job_id=f"run-start-{run_id}", unique=True, result_ttl=0, job_timeout=3600
            ),
        )

    def enqueue_notice(self, channel_id: int, tool_call_id: int, kind: str) -> bool:
        """Enqueue the delivery of a call's reminder or escalation through one channel, retried with
        NOTIFY_RETRY_INTERVALS; False if that job exists already or Redis cannot take it (the notice is
        then not sent: the call was marked reminded, and the inbox still shows it)."""
        intervals = list(self.config.notify_retry_intervals)
        return _enqueued(
            f"the {kind} of tool call {tool_call_id}",
            lambda: self.queue.enqueue(
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
            ),
        )

    def enqueue_webhooks(self, subscription_id: int, at: datetime | None = None) -> bool:
        """Enqueue the job that sends a webhook subscription's deliveries (jobs/webhooks.py): now,
        unless one is queued and not yet started (a flag in Redis, which the job clears as it starts,
        so an event committed after it started gets a job of its own); or at `at`, a retry's time
        (RQ's scheduler enqueues it then). False when one is queued already, or when Redis cannot take it
        (the next sweep does)."""
        job = dict(
            job_timeout=webhooks_job_timeout(self.config),
            result_ttl=0,  # webhook_deliveries holds what happened
            failure_ttl=7 * 24 * 3600,
        )
        try:
            if at is None:
                if not self.redis.set(webhooks_key(subscription_id), 1, nx=True, ex=WEBHOOKS_FLAG_SECONDS):
                    return False  # one is queued: it sends this too
                try:
                    self.events_queue.enqueue(WEBHOOKS_JOB, subscription_id, **job)
                except (redis.RedisError, OSError):
                    self.redis.delete(webhooks_key(subscription_id))  # no job is queued: the sweep's may be
                    raise
            else:
                self.events_queue.enqueue_at(at, WEBHOOKS_JOB, subscription_id, **job)
        except (redis.RedisError, OSError) as exc:
            log.warning("could not enqueue the deliveries of webhook %s: %s", subscription_id, exc)
            return False
        return True

    def schedule_wake(self, conversation_id: int, at: datetime) -> None:
        """Wake the conversation at `at` to hand its due tasks back to their tools (RQ's scheduler runs
        it; the sweeper wakes any conversation whose wake-up Redis lost)."""
        # RQ's scheduler keeps whole seconds and runs what is due in the current second: round up, or
        # the wake-up runs before its task is due and finds nothing to do.
        stamp = math.ceil(at.timestamp())
        _enqueued(
            f"the task wake-up of conversation {conversation_id}",
            lambda: self.queue.enqueue_at(
                datetime.fromtimestamp(stamp, UTC),
                WAKE_JOB,
                conversation_id,
                job_id=f"wake-{conversation_id}-{stamp}",
                unique=True,
                result_ttl=0,
            ),
        )

    def enqueue_tool_work(self, target: str, *args, job_id: str, timeout: int = 3600, meta: dict | None = None) -> None:
        """Enqueue a tool's background work once, on the background queue (a second start under the same
        id changes nothing); tools start it through background.py's BackgroundJobs.start_work."""
        try:
            self.background_queue.enqueue(
                TOOL_WORK_JOB,
                target,
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

    # --- which moves' jobs will still run (the sweeper's question) -------------------------------

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


def _since(moment: datetime | None) -> timedelta:
    """How long ago an RQ timestamp was (RQ stores them naive, in UTC); forever when unknown."""
    if moment is None:
        return timedelta.max
    return datetime.now(UTC) - (moment if moment.tzinfo else moment.replace(tzinfo=UTC))
