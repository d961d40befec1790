"""How soon an integrator hears of what happened: event webhooks, from the moment the desk records an
event (its audit event's time, in the transaction that commits it) to the moment a receiver on this
machine has it, signed, for N conversations at once on pool workers.

    .venv/bin/python -m bench.events                                   # SQLite, an embedded Redis
    .venv/bin/python -m bench.events --conversations 200 --postgres postgresql://postgres@127.0.0.1:5432/bench_db \\
        --redis redis://127.0.0.1:6379/13

A subscription of acme to every event type; N refund conversations started at once (each waits for a
reviewer: approval.requested, conversation.awaiting_approval); once every call waits, all are
approved through the API at once (approval.decided, then the refund runs and the assistant answers:
conversation.completed). The receiver checks each request with the `standardwebhooks` library and
counts what came twice and what came out of its conversation's order. Prints a table per backend and
writes JSON and Markdown to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import defaultdict
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sqlalchemy import select

from bench.approvals import start_refunds, wait_until_parked
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
    stats,
)
from bench.runs import plain_engine, worker_pool

ORDER = ("approval.requested", "conversation.awaiting_approval", "approval.decided", "conversation.completed")


class Receiver:
    """A receiver on a local port: each request's arrival time, body and whether it verified."""

    def __init__(self) -> None:
        self.secret = ""
        self.received: list[dict] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                arrived = time.time()
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                from standardwebhooks import Webhook, WebhookVerificationError

                try:
                    Webhook(receiver.secret).verify(raw, dict(self.headers.items()))
                    verified = True
                except WebhookVerificationError:
                    verified = False
                with receiver.lock:
                    receiver.received.append(
                        {"at": arrived, "id": self.headers.get("webhook-id"), "body": json.loads(raw), "ok": verified}
                    )
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self, event_type: str) -> int:
        with self.lock:
            return sum(1 for request in self.received if request["body"]["type"] == event_type)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_for(receiver: Receiver, event_type: str, count: int, timeout: float, check) -> None:
    deadline = time.monotonic() + timeout
    while receiver.count(event_type) < count:
        check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{receiver.count(event_type)} of {count} {event_type} events after {timeout:.0f} s")
        time.sleep(0.05)


def subscribe(app, url: str) -> str:
    from webapp import webhooks
    from webapp.models import User
    from webapp.runtime.extensions import db
    from webapp.runtime.services import services

    with app.app_context():
        admin = db.session.scalar(select(User).where(User.email == "admin@acme.test"))
        _, secret = webhooks.subscribe(db.session, services().config, admin, url, list(webhooks.EVENT_TYPES))
        db.session.commit()
        db.session.remove()
    return secret


def measure(app, env: dict, receiver: Receiver, conversations: int, workers: int, slots: int, timeout: float) -> dict:
    from webapp.models import ToolCall

    try:
        receiver.secret = subscribe(app, f"http://127.0.0.1:{receiver.port}/hooks")
        with worker_pool(env, "pool", workers, slots) as pool:
            ids = start_refunds(app, conversations)
            wait_until_parked(env, ids, timeout=timeout, check=pool.check)
            wait_for(receiver, "conversation.awaiting_approval", conversations, timeout, pool.check)
            engine = plain_engine(env)
            try:
                with engine.connect() as connection:
                    calls = connection.scalars(select(ToolCall.id).where(ToolCall.conversation_id.in_(ids))).all()
            finally:
                engine.dispose()
            client, bearer = signed_in(app, "reviewer@acme.test")
            for call_id in calls:
                answer = client.post(f"/api/approvals/{call_id}", json={"decision": "approve"}, headers=bearer)
                if answer.status_code != 200:
                    raise RuntimeError(f"approval {call_id}: {answer.status_code} {answer.get_data(as_text=True)}")
            wait_for(receiver, "conversation.completed", conversations, timeout, pool.check)
            time.sleep(1)  # anything sent twice has its moment to arrive
            problems = pool.errors()
            if problems["jobs_failed"]:
                log = pool.log_path.read_text(errors="replace")
                keep = pool.log_path.parent.parent / f"events-workers-{int(time.time())}.log"
                keep.write_text(log)
                progress(f"jobs failed in the workers: their log is kept in {keep}")
    finally:
        receiver.close()
    return {**summarize(receiver.received), "worker_problems": problems}


def summarize(received: list[dict]) -> dict:
    latency: dict[str, list[float]] = defaultdict(list)
    seen: set[str] = set()
    twice = out_of_order = 0
    last: dict[int, int] = {}
    for request in sorted(received, key=lambda r: r["at"]):
        body = request["body"]
        recorded = datetime.fromisoformat(body["timestamp"]).timestamp()
        latency[body["type"]].append((request["at"] - recorded) * 1000)
        if request["id"] in seen:
            twice += 1
            continue
        seen.add(request["id"])
        conversation, number = body["data"].get("conversation_id"), int(request["id"].removeprefix("evt_"))
        if conversation is not None:
            if number < last.get(conversation, 0):
                out_of_order += 1
            last[conversation] = number
    return {
        "deliveries": len(received),
        "verified": sum(1 for request in received if request["ok"]),
        "sent_twice": twice,
        "out_of_order": out_of_order,
        "latency_ms": {event_type: stats(values, 1) for event_type, values in latency.items()},
    }


def tables(report: dict) -> list[Table]:
    out = []
    for name, result in report["backends"].items():
        table = Table(
            f"Event webhooks, {BACKEND_LABELS[name]}: recorded → received by the receiver (ms), "
            f"{report['conversations']} conversations, {report['workers']} x {report['slots']} slots",
            ["event", "count", "p50", "p95", "p99"],
        )
        for event_type in ORDER:
            row = result["latency_ms"].get(event_type)
            if row:
                table.add(event_type, row["count"], row["p50_ms"], row["p95_ms"], row["p99_ms"])
        table.add("all verified with standardwebhooks", f"{result['verified']} of {result['deliveries']}", "", "", "")
        table.add(
            "sent twice / out of a conversation's order",
            f"{result['sent_twice']} / {result['out_of_order']}",
            "",
            "",
            "",
        )
        out.append(table)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2, help="pool worker processes (default 2)")
    parser.add_argument("--slots", type=int, default=20, help="slots per worker (default 20)")
    parser.add_argument(
        "--postgres", help="a PostgreSQL database whose public schema is DROPPED (or BENCH_POSTGRES_URL)"
    )
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument("--redis", help="a Redis database that is FLUSHED (default: an embedded server)")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    postgres = postgres_from(args.postgres)
    names = ([] if args.no_sqlite else ["sqlite"]) + (["postgresql"] if postgres else [])
    report = new_report(conversations=args.conversations, workers=args.workers, slots=args.slots)
    for name in names:
        with backend(name, postgres, args.redis) as env:
            receiver = Receiver()
            env["OUTBOUND_ALLOW"] = f"127.0.0.1:{receiver.port}"  # the receiver is the one private address
            app = make_app(env)
            prepare(app)
            progress(f"{BACKEND_LABELS[name]}: {args.conversations} conversations, events to a local receiver")
            report["backends"][name] = measure(
                app, env, receiver, args.conversations, args.workers, args.slots, args.timeout
            )
            dispose(app)
    save("events", report, tables(report))


if __name__ == "__main__":
    main()
