"""Bulk data for the page benchmarks: conversations with their messages, tool calls and model
calls inserted in batches with explicit ids (no ORM, no round trip per row), and audit events with
the same generator as `flask --app webapp audit generate`."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, insert, select, text

BATCH = 5_000  # conversations per transaction
TITLES = ("Refund invoice {n}", "Late delivery, customer {n}", "Email customer {n}", "Close account {n}")


def _next_id(connection, table) -> int:
    return (connection.scalar(select(func.max(table.c.id))) or 0) + 1


def bulk_conversations(engine, count: int, days: int = 90, waiting_every: int = 5) -> dict:
    """`count` conversations of acme's agent spread over `days` days: one in `waiting_every` waiting
    for a reviewer on a refund (question and the tool call), the others completed (question, tool
    call, result, answer), each with its model calls. Returns what was made and how long it took."""
    from webapp.agent.policies import Policy
    from webapp.models import Conversation, Message, ModelCall, ToolCall, User

    policy = Policy("issue_refund", "above_amount", 5000, 1).snapshot()

    conversations, messages = Conversation.__table__, Message.__table__
    tool_calls, model_calls = ToolCall.__table__, ModelCall.__table__
    started = time.perf_counter()
    with engine.connect() as connection:
        agent = connection.execute(select(User.id, User.tenant_id).where(User.email == "agent@acme.test")).one()
        reviewer = connection.scalar(select(User.id).where(User.email == "reviewer@acme.test"))
        ids = {t.name: _next_id(connection, t) for t in (conversations, messages, tool_calls, model_calls)}
    now = datetime.now(UTC)
    step = timedelta(days=days) / max(count, 1)
    made = {"conversations": 0, "messages": 0, "tool_calls": 0, "model_calls": 0, "waiting": 0}
    for first in range(0, count, BATCH):
        rows: dict[str, list[dict]] = {"conversations": [], "messages": [], "tool_calls": [], "model_calls": []}
        for n in range(first, min(count, first + BATCH)):
            waiting = n % waiting_every == waiting_every - 1
            when = now - step * (count - n)
            cid = ids["conversations"] + n
            customer, amount = 4400 + n % 80, 5_000 + (n * 37) % 90_000
            status = "awaiting_approval" if waiting else "completed"
            rows["conversations"].append(
                {
                    "id": cid,
                    "tenant_id": agent.tenant_id,
                    "user_id": agent.id,
                    "title": TITLES[n % 4].format(n=customer),
                    "status": status,
                    "version": 2 if waiting else 4,
                    "recoveries": 0,
                    "moves_used": 1 if waiting else 3,
                    "move_budget": 25,
                    "run_tokens": 900,
                    "token_budget": 0,
                    "stop_reason": "tool_use" if waiting else "end_turn",
                    "created_at": when,
                    "updated_at": when + timedelta(seconds=2),
                }
            )
            tool_use_id = f"toolu_bulk_{cid}"
            arguments = {"invoice_id": customer, "amount_cents": amount, "reason": "late delivery"}
            question = f"Please refund ${amount / 100:.2f} on invoice {customer}, the delivery was late"
            texts = [
                ("user", [{"type": "text", "text": question}]),
                (
                    "assistant",
                    [
                        {"type": "text", "text": f"I'll refund invoice {customer}."},
                        {"type": "tool_use", "id": tool_use_id, "name": "issue_refund", "input": arguments},
                    ],
                ),
            ]
            if not waiting:
                result = f"Refunded ${amount / 100:.2f} on invoice {customer} (refund id {n})."
                texts += [
                    ("user", [{"type": "tool_result", "tool_use_id": tool_use_id, "content": result}]),
                    ("assistant", [{"type": "text", "text": f"Done: **${amount / 100:.2f}** refunded."}]),
                ]
            first_message = ids["messages"] + made["messages"]
            for seq, (role, content) in enumerate(texts, start=1):
                rows["messages"].append(
                    {
                        "id": first_message + seq - 1,
                        "conversation_id": cid,
                        "seq": seq,
                        "role": role,
                        "content": content,
                        "created_at": when + timedelta(milliseconds=400 * seq),
                    }
                )
            made["messages"] += len(texts)
            call = {
                "id": ids["tool_calls"] + n,
                "conversation_id": cid,
                "tenant_id": agent.tenant_id,
                "message_id": first_message + 1,
                "position": 0,
                "tool_use_id": tool_use_id,
                "name": "issue_refund",
                "input": arguments,
                "status": status if waiting else "succeeded",
                "acting_user_id": agent.id,
                "requires_approval": True,
                "approvals_required": 1,
                "policy": policy,
                "expires_at": when + timedelta(days=400),
                "attempts": 0 if waiting else 1,
                "is_error": False,
                "created_at": when + timedelta(milliseconds=800),
                **dict.fromkeys(("result", "decided_by_id", "decided_at", "started_at", "finished_at", "duration_ms")),
            }
            if not waiting:
                call.update(
                    result=result,
                    decided_by_id=reviewer,
                    decided_at=when + timedelta(seconds=1),
                    started_at=when + timedelta(milliseconds=1100),
                    finished_at=when + timedelta(milliseconds=1120),
                    duration_ms=20.0,
                    attempts=1,
                )
            rows["tool_calls"].append(call)
            for k in range(1 if waiting else 2):
                rows["model_calls"].append(
                    {
                        "id": ids["model_calls"] + made["model_calls"] + k,
                        "conversation_id": cid,
                        "tenant_id": agent.tenant_id,
                        "model": "claude-sonnet-5",
                        "request_id": f"req_bulk_{cid}_{k}",
                        "stop_reason": "end_turn" if k else "tool_use",
                        "input_tokens": 400,
                        "output_tokens": 50,
                        "cache_read_input_tokens": 0,
                        "cache_creation_input_tokens": 0,
                        "latency_ms": 900.0,
                        "created_at": when + timedelta(milliseconds=400 + 1400 * k),
                    }
                )
            made["model_calls"] += 1 if waiting else 2
            made["waiting"] += waiting
        with engine.begin() as connection:
            connection.execute(insert(conversations), rows["conversations"])
            connection.execute(insert(messages), rows["messages"])
            connection.execute(insert(tool_calls), rows["tool_calls"])
            connection.execute(insert(model_calls), rows["model_calls"])
        made["conversations"] += len(rows["conversations"])
        made["tool_calls"] += len(rows["tool_calls"])
    if engine.dialect.name == "postgresql":
        with engine.begin() as connection:
            for table in ("conversations", "messages", "tool_calls", "model_calls"):
                # explicit ids leave the sequences behind; the app's next insert must not collide
                connection.execute(
                    text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
                )
    made["seconds"] = round(time.perf_counter() - started, 1)
    settle(engine, "conversations", "messages", "tool_calls", "model_calls")
    return made


def settle(engine, *tables: str) -> None:
    """On PostgreSQL, VACUUM ANALYZE after a bulk load, as autovacuum would soon do: fresh planner
    statistics, and a visibility map so counts can be index-only scans (without it, counting 20,000
    waiting calls reads every heap page: 37 ms instead of 5 here). Not timed."""
    if engine.dialect.name != "postgresql":
        return
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql(f"VACUUM ANALYZE {', '.join(tables)}")


def bulk_audit_events(app, count: int) -> dict:
    """`count` events on acme's chain, as `flask --app webapp audit generate` makes them."""
    from demo.billing.synthetic import generate_events, tenant_for
    from webapp.runtime.extensions import db

    with app.app_context():
        tenant_id = tenant_for("acme").id
        db.session.remove()  # the generator writes on its own connections
        started = time.perf_counter()
        generate_events(db.engine, tenant_id, count, seed=1)
        seconds = time.perf_counter() - started
        settle(db.engine, "audit_events")
    return {"events": count, "seconds": round(seconds, 1), "events_per_s": round(count / seconds)}
