"""The loop as users run it: the JSON API, real RQ workers in subprocesses, real Redis, the model over
HTTP. Workers are killed, raced and starved of their queue; the database must stay the truth."""

from __future__ import annotations

import html
import threading

import pytest
import redis as redis_lib
from rq import Queue
from sqlalchemy import func, select, update
from sqlalchemy import text as text_sql

from demo.billing.models import Refund
from demo.model.wire import validate_request
from tests.clients import session_as
from tests.conftest import wait_until
from tests.model_server import Fault, Reply
from tests.replies import reply, text, tool_use
from webapp.agent.transcript import api_messages
from webapp.models import Conversation, Message, ToolCall
from webapp.runtime.extensions import db
from webapp.runtime.queue import move_job_id
from webapp.runtime.services import services

pytestmark = pytest.mark.slow

AGENT, REVIEWER = "agent@acme.test", "reviewer@acme.test"


def start(api, message: str) -> int:
    response = api.as_(AGENT).post("/api/conversations", json={"message": message})
    assert response.status_code == 201, response.json
    return response.json["id"]


def state(api, conversation_id: int) -> dict:
    return api.as_(AGENT).get(f"/api/conversations/{conversation_id}").json


def wait_status(api, conversation_id: int, *statuses: str, timeout: float = 30) -> dict:
    return wait_until(
        lambda: (s := state(api, conversation_id))["status"] in statuses and s,
        timeout,
        f"conversation {conversation_id} to reach {statuses}",
    )


def assert_valid_transcript(conversation: dict) -> None:
    """Every tool_use has exactly one tool_result, in the next message, in order."""
    problems = validate_request({"model": "m", "max_tokens": 1, "messages": conversation["messages"]})
    assert problems == [], problems
    uses = [b["id"] for m in conversation["messages"] for b in m["content"] if b["type"] == "tool_use"]
    results = [b["tool_use_id"] for m in conversation["messages"] for b in m["content"] if b["type"] == "tool_result"]
    assert results == uses


def approve_all(api, conversation_id: int) -> None:
    for call in state(api, conversation_id)["tool_calls"]:
        if call["status"] == "awaiting_approval":
            response = api.as_(REVIEWER).post(f"/api/approvals/{call['id']}", json={"decision": "approve"})
            assert response.status_code == 200, response.json


def test_a_question_becomes_a_chain_of_jobs_that_completes(api, workers, model):
    workers()
    conversation_id = start(api, "Show invoices for customer 4471")
    done = wait_status(api, conversation_id, "completed")
    assert [m["role"] for m in done["messages"]] == ["user", "assistant", "user", "assistant"]
    assert "#4471" in done["messages"][-1]["content"][0]["text"]
    assert done["usage"]["model_calls"] == 2 and done["usage"]["output_tokens"] > 0
    assert_valid_transcript(done)


def test_an_approved_refund_runs_in_the_worker_and_the_model_hears_the_result(api, workers, model, read):
    workers()
    conversation_id = start(api, "Please refund $60 on invoice 4471, the delivery was late")
    waiting = wait_status(api, conversation_id, "awaiting_approval")
    assert count(read, Refund) == 0
    assert [c["status"] for c in waiting["tool_calls"]] == ["awaiting_approval"]
    approve_all(api, conversation_id)
    done = wait_status(api, conversation_id, "completed")
    assert count(read, Refund) == 1
    assert done["tool_calls"][0]["decided_by"] == REVIEWER
    assert "refund" in done["messages"][-1]["content"][0]["text"].lower()
    assert_valid_transcript(done)


def three_refunds(api, model) -> int:
    refunds = [{"invoice_id": invoice, "amount_cents": 6000, "reason": "goodwill"} for invoice in (4401, 4402, 4403)]
    model.enqueue(Reply.message(reply(*[tool_use("issue_refund", r) for r in refunds])), match="three refunds")
    return start(api, "three refunds please")


def decide_call(api, call_id: int) -> None:
    response = api.as_(REVIEWER).post(f"/api/approvals/{call_id}", json={"decision": "approve"})
    assert response.status_code == 200, response.json


def count(read, model) -> int:
    return read(lambda s: s.scalar(select(func.count(model.id))))


def attempts(read, call_id: int) -> int:
    return read(lambda s: s.get(ToolCall, call_id).attempts)


def assert_three_refunds_once_each(api, read, conversation_id: int) -> dict:
    done = wait_status(api, conversation_id, "completed", timeout=60)
    assert count(read, Refund) == 3  # never twice
    assert sorted(read(lambda s: list(s.scalars(select(Refund.invoice_id))))) == [4401, 4402, 4403]
    assert all(c["status"] == "succeeded" for c in done["tool_calls"])
    assert_valid_transcript(done)
    return {c["input"]["invoice_id"]: attempts(read, c["id"]) for c in done["tool_calls"]}


def test_a_worker_killed_after_the_first_of_three_tools_resumes_with_only_the_other_two(api, workers, model, read):
    conversation_id = three_refunds(api, model)
    worker = workers()
    first, second, third = wait_status(api, conversation_id, "awaiting_approval")["tool_calls"]
    decide_call(api, first["id"])
    wait_until(lambda: count(read, Refund) == 1, 30, "the first refund")
    worker.kill()  # SIGKILL as soon as the first tool's result is committed
    decide_call(api, second["id"])
    decide_call(api, third["id"])
    workers()  # a fresh worker; its sweeper picks up whatever the dead one held
    tries = assert_three_refunds_once_each(api, read, conversation_id)
    assert tries == {4401: 1, 4402: 1, 4403: 1}  # the finished call was not run again


def test_a_worker_killed_inside_a_tool_call_resumes_it_under_its_idempotency_key(api, workers, model, engine, read):
    if engine.dialect.name != "postgresql":
        pytest.skip("holding one invoice's row lock from the test needs PostgreSQL's row locks")
    conversation_id = three_refunds(api, model)
    worker = workers()
    calls = wait_status(api, conversation_id, "awaiting_approval")["tool_calls"]
    with engine.connect() as blocker:  # the refund of invoice 4402 will wait on this row lock
        blocker.execute(text_sql("SELECT id FROM invoices WHERE id = 4402 FOR UPDATE"))
        decide_call(api, calls[0]["id"])
        decide_call(api, calls[1]["id"])
        wait_until(
            lambda: count(read, Refund) == 1 and read(lambda s: s.get(ToolCall, calls[1]["id"]).status) == "running",
            30,
            "the second refund to be claimed and stuck inside the tool",
        )
        # A reviewer deciding the third call is not held up by the second's tool, however long it takes.
        third = threading.Thread(target=decide_call, args=(api, calls[2]["id"]), daemon=True)
        third.start()
        third.join(10)
        assert not third.is_alive(), "the decision waited for another call's running tool"
        worker.kill()
        blocker.rollback()
    workers()  # the dead worker's lease expires; the sweeper hands the move to this one
    tries = assert_three_refunds_once_each(api, read, conversation_id)
    assert tries == {4401: 1, 4402: 2, 4403: 1}  # 4402 re-ran under the same idempotency key


def test_two_workers_racing_for_the_same_moves_never_make_one_twice(app, api, workers, model, read):
    workers(), workers()
    ids = [start(api, "Show invoices for customer 4471") for _ in range(6)]
    # Duplicate every conversation's first job under another id, as a sweeper racing a slow job would.
    for conversation_id in ids:
        version = read(lambda s, cid=conversation_id: s.get(Conversation, cid).version)
        services().dispatcher.enqueue_move(conversation_id, version, recovery=1)
    for conversation_id in ids:
        done = wait_status(api, conversation_id, "completed")
        assert_valid_transcript(done)
        assert done["usage"]["model_calls"] == 2
    assert len(model.requests) == 2 * len(ids)
    assert count(read, Message) == 4 * len(ids)


def test_a_duplicate_enqueue_of_the_same_move_is_refused(app):
    dispatcher = services().dispatcher
    assert dispatcher.enqueue_move(999, 1) is True
    assert dispatcher.enqueue_move(999, 1) is False
    assert Queue(dispatcher.queue.name, connection=dispatcher.redis).job_ids == [move_job_id(999, 1)]


def test_a_transient_model_error_is_retried_and_then_succeeds(api, workers, model):
    model.enqueue(Fault.status(529, error_type="overloaded_error"), match="customer 4471")
    model.enqueue(Fault.status(429, headers={"retry-after": "0"}), match="customer 4471")
    workers()
    conversation_id = start(api, "Show invoices for customer 4471")
    done = wait_status(api, conversation_id, "completed")
    assert len(model.requests) == 4  # two failures, then the two calls of the run
    assert_valid_transcript(done)


def test_transient_errors_past_the_retries_fail_the_run_in_words_and_retry_recovers(api, workers, model):
    for _ in range(3):  # the first attempt and MOVE_RETRIES=2
        model.enqueue(Fault.status(500, error_type="api_error"))
    workers()
    conversation_id = start(api, "Show invoices for customer 4471")
    failed = wait_status(api, conversation_id, "failed")
    assert failed["error"] == {
        "code": "service_error",
        "message": "The model service failed (HTTP 500)."
        " It still failed after retrying; press Retry once the service is back.",
    }
    response = api.as_(AGENT).post(f"/api/conversations/{conversation_id}/retry")
    assert response.status_code == 202
    assert_valid_transcript(wait_status(api, conversation_id, "completed"))


def test_a_permanent_model_error_fails_at_once(api, workers, model):
    model.enqueue(Fault.status(400, "messages: roles must alternate", error_type="invalid_request_error"))
    workers()
    conversation_id = start(api, "Show invoices for customer 4471")
    failed = wait_status(api, conversation_id, "failed")
    assert len(model.requests) == 1  # no retry of a request the service rejected
    assert failed["error"]["code"] == "request_rejected"
    assert "roles must alternate" in failed["error"]["message"]


def test_cancel_between_moves_settles_the_waiting_calls_and_the_conversation_continues(api, workers, model, read):
    workers()
    conversation_id = start(api, "Please refund $60 on invoice 4471 and email customer 4471")
    wait_status(api, conversation_id, "awaiting_approval")
    response = api.as_(AGENT).post(f"/api/conversations/{conversation_id}/cancel")
    assert response.status_code == 202
    cancelled = wait_status(api, conversation_id, "cancelled")
    assert {c["status"] for c in cancelled["tool_calls"]} == {"cancelled"}
    assert count(read, Refund) == 0
    assert_valid_transcript(cancelled)
    again = api.as_(AGENT).post(
        f"/api/conversations/{conversation_id}/messages", json={"message": "Show invoices for customer 4471"}
    )
    assert again.status_code == 202
    assert_valid_transcript(wait_status(api, conversation_id, "completed"))


def test_cancel_during_a_streamed_model_call_stops_it_and_leaves_a_valid_transcript(api, workers, model):
    gate = threading.Event()
    model.enqueue(Reply.held(gate), match="[[long answer]]")
    workers()
    conversation_id = start(api, "[[long answer]]")
    wait_until(lambda: len(model.requests) == 1, 30, "the model call to start")
    assert state(api, conversation_id)["status"] == "running"
    api.as_(AGENT).post(f"/api/conversations/{conversation_id}/cancel")
    cancelled = wait_status(api, conversation_id, "cancelled")
    gate.set()
    assert cancelled["stop_reason"] == "cancelled"
    assert_valid_transcript(cancelled)
    api.as_(AGENT).post(
        f"/api/conversations/{conversation_id}/messages", json={"message": "Show invoices for customer 4471"}
    )
    assert_valid_transcript(wait_status(api, conversation_id, "completed"))


def test_the_sweeper_re_enqueues_a_conversation_whose_job_redis_lost(api, workers, model, env):
    conversation_id = start(api, "Show invoices for customer 4471")
    redis_lib.Redis.from_url(env["REDIS_URL"]).flushdb()  # the queue and its job are gone
    workers()  # its periodic sweeper (every second here) notices within the grace period
    assert_valid_transcript(wait_status(api, conversation_id, "completed", timeout=30))


def test_the_sweep_command_re_enqueues_an_orphaned_conversation(cli, api, env, model):
    conversation_id = start(api, "Show invoices for customer 4471")
    redis_lib.Redis.from_url(env["REDIS_URL"]).flushdb()
    conversation = db.session.get(Conversation, conversation_id)
    from datetime import timedelta

    conversation.updated_at -= timedelta(seconds=5)
    db.session.commit()
    result = cli("sweep")
    assert result.exit_code == 0 and "Re-enqueued 1 conversation" in result.output
    assert services().dispatcher.queue.count == 1
    again = cli("sweep")
    assert "Re-enqueued 0 conversation" in again.output  # its job is alive now


def test_budget_exhaustion_pauses_and_a_reviewer_extends_it(api, workers, model):
    conversation_id = start(api, "Show invoices for customer 4471")
    db.session.execute(update(Conversation).where(Conversation.id == conversation_id).values(move_budget=2))
    db.session.commit()
    workers()
    paused = wait_status(api, conversation_id, "budget_exhausted")
    assert paused["moves_used"] == 2
    forbidden = api.as_(AGENT).post(f"/api/conversations/{conversation_id}/budget", json={"moves": 5})
    assert forbidden.status_code == 403
    response = api.as_(REVIEWER).post(f"/api/conversations/{conversation_id}/budget", json={"moves": 5})
    assert response.status_code == 202 and response.json["move_budget"] == 7
    assert_valid_transcript(wait_status(api, conversation_id, "completed"))


def test_every_message_row_is_written_once_and_in_order(api, workers, model, read):
    workers()
    conversation_id = start(api, "Show invoices for customer 4471")
    wait_status(api, conversation_id, "completed")
    rows = read(
        lambda s: list(
            s.scalars(select(Message).where(Message.conversation_id == conversation_id).order_by(Message.id))
        )
    )
    assert [row.seq for row in rows] == [1, 2, 3, 4]
    assert [m["role"] for m in api_messages(rows)] == ["user", "assistant", "user", "assistant"]


@pytest.mark.parametrize("stop_reason", ["model_context_window_exceeded", "a_stop_reason_of_a_later_api_version"])
def test_an_unknown_stop_reason_ends_the_turn_once_and_the_page_says_so(app, api, workers, model, stop_reason):
    """An unknown stop reason must never make the loop ask the model again (until the move budget
    runs out), and the page says why the answer may be partial. One longer than the rows hold (32
    characters) failed the move's commit on PostgreSQL, and with it the conversation."""
    model.enqueue(Reply.message(reply(text("Here is what I found so far."), stop_reason=stop_reason)))
    workers()
    conversation_id = start(api, "Summarise the account")
    done = wait_status(api, conversation_id, "completed", "failed")
    assert done["status"] == "completed" and len(model.requests) == 1 and done["moves_used"] == 1
    page = html.unescape(session_as(app, AGENT).get(f"/conversations/{conversation_id}").get_data(as_text=True))
    db.session.remove()
    assert "Here is what I found so far." in page
    assert f"The model stopped for a reason this desk does not know (“{stop_reason[:32]}”)" in page
