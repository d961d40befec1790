"""A job makes a conversation's moves back to back, committing after each, and hands the rest back
to the queue after its bound; the moves that follow a person's act wait on a queue of their own."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from jobs import moves as move_jobs
from tests.conftest import desk_app, pushed
from tests.integration.test_workers import assert_valid_transcript, start, state
from tests.model_server import Fault
from webapp.models import AuditEvent, Conversation
from webapp.runtime import worker_state
from webapp.runtime.extensions import db
from webapp.runtime.queue import move_job_id
from webapp.runtime.services import services
from webapp.runtime.worker import PromptWorker

QUESTION = "Show invoices for customer 4471"  # the demo model: lookup_invoices, then an answer: three moves


@pytest.fixture
def app(env, clean, request):
    """The app (the api fixture's too) with the chain's bounds a test asks for (indirect parametrisation)."""
    with pushed(desk_app({**env, **getattr(request, "param", {})})) as app:
        yield app


class CountingWorker(PromptWorker):
    ran = 0

    def execute_job(self, job, queue):
        self.ran += 1
        return super().execute_job(job, queue)


def run_jobs() -> int:
    """Work every move queue empty in this process, as a worker would; how many jobs ran."""
    dispatcher = services().dispatcher
    worker = CountingWorker(dispatcher.move_queues, connection=dispatcher.redis)
    worker.work(burst=True)
    return worker.ran


def versions(conversation_id: int) -> int:
    db.session.remove()
    return db.session.get(Conversation, conversation_id).version


def test_a_persons_message_waits_on_the_people_queue(app, api, model):
    conversation_id = start(api, QUESTION)
    dispatcher = services().dispatcher
    assert dispatcher.people_queue.job_ids == [move_job_id(conversation_id, 1)]
    assert dispatcher.queue.job_ids == []  # not behind the moves already in flight


def test_one_job_makes_every_move_that_is_ready_committing_after_each(app, api, model):
    conversation_id = start(api, QUESTION)
    before = versions(conversation_id)
    assert run_jobs() == 1  # one job for the model call, the lookup and the answer
    answered = state(api, conversation_id)
    assert answered["status"] == "completed"
    assert_valid_transcript(answered)
    assert versions(conversation_id) == before + 3  # each move claimed and ended its own lease
    moves_audited = db.session.scalar(
        select(func.count()).select_from(AuditEvent).where(AuditEvent.conversation_id == conversation_id)
    )
    assert moves_audited >= 3


@pytest.mark.parametrize("app", [{"MOVE_CHAIN_MOVES": "1"}], indirect=True)
def test_past_its_bound_a_job_hands_the_next_move_back_to_the_queue(app, api, model):
    conversation_id = start(api, QUESTION)
    first = versions(conversation_id)
    outcome = move_jobs.advance_conversation(conversation_id, first)
    assert outcome == "generate"  # one move, then the bound
    dispatcher = services().dispatcher
    assert dispatcher.queue.job_ids == [move_job_id(conversation_id, first + 1)]  # the rest: the moves queue
    assert run_jobs() == 3  # the people queue's job (now stale) and one job per move left
    assert state(api, conversation_id)["status"] == "completed"


def test_a_stopping_worker_hands_the_rest_back_after_the_move_it_makes(app, api, model):
    conversation_id = start(api, QUESTION)
    first = versions(conversation_id)
    worker_state.stopping.set()
    try:
        assert move_jobs.advance_conversation(conversation_id, first) == "generate"
    finally:
        worker_state.stopping.clear()
    assert services().dispatcher.queue.job_ids == [move_job_id(conversation_id, first + 1)]


def test_a_transient_failure_after_the_first_move_gets_a_job_of_its_own_and_loses_nothing(app, api, model):
    model.enqueue(Fault.status(529, error_type="overloaded_error"), match="tool_result")  # the answer, once
    conversation_id = start(api, QUESTION)
    first = versions(conversation_id)
    assert move_jobs.advance_conversation(conversation_id, first) == "generate run_tool handed_back"
    assert services().dispatcher.queue.job_ids == [move_job_id(conversation_id, first + 2)]
    run_jobs()
    answered = state(api, conversation_id)
    assert answered["status"] == "completed"
    assert_valid_transcript(answered)
    assert len(model.requests) == 3  # the lookup's call, the refused answer, the answer
