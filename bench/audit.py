"""Benchmark: the audit log at a million events: generating them, the auditor's pages, and exports.

    .venv/bin/python -m bench.audit                      # SQLite (a file in a temp dir)
    .venv/bin/python -m bench.audit --postgres postgresql://postgres@127.0.0.1:5432/postgres
                                                         # also PostgreSQL (scratch database desk_audit_bench)

Generates --events synthetic events on acme's chain with the same code as `flask audit generate`,
then times pages through the Flask test client signed in as an auditor (the first page, a filtered
page with a cursor deep in the set, other filters, a conversation's timeline, the JSON API, the
dashboard) as p50/p95 over --repeat requests, and streams both exports to the end (events/s).
Prints a table and writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

from bench.moves import make_app, percentile, prepare

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = "desk_audit_bench"


@contextmanager
def scratch(name: str, postgres: str | None):
    """Environment for one backend with a fresh, empty database; the database is dropped after."""
    with tempfile.TemporaryDirectory(prefix=f"bench-audit-{name}-") as tmp:
        env = {"INSTANCE_PATH": tmp, "SECRET_KEY": "bench"}
        admin = None
        if name == "sqlite":
            env["DATABASE_URL"] = f"sqlite:///{tmp}/bench.db"
        else:
            admin = create_engine(postgres, isolation_level="AUTOCOMMIT")
            with admin.connect() as connection:
                connection.execute(text(f"DROP DATABASE IF EXISTS {SCRATCH}"))
                connection.execute(text(f"CREATE DATABASE {SCRATCH}"))
            env["DATABASE_URL"] = make_url(postgres).set(database=SCRATCH).render_as_string(False)
        os.environ.pop("ANTHROPIC_API_KEY", None)
        os.environ.update(env)
        try:
            yield env
        finally:
            if admin is not None:
                with admin.connect() as connection:
                    connection.execute(text(f"DROP DATABASE IF EXISTS {SCRATCH} WITH (FORCE)"))
                admin.dispose()


def generate(app, events: int) -> dict:
    from webapp.audit_log import generate_events, tenant_for
    from webapp.extensions import db

    with app.app_context():
        tenant_id = tenant_for("acme").id
        db.session.remove()
        started = time.perf_counter()
        generate_events(db.engine, tenant_id, events, seed=1)
        seconds = time.perf_counter() - started
    return {"events": events, "seconds": round(seconds, 1), "events_per_s": round(events / seconds)}


def signed_in(app, email: str):
    """A test client with this person's session, and an API token for them."""
    from webapp.accounts import create_token
    from webapp.extensions import db
    from webapp.models import User

    client = app.test_client()
    with app.app_context():
        user = db.session.scalar(select(User).where(User.email == email))
        with client.session_transaction() as session:
            session["_user_id"] = user.get_id()
            session["_fresh"] = True
        token = create_token(db.session, user)
        db.session.commit()
        db.session.remove()
    return client, {"Authorization": f"Bearer {token}"}


def targets(app) -> list[tuple[str, str, bool]]:
    """(label, url, is_api) for the pages to time, with values taken from the generated set."""
    from webapp.extensions import db
    from webapp.models import AuditEvent

    with app.app_context():
        e = AuditEvent
        low, high = db.session.execute(select(func.min(e.id), func.max(e.id))).one()
        deep = low + (high - low) // 10  # 90% of the set lies above this cursor
        middle = db.session.scalar(select(e.created_at).where(e.id == (low + high) // 2))
        conversation = db.session.scalar(select(e.conversation_id).where(e.id >= deep, e.conversation_id.is_not(None)))
        db.session.remove()
    day = middle.date()
    month = (day - timedelta(days=15)).isoformat(), (day + timedelta(days=14)).isoformat()
    return [
        ("first page", "/audit", False),
        ("action filter, deep cursor", f"/audit?action=approval_decided&before={deep}", False),
        ("tool filter", "/audit?tool=issue_refund", False),
        ("person filter", "/audit?person=reviewer@acme.test", False),
        ("one day", f"/audit?from={day}&to={day}", False),
        ("30 days in the middle", f"/audit?from={month[0]}&to={month[1]}", False),
        ("text search (rare word)", "/audit?q=chargeback", False),
        ("conversation timeline", f"/audit/conversations/{conversation}", False),
        ("API, 100 events, deep", f"/api/audit?action=tool_call_executed&cursor={deep}", True),
        ("dashboard, 30 days", "/audit/dashboard", False),
    ]


def time_pages(app, repeat: int) -> dict:
    client, bearer = signed_in(app, "auditor@acme.test")
    results = {}
    for label, url, is_api in targets(app):
        times = []
        count = max(3, repeat // 6) if "dashboard" in label else repeat
        for n in range(count + 2):  # two to warm up
            started = time.perf_counter()
            response = client.get(url, headers=bearer if is_api else None)
            elapsed = (time.perf_counter() - started) * 1000
            if response.status_code != 200:
                raise RuntimeError(f"{url} answered {response.status_code}")
            if n >= 2:
                times.append(elapsed)
        results[label] = {
            "url": url,
            "count": len(times),
            "p50_ms": round(statistics.median(times), 1),
            "p95_ms": round(percentile(times, 95), 1),
        }
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
    parser.add_argument("--postgres", help=f"a PostgreSQL server URL; a scratch database {SCRATCH} is made there")
    parser.add_argument("--skip-sqlite", action="store_true")
    args = parser.parse_args()
    if args.events < 1000 or args.repeat < 1:
        parser.error("--events must be at least 1000 and --repeat at least 1")
    backends = ([] if args.skip_sqlite else ["sqlite"]) + (["postgresql"] if args.postgres else [])
    if not backends:
        parser.error("nothing to run: drop --skip-sqlite or add --postgres")

    report = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "cpus": os.cpu_count(), "backends": {}}
    for name in backends:
        with scratch(name, args.postgres) as env:
            app = make_app(env)
            prepare(app)
            print(f"{name}: generating {args.events:,} events ...", flush=True)
            generated = generate(app, args.events)
            print(f"{name}: timing pages and exports ...", flush=True)
            report["backends"][name] = {
                "generate": generated,
                "pages": time_pages(app, args.repeat),
                "exports": time_exports(app, args.events),
            }
            with app.app_context():
                from webapp.extensions import db

                db.engine.dispose()
    print_report(report)
    out = ROOT / "bench" / "results" / f"audit-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"\nJSON: {out.relative_to(ROOT)}")


def print_report(report: dict) -> None:
    print(f"\nAudit log benchmark, {report['cpus']} CPUs")
    print(f"{'backend':<11} {'generate':<34} {'events':>10} {'seconds':>8} {'events/s':>9}")
    for name, result in report["backends"].items():
        g = result["generate"]
        print(f"{name:<11} {'flask audit generate':<34} {g['events']:>10,} {g['seconds']:>8} {g['events_per_s']:>9,}")
    print(f"\n{'backend':<11} {'page':<34} {'count':>6} {'p50 ms':>8} {'p95 ms':>8}")
    for name, result in report["backends"].items():
        for label, row in result["pages"].items():
            print(f"{name:<11} {label:<34} {row['count']:>6} {row['p50_ms']:>8} {row['p95_ms']:>8}")
    print(f"\n{'backend':<11} {'export':<8} {'events':>10} {'MB':>8} {'seconds':>8} {'events/s':>9}")
    for name, result in report["backends"].items():
        for kind, row in result["exports"].items():
            rate = row["events_per_s"]
            print(f"{name:<11} {kind:<8} {row['events']:>10,} {row['mb']:>8} {row['seconds']:>8} {rate:>9,}")


if __name__ == "__main__":
    main()
