"""Bulk runs, by batch and one by one: the same items (half look-ups, half refunds above $50 that wait
for a reviewer) run twice on a pool of worker subprocesses and the offline demo model, once with
every model move through the Message Batches API and once streamed; the refunds are decided in
groups from the inbox (GET /approvals?run=<id>&group=1, then POST /approvals/bulk, a group at a
time), as a reviewer facing a run's calls would.

Reported per way: how long the run took to settle (the demo's batches answer after 2 s, polled every
BATCH_POLL_SECONDS = 1), its model calls and how many went by batch or through POST /v1/messages
(each call through /v1/messages records a model call without a batch), the batches sent, the
bulk decisions, the tokens, and what the run cost: at the batch price, and at the list price (the
same calls made one by one: exactly twice). The batch run's cost over the streamed run's is the
figure the issue asks for; it strays from one half as far as the two runs' tokens differ (the demo
model's prompt cache is each worker process's own, so which process answers what moves its reads
and writes)."""

from __future__ import annotations

import re
import time
from decimal import Decimal
from html import unescape

from sqlalchemy import func, select

from bench.common import signed_in
from bench.runs import QUESTION, REFUND, plain_engine, worker_pool

POLL_SECONDS = "1"
MICRO = Decimal("0.000001")


def items(count: int) -> list[str]:
    return [REFUND if n % 2 else QUESTION for n in range(count)]


def measure_runs(app, env: dict, count: int, workers: int, slots: int, timeout: float = 1800) -> list[dict]:
    """The same run by batch and one by one (see the module docstring); a row each."""
    rows = []
    for batch in (False, True):
        with worker_pool(env, "pool", workers, slots, extra_env={"BATCH_POLL_SECONDS": POLL_SECONDS}) as pool:
            rows.append(_one_run(app, env, count, batch, pool.check, timeout))
    interactive, batched = rows
    streamed = float(interactive["cost_usd"])
    batched["cost_over_interactive_run"] = round(float(batched["cost_usd"]) / streamed, 3) if streamed else None
    return rows


def _one_run(app, env: dict, count: int, batch: bool, check, timeout: float) -> dict:
    from webapp.models import Conversation, ModelCall, Run, User
    from webapp.runs import actions as runs
    from webapp.runtime.extensions import db

    started = time.monotonic()
    with app.app_context():
        agent = db.session.scalar(select(User).where(User.email == "agent@acme.test"))
        run_id = runs.create(db.session, agent, items(count), batch=batch, title="bench").id
        db.session.remove()
    engine = plain_engine(env)
    of_run = Conversation.run_id == run_id
    moving = of_run & Conversation.status.in_(("queued", "running", "awaiting_task", "awaiting_batch"))
    decided = groups = 0
    reviewer, _ = signed_in(app, "reviewer@acme.test")
    try:
        deadline = time.monotonic() + timeout
        while True:
            with engine.connect() as connection:
                conversations = connection.scalar(select(func.count()).where(of_run))
                still = connection.scalar(select(func.count()).where(moving))
                waiting = connection.scalar(
                    select(func.count()).where(of_run & (Conversation.status == "awaiting_approval"))
                )
            if conversations == count and not still:
                if not waiting:
                    break
                made, group_count = _decide_in_groups(reviewer, run_id)
                decided, groups = decided + made, groups + group_count
            if time.monotonic() > deadline:
                raise RuntimeError(f"the run did not settle in {timeout:g} s")
            check()
            time.sleep(0.2)
        seconds = time.monotonic() - started
        with app.app_context():
            run = db.session.get(Run, run_id)
            figures = runs.figures(db.session, run)
            calls = db.session.execute(
                select(
                    func.count(ModelCall.id),
                    func.count(ModelCall.batch_id),
                    func.count(ModelCall.batch_id.distinct()),
                    func.sum(ModelCall.input_tokens),
                    func.sum(ModelCall.cache_creation_input_tokens),
                    func.sum(ModelCall.cache_read_input_tokens),
                    func.sum(ModelCall.output_tokens),
                )
                .join(Conversation, Conversation.id == ModelCall.conversation_id)
                .where(of_run)
            ).one()
            db.session.remove()
    finally:
        engine.dispose()
    return {
        "way": "by batch" if batch else "one by one",
        "items": count,
        "settled_s": round(seconds, 1),
        "completed": figures.counts["completed"],
        "failed": figures.counts["failed"],
        "model_calls": calls[0],
        "by_batch": calls[1],
        "through_messages": calls[0] - calls[1],
        "batches": calls[2],
        "decided_in_groups": decided,
        "group_decisions": groups,
        # the tokens, as the demo model's prompt cache split them (its cache is each worker process's own)
        "input_tokens": calls[3],
        "cache_write_tokens": calls[4],
        "cache_read_tokens": calls[5],
        "output_tokens": calls[6],
        "cost_usd": str(figures.cost.quantize(MICRO)),
        "cost_at_list_usd": str(figures.cost_interactive.quantize(MICRO)),
    }


def _decide_in_groups(reviewer, run_id: int) -> tuple[int, int]:
    """Approve the run's waiting calls from the inbox, one bulk decision per group of tool and policy
    on the page (200 calls a page); returns (calls approved, bulk decisions made)."""
    url = f"/approvals?run={run_id}&group=1"
    page = unescape(reviewer.get(url).get_data(as_text=True))
    token = re.search(r'<form[^>]*id="bulk-form".*?name="csrf_token" value="([^"]+)"', page, re.S).group(1)
    by_group: dict[str, list[str]] = {}
    for group, value in re.findall(r'name="call" value="([^"]+)" data-group="([^"]*)"', page):
        by_group.setdefault(value, []).append(group)
    approved = 0
    for picks in by_group.values():
        answer = reviewer.post(
            "/approvals/bulk", data={"csrf_token": token, "decision": "approve", "call": picks, "back": url}
        )
        if answer.status_code != 303:
            raise RuntimeError(f"a bulk decision answered {answer.status_code}")
        approved += len(picks)
    return approved, len(by_group)
