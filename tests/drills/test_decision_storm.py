"""Drill e: 200 concurrent decisions over real HTTP on 20 waiting calls, from two reviewers at once.

Four conversations ask for five sensitive calls each (refunds above $50 and emails need one approval;
closing an account needs two). Then 200 threads, released together, post decisions to the app served
by werkzeug's threaded server: ten per call, five from each reviewer, a few of them rejections. Each
call must be decided exactly once, each loser must hear a clear 409, nothing may answer 500, and the
approved calls must run exactly once in the workers while the storm goes on.
"""

from __future__ import annotations

import random
import threading
from collections import Counter, defaultdict

import pytest
from sqlalchemy import select

from tests.drills.support import (
    AGENT,
    REVIEWER,
    REVIEWER2,
    Http,
    ServedApp,
    add_drill_customers,
    calls_of,
    drill_seed,
    scripted_responder,
    side_effects_once,
)
from tests.integration.test_workers import assert_valid_transcript, wait_status
from tests.replies import text as text_block
from tests.replies import tool_use
from webapp.models import Decision, ToolCall, User, utcnow

pytestmark = [pytest.mark.slow, pytest.mark.drill]

CONVERSATIONS, PER_CALL = 4, 10


def five_sensitive(customer: int, turn: int) -> list[dict]:
    """Two refunds above $50, two emails, and closing the account (two approvals) for the first two
    customers or a third email for the others: five calls, one round."""
    if turn:
        return [text_block("All settled.")]
    first = 70000 + (customer - 6000) * 10
    email = {"customer_id": customer, "subject": "About your account", "body": "A note from support."}
    last = (
        tool_use("delete_account", {"customer_id": customer, "reason": "drill"})
        if customer < 6002
        else tool_use("send_email", {**email, "subject": "One more thing"})
    )
    return [
        tool_use("issue_refund", {"invoice_id": first, "amount_cents": 6000, "reason": "drill"}),
        tool_use("issue_refund", {"invoice_id": first + 1, "amount_cents": 6000, "reason": "drill"}),
        tool_use("send_email", email),
        tool_use("send_email", {**email, "subject": "Second note"}),
        last,
    ]


def test_two_hundred_concurrent_decisions_decide_each_call_once_and_losers_hear_409(
    app, api, pool, model, engine, read
):
    seed = drill_seed()
    customers = add_drill_customers(engine, CONVERSATIONS, invoices_each=2)
    model.responder = scripted_responder({"five": five_sensitive}, model.responder)
    since = utcnow()
    pool.start()
    pool.start()
    ids = [
        api.as_(AGENT).post("/api/conversations", json={"message": f"[[drill five {c.id}]]"}).json["id"]
        for c in customers
    ]
    calls = [c for cid in ids for c in wait_status(api, cid, "awaiting_approval", timeout=60)["tool_calls"]]
    assert len(calls) == 20 and {c["status"] for c in calls} == {"awaiting_approval"}

    served = ServedApp(app)
    try:
        clients = {email: Http(served.url, token=api.token(email)) for email in (REVIEWER, REVIEWER2)}
        rng = random.Random(seed)
        orders = []
        for index, call in enumerate(calls):
            for n in range(PER_CALL):
                reviewer = REVIEWER if n % 2 == 0 else REVIEWER2
                reject = reviewer == REVIEWER2 and index % 4 == 0  # some calls get a rejection in the race
                orders.append((call, reviewer, reject))
        rng.shuffle(orders)
        barrier = threading.Barrier(len(orders))
        answers: list[tuple[dict, str, int, dict]] = [None] * len(orders)

        def decide(slot: int) -> None:
            call, reviewer, reject = orders[slot]
            body = {"decision": "reject", "reason": "not today"} if reject else {"decision": "approve"}
            body["arguments_hash"] = call["arguments_hash"]
            barrier.wait(60)
            answer = clients[reviewer].post(f"/api/approvals/{call['id']}", json_body=body)
            answers[slot] = (call, reviewer, answer.status, answer.json if answer.body else {})

        threads = [threading.Thread(target=decide, args=(slot,)) for slot in range(len(orders))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert all(answers), f"{answers.count(None)} requests never answered (seed {seed})"
    finally:
        served.stop()

    statuses = Counter(status for _, _, status, _ in answers)
    assert set(statuses) <= {200, 409}, (
        f"answers {statuses} (seed {seed}): {[a for a in answers if a[2] not in (200, 409)][:3]}"
    )
    for _, _, status, body in answers:
        if status == 409:
            assert body["error"] == "already_decided" and body["message"], body

    users = {
        email: read(lambda s, e=email: s.scalar(select(User.id).where(User.email == e)))
        for email in (REVIEWER, REVIEWER2)
    }
    wins = defaultdict(list)
    for call, reviewer, status, _ in answers:
        if status == 200:
            wins[call["id"]].append(reviewer)
    for call in calls:
        rows = read(lambda s, cid=call["id"]: s.scalars(select(Decision).where(Decision.tool_call_id == cid)).all())
        by = sorted(r.reviewer_id for r in rows)
        status = read(lambda s, cid=call["id"]: s.get(ToolCall, cid).status)
        assert status != "awaiting_approval", (
            f"call {call['id']} ({call['name']}) still waits after the storm, with decisions "
            f"{[(r.reviewer_id, r.decision) for r in rows]} (seed {seed})"
        )
        assert len(by) == len(set(by)), f"call {call['id']}: one reviewer decided twice (seed {seed})"
        assert sorted(users[r] for r in wins[call["id"]]) == by, f"call {call['id']}: 200s vs decisions (seed {seed})"
        if call["name"] == "delete_account":  # two approvals, or one rejection
            assert len(rows) in (1, 2), f"call {call['id']}: {len(rows)} decisions (seed {seed})"
        else:
            assert len(rows) == 1, f"call {call['id']} was decided {len(rows)} times (seed {seed})"

    for cid in ids:
        done = wait_status(api, cid, "completed", timeout=90)
        assert_valid_transcript(done)
        settled = read(lambda s, cid=cid: calls_of(s, cid))
        assert {c.status for c in settled} <= {"succeeded", "rejected", "failed"}, [(c.id, c.status) for c in settled]
        for c in settled:  # calls run in the order they are approved: a refund approved after its
            if c.status == "failed":  # account was closed is refused by the tool, in words
                assert c.name == "issue_refund" and "belongs to closed account" in c.result, (c.id, c.result)
        problems = read(lambda s, settled=settled: side_effects_once(s, settled, since))
        assert not problems, f"conversation {cid} (seed {seed}): {problems}"
