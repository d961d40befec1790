"""Drill a: workers SIGKILLed at random points of conversations with three sensitive and two safe calls.

How the 50 are made, honestly: there are 50 kills, each with its own seed (all printed on failure;
DRILL_SEED replays a run). Kill k comes a seeded 0.1-0.9 s after the previous one and SIGKILLs a seeded
choice of the two workers, and a replacement is forked at once; conversation k starts right after
kill k. So 50 conversations run staggered, several at a time, and each lives through several kills
that find it wherever it happens to be: streaming a model reply, inside a tool, between the two
commits, parked, or waiting in the queue. Which point each kill hits is not chosen; over 50 kills and
some 600 moves every kind of point comes up, and each kill's victim and moment follow from its seed.
The last worker started is a fresh one: it and its sweeper must finish every conversation.
"""

from __future__ import annotations

import random
import time

import pytest
import redis as redis_lib
from rq.exceptions import NoSuchJobError
from rq.job import Job
from sqlalchemy import func, select

from demo.billing.models import Customer, OutgoingEmail, Refund
from tests.drills.support import (
    AGENT,
    REVIEWER,
    REVIEWER2,
    add_drill_customers,
    calls_of,
    drill_seed,
    five_calls,
    scripted_responder,
    side_effects_once,
)
from tests.integration.test_workers import assert_valid_transcript
from webapp.models import Conversation, utcnow
from webapp.runtime.queue import move_job_id

pytestmark = [pytest.mark.slow, pytest.mark.drill]

KILLS = 50


def job_states(env, conversation) -> dict:
    """The RQ jobs of the conversation's current move, for a failure message."""
    connection = redis_lib.Redis.from_url(env["REDIS_URL"])
    states = {}
    for recovery in range(conversation.recoveries + 1):
        job_id = move_job_id(conversation.id, conversation.version, recovery)
        try:
            job = Job.fetch(job_id, connection=connection)
        except NoSuchJobError:
            states[job_id] = "none"
            continue
        states[job_id] = f"{job.get_status()} on {job.worker_name}"
    return states


def approve_pending(api) -> None:
    """Every waiting call approved: one reviewer for refunds and emails, both for closing an account."""
    pending = api.as_(REVIEWER).get("/api/approvals").json["approvals"]
    for call in pending:
        for reviewer in (REVIEWER, REVIEWER2) if call["name"] == "delete_account" else (REVIEWER,):
            answer = api.as_(reviewer).post(
                f"/api/approvals/{call['id']}", json={"decision": "approve", "arguments_hash": call["arguments_hash"]}
            )
            assert answer.status_code in (200, 409), answer.json  # 409: decided a moment ago, never a 500


def test_fifty_seeded_worker_kills_never_run_a_tool_twice_nor_lose_a_result(api, pool, model, engine, read, env):
    base = drill_seed() * 1000
    customers = add_drill_customers(engine, KILLS)
    model.responder = scripted_responder({"five": five_calls}, model.responder)
    model.set_chunk_delay(0.01)  # a model reply takes a moment: kills land mid-stream too
    since = utcnow()
    pool.start()
    pool.start()

    seeds: dict[int, int] = {}  # conversation id -> the seed of the kill just before it started
    log: list[str] = []
    next_kill = started = time.monotonic()
    for k in range(KILLS):
        while time.monotonic() < next_kill:
            approve_pending(api)
            time.sleep(0.05)
        seed = base + k
        rng = random.Random(seed)
        alive = sorted(pool.alive())
        assert alive, f"no worker alive before kill {k} (seed {seed}):\n{pool.logs()}"
        victim = rng.choice(alive)
        pool.kill(victim)
        pool.start(wait=False)
        answer = api.as_(AGENT).post("/api/conversations", json={"message": f"[[drill five {customers[k].id}]]"})
        assert answer.status_code == 201, answer.json
        seeds[answer.json["id"]] = seed
        log.append(f"seed {seed}: killed {victim}, started conversation {answer.json['id']}")
        next_kill = time.monotonic() + rng.uniform(0.1, 0.9)

    kills_done = time.monotonic()
    pool.start()  # a fresh worker (and its sweeper) for whatever the dead ones held
    where = f"kills: {'; '.join(log)}"

    deadline = time.monotonic() + 150
    while True:
        approve_pending(api)
        rows = read(lambda s: s.scalars(select(Conversation).where(Conversation.id.in_(seeds))).all())
        stuck = {c.id: c.status for c in rows if c.status in ("failed", "budget_exhausted")}
        assert not stuck, f"conversations ended badly: {stuck} (seeds {[seeds[c] for c in stuck]}); {where}"
        waiting = [c for c in rows if c.status != "completed"]
        if not waiting:
            break
        if time.monotonic() > deadline:
            details = [
                f"{c.id} (seed {seeds[c.id]}): {c.status} v{c.version} lease={c.lease_owner} "
                f"until {c.lease_expires_at} updated {c.updated_at} recoveries={c.recoveries} "
                f"jobs {job_states(env, c)}"
                for c in waiting
            ]
            pytest.fail(f"not completed in time: {details}; now {utcnow()}; {where}")
        time.sleep(0.3)

    print(f"kills took {kills_done - started:.1f} s, completion {time.monotonic() - kills_done:.1f} s")
    for cid, seed in seeds.items():
        state = api.as_(AGENT).get(f"/api/conversations/{cid}").json
        try:
            assert_valid_transcript(state)
        except AssertionError as error:
            raise AssertionError(f"conversation {cid} (seed {seed}): {error}") from error
        calls = read(lambda s, cid=cid: calls_of(s, cid))
        assert sorted(c.name for c in calls) == sorted(
            ["lookup_customer", "lookup_invoices", "issue_refund", "send_email", "delete_account"]
        ), f"conversation {cid} (seed {seed})"
        assert {c.status for c in calls} == {"succeeded"}, (
            f"conversation {cid} (seed {seed}): {[c.result for c in calls]}"
        )
        problems = read(lambda s, calls=calls: side_effects_once(s, calls, since))
        assert not problems, f"conversation {cid} (seed {seed}): {problems}"

    assert read(lambda s: s.scalar(select(func.count(Refund.id)))) == KILLS
    assert read(lambda s: s.scalar(select(func.count(OutgoingEmail.id)))) == KILLS
    closed = read(
        lambda s: s.scalar(
            select(func.count(Customer.id)).where(
                Customer.id.in_([c.id for c in customers]), Customer.status == "closed"
            )
        )
    )
    assert closed == KILLS
