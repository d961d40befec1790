"""Tasks in the loop's domain: tools that answer "not yet", on a real database and the real SDK over
HTTP (no Flask, no RQ: the test plays the scheduler by waking a parked conversation when its task
is due, as the wake-up job does)."""

from __future__ import annotations

import json
import re
import time

import pytest
from sqlalchemy import select

from demo.billing.models import OutgoingEmail
from demo.billing.tools import TOOLS
from tests.model_server import Reply
from tests.replies import reply, text, tool_use
from tests.task_tools import BadStatus, Countdown, Stuck
from webapp.agent import moves, sweeper
from webapp.agent.decisions import arguments_hash, decide
from webapp.agent.transcript import api_messages
from webapp.models import ToolCall, User
from webapp.tools.registry import ToolRegistry
from webapp.tools.tasks import Task, TaskError


@pytest.fixture
def tools() -> ToolRegistry:
    return ToolRegistry([*TOOLS, Countdown, Stuck, BadStatus])


def drive(session, loop, timeout: float = 15.0, seen: list | None = None) -> str:
    """Make moves as the workers would until the conversation stops or waits on a person's decision
    or input; a conversation parked on a task is woken when its task is due. `seen` collects the
    statuses it parked in."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = loop.complete()
        if seen is not None:
            seen.append(status)
        open_tasks = [c for c in loop.open_round() if c.status == "awaiting_task"]
        if status != "awaiting_task" or not open_tasks:
            return status  # done, or a person must decide
        if all(c.task["status"] == "input_required" and c.task_input is None for c in open_tasks):
            return status  # only a person can move it on
        while not sweeper.has_due_task(session, loop.conversation.id):
            time.sleep(0.02)
        moves.wake(session, loop.conversation)
        session.commit()
    raise AssertionError(f"conversation still {loop.conversation.status} after {timeout} s")


def call_named(session, loop, name: str) -> ToolCall:
    return session.scalar(
        select(ToolCall).where(ToolCall.conversation_id == loop.conversation.id, ToolCall.name == name)
    )


def results_message(loop) -> dict:
    """The one user message that answers the round."""
    messages = api_messages(loop.rows())
    answers = [m for m in messages if m["role"] == "user" and any(b["type"] == "tool_result" for b in m["content"])]
    assert len(answers) == 1, answers
    return answers[0]


def start(session, new_loop, model, tools, *blocks, message="Do it."):
    model.enqueue(Reply.message(reply(*blocks)))
    loop = new_loop(tools=tools)
    loop.ask_later(message)
    session.commit()
    return loop


# --- the Task value ------------------------------------------------------------------------------


def test_a_task_round_trips_through_json_so_another_process_can_resume_it():
    task = Task(
        "working",
        message="exported 4 of 10 tables",
        poll_seconds=2.5,
        progress=0.4,
        data={"job": "export-7", "done": ["a", "b"], "nested": {"n": 1}},
    )
    stored = json.loads(json.dumps(task.to_dict()))
    assert Task.from_dict(stored) == task
    waiting = Task("input_required", message="waiting", input_prompt="The code", data={"tries": 3})
    assert Task.from_dict(json.loads(json.dumps(waiting.to_dict()))) == waiting


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda: Task("paused"), "Task status 'paused' is not one of working, input_required, completed"),
        (lambda: Task.from_dict({"status": "done"}), "Task status 'done' is not one of"),
        (lambda: Task.from_dict({"message": "no status"}), "has no status"),
        (lambda: Task.from_dict({"status": "working", "colour": "red"}), "unknown fields: colour"),
        (lambda: Task("working", data={1: "x"}), "string keys"),
        (lambda: Task("working", data={"when": object()}), "JSON-serialisable"),
        (lambda: Task("working", data=["not", "a", "dict"]), "JSON object"),
        (lambda: Task("working", poll_seconds=0), "positive number of seconds"),
        (lambda: Task("working", progress=1.5), "fraction from 0 to 1"),
    ],
)
def test_a_task_that_cannot_be_is_refused_with_a_clear_error(make, says):
    with pytest.raises(TaskError, match=re.escape(says)):
        make()


def test_a_tool_answering_with_a_bad_status_gives_the_model_a_clear_error(session, new_loop, model, tools):
    loop = start(session, new_loop, model, tools, tool_use("bad_status", {}))
    drive(session, loop)
    call = call_named(session, loop, "bad_status")
    assert call.status == "failed" and call.is_error
    assert "gave an invalid task: Task status 'paused' is not one of working" in call.result
    assert model.invalid_requests == []


# --- polling ----------------------------------------------------------------------------------------


def test_a_task_completes_after_three_polls_and_its_result_goes_to_the_model(session, new_loop, model, tools):
    loop = start(session, new_loop, model, tools, tool_use("countdown", {"polls": 3, "poll_seconds": 0.1}))
    seen: list = []
    assert drive(session, loop, seen=seen) == "completed"
    assert "awaiting_task" in seen
    call = call_named(session, loop, "countdown")
    assert call.status == "succeeded" and not call.is_error
    assert '"polls": 3' in call.result and call.result.startswith("<tool_output")
    assert call.task["status"] == "completed" and call.task["progress"] == 1.0
    answer = results_message(loop)
    assert [b["tool_use_id"] for b in answer["content"]] == [call.tool_use_id]
    assert loop.conversation.moves_used == 3  # generate, run the tool, generate: polls are not moves
    assert len(model.requests) == 2 and model.invalid_requests == []


def ended_countdown(session, new_loop, model, tools, polls: int, ends: str):
    """A countdown task that ends as `ends` after `polls` polls, driven until its conversation completed."""
    loop = start(
        session, new_loop, model, tools, tool_use("countdown", {"polls": polls, "poll_seconds": 0.05, "ends": ends})
    )
    assert drive(session, loop) == "completed"
    return loop, call_named(session, loop, "countdown")


def test_a_failed_task_is_an_error_result(session, new_loop, model, tools):
    loop, call = ended_countdown(session, new_loop, model, tools, polls=2, ends="failed")
    assert call.status == "failed" and call.is_error
    assert call.result == "The countdown broke after 2 polls."
    block = results_message(loop)["content"][0]
    assert block["is_error"] is True and block["content"] == call.result
    assert model.invalid_requests == []


def test_a_task_its_tool_cancels_gives_the_model_the_notice(session, new_loop, model, tools):
    _, call = ended_countdown(session, new_loop, model, tools, polls=1, ends="cancelled")
    assert call.status == "cancelled" and call.is_error
    assert call.result == "Cancelled: The countdown was withdrawn by its owner."
    assert model.invalid_requests == []


def test_stopping_the_conversation_cancels_its_open_tasks_and_settles_them(session, new_loop, model, tools):
    loop = start(session, new_loop, model, tools, tool_use("countdown", {"polls": 10, "poll_seconds": 5}))
    assert loop.complete() == "awaiting_task"
    call = call_named(session, loop, "countdown")
    assert call.status == "awaiting_task" and call.task["message"] == "0 of 10 polls"
    version = moves.request_cancel(session, loop.conversation, None)
    session.commit()
    assert version is not None  # a parked conversation gets a move to settle it
    assert loop.complete() == "cancelled"
    assert call.id in Countdown.cancelled
    assert call.status == "cancelled" and call.is_error
    assert "stopped while this call's task was still open (last status: 0 of 10 polls)" in call.result
    assert call.task["status"] == "cancelled" and call.task_due_at is None
    assert [b["tool_use_id"] for b in results_message(loop)["content"]] == [call.tool_use_id]


def test_a_task_without_progress_past_its_time_limit_fails_truthfully(session, new_loop, model, tools):
    loop = start(session, new_loop, model, tools, tool_use("stuck", {}))
    started = time.monotonic()
    assert drive(session, loop) == "completed"
    assert time.monotonic() - started >= 0.5
    call = call_named(session, loop, "stuck")
    assert call.status == "failed" and call.is_error
    assert call.result.startswith("Failed: the task made no progress for 0.5 seconds (last status: Exported 4 of 10")
    assert "Work it had already done may remain" in call.result
    assert model.invalid_requests == []


def test_one_round_of_an_instant_call_a_task_and_an_approval_answers_all_three_in_order(
    session, new_loop, model, tools
):
    loop = start(
        session,
        new_loop,
        model,
        tools,
        text("Checking, exporting and refunding."),
        tool_use("lookup_customer", {"query": "Ada"}, "toolu_1"),
        tool_use("countdown", {"polls": 3, "poll_seconds": 0.3}, "toolu_2"),
        tool_use("issue_refund", {"invoice_id": 4471, "amount_cents": 9000, "reason": "double charge"}, "toolu_3"),
    )
    seen: list = []
    assert drive(session, loop, seen=seen) == "awaiting_approval"  # the refund waits for a person
    refund = call_named(session, loop, "issue_refund")
    assert refund.status == "awaiting_approval"
    assert call_named(session, loop, "lookup_customer").status == "succeeded"
    person = session.scalar(select(User).where(User.email == "reviewer@acme.test"))
    decide(session, refund, person, approve=True, arguments_seen=arguments_hash(refund.input))
    session.commit()
    assert drive(session, loop, seen=seen) == "completed"
    assert "awaiting_task" in seen  # after the approval, only the task was left to wait on
    answer = results_message(loop)
    assert [b["tool_use_id"] for b in answer["content"]] == ["toolu_1", "toolu_2", "toolu_3"]
    assert not any(b.get("is_error") for b in answer["content"])
    assert len(model.requests) == 2 and model.invalid_requests == []


# --- waiting for a person's input ---------------------------------------------------------------


def the_code(session, call: ToolCall) -> str:
    email = session.scalar(select(OutgoingEmail).where(OutgoingEmail.idempotency_key == f"toolcall-{call.id}-verify"))
    return re.search(r"verification code is (\d{6})", email.body).group(1)


def wrong(code: str) -> str:
    return f"{(int(code) + 1) % 1_000_000:06d}"


def give(session, loop, call, value: str) -> str:
    moves.give_input(session, call, value)
    session.commit()
    return drive(session, loop)


def test_a_wrong_identity_code_keeps_it_waiting_and_the_right_one_verifies(session, new_loop, model, tools):
    loop = start(session, new_loop, model, tools, tool_use("verify_identity", {"customer_id": 4471}))
    assert drive(session, loop) == "awaiting_task"
    call = call_named(session, loop, "verify_identity")
    assert call.task["status"] == "input_required"
    assert call.task["input_prompt"] == "The 6-digit code the customer received by email"
    code = the_code(session, call)

    # Looking at it again without input changes nothing: no new code, no try used.
    loop.resume_task(call)
    assert call.task["data"]["tries_left"] == 3 and the_code(session, call) == code
    assert session.scalar(select(OutgoingEmail.id).where(OutgoingEmail.body.contains(code))) is not None

    assert give(session, loop, call, wrong(code)) == "awaiting_task"
    assert call.task["status"] == "input_required" and call.task["message"] == "Wrong code, 2 tries left."
    assert call.task_input is None

    assert give(session, loop, call, f" {code[:3]} {code[3:]} ") == "completed"  # spaces are forgiven
    assert call.status == "succeeded"
    assert '"verified": true' in call.result
    assert model.invalid_requests == []


def test_three_wrong_codes_fail_the_verification(session, new_loop, model, tools):
    loop = start(session, new_loop, model, tools, tool_use("verify_identity", {"customer_id": 4471}))
    drive(session, loop)
    call = call_named(session, loop, "verify_identity")
    bad = wrong(the_code(session, call))
    assert give(session, loop, call, bad) == "awaiting_task"
    assert give(session, loop, call, bad) == "awaiting_task"
    assert call.task["message"] == "Wrong code, 1 try left."
    assert give(session, loop, call, bad) == "completed"
    assert call.status == "failed" and call.is_error
    assert call.result.startswith("Identity not verified: 3 wrong codes")
    with pytest.raises(moves.InputRefused, match="is failed; it is not waiting for input"):
        moves.give_input(session, call, bad)


def test_input_is_refused_for_a_task_that_is_working_or_still_checking_the_last_input(session, new_loop, model, tools):
    loop = start(
        session,
        new_loop,
        model,
        tools,
        tool_use("countdown", {"polls": 10, "poll_seconds": 5}),
        tool_use("verify_identity", {"customer_id": 4471}),
    )
    assert loop.complete() == "awaiting_task"
    with pytest.raises(moves.InputRefused, match="This task is working, not waiting for input"):
        moves.give_input(session, call_named(session, loop, "countdown"), "123456")
    verify = call_named(session, loop, "verify_identity")
    moves.give_input(session, verify, "000000")
    with pytest.raises(moves.InputRefused, match="still being checked"):
        moves.give_input(session, verify, "111111")
