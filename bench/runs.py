"""What the benchmark's parts share to run conversations: queued conversations made in bulk, worker
subprocesses (`python -m bench.worker`) started and stopped, the workers' memory, and polling the
database without taking SQLite's write lock."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from itertools import count as counter
from pathlib import Path

import redis as redis_lib
from sqlalchemy import create_engine, func, select

from bench.common import ROOT

QUESTION = "Show invoices for customer 4471"  # the demo model: generate, lookup_invoices, generate
REFUND = "Please refund $60 on invoice 4471, the delivery was late"  # above $50: waits for a reviewer
_pool_ids = counter(1)


def new_conversations(app, count: int, question: str = QUESTION) -> list[tuple[int, int]]:
    """`count` queued conversations of agent@acme.test, committed, not enqueued: (id, version)."""
    from webapp.agent import moves
    from webapp.models import Conversation, User
    from webapp.runtime.extensions import db
    from webapp.runtime.services import services

    with app.app_context():
        agent = db.session.scalar(select(User).where(User.email == "agent@acme.test"))
        made = []
        for _ in range(count):
            conversation = Conversation(tenant_id=agent.tenant_id, user_id=agent.id, status="queued", move_budget=50)
            db.session.add(conversation)
            db.session.flush()
            services().loop(db.session, conversation).ask_later(question)
            made.append((conversation.id, moves.start_run(db.session, conversation)))
        db.session.commit()
        db.session.remove()
    return made


class Workers:
    """The worker subprocesses of one pool: their pids, and a check that none has died."""

    def __init__(self, procs: list[subprocess.Popen], log_path: Path) -> None:
        self.procs = procs
        self.log_path = log_path

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def errors(self) -> dict:
        """What went wrong in the workers' logs so far, counted: a figure that needed the sweeper
        or lost a live update must say so."""
        text = self.log_path.read_text(errors="replace")
        return {
            "redis_too_many_connections": text.count("Too many connections"),
            "moves_not_enqueued": text.count("the sweeper will"),
            "sweeper_re_enqueued": text.count("sweeper re-enqueued"),
            "jobs_failed": text.count("exception raised while executing"),
        }

    def check(self) -> None:
        """Raise if a worker exited: a run waiting on it would otherwise wait for ever."""
        dead = [(p.pid, p.returncode) for p in self.procs if p.poll() is not None]
        if dead:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"worker(s) exited (pid, code): {dead}; their log ends:\n{tail}")


@contextmanager
def worker_pool(
    env: dict, kind: str, workers: int, concurrency: int | None = None, extra_env: dict | None = None
) -> Iterator[Workers]:
    """`workers` subprocesses of `python -m bench.worker --class kind` (with `--concurrency` slots
    for the pool), registered and idle. `extra_env` reaches the workers only (e.g.
    DEMO_MODEL_REPLY_SECONDS). On exit, SIGTERM: the pool lets moves in flight finish."""
    from rq import Worker

    tag = f"bench-{next(_pool_ids)}-{kind}"
    names = [f"{tag}-{n}" for n in range(workers)]
    log_path = Path(env["INSTANCE_PATH"]) / f"{tag}.log"
    log = log_path.open("wb")
    command = [sys.executable, "-m", "bench.worker", "--class", kind]
    if kind in ("pool", "people") and concurrency:
        command += ["--concurrency", str(concurrency)]
    procs = [
        subprocess.Popen(
            [*command, "--name", name],
            cwd=ROOT,
            env={**os.environ, **env, **(extra_env or {})},
            stdout=log,
            stderr=log,
        )
        for name in names
    ]
    connection = redis_lib.Redis.from_url(env["REDIS_URL"])
    try:
        deadline = time.monotonic() + 180
        while not set(names) <= {w.name for w in Worker.all(connection=connection)}:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{kind} workers did not start:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.1)
        yield Workers(procs, log_path)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        connection.close()


def run_conversations(app, env: dict, count: int, timeout: float = 1800, workers: Workers | None = None) -> dict:
    """Start `count` conversations at once on the running pool; moves per second until the last ends."""
    from webapp.models import Conversation
    from webapp.runtime.services import services

    made = new_conversations(app, count)
    low, high = made[0][0], made[-1][0]
    mine = Conversation.id.between(low, high)
    engine = plain_engine(env)
    try:
        with app.app_context():
            dispatcher = services().dispatcher
            cpu_before = CpuUse.now(workers.pids if workers else [])
            started = datetime.now(UTC)
            for conversation_id, version in made:
                dispatcher.enqueue_move(conversation_id, version)
        deadline = time.monotonic() + timeout
        while True:
            settled = statuses(engine, mine)
            if settled.get("completed", 0) >= count:
                break
            stuck = {k: v for k, v in settled.items() if k in ("failed", "budget_exhausted", "cancelled")}
            if stuck:
                raise RuntimeError(f"conversations ended badly: {stuck}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out: {settled}")
            if workers is not None:
                workers.check()
            time.sleep(0.1)
        cpu = CpuUse.now(workers.pids if workers else []) - cpu_before
        with engine.connect() as connection:
            moves, finished = connection.execute(
                select(func.sum(Conversation.moves_used), func.max(Conversation.updated_at)).where(mine)
            ).one()
    finally:
        engine.dispose()
    if isinstance(finished, str):  # SQLite through a plain engine without the model's type
        finished = datetime.fromisoformat(finished)
    if finished.tzinfo is None:
        finished = finished.replace(tzinfo=UTC)
    seconds = (finished - started).total_seconds()
    total_ms = (cpu.workers + cpu.services) * 1000 / moves
    return {
        "conversations": count,
        "moves": int(moves),
        "seconds": round(seconds, 2),
        "moves_per_s": round(moves / seconds, 1),
        "worker_cpu_ms_per_move": round(cpu.workers * 1000 / moves, 2),
        "services_cpu_ms_per_move": round(cpu.services * 1000 / moves, 2),
        # What the machine's cores could do at that CPU cost per move: the bound on moves/s.
        "cpu_bound_moves_per_s": round((os.cpu_count() or 1) * 1000 / total_ms, 1),
    }


class CpuUse:
    """CPU seconds used so far (/proc/<pid>/stat) by the worker processes, and by the services they
    talk to (every postgres and redis-server process): what a move costs in CPU, all told.

    Kept per process, so a difference counts only what each process used in between: a database
    backend that ends in the meantime takes its ticks with it (counted as nothing, never as less
    than nothing), and one that starts in the meantime counts from zero."""

    TICK = os.sysconf("SC_CLK_TCK")
    SERVICES = ("postgres", "redis-server")

    def __init__(self, workers: dict[int, int], services: dict[int, int]) -> None:
        self._workers = workers
        self._services = services

    @classmethod
    def now(cls, pids: list[int]) -> CpuUse:
        workers = {pid: cls._ticks(pid)[1] for pid in pids}
        services = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) not in workers:
                name, ticks = cls._ticks(int(entry))
                if name in cls.SERVICES:
                    services[int(entry)] = ticks
        return cls(workers, services)

    @staticmethod
    def _ticks(pid: int) -> tuple[str, int]:
        """The process's name and its user + system CPU ticks (0 once it is gone)."""
        try:
            with open(f"/proc/{pid}/stat") as stat:
                text = stat.read()
        except (FileNotFoundError, ProcessLookupError):
            return "", 0
        name, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 1 :].split()
        return name, int(rest[11]) + int(rest[12])

    @property
    def workers(self) -> float:
        return sum(self._workers.values()) / self.TICK

    @property
    def services(self) -> float:
        return sum(self._services.values()) / self.TICK

    def __sub__(self, before: CpuUse) -> CpuUse:
        def used(after: dict[int, int], earlier: dict[int, int]) -> dict[int, int]:
            # A pid whose count went down was reused by a new process: it counts from zero.
            return {
                pid: ticks - earlier.get(pid, 0) if ticks >= earlier.get(pid, 0) else ticks
                for pid, ticks in after.items()
            }

        return CpuUse(used(self._workers, before._workers), used(self._services, before._services))


def statuses(engine, where) -> dict[str, int]:
    """How many of the selected conversations are in each status, read on a plain engine."""
    from webapp.models import Conversation

    with engine.connect() as connection:
        return dict(
            connection.execute(
                select(Conversation.status, func.count()).where(where).group_by(Conversation.status)
            ).all()
        )


def rss_bytes(pid: int) -> int:
    """The process's resident set (VmRSS in /proc/<pid>/status), in bytes; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def plain_engine(env: dict):
    """An engine for polling, without the app's BEGIN IMMEDIATE (a poll must not take SQLite's lock)."""
    return create_engine(env["DATABASE_URL"])


def until(engine, statement, target: int, timeout: float = 600, poll: float = 0.05, check=None) -> None:
    """Poll `statement` (a count) until it reaches `target`; `check()` (if given) raises to give up."""
    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as connection:
            if connection.scalar(statement) >= target:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {target}: {statement}")
        if check is not None:
            check()
        time.sleep(poll)
