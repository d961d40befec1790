"""Benchmark: the audit log at a million events: generating them, the auditor's pages, and exports.

    .venv/bin/python -m bench.audit                      # SQLite (a file in a temp dir)
    .venv/bin/python -m bench.audit --postgres postgresql://postgres@127.0.0.1:5432/bench_db
                                                         # also PostgreSQL (that database's schema is WIPED)

Generates --events synthetic events on acme's chain with the same code as `flask audit generate`,
then times pages through the Flask test client signed in as an auditor (the first page, a filtered
page with a cursor deep in the set, other filters, a conversation's timeline, the JSON API, the
dashboard) as p50/p95 over --repeat requests, and streams both exports to the end (events/s).
Prints tables and writes JSON (and the tables as Markdown) to bench/results/. The page latencies at
this scale are also in `python -m bench` (bench/suite.py); this one adds more filters, the dashboard
and the exports.
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta

from sqlalchemy import func, select

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
    save,
    signed_in,
    time_page,
)
from bench.data import bulk_audit_events


def targets(app) -> list[tuple[str, str, bool]]:
    """(label, url, is_api) for the pages to time, with values taken from the generated set."""
    from webapp.models import AuditEvent
    from webapp.runtime.extensions import db
    from webapp.web.pagination import encode_cursor

    with app.app_context():
        e = AuditEvent
        low, high = db.session.execute(select(func.min(e.id), func.max(e.id))).one()
        deep = low + (high - low) // 10  # 90% of the set lies above this id
        middle = db.session.scalar(select(e.created_at).where(e.id == (low + high) // 2))
        conversation = db.session.scalar(select(e.conversation_id).where(e.id >= deep, e.conversation_id.is_not(None)))
        db.session.remove()
    cursor = encode_cursor([deep])  # a page from this cursor on shows the events older than `deep`
    day = middle.date()
    month = (day - timedelta(days=15)).isoformat(), (day + timedelta(days=14)).isoformat()
    return [
        ("first page", "/audit", False),
        ("action filter, deep cursor", f"/audit?action=approval_decided&cursor={cursor}", False),
        ("tool filter", "/audit?tool=issue_refund", False),
        ("person filter", "/audit?person=reviewer@acme.test", False),
        ("one day", f"/audit?from={day}&to={day}", False),
        ("30 days in the middle", f"/audit?from={month[0]}&to={month[1]}", False),
        ("text search (rare word)", "/audit?q=chargeback", False),
        ("conversation timeline", f"/audit/conversations/{conversation}", False),
        ("API, 100 events, deep", f"/api/audit?action=tool_call_executed&cursor={cursor}", True),
        ("dashboard, 30 days", "/audit/dashboard", False),
    ]


def time_pages(app, repeat: int) -> dict:
    client, bearer = signed_in(app, "auditor@acme.test")
    results = {}
    for label, url, is_api in targets(app):
        count = max(3, repeat // 6) if "dashboard" in label else repeat
        results[label] = time_page(client, url, count, bearer if is_api else None)
    return results


def time_exports(app, events: int) -> dict:
    client, _ = signed_in(app, "auditor@acme.test")
    results = {}
    for kind in ("csv", "jsonl"):
        started = time.perf_counter()
        response = client.get(f"/audit/export.{kind}")
        size = lines = 0
        for chunk in response.iter_encoded():  # streamed: never the whole export in memory
            size += len(chunk)
            lines += chunk.count(b"\n")
        response.close()
        seconds = time.perf_counter() - started
        rows = lines - (kind == "csv")
        if rows != events:
            raise RuntimeError(f"the {kind} export has {rows} events, not {events}")
        results[kind] = {
            "events": rows,
            "mb": round(size / 1e6, 1),
            "seconds": round(seconds, 1),
            "events_per_s": round(rows / seconds),
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000, help="events to generate (default 1,000,000)")
    parser.add_argument("--repeat", type=int, default=30, help="requests per page (default 30)")
    parser.add_argument("--postgres", help="a PostgreSQL database URL to WIPE and use (default: $BENCH_POSTGRES_URL)")
    parser.add_argument("--skip-sqlite", action="store_true")
    args = parser.parse_args()
    if args.events < 1000 or args.repeat < 1:
        parser.error("--events must be at least 1000 and --repeat at least 1")
    postgres = postgres_from(args.postgres)
    backends = ([] if args.skip_sqlite else ["sqlite"]) + (["postgresql"] if postgres else [])
    if not backends:
        parser.error("nothing to run: drop --skip-sqlite or add --postgres")

    report = new_report(events=args.events, repeat=args.repeat)
    for name in backends:
        with backend(name, postgres) as env:
            app = make_app(env)
            prepare(app)
            progress(f"{name}: generating {args.events:,} events")
            generated = bulk_audit_events(app, args.events)
            progress(f"{name}: timing pages and exports")
            report["backends"][name] = {
                "generate": generated,
                "pages": time_pages(app, args.repeat),
                "exports": time_exports(app, args.events),
            }
            dispose(app)
    save("audit", report, tables(report))


def tables(report: dict) -> list[Table]:
    results = report["backends"]
    labels = [BACKEND_LABELS[b] for b in results]
    generate = Table(f"Audit log, {report['cpus']} CPUs: generating events", ["", *labels])
    generate.add("events", *(r["generate"]["events"] for r in results.values()))
    generate.add("seconds", *(r["generate"]["seconds"] for r in results.values()))
    generate.add("events/s", *(r["generate"]["events_per_s"] for r in results.values()))
    pages = Table("Audit pages (ms)", ["page", *(f"{b} {p}" for b in labels for p in ("p50", "p95"))])
    first = next(iter(results.values()))
    for label in first["pages"]:
        pages.add(label, *(r["pages"][label][k] for r in results.values() for k in ("p50_ms", "p95_ms")))
    exports = Table(
        "Exports, streamed to the end", ["export", *(f"{b} {c}" for b in labels for c in ("MB", "events/s"))]
    )
    for kind in first["exports"]:
        exports.add(kind, *(r["exports"][kind][k] for r in results.values() for k in ("mb", "events_per_s")))
    return [generate, pages, exports]


if __name__ == "__main__":
    main()
