"""The parts of RQ that are not its public API and that the desk's worker, scheduler and dispatcher
rely on: the methods PoolWorker overrides, the private attributes it reads and sets, what RQ's own loop
calls of it, and the Redis layout the dispatcher reads directly. pyproject.toml pins RQ to the minor
version these were written against; before raising that pin, run this file against the new RQ: each
failure names the internal that changed and the function of ours that depends on it."""

from __future__ import annotations

import inspect
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import redis
import rq
from rq import Queue, Retry, SimpleWorker
from rq.job import Job, JobStatus
from rq.registry import ScheduledJobRegistry
from rq.scheduler import RQScheduler
from rq.timeouts import JobTimeoutException, TimerDeathPenalty
from rq.utils import str_to_date
from rq.worker import WorkerStatus

from webapp.ops.metrics import worker_slots
from webapp.runtime.queue import MOVE_JOB, move_job_id
from webapp.runtime.services import services
from webapp.runtime.worker import PoolWorker

RQ = f"RQ {rq.__version__}"
WORKER = "webapp.runtime.worker.PoolWorker"
SCHEDULER = "`flask desk scheduler` (webapp/runtime/cli.py, scheduler_command)"
ALIVE = "webapp.runtime.queue.Dispatcher.alive_jobs (the sweeper's view of which moves will still run)"


def changed(internal: str, ours: str, how: str) -> str:
    return f"{RQ} changed {internal}: {how}. {ours} depends on it; see tests/runtime/test_rq_internals.py."


def parameters(function) -> list[tuple[str, str, object]]:
    """What a caller may pass: each parameter's name, kind and default (annotations left out)."""
    return [(p.name, p.kind.name, p.default) for p in inspect.signature(function).parameters.values()]


# --- the methods PoolWorker overrides: RQ still has each, taking what the override takes ------------

# RQ's method -> why the worker overrides it (PoolWorker.<same name>)
OVERRIDES = {
    "serialize": "adds the worker's slots to its record in Redis (the ops page and /metrics read it)",
    "dequeue_job_and_maintain_ttl": "takes a job only once a slot is free, and listens a moment at a time",
    "execute_job": "hands the job to a slot's thread instead of running it in the loop",
    "set_state": "says busy while any slot works, and writes the state only when it changes",
    "heartbeat": "heartbeats at most every few seconds, in one round trip",
    "check_for_suspension": "looks for `rq suspend` at most once a second",
    "_shutdown": "the warm shutdown: takes no more jobs while the slots finish",
    "unsubscribe": "stops the command channel's thread before unsubscribing, so a stop cannot hang",
    "teardown": "lets the slots finish, releases the leases of those that did not, stops MCP servers",
}


@pytest.mark.parametrize("name", sorted(OVERRIDES))
def test_every_rq_method_the_pool_worker_overrides_still_takes_what_the_override_takes(name):
    ours = f"{WORKER}.{name} ({OVERRIDES[name]})"
    override = ours_of(name)
    assert override is not None, f"{WORKER} no longer overrides {name}: take it out of OVERRIDES"
    theirs = getattr(SimpleWorker, name, None)
    assert theirs is not None, changed(f"SimpleWorker.{name}", ours, "it is gone, so the override is never called")
    assert parameters(theirs) == parameters(override), changed(
        f"SimpleWorker.{name}",
        ours,
        f"it now takes {inspect.signature(theirs)}, the override {inspect.signature(override)}",
    )


def ours_of(name: str):
    """The desk's own method of that name on PoolWorker (its own or PromptWorker's), or None."""
    for cls in PoolWorker.__mro__:
        if cls.__module__.startswith("webapp.") and name in cls.__dict__:
            return cls.__dict__[name]
    return None


# What PoolWorker adds to RQ's worker: a method or attribute of RQ's of the same name would be replaced.
OWN_ATTRIBUTES = (
    "app",
    "concurrency",
    "people_queue",
    "people_slots",
    "stop_grace_seconds",
    "_free",
    "_pool",
    "_busy",
    "_busy_lock",
    "_listening",
    "_beat",
    "_suspension_looked",
)


def test_the_pool_worker_overrides_no_other_rq_method_and_no_rq_attribute(app):
    own_methods = [
        name
        for cls in PoolWorker.__mro__
        if cls.__module__.startswith("webapp.")
        for name, value in cls.__dict__.items()
        if inspect.isfunction(value) and not name.startswith("__") and name not in OVERRIDES
    ]
    for name in own_methods:
        assert not hasattr(SimpleWorker, name), changed(
            f"SimpleWorker.{name}", f"{WORKER}.{name}", "RQ now has a method of that name, which ours replaces"
        )
    dispatcher = services().dispatcher
    theirs = SimpleWorker(dispatcher.move_queues, connection=dispatcher.redis, name=f"plain-{uuid.uuid4().hex}")
    worker = pool_worker(app)
    try:
        for name in OWN_ATTRIBUTES:
            assert not hasattr(theirs, name), changed(
                f"Worker.{name}",
                f"{WORKER}.__init__",
                "RQ's worker now has an attribute of that name, which ours replaces",
            )
        added = sorted(vars(worker).keys() - vars(theirs).keys())
        assert added == sorted(OWN_ATTRIBUTES), f"{WORKER}.__init__ sets {added}: list its own in OWN_ATTRIBUTES"
    finally:
        worker._pool.shutdown(wait=False)


# --- what the worker calls of RQ, and what RQ's loop calls of the worker ------------------------------

# (RQ's callable, how we call it: the arguments after self, our function that calls it so)
CALLS = [
    (SimpleWorker.__init__, ("queues",), {"connection": "redis", "name": "name"}, f"{WORKER}.__init__ (via **kwargs)"),
    (SimpleWorker.prepare_execution, ("job",), {}, f"{WORKER}.execute_job"),
    (SimpleWorker.perform_job, ("job", "queue", "execution"), {}, f"{WORKER}._run (a slot's thread)"),
    (SimpleWorker.dequeue_job_and_maintain_ttl, (1.0, 1.0), {}, f"{WORKER}.dequeue_job_and_maintain_ttl"),
    (SimpleWorker.heartbeat, (), {"pipeline": "pipe"}, f"{WORKER}.heartbeat"),
    (SimpleWorker.heartbeat, (60, "pipe"), {}, f"{WORKER}.heartbeat"),
    (SimpleWorker.set_state, ("busy",), {"pipeline": None}, f"{WORKER}.set_state"),
    (SimpleWorker.check_for_suspension, (False,), {}, f"{WORKER}.check_for_suspension"),
    (SimpleWorker.set_shutdown_requested_date, (), {}, f"{WORKER}._shutdown"),
    (SimpleWorker.register_death, (), {}, "webapp.runtime.worker._retire"),
    (
        SimpleWorker.work,
        (),
        {"burst": True, "with_scheduler": True, "logging_level": "WARNING"},
        "webapp.runtime.worker.run_worker",
    ),
    (TimerDeathPenalty.__init__, (30, JobTimeoutException), {"job_id": "id"}, f"{WORKER}.death_penalty_class"),
    (
        RQScheduler.__init__,
        ("queues",),
        {"connection": "redis", "interval": 1, "logging_level": "WARNING"},
        SCHEDULER,
    ),
    (RQScheduler.acquire_locks, (), {}, SCHEDULER),
    (RQScheduler.register_birth, (), {}, SCHEDULER),
    (RQScheduler.enqueue_scheduled_jobs, (), {}, SCHEDULER),
    (RQScheduler.release_locks, (), {}, SCHEDULER),
    (RQScheduler.register_death, (), {}, SCHEDULER),
    (RQScheduler.work, (), {}, SCHEDULER),
    (ScheduledJobRegistry.get_jobs_to_schedule, (1_700_000_000,), {}, f"{SCHEDULER} with --once"),
]


@pytest.mark.parametrize(
    ("function", "args", "kwargs", "ours"), CALLS, ids=[f"{call[0].__qualname__}-{n}" for n, call in enumerate(CALLS)]
)
def test_rq_still_takes_the_calls_the_desk_makes(function, args, kwargs, ours):
    try:
        inspect.signature(function).bind("self", *args, **kwargs)
    except TypeError as exc:
        shown = ", ".join([*map(repr, args), *(f"{key}={value!r}" for key, value in kwargs.items())])
        pytest.fail(
            changed(function.__qualname__, ours, f"it takes {inspect.signature(function)}, not ({shown}): {exc}")
        )


def test_standalone_rq_functions_the_dispatcher_calls_take_the_same_arguments():
    for function, args, ours in (
        (str_to_date, (b"2026-01-01T00:00:00.000000Z",), ALIVE),
        (Job.key_for, ("id",), ALIVE),
    ):
        try:
            inspect.signature(function).bind(*args)
        except TypeError as exc:
            pytest.fail(changed(function.__qualname__, ours, f"it takes {inspect.signature(function)}: {exc}"))


# RQ's method -> the overrides of PoolWorker's it must still call, and what the call gives the desk
CALLED_BY_RQ = {
    SimpleWorker.work: {
        "check_for_suspension": "the suspension is looked at once a second, not before every job",
        "dequeue_job_and_maintain_ttl": "a job is taken only once a slot is free",
        "execute_job": "jobs run in the slots",
        "teardown": "a stopping worker lets its moves finish and releases their leases",
    },
    SimpleWorker.request_stop: {"_shutdown": "SIGTERM stops taking jobs while the slots finish"},
    SimpleWorker.teardown: {"unsubscribe": "a stop cannot hang on the command channel"},
    SimpleWorker.dequeue_job_and_maintain_ttl: {
        "heartbeat": "the worker's loop heartbeats in one round trip",
        "set_state": "the worker says busy while a slot works",
    },
    SimpleWorker.register_birth: {"serialize": "the worker's record holds its slots (the ops page, /metrics)"},
}


@pytest.mark.parametrize("function", list(CALLED_BY_RQ), ids=lambda f: f.__qualname__)
def test_rq_still_calls_the_methods_the_pool_worker_overrides(function):
    source = inspect.getsource(function)
    for name, why in CALLED_BY_RQ[function].items():
        assert re.search(rf"\bself\.{re.escape(name)}\(", source), changed(
            function.__qualname__, f"{WORKER}.{name}", f"it no longer calls self.{name}(), so {why} no longer holds"
        )


def test_rq_sets_what_the_pool_worker_reads_before_it_calls_it():
    # PoolWorker._shutdown calls set_shutdown_requested_date(), which writes the date request_stop set first.
    stop = inspect.getsource(SimpleWorker.request_stop)
    assert "self._shutdown_requested_date =" in stop and stop.index("self._shutdown_requested_date =") < stop.index(
        "self._shutdown()"
    ), changed(
        "SimpleWorker.request_stop",
        f"{WORKER}._shutdown",
        "it no longer sets _shutdown_requested_date before _shutdown()",
    )
    # Job timeouts by timer (signals reach only the main thread; jobs run in the slots' threads).
    perform = inspect.getsource(SimpleWorker.perform_job)
    assert "self.death_penalty_class(" in perform, changed(
        "SimpleWorker.perform_job", f"{WORKER}.death_penalty_class", "it no longer times a job with death_penalty_class"
    )
    # The dequeue listens to the queues in self._ordered_queues, which the pool narrows to the people queue.
    dequeue = inspect.getsource(SimpleWorker.dequeue_job_and_maintain_ttl)
    assert "self._ordered_queues" in dequeue, changed(
        "SimpleWorker.dequeue_job_and_maintain_ttl",
        f"{WORKER}.dequeue_job_and_maintain_ttl",
        "it no longer listens to self._ordered_queues, so the slots kept for people's moves take any job",
    )
    # The loop stops when _stop_requested is set (PoolWorker._shutdown sets it; run_worker reads it).
    assert "self._stop_requested" in inspect.getsource(SimpleWorker.work), changed(
        "SimpleWorker.work", f"{WORKER}._shutdown and run_worker", "its loop no longer stops on self._stop_requested"
    )


# --- the attributes the worker reads and sets, on a real worker against the test Redis ---------------

# attribute -> (what it holds on a new worker, our functions that use it)
RQ_ATTRIBUTES = {
    "_ordered_queues": (list, f"{WORKER}.dequeue_job_and_maintain_ttl (narrowed to the people queue)"),
    "_stop_requested": (bool, f"{WORKER}.dequeue_job_and_maintain_ttl, _shutdown, and run_worker"),
    "_state": (str, f"{WORKER}.set_state (writes only a change)"),
    "_shutdown_requested_date": (type(None), f"{WORKER}._shutdown (set_shutdown_requested_date writes it)"),
    "connection": (redis.Redis, f"{WORKER}.heartbeat (its own pipeline)"),
    "pubsub": (type(None), f"{WORKER}.unsubscribe"),
    "pubsub_thread": (type(None), f"{WORKER}.unsubscribe"),
    "key": (str, "webapp.ops.metrics.worker_slots (reads the slots from the worker's record)"),
}


def pool_worker(app, concurrency: int = 3) -> PoolWorker:
    dispatcher = services().dispatcher
    return PoolWorker(
        [*dispatcher.move_queues, dispatcher.background_queue],
        app=app,
        concurrency=concurrency,
        stop_grace_seconds=0,
        people_queue=dispatcher.people_queue,
        people_slots=1,
        connection=dispatcher.redis,
        name=f"internals-{uuid.uuid4().hex}",
    )


def test_a_real_worker_has_the_attributes_the_pool_worker_reads(app):
    worker = pool_worker(app)
    try:
        for name, (kind, ours) in RQ_ATTRIBUTES.items():
            assert hasattr(worker, name), changed(f"Worker.{name}", ours, "a worker no longer has it")
            assert isinstance(getattr(worker, name), kind), changed(
                f"Worker.{name}", ours, f"it holds {getattr(worker, name)!r}, not a {kind.__name__}"
            )
        assert worker._ordered_queues == worker.queues, changed(
            "Worker._ordered_queues", RQ_ATTRIBUTES["_ordered_queues"][1], "it no longer starts as the worker's queues"
        )
        assert WorkerStatus.IDLE == "idle" and WorkerStatus.BUSY == "busy", changed(
            "rq.worker.WorkerStatus", f"{WORKER}.set_state", "its IDLE and BUSY changed"
        )
    finally:
        worker._pool.shutdown(wait=False)


def test_a_real_worker_keeps_its_record_in_redis_as_the_pool_worker_expects(app):
    worker = pool_worker(app, concurrency=7)
    connection = worker.connection
    try:
        worker.register_birth()
        assert connection.hget(worker.key, "slots") == b"7", changed(
            "SimpleWorker.register_birth",
            f"{WORKER}.serialize",
            "the worker's record no longer holds what serialize() says",
        )
        seen = rq.Worker.find_by_key(worker.key, connection=connection)
        assert worker_slots(seen) == (0, 7), changed(
            "Worker.find_by_key / current_execution_count",
            "webapp.ops.metrics.worker_slots",
            f"read {worker_slots(seen)}",
        )

        worker.set_state(WorkerStatus.BUSY)  # (ours, then RQ's)
        assert worker._state == "busy" and connection.hget(worker.key, "state") == b"busy", changed(
            "SimpleWorker.set_state", f"{WORKER}.set_state", "it no longer keeps _state as what it wrote"
        )
        connection.hdel(worker.key, "last_heartbeat")
        worker.heartbeat()  # ours: one pipeline of RQ's heartbeat
        assert connection.hget(worker.key, "last_heartbeat"), changed(
            "SimpleWorker.heartbeat", f"{WORKER}.heartbeat", "with a pipeline it no longer writes the last heartbeat"
        )
        worker._shutdown_requested_date = datetime.now(UTC)  # as request_stop sets it before _shutdown()
        worker.set_shutdown_requested_date()  # as PoolWorker._shutdown calls it
        assert connection.hget(worker.key, "shutdown_requested_date"), changed(
            "SimpleWorker.set_shutdown_requested_date", f"{WORKER}._shutdown", "the stop is no longer recorded"
        )
    finally:
        worker.register_death()
        worker._pool.shutdown(wait=False)
    assert connection.hget(worker.key, "death"), changed(
        "SimpleWorker.register_death", "webapp.runtime.worker._retire", "a dead worker's record no longer says so"
    )


# --- the Redis layout the dispatcher reads without RQ (Dispatcher.alive_jobs, waiting_move_ids) --------


def test_a_job_is_a_redis_hash_and_a_queue_a_redis_list_as_the_dispatcher_reads_them(app):
    dispatcher = services().dispatcher
    connection, queue = dispatcher.redis, dispatcher.queue
    job_id = move_job_id(424242, 1)
    assert dispatcher.enqueue_move(424242, 1)
    job = Job.fetch(job_id, connection=connection)

    assert Job.key_for(job_id) == job.key and connection.type(job.key) == b"hash", changed(
        "Job.key_for", ALIVE, "a job is no longer a Redis hash under Job.key_for(id)"
    )
    status, started_at, enqueued_at = connection.hmget(Job.key_for(job_id), "status", "started_at", "enqueued_at")
    assert status == b"queued" and JobStatus(status.decode()) == JobStatus.QUEUED, changed(
        "the job hash's status field", ALIVE, f"it holds {status!r}"
    )
    assert enqueued_at and abs(str_to_date(enqueued_at) - job.enqueued_at) < timedelta(milliseconds=1), changed(
        "the job hash's enqueued_at field, read with rq.utils.str_to_date", ALIVE, f"it holds {enqueued_at!r}"
    )
    assert not started_at  # not started yet (empty)

    assert connection.type(queue.key) == b"list" and job_id.encode() in connection.lrange(queue.key, 0, -1), changed(
        "Queue.key",
        "webapp.runtime.queue.Dispatcher.waiting_move_ids and _waiting",
        "a queue is no longer a list of ids",
    )

    job.set_status(JobStatus.STARTED)
    job.started_at = datetime.now(UTC)
    job.save()
    status, started_at = connection.hmget(Job.key_for(job_id), "status", "started_at")
    assert status == b"started" and abs(str_to_date(started_at) - job.started_at) < timedelta(milliseconds=1), changed(
        "the job hash's status and started_at fields", ALIVE, f"they hold {status!r}, {started_at!r}"
    )
    for state in ("QUEUED", "STARTED", "SCHEDULED", "DEFERRED", "FAILED", "FINISHED"):
        assert hasattr(JobStatus, state), changed(
            "rq.job.JobStatus", "webapp.runtime.queue (LIVE_JOB_STATES, job_status)", f"{state} is gone"
        )


def test_a_job_enqueued_with_retries_says_how_many_are_left(app):
    # jobs/moves.py and jobs/notify.py (a move's and a notice's job) read job.retries_left to tell a last attempt.
    queue = Queue(f"internals-{uuid.uuid4().hex}", connection=services().dispatcher.redis)
    job = queue.enqueue(MOVE_JOB, 1, 1, retry=Retry(max=2, interval=[1, 2]))
    assert Job.fetch(job.id, connection=queue.connection).retries_left == 2, changed(
        "Job.retries_left", "jobs.moves and jobs.notify (the last attempt)", "a job no longer keeps it"
    )
    queue.delete(delete_jobs=True)
