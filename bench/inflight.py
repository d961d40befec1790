"""Conversations in flight: many conversations against a model that takes its time, on the app's own
pool workers.

measure_inflight(): N conversations committed, then enqueued at once, worked by P pool worker
processes of C slots each, the demo model taking L seconds per reply (DEMO_MODEL_REPLY_SECONDS,
streamed). It reports:

- done / L: from the first enqueue to the last conversation's end, in model replies (each
  conversation makes two model calls and one tool call, so 2 is the floor);
- the wait before the model sees a conversation's question: its first model call's start (the
  ModelCall row's created_at, written when the call ended, minus its latency_ms) minus the moment
  the conversation was enqueued (p50, p95);
- memory per conversation in flight: the workers' resident sets (VmRSS, /proc/<pid>/status) summed,
  at their highest while all N were in flight (from the first enqueue until the first conversation
  completes), minus the same processes' sum when idle just before (after a warm-up of a few
  conversations, so one-time costs such as building the SDK client are not charged to the N),
  divided by N.

Feeder: keeps a number of conversations in flight (ramped up, then one started for each that
completes), the background load of the approvals part.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from datetime import UTC, datetime

from sqlalchemy import func, select

from bench.common import percentile
from bench.runs import new_conversations, plain_engine, rss_bytes, run_conversations, statuses, worker_pool

MB = 1024 * 1024
ENDED_BADLY = ("failed", "budget_exhausted", "cancelled")


def parse_scenarios(text: str) -> list[dict]:
    """ "40:2.25:2:20,200:5:1:200" -> conversations, reply seconds, workers, slots per worker."""
    scenarios = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        fields = item.split(":")
        if len(fields) != 4:
            raise ValueError(f"{item!r}: expected conversations:reply_seconds:workers:slots, e.g. 40:2.25:2:20")
        count, reply, workers, slots = int(fields[0]), float(fields[1]), int(fields[2]), int(fields[3])
        if count < 1 or reply <= 0 or workers < 1 or slots < 1:
            raise ValueError(f"{item!r}: every figure must be positive")
        scenarios.append({"conversations": count, "reply_seconds": reply, "workers": workers, "slots": slots})
    return scenarios


def scenario_label(s: dict) -> str:
    return f"{s['conversations']} at L={s['reply_seconds']:g} s, {s['workers']} x {s['slots']} slots"


def _rss(pids: list[int]) -> int:
    return sum(rss_bytes(pid) for pid in pids)


def measure_inflight(
    app, env: dict, conversations: int, reply_seconds: float, workers: int, slots: int, timeout: float = 1800
) -> dict:
    from webapp.models import Conversation, ModelCall
    from webapp.runtime.extensions import db
    from webapp.runtime.services import services

    extra = {"DEMO_MODEL_REPLY_SECONDS": str(reply_seconds)}
    with worker_pool(env, "pool", workers, slots, extra) as pool:
        pids = pool.pids
        cold = _rss(pids)
        run_conversations(app, env, 2 * workers, timeout=60 + 20 * reply_seconds, workers=pool)  # warm-up
        idle_samples = []
        for _ in range(5):
            time.sleep(0.1)
            idle_samples.append(_rss(pids))
        idle = statistics.median(idle_samples)

        made = new_conversations(app, conversations)
        low, high = made[0][0], made[-1][0]
        mine = Conversation.id.between(low, high)
        samples: list[tuple[float, int]] = []
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(0.1):
                samples.append((time.monotonic(), _rss(pids)))

        sampler = threading.Thread(target=sample, name="rss-sampler", daemon=True)
        engine = plain_engine(env)
        enqueued: dict[int, datetime] = {}
        first_done = None
        peak_running = 0
        try:
            with app.app_context():
                dispatcher = services().dispatcher
                sampler.start()
                started = datetime.now(UTC)
                started_mono = time.monotonic()
                for conversation_id, version in made:
                    enqueued[conversation_id] = datetime.now(UTC)
                    dispatcher.enqueue_move(conversation_id, version)
            deadline = started_mono + timeout
            while True:
                settled = statuses(engine, mine)
                done = settled.get("completed", 0)
                if first_done is None:
                    peak_running = max(peak_running, settled.get("running", 0))
                    if done:
                        first_done = time.monotonic()
                if done >= conversations:
                    break
                bad = {k: v for k, v in settled.items() if k in ENDED_BADLY}
                if bad:
                    raise RuntimeError(f"conversations ended badly: {bad}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"timed out: {settled}")
                pool.check()
                time.sleep(0.1)
            errors = pool.errors()
        finally:
            sampling.set()
            if sampler.is_alive():
                sampler.join()
            engine.dispose()

    window = [rss for at, rss in samples if first_done is None or at <= first_done] or [rss for _, rss in samples]
    peak = max(window) if window else idle
    with app.app_context():
        finished, moves, recoveries = db.session.execute(
            select(
                func.max(Conversation.updated_at), func.sum(Conversation.moves_used), func.sum(Conversation.recoveries)
            ).where(mine)
        ).one()
        first_calls = select(func.min(ModelCall.id)).where(ModelCall.conversation_id.between(low, high))
        first_calls = first_calls.group_by(ModelCall.conversation_id)
        rows = db.session.execute(
            select(ModelCall.conversation_id, ModelCall.created_at, ModelCall.latency_ms).where(
                ModelCall.id.in_(first_calls)
            )
        ).all()
        db.session.remove()
    waits = [
        (created - enqueued[conversation_id]).total_seconds() - latency / 1000
        for conversation_id, created, latency in rows
    ]
    seconds = (finished - started).total_seconds()
    return {
        "conversations": conversations,
        "reply_seconds": reply_seconds,
        "workers": workers,
        "slots": slots,
        "moves": int(moves),
        "seconds": round(seconds, 2),
        "done_over_reply": round(seconds / reply_seconds, 2),
        "wait_for_model_p50_s": round(statistics.median(waits), 3),
        "wait_for_model_p95_s": round(percentile(waits, 95), 3),
        "wait_for_model_max_s": round(max(waits), 3),
        "peak_moves_running": peak_running,
        "rss_cold_mb": round(cold / MB, 1),
        "rss_idle_mb": round(idle / MB, 1),
        "rss_in_flight_mb": round(peak / MB, 1),
        "rss_samples_in_window": len(window),
        "mb_per_conversation": round((peak - idle) / MB / conversations, 3),
        "sweeper_recoveries": int(recoveries or 0),  # conversations the sweeper had to re-enqueue
        "worker_log": errors,
    }


class Feeder(threading.Thread):
    """Keeps `target` conversations in flight (started and not yet completed): ramps up over
    `ramp_seconds`, then starts one for each that completes. `in_flight` samples the count."""

    def __init__(self, app, env: dict, target: int, ramp_seconds: float, poll: float = 0.2) -> None:
        super().__init__(name="feeder", daemon=True)
        self.app, self.env, self.target, self.ramp_seconds, self.poll = app, env, target, ramp_seconds, poll
        self.active: set[int] = set()
        self.started_count = 0
        self.completed = 0
        self.error: BaseException | None = None
        self._stop_feeding = threading.Event()
        self._stopped = threading.Event()

    def run(self) -> None:
        from webapp.models import Conversation
        from webapp.runtime.services import services

        engine = plain_engine(self.env)
        began = time.monotonic()
        try:
            while not self._stopped.is_set():
                if self.active:
                    with engine.connect() as connection:
                        ended = connection.execute(
                            select(Conversation.id, Conversation.status).where(
                                Conversation.id.in_(self.active), Conversation.status.in_(("completed", *ENDED_BADLY))
                            )
                        ).all()
                    for conversation_id, status in ended:
                        if status != "completed":
                            raise RuntimeError(f"background conversation {conversation_id} ended {status}")
                        self.active.discard(conversation_id)
                        self.completed += 1
                if not self._stop_feeding.is_set():
                    ramp = (time.monotonic() - began) / self.ramp_seconds if self.ramp_seconds > 0 else 1
                    missing = min(self.target, math.ceil(self.target * ramp)) - len(self.active)
                    if missing > 0:
                        made = new_conversations(self.app, missing)
                        with self.app.app_context():
                            dispatcher = services().dispatcher
                            for conversation_id, version in made:
                                dispatcher.enqueue_move(conversation_id, version)
                        self.active.update(conversation_id for conversation_id, _ in made)
                        self.started_count += len(made)
                elif not self.active:
                    return
                self._stopped.wait(self.poll)
        except BaseException as error:  # the main thread reads it and fails the part
            self.error = error
        finally:
            engine.dispose()

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the background load failed: {self.error}") from self.error

    def drain(self, timeout: float, check=None) -> None:
        """Start no more; wait for those in flight to complete (`check()` raises to give up)."""
        self._stop_feeding.set()
        deadline = time.monotonic() + timeout
        try:
            while self.is_alive() and time.monotonic() < deadline:
                self.join(0.5)
                if check is not None:
                    check()
        finally:
            self._stopped.set()
        self.join(5)
        self.check()
        if self.active:
            raise RuntimeError(f"{len(self.active)} background conversations did not complete in {timeout:.0f} s")
