"""GET /metrics: who may scrape it, and numbers that follow what happens in the database and Redis."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select, update

from tests.clients import session_as
from tests.conftest import desk_app, pushed
from tests.model_server import Reply
from tests.replies import reply, text, tool_use
from webapp.config import Config
from webapp.models import Conversation, ModelCall, ToolCall, utcnow
from webapp.ops.metrics import Tally
from webapp.runtime.extensions import db
from webapp.runtime.services import services

TOKEN = "metrics-token-for-the-tests-0123"


@pytest.fixture
def app(env, clean):
    """The app with a METRICS_TOKEN (the conftest's app has none)."""
    with pushed(desk_app({**env, "METRICS_TOKEN": TOKEN})) as app:
        yield app


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(app, token: str | None = TOKEN, **headers) -> dict[tuple, float]:
    """{(sample name, sorted labels): value} of one scrape with the token."""
    if token:
        headers["Authorization"] = f"Bearer {token}"
    response = app.test_client().get("/metrics", headers=headers)
    db.session.remove()
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/plain")
    return samples(response.text)


def samples(body: str) -> dict[tuple, float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def value(found: dict[tuple, float], name: str, **labels) -> float:
    return found[(name, tuple(sorted(labels.items())))]


def waiting_conversation(api, model, amount_cents: int = 6000) -> Conversation:
    """A conversation of agent@acme.test whose refund waits for a reviewer (one model call made)."""
    model.enqueue(
        Reply.message(
            reply(
                text("Refunding."),
                tool_use("issue_refund", {"invoice_id": 4471, "amount_cents": amount_cents, "reason": "late"}),
            )
        )
    )
    created = api.as_("agent@acme.test").post("/api/conversations", json={"message": "refund please"}).json
    conversation = db.session.get(Conversation, created["id"])
    assert services().loop(db.session, conversation).complete() == "awaiting_approval"
    db.session.commit()
    return conversation


def test_metrics_need_the_token_or_a_signed_in_admin(app):
    client = app.test_client()
    anonymous = client.get("/metrics")
    assert anonymous.status_code == 401
    assert anonymous.headers["WWW-Authenticate"] == "Bearer"
    assert "METRICS_TOKEN" in anonymous.text and "desk_" not in anonymous.text
    wrong = client.get("/metrics", headers={"Authorization": "Bearer not-the-metrics-token-at-all"})
    assert wrong.status_code == 401 and "is not the metrics token" in wrong.text
    assert client.get("/metrics", headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert session_as(app, "admin@acme.test").get("/metrics").status_code == 200
    refused = session_as(app, "reviewer@acme.test").get("/metrics")
    assert refused.status_code == 403 and "desk_" not in refused.text
    db.session.remove()


def test_without_a_metrics_token_a_bearer_is_refused_in_words(env, clean):
    from webapp import create_app

    app = create_app(Config.from_env(env))  # no METRICS_TOKEN
    with app.app_context():
        answer = app.test_client().get("/metrics", headers={"Authorization": "Bearer anything-at-all-long-enough"})
        assert answer.status_code == 401 and "METRICS_TOKEN is not set" in answer.text
        db.session.remove()
        db.engine.dispose()


def test_a_short_metrics_token_stops_the_boot_with_a_sentence(env):
    from webapp.config import ConfigError

    with pytest.raises(ConfigError, match="METRICS_TOKEN must be at least 16 characters"):
        Config.from_env({**env, "METRICS_TOKEN": "short"})


def test_scrape_follows_approvals_moves_tokens_and_the_queue(app, api, model):
    before = scrape(app)
    assert value(before, "desk_database_up") == 1 and value(before, "desk_redis_up") == 1
    assert value(before, "desk_approvals_pending") == 0
    assert value(before, "desk_approval_oldest_age_seconds") == 0

    # Counters from the audit log, which earlier tests also wrote to: compared as increases.
    def grew(now, name, **labels) -> float:
        key = (name, tuple(sorted(labels.items())))
        return now[key] - before.get(key, 0.0)

    assert value(before, "desk_queue_jobs", queue="test-moves", state="queued") == 0
    assert value(before, "desk_workers_registered") == 0

    conversation = waiting_conversation(api, model)
    after = scrape(app)
    assert value(after, "desk_approvals_pending") == 1
    assert value(after, "desk_tool_calls", status="awaiting_approval") == 1
    assert value(after, "desk_conversations", status="awaiting_approval") == 1
    assert value(after, "desk_approvals_pending_by_age", age="0-5m") == 1
    assert value(after, "desk_approvals_pending_by_age", age="1h-4h") == 0
    assert 0 <= value(after, "desk_approval_oldest_age_seconds") < 60
    assert value(after, "desk_model_calls_total", model="claude-test") == 1
    assert value(after, "desk_model_tokens_total", model="claude-test", kind="input") == 100
    assert value(after, "desk_model_tokens_total", model="claude-test", kind="output") == 20
    assert value(after, "desk_model_tokens_total", model="claude-test", kind="cache_read") == 80
    assert value(after, "desk_model_call_latency_seconds_count", model="claude-test") == 1
    assert value(after, "desk_model_call_latency_seconds_bucket", model="claude-test", le="+Inf") == 1
    assert grew(after, "desk_moves_total", kind="model_call") == 1
    assert grew(after, "desk_audit_events_total", action="approval_requested", outcome="awaiting_approval") == 1
    # The API enqueued the first move and no worker runs: it is still on the queue.
    assert (
        value(after, "desk_queue_jobs", queue="test-moves-people", state="queued") == 1
    )  # a person's act: the people queue

    # The call has now waited two hours.
    db.session.execute(update(ToolCall).values(created_at=utcnow() - timedelta(hours=2)))
    db.session.commit()
    aged = scrape(app)
    assert value(aged, "desk_approvals_pending_by_age", age="0-5m") == 0
    assert value(aged, "desk_approvals_pending_by_age", age="1h-4h") == 1
    assert 7200 <= value(aged, "desk_approval_oldest_age_seconds") < 7300

    # A reviewer approves; the refund runs and the model answers.
    call = db.session.scalar(select(ToolCall).where(ToolCall.conversation_id == conversation.id))
    decided = api.as_("reviewer@acme.test").post(f"/api/approvals/{call.id}", json={"decision": "approve"})
    assert decided.status_code == 200, decided.json
    model.enqueue(Reply.message(reply(text("Done."))))
    assert services().loop(db.session, db.session.get(Conversation, conversation.id)).complete() == "completed"
    db.session.commit()
    done = scrape(app)
    assert value(done, "desk_approvals_pending") == 0
    assert grew(done, "desk_approval_decisions_total", outcome="approved") == 1
    assert grew(done, "desk_tool_calls_executed_total", outcome="succeeded") == 1
    assert grew(done, "desk_moves_total", kind="tool_call") == 1
    assert grew(done, "desk_moves_total", kind="model_call") == 2
    assert value(done, "desk_model_tokens_total", model="claude-test", kind="input") == 200
    assert value(done, "desk_conversations", status="awaiting_approval") == 0


def test_a_tally_counts_each_row_once_as_its_checkpoint_moves(app, api, model, session):
    waiting_conversation(api, model)
    tally = Tally(ModelCall.id, group_by=[ModelCall.model], sums=[ModelCall.output_tokens], settle_seconds=0)
    assert tally.totals(db.session) == {("claude-test",): [1.0, 20.0]}
    assert tally.totals(db.session) == {("claude-test",): [1.0, 20.0]}  # the first rows are now settled
    assert tally.checkpoint == db.session.scalar(select(func.max(ModelCall.id)))
    db.session.remove()
    waiting_conversation(api, model, amount_cents=7000)
    assert tally.totals(db.session) == {("claude-test",): [2.0, 40.0]}
    assert tally.totals(db.session) == {("claude-test",): [2.0, 40.0]}
    db.session.remove()


def test_the_scrape_says_when_redis_is_down(env, clean):
    from webapp import create_app

    app = create_app(
        Config.from_env({**env, "METRICS_TOKEN": TOKEN, "REDIS_URL": f"redis://127.0.0.1:{closed_port()}/0"})
    )
    with app.app_context():
        found = scrape(app)
        assert value(found, "desk_redis_up") == 0
        assert value(found, "desk_database_up") == 1
        assert ("desk_queue_jobs", (("queue", "test-moves"), ("state", "queued"))) not in found
        db.session.remove()
        db.engine.dispose()
