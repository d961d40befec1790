"""Approval to resume: a refund above $50 waits for a reviewer; the approval is POSTed to
/api/approvals/<id>, and the database's timestamps say when the tool move started and ended and when
the next model move (the answer) ended.

- measure_approvals(): with the workers idle (the zero-latency demo model);
- measure_approvals_in_flight(): the same while other conversations keep the same pool workers busy
  (a Feeder keeps them in flight), the model taking L seconds per reply for everyone, the approved
  conversation included. The next model move then lasts at least L, so the desk's share is reported
  too: "next model move ends" minus that move's model call (its ModelCall.latency_ms), that is the
  decision's commit, the enqueues, the wait for a slot, the tool move, and the model move's own
  claim, transcript, audit and commits.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from datetime import UTC, datetime

from sqlalchemy import func, select

from bench.common import signed_in, stats
from bench.inflight import Feeder
from bench.runs import REFUND, plain_engine, until, worker_pool

POST = "POST /api/approvals/<id> (approve)"
TO_START = "decision posted → tool move starts"
TO_END = "decision posted → tool move ends"
TO_ANSWER = "decision posted → next model move ends"
MODEL = "the model call within that move"
DESK_SHARE = "decision posted → next model move ends, minus its model call (the desk's share)"
FIRST_WORDS = "new message posted → its answer's first words on the live channel"
MEASURES = (POST, TO_START, TO_END, TO_ANSWER, MODEL, DESK_SHARE, FIRST_WORDS)
FOLLOW_UP = "Thank you, that is all."  # the demo model answers in words, no tool


def start_refunds(app, count: int) -> list[int]:
    """`count` refund conversations started as agent@acme.test would (committed, then enqueued)."""
    from webapp.conversations import actions as conversations
    from webapp.models import User
    from webapp.runtime.extensions import db

    with app.app_context():
        agent = db.session.scalar(select(User).where(User.email == "agent@acme.test"))
        ids = [conversations.start(db.session, agent, REFUND).id for _ in range(count)]
        db.session.remove()
    return ids


def wait_until_parked(env: dict, ids: list[int], timeout: float = 600, check=None) -> None:
    from webapp.models import Conversation, ToolCall

    engine = plain_engine(env)
    try:
        waiting = ToolCall.conversation_id.in_(ids) & (ToolCall.status == "awaiting_approval")
        until(engine, select(func.count()).where(waiting), len(ids), timeout=timeout, check=check)
        parked = Conversation.id.in_(ids) & (Conversation.status == "awaiting_approval")
        until(engine, select(func.count()).where(parked), len(ids), timeout=timeout, check=check)  # once parked
    finally:
        engine.dispose()


def approve_one_at_a_time(app, env: dict, ids: list[int], check=None, between=None, timeout: float = 120) -> dict:
    """Approve each waiting call through the API, waiting for its conversation to complete; then
    its agent sends a new message and the time to the answer's first streamed words is taken as a
    live page would see them (the conversation's Redis channel), and the conversation completes again
    before the next decision. Then the resume's timestamps are read. `between()` runs before each
    decision, `check()` while waiting (it raises to give up)."""
    from webapp.models import Conversation, ModelCall, ToolCall
    from webapp.runtime.extensions import db
    from webapp.runtime.services import services

    client, bearer = signed_in(app, "reviewer@acme.test")
    agent, agent_bearer = signed_in(app, "agent@acme.test")
    with app.app_context():
        live = services().live_events
        channels = {conversation_id: live.conversation_channel(conversation_id) for conversation_id in ids}
        redis = live.redis
    first_words_ms = []
    answers: dict[int, int] = {}
    engine = plain_engine(env)
    try:
        with engine.connect() as connection:
            calls = connection.execute(
                select(ToolCall.id, ToolCall.conversation_id).where(ToolCall.conversation_id.in_(ids))
            ).all()
        posted: dict[int, datetime] = {}
        post_ms = []
        for call_id, conversation_id in calls:
            if between is not None:
                between()
            posted[call_id] = datetime.now(UTC)
            started = time.perf_counter()
            response = client.post(f"/api/approvals/{call_id}", json={"decision": "approve"}, headers=bearer)
            post_ms.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                raise RuntimeError(f"approval {call_id}: {response.status_code} {response.get_data(as_text=True)}")
            done = select(func.count()).where(Conversation.id == conversation_id, Conversation.status == "completed")
            until(engine, done, 1, timeout=timeout, poll=0.01, check=check)
            with engine.connect() as connection:  # the answer that followed the decision (not the next one's)
                answers[call_id] = connection.scalar(
                    select(func.max(ModelCall.id)).where(ModelCall.conversation_id == conversation_id)
                )
            listening = redis.pubsub(ignore_subscribe_messages=True)
            listening.subscribe(channels[conversation_id])
            try:
                listening.get_message(timeout=1)  # the subscription confirmed before the message goes
                sent = time.perf_counter()
                response = agent.post(
                    f"/api/conversations/{conversation_id}/messages", json={"message": FOLLOW_UP}, headers=agent_bearer
                )
                if response.status_code not in (200, 201, 202):
                    raise RuntimeError(f"message to {conversation_id}: {response.status_code} {response.text}")
                first_words_ms.append(_first_words(listening, sent, timeout, check))
            finally:
                listening.close()
            until(engine, done, 1, timeout=timeout, poll=0.01, check=check)
    finally:
        engine.dispose()
    found: dict[str, list[float]] = {m: [] for m in MEASURES}
    found[POST] = post_ms
    found[FIRST_WORDS] = first_words_ms
    with app.app_context():
        for call_id, _ in calls:
            call = db.session.get(ToolCall, call_id)
            answer = db.session.get(ModelCall, answers[call_id])
            t0 = posted[call_id]
            to_answer = (answer.created_at - t0).total_seconds() * 1000
            found[TO_START].append((call.started_at - t0).total_seconds() * 1000)
            found[TO_END].append((call.finished_at - t0).total_seconds() * 1000)
            found[TO_ANSWER].append(to_answer)
            found[MODEL].append(answer.latency_ms)
            found[DESK_SHARE].append(to_answer - answer.latency_ms)
        db.session.remove()
    return {measure: stats(values, 1) for measure, values in found.items()}


def _cpu_ticks() -> tuple[int, int]:
    """The machine's CPU time so far, (busy, all), in ticks of /proc/stat (every core together)."""
    with open("/proc/stat") as stat:
        ticks = [int(x) for x in stat.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle and iowait
    return sum(ticks) - idle, sum(ticks)


def _first_words(listening, sent: float, timeout: float, check=None) -> float:
    """Milliseconds from `sent` to the first streamed words on the subscribed channel."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        event = listening.get_message(timeout=0.5)
        if event is not None and json.loads(event["data"]).get("type") == "text":
            return (time.perf_counter() - sent) * 1000
        if check is not None:
            check()
    raise RuntimeError("no streamed words came for the new message")


def measure_approvals(app, env: dict, decisions: int, check=None) -> dict:
    """With the worker idle: approve waiting refunds one at a time through the API; time the resume.
    `check()` raises if the workers died."""
    ids = start_refunds(app, decisions)
    wait_until_parked(env, ids, check=check)
    return approve_one_at_a_time(app, env, ids, check)


def parse_loads(text: str) -> list[dict]:
    """ "100:5:2:120,200:5:2:120" -> one load each (parse_load); "0" -> none."""
    if text.strip() in ("", "0"):
        return []
    return [parse_load(part) for part in text.split(",")]


def parse_load(text: str) -> dict:
    """ "200:5:2:120" -> conversations in flight, reply seconds, workers, slots; a fifth figure,
    "200:5:2:120:1", adds that many people-only workers (`flask worker --people-only`, 10 slots)."""
    fields = text.strip().split(":")
    if len(fields) not in (4, 5):
        raise ValueError(f"{text!r}: expected in_flight:reply_seconds:workers:slots[:people_workers], e.g. 200:5:2:120")
    load = {"in_flight": int(fields[0]), "reply_seconds": float(fields[1]), "workers": int(fields[2])}
    load["slots"] = int(fields[3])
    if len(fields) == 5:
        load["people_workers"] = int(fields[4])
    if load["in_flight"] < 1 or load["reply_seconds"] <= 0 or load["workers"] < 1 or load["slots"] < 1:
        raise ValueError(f"{text!r}: every figure must be positive")
    return load


def measure_approvals_in_flight(
    app,
    env: dict,
    decisions: int,
    in_flight: int,
    reply_seconds: float,
    workers: int,
    slots: int,
    people_workers: int = 0,
) -> dict:
    """As measure_approvals, while `in_flight` other conversations (model replies of `reply_seconds`)
    keep the same `workers` pool processes of `slots` slots busy (beside `people_workers` processes
    that take only people's moves)."""
    extra = {"DEMO_MODEL_REPLY_SECONDS": str(reply_seconds)}
    people = worker_pool(env, "people", people_workers, 10, extra) if people_workers else contextlib.nullcontext()
    with worker_pool(env, "pool", workers, slots, extra) as pool, people:
        ids = start_refunds(app, decisions)
        wait_until_parked(env, ids, timeout=120 + 10 * reply_seconds, check=pool.check)
        feeder = Feeder(app, env, in_flight, ramp_seconds=2 * reply_seconds)
        feeder.start()
        counts: list[int] = []
        try:
            # Ramp up over two replies (so the background does not move in lockstep), then settle.
            deadline = time.monotonic() + 3 * reply_seconds
            while time.monotonic() < deadline:
                feeder.check()
                pool.check()
                time.sleep(0.2)

            def check() -> None:
                feeder.check()
                pool.check()

            def between() -> None:
                counts.append(len(feeder.active))

            before = _cpu_ticks()
            measures = approve_one_at_a_time(app, env, ids, check, between, timeout=120 + 10 * reply_seconds)
            busy, total = (after - then for after, then in zip(_cpu_ticks(), before, strict=True))
            counts.append(len(feeder.active))
        finally:
            feeder.drain(timeout=300 + 10 * reply_seconds, check=pool.check)
        errors = pool.errors()
    return {
        "settings": {
            "in_flight": in_flight,
            "reply_seconds": reply_seconds,
            "workers": workers,
            "slots": slots,
            "people_workers": people_workers,
            "in_flight_at_decisions_min": min(counts),
            "in_flight_at_decisions_median": statistics.median(counts),
            "background_completed": feeder.completed,
            "cpu_busy_share": round(busy / total, 3) if total else None,
            "worker_log": errors,
        },
        "measures": measures,
    }
