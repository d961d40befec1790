"""Drill c: the worker's database connection is terminated in the middle of a move (PostgreSQL's
pg_terminate_backend, as a failover or a restarted database does). The move must roll back, be
retried, and the conversation complete with nothing half-written and nothing run twice."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import OperationalError, PendingRollbackError

from demo.billing.models import Refund
from tests.conftest import wait_until
from tests.drills.support import AGENT, REVIEWER, add_drill_customers, scripted_responder
from tests.integration.test_workers import assert_valid_transcript, wait_status
from tests.model_server import Reply
from tests.replies import text as text_block
from tests.replies import tool_use
from webapp.agent.moves import advance
from webapp.models import AuditEvent, Conversation, Message, ModelCall, ToolCall, User, utcnow

pytestmark = [pytest.mark.slow, pytest.mark.drill]

WORKER_APP = "drill-worker"  # the application_name of the worker's connections, to find its backends


@pytest.fixture
def postgresql(engine):
    if engine.dialect.name != "postgresql":
        pytest.skip("terminating a backend mid-move needs PostgreSQL (pg_terminate_backend); SQLite has no server")
    return engine


def worker_database_url(env: dict[str, str]) -> str:
    url = env["DATABASE_URL"]
    return f"{url}{'&' if '?' in url else '?'}application_name={WORKER_APP}"


def one_refund(customer: int, turn: int) -> list[dict]:
    invoice = 70000 + (customer - 6000) * 10
    if turn == 0:
        return [tool_use("issue_refund", {"invoice_id": invoice, "amount_cents": 6000, "reason": "drill"})]
    return [text_block("The refund is done.")]


def test_a_connection_dropped_inside_a_tool_rolls_the_move_back_and_the_retry_completes_it(
    api, pool, model, postgresql, read, env
):
    customer = add_drill_customers(postgresql, 1)[0]
    model.responder = scripted_responder({"refund": one_refund}, model.responder)
    since = utcnow()
    pool.start(DATABASE_URL=worker_database_url(env))
    cid = api.as_(AGENT).post("/api/conversations", json={"message": f"[[drill refund {customer.id}]]"}).json["id"]
    (call,) = wait_status(api, cid, "awaiting_approval", timeout=60)["tool_calls"]

    with postgresql.connect() as blocker:  # the refund locks its invoice: it will wait on this lock
        blocker.execute(text("SELECT id FROM invoices WHERE id = :id FOR UPDATE"), {"id": customer.invoices[0]})
        ours = blocker.execute(text("SELECT pg_backend_pid()")).scalar()
        decided = api.as_(REVIEWER).post(f"/api/approvals/{call['id']}", json={"decision": "approve"})
        assert decided.status_code == 200, decided.json

        def worker_waiting_on_us():
            with postgresql.connect() as look:
                return look.execute(
                    text("SELECT pid FROM pg_stat_activity WHERE :ours = ANY(pg_blocking_pids(pid))"), {"ours": ours}
                ).scalar()

        victim = wait_until(worker_waiting_on_us, 30, "the worker's refund to wait on the invoice's lock")
        with postgresql.connect() as admin:
            assert admin.execute(text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": victim}).scalar()
            admin.commit()
        assert read(lambda s: s.scalar(select(func.count(Refund.id)))) == 0  # nothing half-written
        blocker.rollback()

    done = wait_status(api, cid, "completed", "failed", timeout=60)
    assert done["status"] == "completed", done["error"]
    assert_valid_transcript(done)
    assert read(lambda s: s.scalar(select(func.count(Refund.id)))) == 1
    assert read(lambda s: s.get(ToolCall, call["id"]).attempts) == 2  # run again, under the same key
    assert read(lambda s: s.scalar(select(Refund.idempotency_key))) == f"toolcall-{call['id']}"
    failures = read(
        lambda s: s.scalar(
            select(func.count(AuditEvent.id)).where(
                AuditEvent.action == "conversation_failed", AuditEvent.created_at >= since
            )
        )
    )
    assert failures == 0
    assert "lost the database" in pool.logs(tail=None)


def test_connections_dropped_while_the_model_streams_cost_nothing(api, pool, model, postgresql, read, env):
    gate = threading.Event()
    model.enqueue(Reply.held(gate), match="[[slow stream]]")
    pool.start(DATABASE_URL=worker_database_url(env))
    cid = api.as_(AGENT).post("/api/conversations", json={"message": "Show invoices for customer 4471 [[slow stream]]"})
    cid = cid.json["id"]
    wait_until(lambda: len(model.requests) == 1, 30, "the model call to start streaming")
    with postgresql.connect() as admin:
        dropped = admin.execute(
            # (with a timeout each returns once its backend has ended, as a restarted database's have)
            text("SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity WHERE application_name = :name"),
            {"name": WORKER_APP},
        ).scalar()
        admin.commit()
    assert dropped >= 1
    gate.set()
    done = wait_status(api, cid, "completed", "failed", timeout=60)
    assert done["status"] == "completed", done["error"]
    assert_valid_transcript(done)
    assert read(lambda s: s.scalar(select(func.count(Message.id)).where(Message.conversation_id == cid))) == 4
    assert read(lambda s: s.scalar(select(func.count(ModelCall.id)).where(ModelCall.conversation_id == cid))) == 2


# --- the rule itself, on any database ---------------------------------------------------------------


def _lost_connection() -> Exception:
    error = OperationalError("SELECT 1", {}, Exception("terminating connection due to administrator command"))
    error.connection_invalidated = True
    return error


class _FailingLoop:
    """A loop whose work raises, as a move whose tool hit the error would."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def next_move(self):
        return SimpleNamespace(kind="tool", parks=False)

    def begin(self, move) -> None:
        pass

    def perform(self, move) -> None:
        raise self.error


@pytest.mark.parametrize(
    ("error", "final_attempt", "expected"),
    [
        (_lost_connection(), True, "queued"),  # a lost connection is never the conversation's fault
        (OperationalError("SELECT 1", {}, Exception("server closed the connection")), False, "queued"),
        (
            PendingRollbackError("Can't reconnect until invalid transaction is rolled back.", code="8s2b"),
            True,
            "queued",
        ),
        (RuntimeError("a bug"), False, "failed"),  # a bug still fails it, with internal_error
    ],
    ids=["lost-connection", "operational-error-with-retries-left", "connection-lost-earlier-in-the-move", "a-bug"],
)
def test_a_lost_database_releases_the_lease_for_a_retry_and_a_bug_still_fails(session, error, final_attempt, expected):
    agent = session.scalar(select(User).where(User.email == AGENT))
    conversation = Conversation(tenant_id=agent.tenant_id, user_id=agent.id, status="queued", move_budget=25)
    session.add(conversation)
    session.commit()
    with pytest.raises(type(error)):
        advance(
            session,
            conversation.id,
            conversation.version,
            owner="worker-1",
            make_loop=lambda *_: _FailingLoop(error),
            lease_seconds=30,
            final_attempt=final_attempt,
        )
    session.expire_all()
    after = session.get(Conversation, conversation.id)
    assert (after.status, after.lease_owner) == (expected, None)
    assert (after.error_code == "internal_error") == (expected == "failed")
