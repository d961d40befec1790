"""The benchmark: one command, every figure docs/performance.md shows.

    .venv/bin/python -m bench --quick                      # a few minutes: small sizes
    .venv/bin/python -m bench --postgres postgresql://postgres@127.0.0.1:5432/bench_db \
        --redis redis://127.0.0.1:6379/13                  # the full run, SQLite and PostgreSQL

The model is the offline demo model answering in-process beneath the real `anthropic` SDK, at zero
latency unless a part says otherwise (DEMO_MODEL_REPLY_SECONDS=L in its workers: each reply takes
L seconds, streamed), so what is measured is the desk itself. For each backend (SQLite always
unless --no-sqlite; PostgreSQL when --postgres or $BENCH_POSTGRES_URL names a database, whose
public schema is DROPPED and recreated, so never point it at data you keep):

1. overhead: advance() called in-process, move after move (p50, p95, p99 per move);
2. langgraph: the same scripted agent (a lookup, a refund that waits for approval, an answer) as
   LangGraph 1.x with its SQLite checkpointer and as the desk's moves, time per step in-process
   (bench/langgraph_agent.py; skipped, saying so, without `pip install -e '.[bench]'`);
3. throughput: N conversations started at once (three moves each), worked by 1, 2, 4 worker
   subprocesses of each worker class (`python -m bench.worker --class pool|simple|fork|spawn`;
   pool is the app's own worker with --pool-slots slots per process), with the CPU a move costs in
   the workers and in PostgreSQL and Redis, and the moves/s the machine's cores allow at that cost;
4. inflight: N conversations at once against a model taking L s per reply, on P pool workers of C
   slots: time to finish in replies, the wait before the model sees a question, memory per
   conversation in flight (bench/inflight.py);
5. approvals: a decision POSTed to /api/approvals/<id>, then the next move (the tool) starting and
   ending, and the answer after it, read from the database's timestamps: with one idle worker, and
   on pool workers while other conversations are in flight (bench/approvals.py);
6. pages: bulk-inserted conversations and audit events, then the inbox, the decision page, the
   conversation list, the chat page and the audit log through the test client (p50, p95, p99);
7. waiting: the reviewer's pages (the inbox, the decision page of the oldest and the newest call,
   the API's call and first page) at each size of --waiting-sizes waiting calls in one database,
   grown from the smallest to the largest, and how much slower the largest is than the smallest;
8. batch: a bulk run of --batch-items items (half refunds that wait for a reviewer, decided in
   groups from the inbox) one by one, then by Message Batch, on two pool workers: the model calls
   by batch and through /v1/messages, the time to settle, and what each cost (bench/batches.py).

Redis: --redis (its database is FLUSHED) or an embedded server. Prints the tables side by side
per backend (compare within one run: ratios, not absolute figures) and writes JSON and Markdown to
bench/results/.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sqlalchemy import func, select

from bench import approvals as approvals_part
from bench import batches as batches_part
from bench import data, langgraph_agent
from bench.common import (
    BACKEND_LABELS,
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
from bench.context import measure_context
from bench.inflight import measure_inflight, parse_scenarios, scenario_label
from bench.runs import new_conversations, run_conversations, worker_pool
from bench.worker import KINDS
from bench.worker import label as class_label

PARTS = ("overhead", "langgraph", "throughput", "inflight", "approvals", "context", "pages", "waiting", "batch")
FULL = {
    "overhead_conversations": 100,
    "script_runs": 100,
    "conversations": 500,
    "workers": "1,2,4",
    "classes": "pool,simple",
    "pool_slots": 20,
    "fork_conversations": 100,
    "spawn_conversations": 4,
    "spawn_workers": "2",
    "inflight": "40:2.25:2:20,200:5:1:200,40:2.25:2:1",
    "decisions": 20,
    "approval_classes": "pool,simple",
    "approvals_in_flight": "100:5:2:120,200:5:2:120,300:5:2:150",
    "page_conversations": 100_000,
    "audit_events": 1_000_000,
    "waiting_sizes": "1000,100000",
    "repeats": 30,
    "context_turns": 30,
    "batch_items": 200,
}
QUICK = {
    **FULL,
    "overhead_conversations": 20,
    "script_runs": 10,
    "conversations": 20,
    "workers": "1,2",
    "fork_conversations": 20,
    "inflight": "10:0.5:2:5,20:1:1:20,10:0.5:2:1",
    "decisions": 3,
    "approval_classes": "pool",
    "approvals_in_flight": "20:0.5:1:30",
    "page_conversations": 2_000,
    "audit_events": 20_000,
    "waiting_sizes": "100,2000",
    "repeats": 5,
    "context_turns": 12,
    "batch_items": 20,
}
HELP = {
    "overhead_conversations": "conversations for the per-move figures",
    "script_runs": "runs of the scripted agent per side for the LangGraph comparison",
    "conversations": "conversations started at once for moves/s (pool, simple)",
    "workers": "worker counts for moves/s",
    "classes": "worker classes for moves/s: pool (the app's PoolWorker), simple (rq.SimpleWorker), "
    "fork (rq.Worker), spawn (rq.SpawnWorker)",
    "pool_slots": "slots per pool worker for moves/s and the idle approvals",
    "fork_conversations": "conversations for fork (0 skips it)",
    "spawn_conversations": "conversations for spawn (~5 s per move: a new interpreter; 0 skips it)",
    "spawn_workers": "worker counts for spawn",
    "inflight": "scenarios conversations:reply_seconds:workers:slots, comma-separated",
    "decisions": "approvals to time (idle, and in flight)",
    "approval_classes": "worker classes to time idle approvals with",
    "approvals_in_flight": "background loads for approvals, comma-separated: in_flight:reply_seconds:workers:slots "
    "(0 skips them)",
    "page_conversations": "conversations in the database for the pages",
    "audit_events": "audit events in the database for the pages",
    "waiting_sizes": "waiting calls for the reviewer's pages, comma-separated, smallest first",
    "repeats": "requests per page",
    "context_turns": "turns of the long chat against a 12,000-token window",
    "batch_items": "items of the bulk run made by batch and one by one (half refunds, decided in groups)",
}


# --- 1. overhead per move ------------------------------------------------------------------------


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


# --- 6. pages at scale ----------------------------------------------------------------------------


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


# --- 7. the reviewer's pages among many waiting calls ----------------------------------------------


def waiting_targets(app) -> list[tuple[str, str, bool]]:
    """(label, url, is_api) for the reviewer's pages, with the oldest and newest waiting calls."""
    from webapp.models import ToolCall
    from webapp.runtime.extensions import db

    with app.app_context():
        oldest, newest = db.session.execute(
            select(func.min(ToolCall.id), func.max(ToolCall.id)).where(ToolCall.status == "awaiting_approval")
        ).one()
        db.session.remove()
    return [
        ("inbox, first page", "/approvals", False),
        ("inbox, filtered by tool and amount", "/approvals?tool=issue_refund&min_amount=500&max_amount=600", False),
        ("decision page, the oldest call", f"/approvals/{oldest}", False),
        ("decision page, the newest call", f"/approvals/{newest}", False),
        ("API: one waiting call", f"/api/approvals/{oldest}", True),
        ("API: the inbox's first page", "/api/approvals", True),
    ]


def measure_waiting(app, sizes: list[int], repeats: int) -> dict:
    """The reviewer's pages at each size of waiting calls, the database grown between sizes."""
    from webapp.runtime.extensions import db

    client, headers = signed_in(app, "reviewer@acme.test")
    made, pages = 0, {}
    for size in sizes:
        progress(f"  bulk-inserting {size - made:,} waiting conversations (to {size:,})")
        with app.app_context():
            data.bulk_conversations(db.engine, size - made, waiting_every=1)
        made = size
        for label, url, is_api in waiting_targets(app):
            timed = time_page(client, url, repeats, headers if is_api else None)
            pages.setdefault(label, {})[str(size)] = timed
    return {"sizes": sizes, "pages": pages}


# --- the run ------------------------------------------------------------------------------------


def run_backend(name: str, args, postgres: str | None, shared: dict) -> dict:
    result: dict = {}
    with backend(name, postgres, args.redis) as env:
        app = make_app(env)
        prepare(app)
        label = BACKEND_LABELS[name]
        if "overhead" in args.parts:
            progress(f"{label}: overhead per move, {args.overhead_conversations} conversations in-process")
            result["overhead"] = measure_overhead(app, args.overhead_conversations)
        if "langgraph" in args.parts:
            missing = langgraph_agent.available()
            if missing:
                progress(f"{label}: LangGraph comparison skipped: {missing}")
                shared.setdefault("langgraph", {"skipped": missing})
            else:
                progress(f"{label}: the scripted agent as desk moves, {args.script_runs} runs in-process")
                result["script"] = langgraph_agent.measure_desk(app, args.script_runs, new_conversations)
                if "langgraph" not in shared:
                    progress(f"LangGraph: the scripted agent, {args.script_runs} runs in-process")
                    shared["langgraph"] = {
                        "versions": langgraph_agent.versions(),
                        **langgraph_agent.measure_langgraph(args.script_runs),
                    }
        if "throughput" in args.parts:
            result["throughput"] = []
            for kind in args.classes:
                size = {"fork": args.fork_conversations, "spawn": args.spawn_conversations}.get(
                    kind, args.conversations
                )
                slots = args.pool_slots if kind == "pool" else None
                for workers in args.spawn_workers if kind == "spawn" else args.workers:
                    if size < 1:
                        continue
                    with worker_pool(env, kind, workers, slots) as pool:
                        progress(f"{label}: {class_label(kind, slots)} x{workers}, {size} conversations")
                        row = run_conversations(app, env, size, workers=pool)
                    result["throughput"].append({"class": kind, "workers": workers, "slots": slots, **row})
                    progress(f"{label}:   {row['moves_per_s']} moves/s")
        if "inflight" in args.parts:
            result["inflight"] = []
            for scenario in args.inflight:
                progress(f"{label}: in flight, {scenario_label(scenario)}")
                row = measure_inflight(
                    app,
                    env,
                    scenario["conversations"],
                    scenario["reply_seconds"],
                    scenario["workers"],
                    scenario["slots"],
                )
                result["inflight"].append(row)
                progress(
                    f"{label}:   done in {row['done_over_reply']} x L, wait p95 {row['wait_for_model_p95_s']} s, "
                    f"{row['mb_per_conversation']} MB per conversation in flight; worker log: {row['worker_log']}"
                )
        if "approvals" in args.parts:
            result["approvals"] = {}
            for kind in args.approval_classes:
                slots = args.pool_slots if kind == "pool" else None
                with worker_pool(env, kind, 1, slots) as pool:
                    progress(f"{label}: approval to resume, {class_label(kind, slots)} x1 idle, {args.decisions}")
                    result["approvals"][kind] = approvals_part.measure_approvals(app, env, args.decisions, pool.check)
            if args.approvals_in_flight:
                result["approvals_in_flight"] = []
            for load in args.approvals_in_flight:
                progress(
                    f"{label}: approval to resume with {load['in_flight']} conversations in flight "
                    f"(L={load['reply_seconds']:g} s, {load['workers']} x {load['slots']} slots), {args.decisions}"
                )
                row = approvals_part.measure_approvals_in_flight(app, env, args.decisions, **load)
                result["approvals_in_flight"].append(row)
                settings = row["settings"]
                progress(f"{label}:   CPU busy {settings['cpu_busy_share']}; worker log: {settings['worker_log']}")
        if "context" in args.parts:
            progress(f"{label}: a {args.context_turns}-turn chat against a 12,000-token window, three ways")
            result["context"] = measure_context(app, args.context_turns)
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
        if "waiting" in args.parts:
            progress(
                f"{label}: the reviewer's pages at {', '.join(f'{n:,}' for n in args.waiting_sizes)} waiting calls"
            )
            result["waiting"] = measure_waiting(app, args.waiting_sizes, args.repeats)
        if "batch" in args.parts:
            progress(f"{label}: a run of {args.batch_items} items one by one, then by batch (2 pool workers)")
            result["batch"] = batches_part.measure_runs(app, env, args.batch_items, 2, args.pool_slots)
            progress(f"{label}:   by batch / one by one, cost: {result['batch'][1]['cost_over_interactive_run']}")
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
    graph = report.get("langgraph")
    if graph and "skipped" in graph:
        table = Table("The scripted agent, desk vs LangGraph", ["part"])
        table.add(f"skipped: {graph['skipped']}")
        out.append(table)
    elif graph and "script" in first:
        table = Table(
            "Time per step of the same scripted agent, in-process (ms): "
            f"LangGraph {graph['versions']['langgraph']} + SqliteSaver vs the desk's moves",
            [
                "step",
                "LangGraph invoke per step p50",
                "LangGraph invoke per step p95",
                "LangGraph one stream p50",
                "LangGraph one stream p95",
                *(x for b in labels for x in (f"desk {b} p50", f"desk {b} p95", f"desk {b} / LangGraph per step p50")),
            ],
        )
        for row in first["script"]:
            step, stream = graph["step"].get(row), graph["stream"].get(row)
            desk = [results[b]["script"][row] for b in backends]
            table.add(
                row,
                *(step["p50_ms"], step["p95_ms"]) if step else ("-", "-"),
                *(stream["p50_ms"], stream["p95_ms"]) if stream else ("-", "-"),
                *(x for d in desk for x in (d["p50_ms"], d["p95_ms"], ratio(d["p50_ms"], step and step["p50_ms"]))),
            )
        out.append(table)
    if first.get("throughput"):
        table = Table(
            "Moves per second, conversations started at once (three moves each), worker subprocesses",
            [
                "worker class",
                "workers",
                "conversations",
                *(
                    f"{b} {c}"
                    for b in labels
                    for c in (
                        "moves/s",
                        "vs 1 worker",
                        "vs SimpleWorker",
                        "CPU ms/move",
                        "of it workers",
                        "of it database and Redis",
                        "CPU bound moves/s",
                    )
                ),
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
                cpu = mine.get("worker_cpu_ms_per_move", 0) + mine.get("services_cpu_ms_per_move", 0)
                cells.append(
                    (
                        mine["moves_per_s"],
                        one and one["moves_per_s"],
                        simple and simple["moves_per_s"],
                        round(cpu, 2),
                        mine.get("worker_cpu_ms_per_move"),
                        mine.get("services_cpu_ms_per_move"),
                        mine.get("cpu_bound_moves_per_s"),
                    )
                )
            table.add(
                class_label(row["class"], row.get("slots")),
                row["workers"],
                row["conversations"],
                *(x for c in cells for x in (c[0], ratio(c[0], c[1]), ratio(c[0], c[2]), *c[3:])),
                *pg_over_sqlite([c[0] for c in cells]),
            )
        out.append(table)
    if first.get("context"):
        ways = list(first["context"])
        table = Table(
            f"A {first['context'][ways[0]]['turns']}-turn chat against a 12,000-token window (in-process, demo model)",
            ["sending", "measure", *labels],
            labels=2,
        )
        measures = (
            ("turns answered", "answered"),
            ("summaries written", "summaries"),
            ("largest request (input tokens)", "largest_request_tokens"),
            ("model calls past the window", "over_window"),
            ("input read from the prompt cache", "cache_read_share"),
            ("input tokens per turn", "input_tokens_per_turn"),
            ("output tokens per turn", "output_tokens_per_turn"),
            ("US cents per turn (Sonnet list prices)", "cents_per_turn"),
            ("the first turn's fact still sent", "fact_kept"),
        )
        for way in ways:
            for name, key in measures:
                table.add(way, name, *(results[b]["context"][way][key] for b in backends))
        out.append(table)
    if first.get("inflight"):
        table = Table(
            "Conversations in flight: N started at once, the model taking L s per reply (two replies and a tool "
            "each), PoolWorker processes",
            [
                "scenario",
                *(
                    f"{b} {c}"
                    for b in labels
                    for c in (
                        "done / L",
                        "wait for the model p50 s",
                        "p95 s",
                        "peak moving",
                        "MB per conversation",
                        "sweeper re-enqueued",
                    )
                ),
            ],
        )
        for n, row in enumerate(first["inflight"]):
            cells = [results[b]["inflight"][n] for b in backends]
            table.add(
                scenario_label(row),
                *(
                    x
                    for c in cells
                    for x in (
                        c["done_over_reply"],
                        c["wait_for_model_p50_s"],
                        c["wait_for_model_p95_s"],
                        c["peak_moves_running"],
                        c["mb_per_conversation"],
                        str(c["sweeper_recoveries"]),
                    )
                ),
            )
        out.append(table)
    if first.get("approvals"):
        table = Table(
            "Approval to resume (ms): one idle worker (zero-latency model)",
            [
                "worker class",
                "measure",
                *(f"{b} {c}" for b in labels for c in ("idle p50", "idle p95")),
                *(["PG / SQLite idle p50"] if both else []),
            ],
            labels=2,
        )
        for kind, measures in first["approvals"].items():
            for measure in measures:
                cells = [results[b]["approvals"][kind][measure] for b in backends]
                table.add(
                    class_label(kind),
                    measure,
                    *(x for c in cells for x in (c["p50_ms"], c["p95_ms"])),
                    *pg_over_sqlite([c["p50_ms"] for c in cells]),
                )
        out.append(table)
    if first.get("approvals_in_flight"):
        table = Table(
            "Approval to resume and a new message's first words (ms), on PoolWorkers while other "
            "conversations stay in flight (every model reply taking L)",
            [
                "load",
                "measure",
                *(f"{b} {c}" for b in labels for c in ("p50", "p95")),
            ],
            labels=2,
        )
        for number, load in enumerate(first["approvals_in_flight"]):
            s = load["settings"]
            rows = [results[b]["approvals_in_flight"][number] for b in backends]
            lost = sum(row["settings"]["worker_log"]["sweeper_re_enqueued"] for row in rows)
            busy = "/".join(f"{row['settings']['cpu_busy_share']:.0%}" for row in rows)
            people = s.get("people_workers")
            name = (
                f"{s['in_flight']} in flight, L={s['reply_seconds']:g} s, {s['workers']} x {s['slots']} slots"
                + (f" + {people} people-only x 10" if people else "")
                + f" (CPU busy {busy}"
                + (f"; the sweeper re-enqueued {lost}" if lost else "")
                + ")"
            )
            for measure in load["measures"]:
                cells = [row["measures"][measure] for row in rows]
                table.add(name, measure, *(x for c in cells for x in (c["p50_ms"], c["p95_ms"])))
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
    if "waiting" in first:
        sizes = first["waiting"]["sizes"]
        small, large = str(sizes[0]), str(sizes[-1])
        table = Table(
            f"The reviewer's pages at {' and '.join(f'{n:,}' for n in sizes)} waiting calls (ms, p50)",
            ["page", *(f"{b} {n:,}" for b in labels for n in sizes), *(f"{b} {large} / {small}" for b in labels)],
        )
        for page in first["waiting"]["pages"]:
            cells = [results[b]["waiting"]["pages"][page] for b in backends]
            table.add(
                page,
                *(cell[str(n)]["p50_ms"] for cell in cells for n in sizes),
                *(ratio(cell[large]["p50_ms"], cell[small]["p50_ms"]) for cell in cells),
            )
        out.append(table)
    if "batch" in first:
        table = Table(
            f"A bulk run of {first['batch'][0]['items']} items, one by one and by Message Batch",
            ["backend", "way", "settled (s)", "completed", "model calls", "by batch", "via /v1/messages",
             "batches", "decided in groups", "bulk decisions", "input tokens", "cache write", "cache read",
             "output tokens", "cost (USD)", "at list price (USD)", "by batch / one by one"],
            labels=2,
        )  # fmt: skip
        for b, label in zip(backends, labels, strict=True):
            for row in results[b]["batch"]:
                table.add(
                    label, row["way"], row["settled_s"], row["completed"], row["model_calls"], row["by_batch"],
                    row["through_messages"], row["batches"], row["decided_in_groups"], row["group_decisions"],
                    row["input_tokens"], row["cache_write_tokens"], row["cache_read_tokens"], row["output_tokens"],
                    row["cost_usd"], row["cost_at_list_usd"], row.get("cost_over_interactive_run") or "",
                )  # fmt: skip
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
    parser.add_argument("--quick", action="store_true", help="small sizes (a few minutes); defaults below are full")
    parser.add_argument("--postgres", help="a PostgreSQL database URL to WIPE and use (default: $BENCH_POSTGRES_URL)")
    parser.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only, even if $BENCH_POSTGRES_URL is set")
    parser.add_argument("--redis", help="a Redis URL whose database is FLUSHED and used (default: embedded)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"what to measure (default {','.join(PARTS)})")
    parser.add_argument("--results", type=Path, default=None, help="directory for the results (default bench/results)")
    sizes = parser.add_argument_group("sizes (full / --quick)")
    for key, text in HELP.items():
        kind = int if isinstance(FULL[key], int) else str
        sizes.add_argument(
            "--" + key.replace("_", "-"), type=kind, default=None, help=f"{text} ({FULL[key]} / {QUICK[key]})"
        )
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.workers = _numbers(args.workers, "--workers", parser)
    args.spawn_workers = _numbers(args.spawn_workers, "--spawn-workers", parser)
    args.classes = _names(args.classes, "--classes", KINDS, parser)
    args.approval_classes = _names(args.approval_classes, "--approval-classes", KINDS, parser)
    args.parts = _names(args.parts, "--parts", PARTS, parser)
    args.waiting_sizes = _numbers(args.waiting_sizes, "--waiting-sizes", parser)
    if args.waiting_sizes != sorted(set(args.waiting_sizes)):
        parser.error("--waiting-sizes must grow from the smallest to the largest, each once")
    try:
        args.inflight = parse_scenarios(args.inflight)
        args.approvals_in_flight = approvals_part.parse_loads(args.approvals_in_flight)
    except ValueError as error:
        parser.error(str(error))
    for key in ("overhead_conversations", "script_runs", "conversations", "pool_slots", "decisions"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be at least 1")
    for key in ("page_conversations", "repeats"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be at least 1")
    if args.audit_events < 1000:
        parser.error("--audit-events must be at least 1000")
    if "inflight" in args.parts and not args.inflight:
        parser.error("--inflight needs at least one scenario, or leave inflight out of --parts")
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
    shared: dict = {}
    for name in args.backends:
        report["backends"][name] = run_backend(name, args, args.postgres, shared)
    report.update(shared)
    report["seconds"] = round(time.monotonic() - started, 1)
    path = save("bench", report, tables(report), args.results)
    print(f"{report['seconds']:.0f} s in all, {report['cpus']} CPUs")
    return path
