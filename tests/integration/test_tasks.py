"""Tasks on real workers: a call that finishes later pauses its conversation without holding a
worker, is polled by RQ's scheduler, survives a worker's death, takes a person's input through the
API, and is stopped with its conversation."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import redis as redis_lib
from rq.job import Job
from sqlalchemy import select

from demo.billing.models import Invoice, OutgoingEmail
from tests.conftest import BILLING, wait_until
from tests.integration.test_workers import AGENT, assert_valid_transcript, start, state, wait_status
from tests.model_server import Reply
from tests.replies import reply, tool_use
from webapp.models import Conversation, ToolCall

pytestmark = pytest.mark.slow

TASK_TOOLS = {"EXTRA_TOOLS": f"{BILLING},tests.task_tools:Countdown"}


def the_call(read, conversation_id: int, name: str) -> ToolCall:
    return read(
        lambda s: s.scalar(select(ToolCall).where(ToolCall.conversation_id == conversation_id, ToolCall.name == name))
    )


def test_a_task_polled_three_times_completes_across_a_worker_restart(api, workers, model, read):
    model.enqueue(Reply.message(reply(tool_use("countdown", {"polls": 3, "poll_seconds": 1.0}))), match="count down")
    first = workers(**TASK_TOOLS)
    conversation_id = start(api, "count down please")
    waiting = wait_status(api, conversation_id, "awaiting_task")
    assert waiting["tasks"][0]["status"] == "working" and waiting["tasks"][0]["message"] == "0 of 3 polls"
    wait_until(lambda: the_call(read, conversation_id, "countdown").task["data"]["polls"] >= 1, 30, "the first poll")
    first.kill()  # no worker holds the waiting task: the next process picks it up from the database
    second = workers(**TASK_TOOLS)
    done = wait_status(api, conversation_id, "completed", timeout=60)
    call = the_call(read, conversation_id, "countdown")
    result = json.loads(re.search(r"\{.*\}", call.result, re.S).group(0))
    assert result["polls"] == 3
    assert first.pid in result["pids"] and second.pid in result["pids"]  # polled in both processes
    assert done["tasks"] == [] and done["tool_calls"][0]["task"]["status"] == "completed"
    # Parked between polls, not spinning: generate, run, 3 polls, generate, and a few re-checks at most.
    version = read(lambda s: s.get(Conversation, conversation_id).version)
    assert version < 20, f"{version} moves for 3 polls: the conversation spun instead of parking"
    assert_valid_transcript(done)
    assert model.invalid_requests == []


def test_the_export_tool_writes_the_tenants_data_and_reports_progress(api, workers, model, env):
    workers(EXPORT_STEP_SECONDS="1.5")
    workers(EXPORT_STEP_SECONDS="1.5")  # one works the export while the other follows it
    conversation_id = start(api, "Please export customer 4471's data")
    waiting = wait_status(api, conversation_id, "awaiting_task")
    task = waiting["tasks"][0]
    assert task["tool"] == "export_customer_data" and task["status"] == "working"
    assert task["input_required"] is None and 0 <= task["progress"] < 1
    progressed = wait_until(
        lambda: (
            (s := state(api, conversation_id))["tasks"]
            and (s["tasks"][0]["message"] or "").startswith("Exported")
            and s
        ),
        30,
        "export progress",
    )
    assert progressed["tasks"][0]["progress"] > 0
    done = wait_status(api, conversation_id, "completed", timeout=60)
    call = done["tool_calls"][0]
    assert call["status"] == "succeeded" and call["task"]["status"] == "completed"
    file_name = f"customer-4471-export-{call['id']}.json"
    exported = Path(env["INSTANCE_PATH"]) / "exports" / "1" / file_name
    data = json.loads(exported.read_text())
    assert f'"file": "{file_name}"' in call["result"] and f'"bytes": {exported.stat().st_size}' in call["result"]
    assert data["profile"]["id"] == 4471 and data["tenant_id"] == 1
    assert {invoice["id"] for invoice in data["invoices"]} >= {4471}
    assert file_name in done["messages"][-1]["content"][0]["text"]
    assert_valid_transcript(done)


def test_identity_codes_typed_through_the_api(api, workers, model, read):
    workers()
    conversation_id = start(api, "Verify customer 4471 before we talk about the invoice")
    waiting = wait_status(api, conversation_id, "awaiting_task")
    task = waiting["tasks"][0]
    assert task["status"] == "input_required"
    assert task["input_required"]["prompt"] == "The 6-digit code the customer received by email"
    url = task["input_required"]["url"]
    call_id = task["tool_call_id"]
    agent = api.as_(AGENT)

    for body, status, says in [
        ({"input": ""}, 422, "Type the input first."),
        ({"input": "1" * 501}, 422, "at most 500 characters"),
        ({}, 422, "Type the input first."),
    ]:
        response = agent.post(url, json=body)
        assert (response.status_code, response.json["error"]) == (status, "invalid_field")
        assert says in response.json["message"]
    assert agent.post("/api/tool-calls/999999/input", json={"input": "1"}).status_code == 404
    assert api.as_("agent@globex.test").post(url, json={"input": "123456"}).status_code == 404  # another tenant

    email = read(lambda s: s.scalar(select(OutgoingEmail).where(OutgoingEmail.idempotency_key.like("%-verify"))))
    code = re.search(r"code is (\d{6})", email.body).group(1)
    response = agent.post(url, json={"input": f"{(int(code) + 1) % 1_000_000:06d}"})
    assert response.status_code == 202, response.json
    wait_until(
        lambda: (state(api, conversation_id)["tasks"] or [{}])[0].get("message") == "Wrong code, 2 tries left.",
        30,
        "the wrong code to be checked",
    )
    assert agent.post(url, json={"input": code}).status_code == 202
    done = wait_status(api, conversation_id, "completed", timeout=60)
    assert done["tasks"] == [] and '"verified": true' in done["tool_calls"][0]["result"]
    assert "verified" in done["messages"][-1]["content"][0]["text"]
    again = agent.post(f"/api/tool-calls/{call_id}/input", json={"input": code})
    assert again.status_code == 409 and "not waiting for input" in again.json["message"]
    assert_valid_transcript(done)


def test_stopping_a_conversation_stops_its_export(api, workers, model, env, read):
    exports = Path(env["INSTANCE_PATH"]) / "exports" / "1"
    shutil.rmtree(exports, ignore_errors=True)
    workers(EXPORT_STEP_SECONDS="1")
    workers(EXPORT_STEP_SECONDS="1")
    conversation_id = start(api, "export customer 4471 data")
    wait_status(api, conversation_id, "awaiting_task")
    response = api.as_(AGENT).post(f"/api/conversations/{conversation_id}/cancel")
    assert response.status_code == 202, response.json
    done = wait_status(api, conversation_id, "cancelled", timeout=30)
    call = done["tool_calls"][0]
    assert call["status"] == "cancelled" and call["task"]["status"] == "cancelled"
    assert "its tool was asked to stop it" in call["result"]
    job = Job.fetch(f"export-{call['id']}", connection=redis_lib.Redis.from_url(env["REDIS_URL"]))
    wait_until(lambda: job.get_status(refresh=True) in ("finished", "canceled"), 30, "the export job to stop")
    assert job.get_status() == "canceled" or job.return_value() == {"cancelled": True}
    assert not list(exports.glob("customer-4471-export-*"))  # it stopped before writing anything
    assert_valid_transcript(done)
    assert read(lambda s: s.scalar(select(Invoice.id).where(Invoice.id == 4471))) == 4471
