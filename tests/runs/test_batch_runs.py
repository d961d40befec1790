"""A bulk run on the batch path: every model move of its conversations goes through the Message
Batches API (the tests' stand-in, behind the real SDK over HTTP), tools run between rounds as in any
conversation, an expired or errored item fails only its own conversation, and the run costs half."""

from __future__ import annotations

import re
import uuid
from datetime import date
from decimal import Decimal
from html import unescape

import pytest
from sqlalchemy import func, select

from demo.model.batches import ERRORED_HOOK, EXPIRED_HOOK
from jobs import batches as batch_jobs
from tests.clients import session_as
from tests.conftest import desk_app, pushed
from tests.integration.test_workers import AGENT
from webapp.audit import costs
from webapp.models import AuditEvent, BatchRequest, Conversation, ModelCall, Run, User
from webapp.runs import actions as runs
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.runtime.worker import PromptWorker

LOOKUP = "Show invoices for customer 4471"  # the demo model: lookup_invoices, then an answer (two rounds)


@pytest.fixture
def app(env, clean, request):
    """The app, with the settings a test asks for (indirect parametrisation)."""
    with pushed(desk_app({**env, "BATCH_POLL_SECONDS": "0.2", **getattr(request, "param", {})})) as app:
        yield app


def run_jobs() -> None:
    """Work the move queues empty in this process, as a worker would."""
    dispatcher = services().dispatcher
    PromptWorker(dispatcher.move_queues, connection=dispatcher.redis).work(burst=True)


def statuses(run_id: int) -> dict[int, str]:
    db.session.remove()
    rows = db.session.execute(select(Conversation.id, Conversation.status).where(Conversation.run_id == run_id))
    return dict(rows.all())


def settle_run(run_id: int, rounds: int = 20) -> dict[int, str]:
    """Jobs and pumps until no conversation of the run moves or waits for its batch."""
    for _ in range(rounds):
        run_jobs()
        now = statuses(run_id)
        if now and all(status not in ("queued", "running", "awaiting_batch") for status in now.values()):
            return now
        batch_jobs.pump()
    raise AssertionError(f"the run did not settle: {statuses(run_id)}")


def start_run(api, messages: list[str], batch: bool = True) -> int:
    response = api.as_(AGENT).post("/api/runs", json={"items": [{"message": m} for m in messages], "batch": batch})
    assert response.status_code == 201, response.json
    return response.json["id"]


def test_a_batch_run_makes_every_model_move_by_batch_and_an_expired_or_errored_item_fails_alone(app, api, model):
    run_id = start_run(api, [LOOKUP, f"{LOOKUP} {EXPIRED_HOOK}", f"{LOOKUP} {ERRORED_HOOK}", LOOKUP])

    final = settle_run(run_id)

    assert model.requests == []  # nothing went through POST /v1/messages
    assert sorted(final.values()) == ["completed", "completed", "failed", "failed"]
    conversations = {c.id: c for c in db.session.scalars(select(Conversation).where(Conversation.run_id == run_id))}
    failed = {c.title[len(LOOKUP) + 1 :]: c.error_message for c in conversations.values() if c.status == "failed"}
    assert "expired" in failed[EXPIRED_HOOK] and "24 hours" in failed[EXPIRED_HOOK]
    assert failed[ERRORED_HOOK] == "The model service failed while answering."
    # each finished conversation looked the invoices up (a tool run between two rounds) and answered
    view = api.as_(AGENT).get(f"/api/conversations/{min(conversations)}").json
    assert [call["name"] for call in view["tool_calls"]] == ["lookup_invoices"]
    assert view["tool_calls"][0]["status"] == "succeeded"
    assert view["messages"][-1]["role"] == "assistant"
    # the rounds were gathered: the first round of all four in one batch, the second of both survivors in one
    assert [len(body["requests"]) for body in model.batches] == [4, 2]
    calls = db.session.scalars(select(ModelCall)).all()
    assert len(calls) == 4 and all(call.batch_id for call in calls)

    run = api.as_(AGENT).get(f"/api/runs/{run_id}").json
    assert run["status"] == "completed"
    assert run["counts"] == {
        "queued": 0, "running": 0, "awaiting_approval": 0, "completed": 2, "failed": 2, "cancelled": 0,
    }  # fmt: skip
    assert run["conversations"] == sorted(conversations)
    assert run["cost"]["batched_calls"] == 4


def test_a_stop_while_the_batch_is_out_cancels_the_batch_and_the_run_counts_it_cancelled(app, api, model):
    model.hold_batches()
    run_id = start_run(api, [LOOKUP, LOOKUP])
    run_jobs()
    batch_jobs.pump()
    assert set(statuses(run_id).values()) == {"awaiting_batch"}
    assert db.session.scalars(select(BatchRequest.status)).all() == ["sent", "sent"]

    response = api.as_(AGENT).post(f"/api/runs/{run_id}/cancel")
    assert response.status_code == 202, response.json
    run_jobs()
    assert set(statuses(run_id).values()) == {"cancelled"}

    batch_jobs.pump()  # no one waits for the batch any more: it is cancelled at the service (held or not)
    assert set(db.session.scalars(select(BatchRequest.status)).all()) == {"discarded"}
    assert set(statuses(run_id).values()) == {"cancelled"}  # no move took the answer after the stop
    run = api.as_(AGENT).get(f"/api/runs/{run_id}").json
    assert run["status"] == "cancelled" and run["counts"]["cancelled"] == 2
    again = api.as_(AGENT).post(f"/api/runs/{run_id}/cancel")
    assert again.status_code == 409 and again.json["error"] == "already_cancelled"
    assert db.session.get(Run, run_id).cancelled_at is not None


def test_a_batch_call_costs_half_its_list_price_on_the_run_and_the_dashboard_splits_the_ways(app, api, model):
    def by_mode() -> dict:  # the dashboard's figures today (the audit log outlives each test's data)
        today, tenant_id = date.today(), db.session.get(Run, batched).tenant_id
        db.session.commit()  # (SQLite: the dashboard's own connections need the write lock this one took)
        board = costs.dashboard(db.engine, tenant_id, today, today, runs.price_table())
        return {mode: (usage.model_calls, usage.cost) for mode, usage in board.usage_by_mode.items()}

    batched = start_run(api, [LOOKUP])
    before = by_mode()
    settle_run(batched)
    streamed = start_run(api, [LOOKUP], batch=False)
    settle_run(streamed)
    assert len(model.requests) == 2  # the streamed run's two model moves, the batch run's none

    run = runs.figures(db.session, db.session.get(Run, batched))
    assert run.model_calls == run.batched_calls == 2
    assert run.cost > 0 and run.cost * 2 == run.cost_interactive
    one_by_one = runs.figures(db.session, db.session.get(Run, streamed))
    assert one_by_one.batched_calls == 0 and one_by_one.cost == one_by_one.cost_interactive
    shown = api.as_(AGENT).get(f"/api/runs/{batched}").json["cost"]
    assert Decimal(shown["usd"]) == run.cost.quantize(Decimal("0.000001"))

    after = by_mode()
    grew = {
        mode: (calls - before.get(mode, (0, 0))[0], cost - before.get(mode, (0, 0))[1])
        for mode, (calls, cost) in after.items()
    }
    assert grew == {"batch": (2, run.cost), "interactive": (2, one_by_one.cost)}
    page = session_as(app, "auditor@acme.test").get(f"/audit/dashboard?start={date.today()}&end={date.today()}")
    table = re.search(r'<table[^>]*id="usage-by-mode".*?</table>', unescape(page.get_data(as_text=True)), re.S)
    assert re.findall(r'<th scope="row">([^<]+)</th>', table.group(0)) == ["by batch (half price)", "one by one"]


def test_a_run_whose_agent_is_disabled_before_its_items_start_stops_and_says_why(app, api, model):
    from webapp.identity import create_user, get_or_create_tenant

    email = f"bulk-{uuid.uuid4().hex[:8]}@acme.test"
    agent = create_user(db.session, email, "demo-password", ["agent"], get_or_create_tenant(db.session, "acme"))
    db.session.commit()
    response = api.as_(email).post("/api/runs", json={"items": [{"message": LOOKUP}] * 3, "batch": True})
    assert response.status_code == 201, response.json
    run_id = response.json["id"]
    db.session.get(User, agent.id).active = False  # (as the users page's disable does, before the job ran)
    db.session.commit()

    run_jobs()

    assert statuses(run_id) == {}  # nothing started for a disabled agent
    run = db.session.get(Run, run_id)
    assert run.cancelled_at is not None
    reason = db.session.scalar(
        select(AuditEvent.data).where(AuditEvent.action == "run_cancelled").order_by(AuditEvent.id.desc())
    )
    assert reason["reason"] == f"{email}'s account was disabled" and reason["items_not_started"] == 3


@pytest.mark.parametrize("app", [{"MOVE_BUDGET": "2"}], indirect=True)
def test_a_batch_answer_is_one_move_of_the_budget_and_a_run_out_of_budget_waits_for_a_person(app, api, model):
    run_id = start_run(api, [LOOKUP])
    assert set(settle_run(run_id).values()) == {"budget_exhausted"}  # the answer asking the tool, then the tool
    conversation = db.session.scalar(select(Conversation).where(Conversation.run_id == run_id))
    assert conversation.moves_used == 2
    assert [len(body["requests"]) for body in model.batches] == [1]  # the park made no move of the budget
    assert db.session.scalar(select(func.count(ModelCall.id))) == 1
    assert api.as_(AGENT).get(f"/api/runs/{run_id}").json["counts"]["failed"] == 1


def test_a_stop_landing_while_a_move_parks_for_its_batch_requeues_it_and_stores_no_request(app, api, model, engine):
    """The park is guarded as any park: a stop asked between the move's look and its commit is honoured
    by the next move, and the request it would have stored for the batch is never sent."""
    from sqlalchemy.orm import Session

    from webapp.agent import moves
    from webapp.agent.loop import Loop

    run_id = start_run(api, [LOOKUP])
    original_perform = Loop.perform

    def perform_with_a_stop_meanwhile(self, move):
        with Session(engine) as other:  # a person presses Stop in another process
            moves.request_cancel(other, other.get(Conversation, self.conversation.id), None)
            other.commit()
        original_perform(self, move)

    Loop.perform = perform_with_a_stop_meanwhile
    try:
        run_jobs()  # the start job, then the move that would park: re-queued instead
    finally:
        Loop.perform = original_perform
    run_jobs()
    assert set(statuses(run_id).values()) == {"cancelled"}
    assert db.session.scalar(select(func.count(BatchRequest.id))) == 0
    batch_jobs.pump()
    assert model.batches == [] and model.requests == []
