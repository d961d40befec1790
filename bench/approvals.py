"""Benchmark: from an approve click to the tool running and to the next model call, and the inbox
page with 100,000 calls waiting.

    .venv/bin/python -m bench.approvals                    # SQLite + embedded Redis
    .venv/bin/python -m bench.approvals --postgres postgresql://postgres@127.0.0.1:5432/postgres \
        --redis redis://127.0.0.1:6379/14

The model is the offline demo model in-process beneath the SDK (zero latency). Latencies are read
from the database's own timestamps: the decision row, the tool call's start, and the next model
call's start (its record time minus its latency). Prints a table and writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, insert, select

from bench.moves import ROOT, backend_env, make_app, percentile, prepare

REFUND = "Please refund $60 on invoice 4471, the delivery was late"


def _stats(values: list[float]) -> dict:
    return {
        "count": len(values),
        "p50_ms": round(statistics.median(values), 1),
        "p95_ms": round(percentile(values, 95), 1),
    }


def _signed_in(app, email: str):
    client = app.test_client()
    page = client.get("/login").get_data(as_text=True)
    token = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', page).group(1)
    client.post("/login", data={"email": email, "password": "demo-password", "csrf_token": token})
    return client


def measure_decisions(app, env: dict, count: int) -> dict:
    """Approve `count` waiting refunds one at a time with one worker running; read the latencies."""
    from webapp import approvals, conversations
    from webapp.extensions import db
    from webapp.models import Decision, ModelCall, ToolCall, User

    worker = subprocess.Popen(
        [sys.executable, "-m", "flask", "--app", "webapp", "worker"],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with app.app_context():
            agent = db.session.scalar(select(User).where(User.email == "agent@acme.test"))
            reviewer = db.session.scalar(select(User).where(User.email == "reviewer@acme.test"))
            ids = [conversations.start(db.session, agent, REFUND).id for _ in range(count)]
            _wait(
                lambda: (
                    db.session.scalar(select(func.count(ToolCall.id)).where(ToolCall.status == "awaiting_approval"))
                    >= count
                ),
                "refunds to wait for approval",
            )
            calls = list(db.session.scalars(select(ToolCall).where(ToolCall.conversation_id.in_(ids))))
            db.session.remove()
            for call in calls:
                approvals.decide(db.session, db.session.get(User, reviewer.id), call.id, "approve")
                db.session.remove()
                time.sleep(0.05)  # one at a time: latency, not a queue
            _wait(lambda: db.session.scalar(select(func.count(ModelCall.id))) >= 2 * count, "the answers")
            to_tool, to_model = [], []
            for call in calls:
                decided = db.session.scalar(select(Decision.created_at).where(Decision.tool_call_id == call.id))
                started = db.session.get(ToolCall, call.id).started_at
                answer = db.session.scalars(
                    select(ModelCall).where(ModelCall.conversation_id == call.conversation_id).order_by(ModelCall.id)
                ).all()[-1]
                answer_start = answer.created_at - timedelta(milliseconds=answer.latency_ms)
                to_tool.append((started - decided).total_seconds() * 1000)
                to_model.append((answer_start - decided).total_seconds() * 1000)
            db.session.remove()
    finally:
        worker.terminate()
        worker.wait(10)
    return {"approve to tool start": _stats(to_tool), "approve to next model call": _stats(to_model)}


def _wait(condition, what: str, timeout: float = 300) -> None:
    from webapp.extensions import db

    deadline = time.monotonic() + timeout
    while True:
        done = condition()
        db.session.remove()  # a read left open would hold SQLite's write lock against the worker
        if done:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def fill_inbox(app, pending: int) -> None:
    """`pending` calls waiting for a decision, inserted in bulk under one conversation."""
    from webapp.extensions import db
    from webapp.models import Conversation, Message, ToolCall, User

    with app.app_context():
        agent = db.session.scalar(select(User).where(User.email == "agent@acme.test"))
        conversation = Conversation(
            tenant_id=agent.tenant_id, user_id=agent.id, status="awaiting_approval", title="bulk"
        )
        db.session.add(conversation)
        db.session.flush()
        message = Message(
            conversation_id=conversation.id, seq=1, role="assistant", content=[{"type": "text", "text": "x"}]
        )
        db.session.add(message)
        db.session.flush()
        now = datetime.now(UTC)
        tools = ["issue_refund", "send_email", "delete_account"]
        for start in range(0, pending, 10_000):
            rows = []
            for n in range(start, min(pending, start + 10_000)):
                name = tools[n % 3]
                arguments = {"invoice_id": 4400 + n % 30, "amount_cents": 5001 + n % 90_000, "reason": "bulk"}
                if name != "issue_refund":
                    arguments = {"customer_id": 4466 + n % 8, "subject": "s", "body": "b", "reason": "bulk"}
                rows.append(
                    {
                        "conversation_id": conversation.id,
                        "tenant_id": agent.tenant_id,
                        "message_id": message.id,
                        "position": n,
                        "tool_use_id": f"toolu_bulk_{n}",
                        "name": name,
                        "input": arguments,
                        "status": "awaiting_approval",
                        "acting_user_id": agent.id,
                        "requires_approval": True,
                        "approvals_required": 1,
                        "expires_at": now + timedelta(days=1),
                        "created_at": now - timedelta(seconds=pending - n),
                        "attempts": 0,
                        "is_error": False,
                    }
                )
            db.session.execute(insert(ToolCall), rows)
        db.session.commit()


def measure_inbox(app, repeats: int) -> dict:
    client = _signed_in(app, "reviewer@acme.test")
    pages = {
        "inbox, first page": "/approvals",
        "inbox, filtered (tool + amount)": "/approvals?tool=issue_refund&min_amount=500&max_amount=600",
        "navigation badge": "/approvals/badge",
    }
    result = {}
    for label, url in pages.items():
        client.get(url)  # warm
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (url, response.status_code)
        result[label] = _stats(times)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decisions", type=int, default=40, help="approvals to time (default 40)")
    parser.add_argument("--pending", type=int, default=100_000, help="calls waiting in the inbox (default 100,000)")
    parser.add_argument("--repeats", type=int, default=20, help="page loads per page (default 20)")
    parser.add_argument("--postgres", help="a PostgreSQL server URL; a scratch database desk_bench is made there")
    parser.add_argument("--redis", help="a Redis URL for the PostgreSQL run (default: embedded)")
    parser.add_argument("--skip-sqlite", action="store_true")
    args = parser.parse_args()
    if args.decisions < 1 or args.pending < 1 or args.repeats < 1:
        parser.error("--decisions, --pending and --repeats must be at least 1")
    backends = ([] if args.skip_sqlite else [("sqlite", None)]) + (
        [("postgresql", args.redis)] if args.postgres else []
    )
    if not backends:
        parser.error("nothing to run: drop --skip-sqlite or add --postgres")
    report = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "cpus": os.cpu_count(), "backends": {}}
    for name, redis_url in backends:
        with backend_env(name, args.postgres, redis_url) as env:
            app = make_app(env)
            prepare(app)
            decisions = measure_decisions(app, env, args.decisions)
            fill_inbox(app, args.pending)
            pages = measure_inbox(app, args.repeats)
            report["backends"][name] = {"decisions": decisions, "pages": pages, "pending": args.pending}
            with app.app_context():
                from webapp.extensions import db

                db.engine.dispose()
    print(f"\nApproval latency and inbox pages, {report['cpus']} CPUs, zero-latency model")
    print(f"{'backend':<11} {'measure':<44} {'count':>6} {'p50 ms':>8} {'p95 ms':>8}")
    for name, result in report["backends"].items():
        for label, row in {
            **result["decisions"],
            **{f"{k} ({result['pending']:,})": v for k, v in result["pages"].items()},
        }.items():
            print(f"{name:<11} {label:<44} {row['count']:>6} {row['p50_ms']:>8} {row['p95_ms']:>8}")
    out = ROOT / "bench" / "results" / f"approvals-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"\nJSON: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
