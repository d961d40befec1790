"""The benchmark: one command, every figure the README's "Performance" section shows.

    .venv/bin/python -m bench --quick                      # a minute or two: small sizes
    .venv/bin/python -m bench --postgres postgresql://postgres@127.0.0.1:5432/bench_db \
        --redis redis://127.0.0.1:6379/13                  # the full run, SQLite and PostgreSQL

The model is the offline demo model answering in-process beneath the real `anthropic` SDK (zero
latency), so what is measured is the desk itself. For each backend (SQLite always unless
--no-sqlite; PostgreSQL when --postgres or $BENCH_POSTGRES_URL names a database, whose public
schema is DROPPED and recreated, so never point it at data you keep):

1. overhead: advance() called in-process, move after move (p50, p95, p99 per move);
2. throughput: N conversations started at once (three moves each), worked by 1, 2, 4, 8 worker
   subprocesses of each RQ worker class (`python -m bench.worker --class simple|fork|spawn`);
3. approvals: with one idle worker, a decision POSTed to /api/approvals/<id>, then the next move
   (the tool) starting and ending, and the answer after it, read from the database's timestamps;
4. pages: bulk-inserted conversations and audit events, then the inbox, the decision page, the
   conversation list, the chat page and the audit log through the test client (p50, p95, p99).

Redis: --redis (its database is FLUSHED) or an embedded server. Prints the tables side by side
per backend (compare within one run: ratios, not absolute figures) and writes JSON and Markdown to
bench/results/.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import UTC, datetime
from itertools import count as counter
from pathlib import Path

import redis as redis_lib
from sqlalchemy import create_engine, func, select

from bench import data
from bench.common import (
    BACKEND_LABELS,
    ROOT,
    Table,
    backend,
    dispose,
    make_app,
    new_report,
    postgres_from,
    prepare,
    progress,
    ratio,
    save,
    signed_in,
    stats,
    time_page,
)
from bench.worker import LABELS as CLASS_LABELS

QUESTION = "Show invoices for customer 4471"  # the demo model: generate, lookup_invoices, generate
REFUND = "Please refund $60 on invoice 4471, the delivery was late"  # above $50: waits for a reviewer
PARTS = ("overhead", "throughput", "approvals", "pages")
FULL = {
    "overhead_conversations": 100,
    "conversations": 500,
    "workers": "1,2,4,8",
    "classes": "simple,fork,spawn",
    "fork_conversations": 100,
    "spawn_conversations": 4,
    "spawn_workers": "2",
    "decisions": 20,
    "approval_classes": "simple,fork",
    "page_conversations": 100_000,
    "audit_events": 1_000_000,
    "repeats": 30,
}
QUICK = {
    **FULL,
    "overhead_conversations": 20,
    "conversations": 20,
    "workers": "1,2",
    "classes": "simple,fork",
    "fork_conversations": 20,
    "decisions": 3,
    "approval_classes": "simple",
    "page_conversations": 2_000,
    "audit_events": 20_000,
    "repeats": 5,
}
_pool_ids = counter(1)


# --- 1. overhead per move ------------------------------------------------------------------------


def new_conversations(app, count: int, question: str = QUESTION) -> list[tuple[int, int]]:
    """`count` queued conversations of agent@acme.test, committed, not enqueued: (id, version)."""
    from webapp.agent import moves
    from webapp.models import Conversation, User
    from webapp.runtime.extensions import db
    from webapp.runtime.services import services

    with app.app_context():
        agent = db.session.scalar(select(User).where(User.email == "agent@acme.test"))
        made = []
        for _ in range(count):
            conversation = Conversation(tenant_id=agent.tenant_id, user_id=agent.id, status="queued", move_budget=50)
            db.session.add(conversation)
            db.session.flush()
            services().loop(db.session, conversation).ask_later(question)
            made.append((conversation.id, moves.start_run(db.session, conversation)))
        db.session.commit()
        db.session.remove()
    return made


def measure_overhead(app, conversations: int) -> dict:
    """advance() in-process, move by move, each conversation run to its end."""
    from webapp.agent.moves import advance
    from webapp.models import ModelCall
    from webapp.runtime.extensions import db
    from webapp.runtime.services import services

    samples: dict[str, list[float]] = {"generate": [], "run_tool": [], "sdk": [], "orchestration": []}
    new = new_conversations(app, conversations + 3)
    with app.app_context():
        desk = services()
        for n, (conversation_id, version) in enumerate(new):
            while version is not None:
                started = time.perf_counter()
                result = advance(
                    db.session, conversation_id, version, owner="bench", make_loop=desk.loop, lease_seconds=30
                )
                elapsed = (time.perf_counter() - started) * 1000
                version = result.next_version
                if n < 3:  # the first conversations warm the SDK client and the connection pool
                    continue
                samples.setdefault(result.outcome, []).append(elapsed)
                if result.outcome == "generate":
                    sdk_ms = db.session.scalar(
                        select(ModelCall.latency_ms)
                        .where(ModelCall.conversation_id == conversation_id)
                        .order_by(ModelCall.id.desc())
                        .limit(1)
                    )
                    samples["sdk"].append(sdk_ms)
                    samples["orchestration"].append(elapsed - sdk_ms)
                else:
                    samples["orchestration"].append(elapsed)
        db.session.remove()
    return {
        "all moves": stats(samples["generate"] + samples["run_tool"]),
        "model moves": stats(samples["generate"]),
        "tool moves": stats(samples["run_tool"]),
        "SDK call within a model move": stats(samples["sdk"]),
        "orchestration (move minus SDK call)": stats(samples["orchestration"]),
    }


# --- 2. throughput per worker class and count ----------------------------------------------------


@contextmanager
def worker_pool(env: dict, kind: str, workers: int):
    """`workers` subprocesses of `python -m bench.worker --class kind`, registered and idle."""
    from rq import Worker

    tag = f"bench-{next(_pool_ids)}-{kind}"
    names = [f"{tag}-{n}" for n in range(workers)]
    log_path = Path(env["INSTANCE_PATH"]) / f"{tag}.log"
    log = log_path.open("wb")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.worker", "--class", kind, "--name", name],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=log,
            stderr=log,
        )
        for name in names
    ]
    connection = redis_lib.Redis.from_url(env["REDIS_URL"])
    try:
        deadline = time.monotonic() + 180
        while not set(names) <= {w.name for w in Worker.all(connection=connection)}:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{kind} workers did not start:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.1)
        yield
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def _plain_engine(env: dict):
    """An engine for polling, without the app's BEGIN IMMEDIATE (a poll must not take SQLite's lock)."""
    return create_engine(env["DATABASE_URL"])


def run_conversations(app, env: dict, count: int, timeout: float = 1800) -> dict:
    """Start `count` conversations at once on the running pool; moves per second until the last ends."""
    from webapp.models import Conversation
    from webapp.runtime.services import services

    made = new_conversations(app, count)
    low, high = made[0][0], made[-1][0]
    mine = Conversation.id.between(low, high)
    engine = _plain_engine(env)
    try:
        with app.app_context():
            dispatcher = services().dispatcher
            started = datetime.now(UTC)
            for conversation_id, version in made:
                dispatcher.enqueue_move(conversation_id, version)
        deadline = time.monotonic() + timeout
        while True:
            with engine.connect() as connection:
                settled = dict(
                    connection.execute(
                        select(Conversation.status, func.count()).where(mine).group_by(Conversation.status)
                    ).all()
                )
            if settled.get("completed", 0) >= count:
                break
            stuck = {k: v for k, v in settled.items() if k in ("failed", "budget_exhausted", "cancelled")}
            if stuck:
                raise RuntimeError(f"conversations ended badly: {stuck}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out: {settled}")
            time.sleep(0.1)
        with engine.connect() as connection:
            moves, finished = connection.execute(
                select(func.sum(Conversation.moves_used), func.max(Conversation.updated_at)).where(mine)
            ).one()
    finally:
        engine.dispose()
    if isinstance(finished, str):  # SQLite through a plain engine without the model's type
        finished = datetime.fromisoformat(finished)
    if finished.tzinfo is None:
        finished = finished.replace(tzinfo=UTC)
    seconds = (finished - started).total_seconds()
    return {
        "conversations": count,
        "moves": int(moves),
        "seconds": round(seconds, 2),
        "moves_per_s": round(moves / seconds, 1),
    }


# --- 3. approval to resume -------------------------------------------------------------------------


def measure_approvals(app, env: dict, decisions: int) -> dict:
    """With the pool idle: approve waiting refunds one at a time through the API; time the resume."""
    from webapp.conversations import actions as conversations
    from webapp.models import Conversation, ModelCall, ToolCall, User
    from webapp.runtime.extensions import db

    client, bearer = signed_in(app, "reviewer@acme.test")
    with app.app_context():
        agent = db.session.scalar(select(User).where(User.email == "agent@acme.test"))
        ids = [conversations.start(db.session, agent, REFUND).id for _ in range(decisions)]
        db.session.remove()
    engine = _plain_engine(env)
    waiting = ToolCall.status == "awaiting_approval"
    try:
        _until(engine, select(func.count()).where(ToolCall.conversation_id.in_(ids), waiting), decisions)
        parked = Conversation.id.in_(ids) & (Conversation.status == "awaiting_approval")
        _until(engine, select(func.count()).where(parked), decisions)  # decide only once parked
        with engine.connect() as connection:
            calls = connection.execute(
                select(ToolCall.id, ToolCall.conversation_id).where(ToolCall.conversation_id.in_(ids))
            ).all()
        posted: dict[int, datetime] = {}
        post_ms = []
        for call_id, conversation_id in calls:
            posted[call_id] = datetime.now(UTC)
            started = time.perf_counter()
            response = client.post(f"/api/approvals/{call_id}", json={"decision": "approve"}, headers=bearer)
            post_ms.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                raise RuntimeError(f"approval {call_id}: {response.status_code} {response.get_data(as_text=True)}")
            done = select(func.count()).where(Conversation.id == conversation_id, Conversation.status == "completed")
            _until(engine, done, 1, timeout=120, poll=0.01)
    finally:
        engine.dispose()
    to_start, to_end, to_answer = [], [], []
    with app.app_context():
        for call_id, conversation_id in calls:
            call = db.session.get(ToolCall, call_id)
            answer = db.session.scalar(
                select(ModelCall).where(ModelCall.conversation_id == conversation_id).order_by(ModelCall.id.desc())
            )
            t0 = posted[call_id]
            to_start.append((call.started_at - t0).total_seconds() * 1000)
            to_end.append((call.finished_at - t0).total_seconds() * 1000)
            to_answer.append((answer.created_at - t0).total_seconds() * 1000)
        db.session.remove()
    return {
        "POST /api/approvals/<id> (approve)": stats(post_ms, 1),
        "decision posted → tool move starts": stats(to_start, 1),
        "decision posted → tool move ends": stats(to_end, 1),
        "decision posted → next model move ends": stats(to_answer, 1),
    }


def _until(engine, statement, target: int, timeout: float = 600, poll: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as connection:
            if connection.scalar(statement) >= target:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {target}: {statement}")
        time.sleep(poll)


# --- 4. pages at scale ----------------------------------------------------------------------------


def page_targets(app) -> list[tuple[str, str, str]]:
    """(label, person, url) for the pages to time, with ids taken from the generated data."""
    from webapp.models import AuditEvent, Conversation, ToolCall
    from webapp.runtime.extensions import db
    from webapp.web.pagination import encode_cursor

    with app.app_context():
        low, high = db.session.execute(select(func.min(AuditEvent.id), func.max(AuditEvent.id))).one()
        deep = low + (high - low) // 10  # 90% of the events lie above this cursor
        cid_low, cid_high = db.session.execute(select(func.min(Conversation.id), func.max(Conversation.id))).one()
        middle = db.session.scalar(
            select(Conversation.id)
            .where(Conversation.id >= (cid_low + cid_high) // 2, Conversation.status == "completed")
            .limit(1)
        )
        waiting = db.session.scalar(
            select(ToolCall.id)
            .where(ToolCall.status == "awaiting_approval", ToolCall.conversation_id >= middle)
            .order_by(ToolCall.id)
            .limit(1)
        )
        db.session.remove()
    return [
        ("inbox, first page", "reviewer@acme.test", "/approvals"),
        (
            "inbox, filtered by tool and amount",
            "reviewer@acme.test",
            "/approvals?tool=issue_refund&min_amount=500&max_amount=600",
        ),
        ("decision page (one waiting call)", "reviewer@acme.test", f"/approvals/{waiting}"),
        ("conversation list, first page", "agent@acme.test", "/conversations"),
        ("chat page (one conversation)", "agent@acme.test", f"/conversations/{middle}"),
        ("audit log, first page", "auditor@acme.test", "/audit"),
        (
            "audit log, action filter, deep cursor",
            "auditor@acme.test",
            f"/audit?action=approval_decided&cursor={encode_cursor([deep])}",
        ),
    ]


def measure_pages(app, repeats: int) -> dict:
    clients: dict[str, object] = {}
    results = {}
    for label, person, url in page_targets(app):
        if person not in clients:
            clients[person] = signed_in(app, person)[0]
        results[label] = time_page(clients[person], url, repeats)
    return results


# --- the run ------------------------------------------------------------------------------------


def run_backend(name: str, args, postgres: str | None) -> dict:
    result: dict = {}
    with backend(name, postgres, args.redis) as env:
        app = make_app(env)
        prepare(app)
        label = BACKEND_LABELS[name]
        if "overhead" in args.parts:
            progress(f"{label}: overhead per move, {args.overhead_conversations} conversations in-process")
            result["overhead"] = measure_overhead(app, args.overhead_conversations)
        if "throughput" in args.parts or "approvals" in args.parts:
            result["throughput"], result["approvals"] = [], {}
            for kind in args.classes:
                size = {"simple": args.conversations, "fork": args.fork_conversations}.get(
                    kind, args.spawn_conversations
                )
                timed = args.spawn_workers if kind == "spawn" else args.workers
                if "throughput" not in args.parts or size < 1:
                    timed = []
                wants_approvals = "approvals" in args.parts and kind in args.approval_classes
                for workers in timed + ([1] if wants_approvals and 1 not in timed else []):
                    with worker_pool(env, kind, workers):
                        if workers in timed:
                            progress(f"{label}: {CLASS_LABELS[kind]} x{workers}, {size} conversations")
                            row = run_conversations(app, env, size)
                            result["throughput"].append({"class": kind, "workers": workers, **row})
                            progress(f"{label}:   {row['moves_per_s']} moves/s")
                        if wants_approvals and workers == 1:
                            progress(
                                f"{label}: approval to resume, {CLASS_LABELS[kind]} x1, {args.decisions} decisions"
                            )
                            result["approvals"][kind] = measure_approvals(app, env, args.decisions)
        if "pages" in args.parts:
            progress(f"{label}: bulk-inserting {args.page_conversations:,} conversations")
            with app.app_context():
                from webapp.runtime.extensions import db

                made = data.bulk_conversations(db.engine, args.page_conversations)
            progress(f"{label}:   {made['seconds']} s; generating {args.audit_events:,} audit events")
            generated = data.bulk_audit_events(app, args.audit_events)
            progress(f"{label}:   {generated['seconds']} s; timing pages")
            result["pages"] = {
                "data": {"conversations": made, "audit_events": generated},
                "pages": measure_pages(app, args.repeats),
            }
        dispose(app)
    return result


def tables(report: dict) -> list[Table]:
    backends = list(report["backends"])
    both = len(backends) == 2
    labels = [BACKEND_LABELS[b] for b in backends]
    results = report["backends"]
    out = []

    def pg_over_sqlite(values: list) -> list:
        return [ratio(values[1], values[0])] if both else []

    first = results[backends[0]]
    if "overhead" in first:
        table = Table(
            "Time per move, in-process, zero-latency model (ms)",
            [
                "move",
                *(f"{b} {p}" for b in labels for p in ("p50", "p95", "p99")),
                *(["PG / SQLite p50"] if both else []),
            ],
        )
        for row in first["overhead"]:
            cells = [results[b]["overhead"][row] for b in backends]
            table.add(
                row,
                *(c[k] for c in cells for k in ("p50_ms", "p95_ms", "p99_ms")),
                *pg_over_sqlite([c["p50_ms"] for c in cells]),
            )
        out.append(table)
    if first.get("throughput"):
        table = Table(
            "Moves per second, conversations started at once (three moves each), worker subprocesses",
            [
                "worker class",
                "workers",
                "conversations",
                *(f"{b} {c}" for b in labels for c in ("moves/s", "vs 1 worker", "vs SimpleWorker")),
                *(["PG / SQLite"] if both else []),
            ],
            labels=2,
        )
        for row in first["throughput"]:
            cells = []
            for b in backends:
                rows = results[b]["throughput"]
                mine = next(r for r in rows if r["class"] == row["class"] and r["workers"] == row["workers"])
                one = next((r for r in rows if r["class"] == row["class"] and r["workers"] == 1), None)
                simple = next((r for r in rows if r["class"] == "simple" and r["workers"] == row["workers"]), None)
                cells.append((mine["moves_per_s"], one and one["moves_per_s"], simple and simple["moves_per_s"]))
            table.add(
                CLASS_LABELS[row["class"]],
                row["workers"],
                row["conversations"],
                *(x for c in cells for x in (c[0], ratio(c[0], c[1]), ratio(c[0], c[2]))),
                *pg_over_sqlite([c[0] for c in cells]),
            )
        out.append(table)
    if first.get("approvals"):
        table = Table(
            "Approval to resume, one idle worker (ms)",
            [
                "worker class",
                "measure",
                *(f"{b} {p}" for b in labels for p in ("p50", "p95")),
                *(["PG / SQLite p50"] if both else []),
            ],
            labels=2,
        )
        for kind, measures in first["approvals"].items():
            for measure in measures:
                cells = [results[b]["approvals"][kind][measure] for b in backends]
                table.add(
                    CLASS_LABELS[kind],
                    measure,
                    *(c[k] for c in cells for k in ("p50_ms", "p95_ms")),
                    *pg_over_sqlite([c["p50_ms"] for c in cells]),
                )
        out.append(table)
    if "pages" in first:
        made = first["pages"]["data"]
        conversations, events = made["conversations"], made["audit_events"]["events"]
        table = Table(
            f"Pages at {conversations['conversations']:,} conversations ({conversations['waiting']:,} calls "
            f"waiting) and {events:,} audit events (ms)",
            ["page", *(f"{b} {p}" for b in labels for p in ("p50", "p95")), *(["PG / SQLite p50"] if both else [])],
        )
        for page in first["pages"]["pages"]:
            cells = [results[b]["pages"]["pages"][page] for b in backends]
            table.add(
                page,
                *(c[k] for c in cells for k in ("p50_ms", "p95_ms")),
                *pg_over_sqlite([c["p50_ms"] for c in cells]),
            )
        out.append(table)
        table = Table(
            "Bulk data (seconds)",
            ["what", *labels],
        )
        table.add(
            f"{made['conversations']['conversations']:,} conversations, bulk inserts",
            *(results[b]["pages"]["data"]["conversations"]["seconds"] for b in backends),
        )
        table.add(
            f"{made['audit_events']['events']:,} audit events, `audit generate`",
            *(results[b]["pages"]["data"]["audit_events"]["seconds"] for b in backends),
        )
        out.append(table)
    return out


def _numbers(text: str, flag: str, parser) -> list[int]:
    try:
        values = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        parser.error(f"{flag} takes comma-separated whole numbers, e.g. 1,2,4")
    if not values or any(v < 1 for v in values):
        parser.error(f"{flag} needs numbers of at least 1")
    return values


def _names(text: str, flag: str, allowed, parser) -> list[str]:
    values = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [v for v in values if v not in allowed]
    if unknown:
        parser.error(f"{flag}: unknown {', '.join(unknown)} (choose from {', '.join(allowed)})")
    return values


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (a minute or two); defaults below are full")
    parser.add_argument("--postgres", help="a PostgreSQL database URL to WIPE and use (default: $BENCH_POSTGRES_URL)")
    parser.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only, even if $BENCH_POSTGRES_URL is set")
    parser.add_argument("--redis", help="a Redis URL whose database is FLUSHED and used (default: embedded)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"what to measure (default {','.join(PARTS)})")
    parser.add_argument("--results", type=Path, default=None, help="directory for the results (default bench/results)")
    sizes = parser.add_argument_group("sizes (full / --quick)")
    for key, kind, text in (
        ("overhead_conversations", int, "conversations for the per-move figures"),
        ("conversations", int, "conversations started at once for moves/s (simple)"),
        ("fork_conversations", int, "conversations for fork (0 skips it)"),
        ("workers", str, "worker counts"),
        ("classes", str, "RQ worker classes: simple (rq.SimpleWorker), fork (rq.Worker), spawn (rq.SpawnWorker)"),
        ("spawn_conversations", int, "conversations for spawn (~5 s per move: a new interpreter; 0 skips it)"),
        ("spawn_workers", str, "worker counts for spawn"),
        ("decisions", int, "approvals to time"),
        ("approval_classes", str, "worker classes to time approvals with"),
        ("page_conversations", int, "conversations in the database for the pages"),
        ("audit_events", int, "audit events in the database for the pages"),
        ("repeats", int, "requests per page"),
    ):
        sizes.add_argument(
            "--" + key.replace("_", "-"), type=kind, default=None, help=f"{text} ({FULL[key]} / {QUICK[key]})"
        )
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.workers = _numbers(args.workers, "--workers", parser)
    args.spawn_workers = _numbers(args.spawn_workers, "--spawn-workers", parser)
    args.classes = _names(args.classes, "--classes", ("simple", "fork", "spawn"), parser)
    args.approval_classes = _names(args.approval_classes, "--approval-classes", ("simple", "fork", "spawn"), parser)
    args.parts = _names(args.parts, "--parts", PARTS, parser)
    for key in ("overhead_conversations", "conversations", "decisions", "page_conversations", "repeats"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be at least 1")
    if args.audit_events < 1000:
        parser.error("--audit-events must be at least 1000")
    args.postgres = None if args.no_postgres else postgres_from(args.postgres)
    args.backends = ([] if args.no_sqlite else ["sqlite"]) + (["postgresql"] if args.postgres else [])
    if not args.backends:
        parser.error("nothing to run: drop --no-sqlite, or give --postgres")
    return args


def main(argv: list[str] | None = None) -> Path:
    args = parse(argv)
    sizes = {key: getattr(args, key) for key in FULL}
    report = new_report(mode="quick" if args.quick else "full", command=sys.argv, sizes=sizes, parts=args.parts)
    started = time.monotonic()
    for name in args.backends:
        report["backends"][name] = run_backend(name, args, args.postgres)
    report["seconds"] = round(time.monotonic() - started, 1)
    path = save("bench", report, tables(report), args.results)
    print(f"{report['seconds']:.0f} s in all, {report['cpus']} CPUs")
    return path
