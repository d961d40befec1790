"""Synthetic, valid audit events for performance tests: `flask --app webapp audit generate` and the
benchmarks (bench/data.py, bench/audit.py) append them to a tenant's chain with `generate_events`,
finding the tenant with `tenant_for`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine

from webapp.audit_chain import GENESIS, event_hash
from webapp.models import AuditEvent, AuditHead, Tenant, User
from webapp.runtime.extensions import db

SYNTHETIC_BASE = 1_000_000_000  # conversation and tool-call ids of synthetic events start here
_UPSERT = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}
_REASONS = (
    "Amount is above the agent's limit",
    "Customer already got a goodwill credit this quarter",
    "We tell customers by phone",
    "Suspected chargeback fraud",
    "Wrong invoice",
)
_TOOLS = (
    ("lookup_customer", False, lambda r: {"query": str(r.randint(4400, 4480))}),
    ("lookup_invoices", False, lambda r: {"customer_id": r.randint(4400, 4480)}),
    (
        "issue_refund",
        True,
        lambda r: {"invoice_id": r.randint(4400, 4480), "amount_cents": r.randint(1, 400) * 100, "reason": "late"},
    ),
    ("send_email", True, lambda r: {"customer_id": r.randint(4400, 4480), "body": "Your refund is on its way"}),
    ("delete_account", True, lambda r: {"customer_id": r.randint(4400, 4480), "reason": "customer asked"}),
)


def generate_events(
    engine: Engine,
    tenant_id: int,
    count: int,
    *,
    days: int = 90,
    batch_size: int = 10_000,
    seed: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Append `count` synthetic, valid events to the tenant's chain: conversations of its agents with
    model calls, tool calls, approvals by its reviewers and executions, dated over the last `days`
    days. Each batch is one transaction that locks the chain's head, hashes with audit.event_hash,
    bulk-inserts and moves the head, so the chain verifies and the app can write in between.
    Conversation and tool-call ids start at SYNTHETIC_BASE and name no real row. Returns `count`."""
    rng = random.Random(seed)
    with engine.connect() as connection:
        people = connection.execute(select(User.id, User.email, User.roles).where(User.tenant_id == tenant_id)).all()
        highest = connection.scalar(
            select(func.max(AuditEvent.conversation_id)).where(AuditEvent.conversation_id >= SYNTHETIC_BASE)
        )
        highest_call = connection.scalar(
            select(func.max(AuditEvent.tool_call_id)).where(AuditEvent.tool_call_id >= SYNTHETIC_BASE)
        )
    agents = [(p.id, p.email) for p in people if "agent" in (p.roles or [])] or [(None, "agent@synthetic")]
    reviewers = [(p.id, p.email) for p in people if "reviewer" in (p.roles or [])] or [(None, "reviewer@synthetic")]
    ids = {"conversation": (highest or SYNTHETIC_BASE - 1) + 1, "tool_call": (highest_call or SYNTHETIC_BASE - 1) + 1}
    end = datetime.now(UTC)
    step = timedelta(days=days) / max(count, 1)
    script = _conversations(rng, agents, reviewers, ids)
    chain = str(tenant_id)
    upsert = _UPSERT[engine.dialect.name]
    heads, written = AuditHead.__table__, 0
    while written < count:
        size = min(batch_size, count - written)
        with engine.begin() as connection:
            locked = select(heads.c.seq, heads.c.hash).where(heads.c.chain == chain).with_for_update()
            head = connection.execute(locked).first()
            if head is None:
                connection.execute(
                    upsert(heads)
                    .values(chain=chain, seq=0, hash=GENESIS)
                    .on_conflict_do_nothing(index_elements=["chain"])
                )
                head = connection.execute(locked).one()
            seq, prev_hash = head.seq, head.hash
            rows = []
            for n in range(size):
                seq += 1
                row = next(script)
                row.update(
                    chain=chain,
                    seq=seq,
                    tenant_id=tenant_id,
                    created_at=end - step * (count - written - n),
                    prev_hash=prev_hash,
                )
                row["hash"] = prev_hash = event_hash(row)
                rows.append(row)
            connection.execute(insert(AuditEvent.__table__), rows)
            connection.execute(update(heads).where(heads.c.chain == chain).values(seq=seq, hash=prev_hash))
        written += size
        if progress:
            progress(written)
    if engine.dialect.name == "postgresql":
        # After a bulk load the planner's statistics are stale until autovacuum notices (if it runs):
        # it would then sort the tenant's whole chain to show one page.
        with engine.begin() as connection:
            connection.exec_driver_sql("ANALYZE audit_events")
    return count


def _conversations(rng: random.Random, agents: list, reviewers: list, ids: dict) -> Iterator[dict]:
    """An endless stream of plausible conversations, event by event, in the order the app writes them."""

    def event(action, actor, conversation_id=None, call=None, tool=None, outcome=None, data=None):
        return {
            "action": action,
            "actor_id": actor[0] if actor else None,
            "actor_label": actor[1] if actor else "assistant",
            "conversation_id": conversation_id,
            "tool_call_id": call,
            "tool_name": tool,
            "outcome": outcome,
            "data": data or {},
        }

    def model_call(conversation_id, stop):
        return event(
            "model_call",
            None,
            conversation_id,
            outcome=stop,
            data={
                "model": "claude-sonnet-5",
                "latency_ms": round(rng.uniform(300, 4000), 1),
                "request_id": f"req_{rng.getrandbits(48):012x}",
                "input_tokens": rng.randint(200, 4000),
                "output_tokens": rng.randint(20, 600),
                "cache_read_input_tokens": rng.choice((0, rng.randint(1000, 3000))),
                "cache_creation_input_tokens": rng.choice((0, 0, rng.randint(500, 1500))),
            },
        )

    while True:
        agent = rng.choice(agents)
        conversation_id = ids["conversation"]
        ids["conversation"] += 1
        if rng.random() < 0.2:
            yield event("sign_in", agent, outcome="succeeded", data={"address": "127.0.0.1"})
        yield event("conversation_started", agent, conversation_id, data={"message": "Please help customer 4471"})
        for _ in range(rng.randint(1, 3)):
            yield model_call(conversation_id, "tool_use")
            for name, sensitive, make_input in rng.sample(_TOOLS, rng.randint(1, 2)):
                call, arguments = ids["tool_call"], make_input(rng)
                ids["tool_call"] += 1
                status = "awaiting_approval" if sensitive else "pending"
                yield event("tool_call_requested", None, conversation_id, call, name, status, {"input": arguments})
                if sensitive:
                    yield event("approval_requested", None, conversation_id, call, name, status, {"input": arguments})
                    approve = rng.random() < 0.85
                    reason = "" if approve else rng.choice(_REASONS)
                    decision = {"decision": "approve" if approve else "reject", "reason": reason, "input": arguments}
                    outcome = "approved" if approve else "rejected"
                    yield event(
                        "approval_decided", rng.choice(reviewers), conversation_id, call, name, outcome, decision
                    )
                    if not approve:
                        continue
                failed = rng.random() < 0.05
                yield event(
                    "tool_call_executed",
                    agent,
                    conversation_id,
                    call,
                    name,
                    "failed" if failed else "succeeded",
                    {
                        "input": arguments,
                        "duration_ms": round(rng.uniform(1, 80), 1),
                        "result_chars": 200,
                        "attempt": 1,
                    },
                )
        yield model_call(conversation_id, "end_turn")


def tenant_for(slug: str | None) -> Tenant | None:
    """The tenant with this slug, or the first one when no slug is given."""
    query = select(Tenant).order_by(Tenant.id)
    return db.session.scalar(query.where(Tenant.slug == slug) if slug else query.limit(1))
