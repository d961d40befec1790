"""The dispatcher's view of RQ: which moves are still alive, so the sweeper re-enqueues only dead ones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rq import Queue
from rq.job import Job

from webapp.runtime.queue import move_job_id
from webapp.runtime.services import services


def test_a_move_a_worker_has_just_popped_stays_alive_until_a_lease_has_passed(app):
    dispatcher = services().dispatcher
    job_id = move_job_id(999, 4)
    assert dispatcher.enqueue_move(999, 4)
    assert dispatcher.job_alive(job_id)  # waiting in the queue
    assert job_id in dispatcher.waiting_move_ids()  # as a sweep reads the queues, once for all
    assert dispatcher.job_alive(job_id, dispatcher.waiting_move_ids())

    # A worker (listening to the moves queue, then the background one) pops it: still "queued" until
    # the worker marks it started. Seen dead in that moment, the sweeper would add a second job, which
    # after a transient failure is an attempt more than MOVE_RETRIES allows.
    taken = Queue.dequeue_any([dispatcher.queue, dispatcher.background_queue], None, connection=dispatcher.redis)
    assert taken is not None and taken[0].id == job_id
    assert dispatcher.redis.lpos(dispatcher.queue.key, job_id) is None
    assert dispatcher.job_alive(job_id)
    assert dispatcher.job_alive(job_id, dispatcher.waiting_move_ids())  # popped: alive, though not waiting

    # A worker that died right there leaves it queued for good: dead once a lease has passed.
    job = Job.fetch(job_id, connection=dispatcher.redis)
    job.enqueued_at = datetime.now(UTC) - timedelta(seconds=dispatcher.config.lease_seconds + 1)
    job.save()
    assert not dispatcher.job_alive(job_id)
    assert not dispatcher.job_alive(job_id, dispatcher.waiting_move_ids())


def test_a_move_that_is_gone_or_long_started_is_dead(app):
    dispatcher = services().dispatcher
    assert not dispatcher.job_alive(move_job_id(12345, 0))  # Redis never had it (or lost it)
    assert dispatcher.enqueue_move(998, 1)
    job = Job.fetch(move_job_id(998, 1), connection=dispatcher.redis)
    job.set_status("started")
    job.started_at = datetime.now(UTC)
    job.save()
    assert dispatcher.job_alive(job.id)
    job.started_at = datetime.now(UTC) - timedelta(seconds=dispatcher.config.lease_seconds + 1)
    job.save()
    assert not dispatcher.job_alive(job.id)


def test_a_process_holds_hundreds_of_redis_connections_at_once(app):
    # Each live page holds a pub/sub connection, and a worker's slots each take one as they finish:
    # redis-py's default pool refuses the 101st ("Too many connections").
    dispatcher = services().dispatcher
    listeners = []
    try:
        for n in range(150):
            listener = dispatcher.redis.pubsub()
            listener.subscribe(f"desk:test:{n}")
            listeners.append(listener)
        assert dispatcher.redis.ping()
    finally:
        for listener in listeners:
            listener.close()
