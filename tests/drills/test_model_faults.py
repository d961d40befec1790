"""Drill d: the model endpoint misbehaves in every way the network and the API do, on real workers.

tests/agent/test_moves.py already pins that each fault is a transient ModelError that rolls the move
back, and tests/integration/test_workers.py runs 529/429-then-success and 500-until-failed on real
workers. This drill runs all six faults at once on real workers with the production retry path (RQ's
retries with backoff through its scheduler): each conversation is retried with the configured
intervals, fails with a reason a person can read, writes nothing half-way, and completes after
POST /api/conversations/<id>/retry; a fault that clears within the retries never fails at all.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import func, select

from tests.drills.support import AGENT
from tests.integration.test_workers import assert_valid_transcript, state, wait_status
from tests.model_server import Fault
from webapp.models import Message, ToolCall

pytestmark = [pytest.mark.slow, pytest.mark.drill]

INTERVALS = (2, 3)  # MOVE_RETRY_INTERVALS for this drill: the backoff between the three attempts
SLACK = 1.0  # RQ schedules retries on whole seconds (its scheduled-job registry scores are integers)
FAULTS = {
    # tag: (fault, expected error code, words the reason must contain)
    "429": (Fault.status(429, headers={"retry-after": "1"}), "rate_limited", "rate limiting"),
    "529": (Fault.status(529, error_type="overloaded_error"), "overloaded", "overloaded"),
    "500": (Fault.status(500, error_type="api_error"), "service_error", "HTTP 500"),
    "hang": (Fault.hang(6), "timeout", "did not answer in time"),  # past MODEL_TIMEOUT_SECONDS=2
    "malformed": (Fault.malformed(), "bad_response", "could not be read"),
    "cut": (Fault.cut_after(4), "bad_response", "ended half-way"),  # the stream stops mid-reply
}


def record_arrivals(model) -> dict[str, list[float]]:
    """When each drill conversation's model requests arrived, by tag."""
    arrivals: dict[str, list[float]] = {}
    answer = model._answer

    def timed(http, raw: bytes) -> None:
        body = raw.decode("utf-8", "replace")
        for tag in [*FAULTS, "flaky"]:
            if f"[[fault {tag}]]" in body:
                arrivals.setdefault(tag, []).append(time.monotonic())
        answer(http, raw)

    model._answer = timed
    return arrivals


def test_every_model_fault_is_retried_with_backoff_then_fails_in_words_and_retry_completes(
    app, configured_api, pool, model, read
):
    arrivals = record_arrivals(model)
    for tag, (fault, _, _) in FAULTS.items():
        for _ in range(3):  # the first attempt and MOVE_RETRIES=2
            model.enqueue(fault, match=f"[[fault {tag}]]")
    model.enqueue(Fault.status(500, error_type="api_error"), match="[[fault flaky]]")
    model.enqueue(Fault.cut_after(3), match="[[fault flaky]]")
    settings = {
        "MOVE_RETRIES": "2",
        "MOVE_RETRY_INTERVALS": ",".join(map(str, INTERVALS)),
        "MODEL_TIMEOUT_SECONDS": "2",
        "MODEL_MAX_RETRIES": "0",
        # A lease (and a job taken by a worker) outlives a starved moment of a loaded machine: the
        # sweeper takes an expired lease for a dead worker and hands out one attempt more.
        "MOVE_LEASE_SECONDS": "15",
    }
    pool.start(**settings)
    pool.start(**settings)
    api = configured_api(**settings)

    ids = {}
    for tag in [*FAULTS, "flaky"]:
        answer = api.as_(AGENT).post(
            "/api/conversations", json={"message": f"Show invoices for customer 4471 [[fault {tag}]]"}
        )
        assert answer.status_code == 201, answer.json
        ids[tag] = answer.json["id"]

    flaky = wait_status(api, ids["flaky"], "completed", "failed", timeout=60)
    assert flaky["status"] == "completed", f"a fault that clears within the retries failed the run: {flaky['error']}"
    assert_valid_transcript(flaky)

    for tag, (_, code, words) in FAULTS.items():
        failed = wait_status(api, ids[tag], "failed", "completed", timeout=60)
        assert failed["status"] == "failed", f"[[fault {tag}]] did not fail after three attempts: {arrivals.get(tag)}"
        assert failed["error"]["code"] == code, (tag, failed["error"])
        assert words in failed["error"]["message"], (tag, failed["error"])
        times = arrivals[tag]
        assert len(times) == 3, f"[[fault {tag}]]: {len(times)} attempts"
        for gap, interval in zip((b - a for a, b in zip(times, times[1:], strict=False)), INTERVALS, strict=True):
            assert gap >= interval - SLACK, f"[[fault {tag}]] retried after {gap:.2f}s, before its {interval}s backoff"
        assert_valid_transcript(failed)
        assert [m["role"] for m in failed["messages"]] == ["user"]  # nothing half-written
        assert (
            read(
                lambda s, cid=ids[tag]: s.scalar(select(func.count(ToolCall.id)).where(ToolCall.conversation_id == cid))
            )
            == 0
        )

    # Retry them all at once: each completes, with only what the model really answered.
    for tag in FAULTS:
        response = api.as_(AGENT).post(f"/api/conversations/{ids[tag]}/retry")
        assert response.status_code == 202, (tag, response.json)
    for tag in FAULTS:
        done = wait_status(api, ids[tag], "completed", "failed", timeout=60)
        assert done["status"] == "completed", (tag, done["error"])
        assert done["error"] is None
        assert_valid_transcript(done)
        assert [m["role"] for m in done["messages"]] == ["user", "assistant", "user", "assistant"]
        rows = read(
            lambda s, cid=ids[tag]: s.scalar(select(func.count(Message.id)).where(Message.conversation_id == cid))
        )
        assert rows == 4
    assert all(state(api, cid)["status"] == "completed" for cid in ids.values())
