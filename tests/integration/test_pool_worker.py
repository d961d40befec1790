"""One worker process, many moves in flight: slots share the process while their model calls wait,
and stopping or killing the process loses no move."""

from __future__ import annotations

import threading
import time

import pytest
from rq.job import Job
from sqlalchemy import select

from demo.billing.models import Refund
from tests.clients import session_as
from tests.conftest import wait_until
from tests.integration.test_workers import assert_valid_transcript, start, wait_status
from tests.model_server import Reply
from tests.ops.test_metrics import samples, value
from webapp.models import Conversation
from webapp.runtime.queue import move_job_id
from webapp.runtime.services import services

pytestmark = pytest.mark.slow

QUESTION = "Show invoices for customer 4471 [[held]]"  # the demo model: lookup_invoices, then an answer


def held_replies(model, count: int) -> threading.Event:
    """The next `count` model calls stream their first words, then wait for the returned gate."""
    gate = threading.Event()
    for _ in range(count):
        model.enqueue(Reply.held(gate), match="[[held]]")
    return gate


def slots(app) -> tuple[float, float]:
    """(busy, free) worker slots as /metrics reports them to an operator (the fleet's, never a tenant admin's)."""
    response = session_as(app, "operator@desk.test").get("/metrics")
    assert response.status_code == 200, response.text
    found = samples(response.text)
    return value(found, "desk_worker_slots", state="busy"), value(found, "desk_worker_slots", state="free")


def test_one_worker_process_keeps_eight_model_calls_in_flight_at_once(app, api, workers, model):
    gate = held_replies(model, 8)
    workers(WORKER_CONCURRENCY="8")
    ids = [start(api, f"{QUESTION} #{n}") for n in range(8)]
    # Every reply is held until all eight calls have arrived: one move at a time would never get there.
    wait_until(lambda: len(model.requests) >= 8, 30, "eight model calls in flight in one worker process")
    assert slots(app) == (8, 0)
    ops = session_as(app, "operator@desk.test").get("/ops").get_data(as_text=True)
    assert '<td class="slots">8 of 8</td>' in ops
    admin = session_as(app, "admin@acme.test").get("/ops").get_data(as_text=True)
    assert "The desk runs 1 worker with 8 slots for every organisation; 8 are busy now." in admin
    gate.set()
    for conversation_id in ids:
        assert_valid_transcript(wait_status(api, conversation_id, "completed"))
    wait_until(lambda: slots(app) == (0, 8), 10, "the slots to free up")
    assert model.invalid_requests == []


def test_a_worker_killed_with_thirty_moves_in_flight_loses_none(app, api, workers, model, read):
    gate = held_replies(model, 30)
    doomed = workers(WORKER_CONCURRENCY="30")
    ids = [start(api, f"{QUESTION} #{n}") for n in range(30)]
    wait_until(lambda: len(model.requests) >= 30, 30, "thirty model calls in flight")
    doomed.kill()  # SIGKILL: no cleanup at all, thirty leases held by a dead process
    gate.set()
    workers(WORKER_CONCURRENCY="30")  # the leases expire; the sweeper hands the moves to this one
    for conversation_id in ids:
        assert_valid_transcript(wait_status(api, conversation_id, "completed", timeout=60))
    assert model.invalid_requests == []


def test_sigterm_lets_the_moves_in_flight_finish(api, workers, model):
    gate = held_replies(model, 4)
    worker = workers(WORKER_CONCURRENCY="4", WORKER_STOP_GRACE_SECONDS="30")
    ids = [start(api, f"{QUESTION} #{n}") for n in range(4)]
    wait_until(lambda: len(model.requests) >= 4, 30, "four model calls in flight")
    worker.terminate()
    threading.Timer(1.0, gate.set).start()  # the answers come while the worker is stopping
    assert worker.wait_gone(20), worker.output()
    assert "released" not in worker.output()  # every move finished: no lease needed releasing
    workers()  # the moves after those (the tool, the answer) are someone else's
    for conversation_id in ids:
        assert_valid_transcript(wait_status(api, conversation_id, "completed"))


def test_sigterm_past_the_grace_releases_the_leases_and_another_worker_takes_over(app, api, workers, model, read):
    gate = held_replies(model, 3)
    worker = workers(WORKER_CONCURRENCY="3", WORKER_STOP_GRACE_SECONDS="1")
    ids = [start(api, f"{QUESTION} #{n}") for n in range(3)]
    wait_until(lambda: len(model.requests) >= 3, 30, "three model calls in flight")
    worker.terminate()
    assert worker.wait_gone(10), worker.output()
    assert "released 3 lease(s)" in worker.output()
    leases = read(lambda s: s.scalars(select(Conversation.lease_owner).where(Conversation.id.in_(ids))).all())
    assert leases == [None, None, None]
    gate.set()
    workers()
    for conversation_id in ids:
        assert_valid_transcript(wait_status(api, conversation_id, "completed", timeout=30))
    assert model.invalid_requests == []


def test_a_database_pool_smaller_than_the_slots_makes_moves_wait_not_fail(app, api, workers, model, read):
    # Ten slots, two connections: the refunds, lookups and answers queue for a connection in turn.
    workers(WORKER_CONCURRENCY="10", DATABASE_POOL_SIZE="1")
    ids = [start(api, f"Refund $1.00 on invoice 4471 and show invoices for customer 4471 (#{n})") for n in range(10)]
    for conversation_id in ids:
        conversation = wait_status(api, conversation_id, "completed", timeout=60)
        assert conversation["error"] is None
        assert_valid_transcript(conversation)
    assert read(lambda s: len(s.scalars(select(Refund.id)).all())) == 10  # one each, none twice


def test_a_full_pool_keeps_a_slot_for_the_move_a_person_asked_for(api, workers, model):
    """Two slots, one kept for people: a move from the moves queue (the loop's own, or the sweeper's)
    takes the first; another waits for it, while a person's new message goes ahead at once."""
    gate = held_replies(model, 2)
    dispatcher = services().dispatcher
    background = [start(api, f"{QUESTION} background #{n}") for n in range(2)]
    for conversation_id in background:  # as if the loop had enqueued them, not a person
        Job.fetch(move_job_id(conversation_id, 1), connection=dispatcher.redis).delete()
    dispatcher.enqueue_move(background[0], 1)
    # (no sweep meanwhile: it would rightly re-enqueue the second, whose job this test took away)
    workers(WORKER_CONCURRENCY="2", WORKER_PEOPLE_SLOTS="1", MODEL_TIMEOUT_SECONDS="60", SWEEP_INTERVAL_SECONDS="60")
    wait_until(lambda: len(model.requests) >= 1, 30, "the first background move's model call")
    dispatcher.enqueue_move(background[1], 1)
    time.sleep(2)  # room for a worker that would wrongly take it (it looks again every quarter second)
    assert move_job_id(background[1], 1) in dispatcher.queue.job_ids  # the kept slot stays free
    assert len(model.requests) == 1

    person = start(api, f"{QUESTION} a person's #2")
    wait_until(lambda: len(model.requests) >= 2, 30, "the person's move in the kept slot")
    assert "a person's #2" in str(model.requests[1])
    assert move_job_id(background[1], 1) in dispatcher.queue.job_ids  # still behind the person
    gate.set()
    for conversation_id in [*background, person]:
        assert_valid_transcript(wait_status(api, conversation_id, "completed", timeout=60))


def test_a_people_only_worker_takes_the_moves_people_asked_for_and_no_other(api, workers, model):
    dispatcher = services().dispatcher
    other = start(api, "Show invoices for customer 4471 (the loop's own move)")
    Job.fetch(move_job_id(other, 1), connection=dispatcher.redis).delete()
    dispatcher.enqueue_move(other, 1)  # on the moves queue, as the loop or the sweeper enqueues
    person = start(api, "Show invoices for customer 4471 (a person's)")
    workers(args=("--people-only", "--concurrency", "2"))
    assert_valid_transcript(wait_status(api, person, "completed", timeout=60))
    assert move_job_id(other, 1) in dispatcher.queue.job_ids  # left for the pool workers
    workers()
    assert_valid_transcript(wait_status(api, other, "completed", timeout=60))


def test_rq_suspend_holds_a_pool_worker_and_rq_resume_lets_it_go_on(api, workers, model):
    from rq.suspension import resume, suspend

    redis = services().dispatcher.redis
    workers()
    first = start(api, "Show invoices for customer 4471 (before the suspension)")
    assert_valid_transcript(wait_status(api, first, "completed", timeout=60))
    suspend(redis)
    try:
        # A worker looks for a suspension before it listens, at most once a second (SUSPENSION_LOOK_SECONDS),
        # and listens a second at a time: it has seen it within two seconds, busy or idle.
        time.sleep(3)
        held = start(api, "Show invoices for customer 4471 (while suspended)")
        time.sleep(2)  # room for a worker that would wrongly take it
        assert wait_status(api, held, "queued", timeout=1)["status"] == "queued"
    finally:
        resume(redis)
    assert_valid_transcript(wait_status(api, held, "completed", timeout=60))
