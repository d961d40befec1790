"""The worker process: RQ jobs run in a pool of slots, each slot a thread with its own app context
(and so its own database session), plus a sweep ticker.

A move mostly waits (on the model, on a tool's server), so one process keeps many in flight: it takes
a job off the queue only when a slot is free, so a job taken is a job started, and other processes
take the rest. Everything that keeps moves safe lives in the database and is indifferent to threads:
the lease, the compare-and-set guards, job ids per move, idempotency keys.

Stopping: the first SIGTERM or SIGINT stops taking jobs and lets the moves in flight finish for up
to WORKER_STOP_GRACE_SECONDS (25: below the 30 s most process managers wait before SIGKILL). Moves
still running then have their leases released, so the sweeper hands them to another worker at its
next pass instead of after a lease, and whatever they write later is refused by the guard (they no
longer hold the lease). The MCP servers the process started (webapp/tools/mcp/sessions.py keeps one per
server while calls come) are stopped before it exits. A second signal stops at once; a SIGKILL
loses nothing either: the leases expire and the sweeper re-enqueues (and a server the desk started
sees its stdin close and ends, as the MCP stdio transport asks of it).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import redis
from flask import Flask
from rq import SimpleWorker
from rq.exceptions import StopRequested
from rq.timeouts import TimerDeathPenalty
from rq.worker import WorkerStatus

from webapp import logs
from webapp.agent import moves
from webapp.runtime import worker_state
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.tools import mcp

log = logging.getLogger(__name__)
HEARTBEAT_EVERY = 5.0  # seconds; RQ's worker key lives for its worker_ttl (minutes)
KEPT_SLOT_LOOK_SECONDS = 0.25  # with only people's slots free, how often the other moves are looked at again
SUSPENSION_LOOK_SECONDS = 1.0  # how often the worker looks whether `rq suspend` holds the workers


class PromptWorker(SimpleWorker):
    """RQ's SimpleWorker whose stop cannot hang on its command channel (the tests' in-process workers
    are these; PoolWorker is one)."""

    def unsubscribe(self) -> None:
        """RQ's, in an order that cannot hang. RQ sends UNSUBSCRIBE, then stops the thread that reads
        its command channel; from redis-py 8.2 that stop waits for the thread, which, had it read the
        reply before it was told to stop, sleeps in a read of 60 s (a stopping worker outlived its
        grace by that much). Told first, the thread ends at the reply."""
        thread = self.pubsub_thread
        if not thread:
            return
        try:
            thread.stop(timeout=0)  # only clears its flag (redis-py 8.2 joins for up to `timeout`)
        except TypeError:  # an older redis-py: stop() takes no timeout, and never waited
            thread.stop()
        self.pubsub.unsubscribe()
        thread.join(timeout=1)
        self.pubsub.close()


class PoolWorker(PromptWorker):
    """An RQ worker running up to `concurrency` jobs at once, each in a thread of a pool with its
    own app context. RQ 3 tracks a worker's executions one by one (worker.executions), so its
    registries, heartbeats and results stay right with several at a time. The people queue comes
    first, and its last `people_slots` free slots take no other job: the move that follows a person's
    act never waits behind a full pool."""

    death_penalty_class = TimerDeathPenalty  # job timeouts by timer: signals reach the main thread only

    def __init__(
        self,
        queues,
        *,
        app: Flask,
        concurrency: int,
        stop_grace_seconds: float,
        people_queue=None,
        people_slots: int = 0,
        **kwargs,
    ) -> None:
        super().__init__(queues, **kwargs)
        self.app = app
        self.concurrency = concurrency
        # The last `people_slots` free slots take only jobs of `people_queue` (the first of `queues`).
        self.people_queue = people_queue
        self.people_slots = min(people_slots, concurrency - 1) if people_queue is not None else 0
        worker_state.stopping.clear()
        self.stop_grace_seconds = stop_grace_seconds
        self._free = threading.BoundedSemaphore(concurrency)
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="slot")
        self._busy = 0
        self._busy_lock = threading.Lock()
        self._listening = False
        self._beat = 0.0  # when the worker's own loop last heartbeat (time.monotonic())
        self._suspension_looked = -SUSPENSION_LOOK_SECONDS  # when it last looked for `rq suspend`

    def serialize(self) -> dict:
        """RQ's worker record in Redis, with the number of slots (the ops page and /metrics read it) and
        the moves made so far (the ops page; a heartbeat brings it up to date)."""
        return {**super().serialize(), "slots": self.concurrency, "moves": worker_state.moves_made()}

    def dequeue_job_and_maintain_ttl(self, timeout, max_idle_time=None):
        """Take a job only once a slot is free (heartbeating meanwhile), so a job taken is a job
        started. In burst mode, an empty queue ends the work only once no slot is busy: the moves in
        flight may enqueue the next ones."""
        while not self._free.acquire(timeout=1):
            if self._stop_requested:
                raise StopRequested()
            self.heartbeat()
        result = None
        everything = self._ordered_queues
        listening_since = time.monotonic()
        try:
            while not self._stop_requested:
                # Listen a moment at a time, so that between moments the worker sees an `rq suspend`
                # (RQ itself looks only before it listens, and then listens for minutes) and, with only
                # the slots kept for people free, listens to the people queue alone, looking again at
                # how many slots are free after each moment.
                kept = self._busy >= self.concurrency - self.people_slots
                self._ordered_queues = [self.people_queue] if kept else everything
                moment = None if timeout is None else KEPT_SLOT_LOOK_SECONDS if kept else SUSPENSION_LOOK_SECONDS
                self._listening = True
                try:
                    result = super().dequeue_job_and_maintain_ttl(moment, moment)
                finally:
                    self._listening = False
                    self._ordered_queues = everything
                if result is not None:
                    break
                if timeout is None:  # burst: done once the queues are empty and no slot is busy
                    if not self._busy:
                        break
                    time.sleep(0.05)
                    continue
                if max_idle_time is not None and time.monotonic() - listening_since >= max_idle_time:
                    break  # RQ's max_idle_time ran out
                self._suspension_looked = -SUSPENSION_LOOK_SECONDS  # an idle worker looks after each moment
                self.check_for_suspension(burst=False)  # (waits while suspended)
        finally:
            if result is None:
                self._free.release()
        if result is None and self._stop_requested:
            raise StopRequested()
        return result

    def execute_job(self, job, queue) -> None:
        execution = self.prepare_execution(job)
        with self._busy_lock:
            self._busy += 1
        self._pool.submit(self._run, job, queue, execution)

    def _run(self, job, queue, execution) -> None:
        try:
            with self.app.app_context():
                try:
                    self.perform_job(job, queue, execution)
                finally:
                    db.session.remove()
        except Exception:  # perform_job records a job's failure itself; this is RQ's bookkeeping failing
            log.exception("slot could not finish job %s", job.id)
        finally:
            with self._busy_lock:
                self._busy -= 1
                idle = self._busy == 0
            self._free.release()
            if idle:
                self._set_state_quietly(WorkerStatus.IDLE)

    def set_state(self, state: str, pipeline=None) -> None:
        # RQ says "idle" whenever it listens for a job; with slots still working the worker is busy.
        if state == WorkerStatus.IDLE and self._busy:
            state = WorkerStatus.BUSY
        if state == self._state and pipeline is None:
            return  # RQ sets the state before every dequeue: a write only when it changes
        super().set_state(state, pipeline=pipeline)

    def heartbeat(self, timeout=None, pipeline=None) -> None:
        """RQ heartbeats the worker before every dequeue and after every job, three Redis round trips
        each time for a key that lives for minutes: with many slots, a good part of every move's
        cost. The worker's own loop heartbeats at most every HEARTBEAT_EVERY seconds, in one round
        trip; the heartbeats RQ sends inside its own pipelines (a job starting) go as they are."""
        if timeout is not None or pipeline is not None:
            super().heartbeat(timeout, pipeline)
            return
        if time.monotonic() - self._beat < HEARTBEAT_EVERY:
            return
        beat = self.connection.pipeline(transaction=False)
        super().heartbeat(pipeline=beat)
        beat.hset(self.key, "moves", worker_state.moves_made())
        beat.execute()
        self._beat = time.monotonic()

    def check_for_suspension(self, burst: bool) -> None:
        """RQ looks whether `rq suspend` holds the workers before taking every job, a round trip with a
        heartbeat each time (a tenth of RQ's share of a move); a pool looks at most once a second, and
        listens a second at a time (dequeue_job_and_maintain_ttl), so a suspension stops it from
        taking jobs within two seconds, busy or idle."""
        if time.monotonic() - self._suspension_looked < SUSPENSION_LOOK_SECONDS:
            return
        super().check_for_suspension(burst)
        self._suspension_looked = time.monotonic()

    def _set_state_quietly(self, state: str) -> None:
        try:
            self.set_state(state)
        except (redis.RedisError, OSError):
            pass

    def _shutdown(self) -> None:
        """Warm shutdown (RQ's signal handler): take no more jobs. The main thread is interrupted
        only while it listens for one, never while it hands a job to a slot."""
        self._stop_requested = True
        worker_state.stopping.set()  # a job working a conversation's moves back to back hands the rest back
        self.set_shutdown_requested_date()
        if self._listening:
            raise StopRequested()

    def teardown(self) -> None:
        """Let the moves in flight finish (up to the stop grace), release the leases of those that
        did not, then deregister."""
        deadline = time.monotonic() + self.stop_grace_seconds
        while self._busy and time.monotonic() < deadline:
            time.sleep(0.05)
        stranded = self._busy
        if stranded:
            with self.app.app_context():
                try:
                    released = moves.release_leases(db.session, worker_state.process_owner())
                    db.session.commit()
                finally:
                    db.session.remove()
            log.warning("stopping with %s move(s) still running; released %s lease(s)", stranded, released)
        # The MCP servers this process started run in sessions of their own (the SDK starts each in a
        # new process group, out of reach of a signal to the worker's): stop them before leaving, and
        # start none for a move still running. (A loop that ended unasked works on as a fresh worker,
        # which starts them again when called.)
        closed = mcp.close_sessions(stopping=self._stop_requested or bool(stranded))
        if closed:
            log.info("stopped %s MCP server(s) this worker had started", closed)
        super().teardown()
        self._pool.shutdown(wait=False)
        if stranded:
            logging.shutdown()
            # The slots' threads would hold the interpreter open until their moves end. Asked to stop,
            # that is a clean exit; otherwise (RQ's loop gave up) a process manager should restart it.
            os._exit(0 if self._stop_requested else 1)


def start_sweep_ticker(app: Flask, stop: threading.Event) -> threading.Thread:
    """Every sweep interval, enqueue one sweep job for the whole fleet (its id is unique per interval)."""
    desk = services()
    interval = desk.config.sweep_interval_seconds

    def tick() -> None:
        while not stop.is_set():
            try:
                desk.dispatcher.enqueue_sweep(int(time.time() // interval))
            except Exception:  # Redis down: the next tick tries again
                app.logger.warning("could not enqueue the sweeper; retrying next interval")
            stop.wait(interval)

    thread = threading.Thread(target=tick, name="sweep-ticker", daemon=True)
    thread.start()
    return thread


def _retire(worker: PoolWorker) -> None:
    """Mark a worker whose loop ended as dead in Redis, so a fresh one may register under its name
    (RQ refuses a name whose worker it still counts as alive). Without Redis there is nothing to mark."""
    try:
        worker.register_death()
    except (redis.RedisError, OSError):
        pass


def run_worker(
    app: Flask, burst: bool = False, name: str | None = None, concurrency: int | None = None, people_only: bool = False
) -> bool:
    """Work the people queue, the moves queue, then tools' background jobs, `concurrency` jobs at a
    time (default: WORKER_CONCURRENCY), until stopped (or until they are empty with burst); returns
    whether any job ran. `people_only`: the people queue alone, in a process of its own, which the
    operating system gives its share of the CPU however busy the pool workers' threads are."""
    with app.app_context():
        logs.configure(app)  # JSON lines; RQ's own loggers then write through it too
        desk = services()
        slots = concurrency or desk.config.worker_concurrency
        dispatcher = desk.dispatcher
        queues = [*dispatcher.move_queues, dispatcher.background_queue]  # people's moves first, then moves
        people_slots = desk.config.worker_people_slots
        if people_slots is None:
            people_slots = max(1, slots // 10) if slots >= 4 else 0
        if people_only:
            queues, people_slots = [dispatcher.people_queue], 0

        def new_worker() -> PoolWorker:
            return PoolWorker(
                queues,
                app=app,
                concurrency=slots,
                people_queue=dispatcher.people_queue,
                people_slots=people_slots,
                stop_grace_seconds=desk.config.worker_stop_grace_seconds,
                connection=desk.dispatcher.redis,
                name=name,
            )

        worker = new_worker()
        stop = threading.Event()
        if not burst:
            start_sweep_ticker(app, stop)
        try:
            while True:
                try:
                    worked = worker.work(burst=burst, with_scheduler=True, logging_level="WARNING")
                    if burst or worker._stop_requested:
                        return worked
                    # RQ's loop returns after an error it did not expect (it logs "quitting"): a worker
                    # that stops unasked would leave the queue to the others, so work on as a fresh one.
                    app.logger.warning("the worker's loop ended unasked; working on as a fresh worker")
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    # RQ quits when Redis vanishes around a job (it cannot record the job's end). The
                    # database holds the state: wait for Redis and work on as a fresh worker.
                    app.logger.warning("lost Redis (%s); working again once it answers", exc)
                time.sleep(2)
                _retire(worker)
                worker = new_worker()
        finally:
            stop.set()
