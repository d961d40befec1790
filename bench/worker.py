"""A bench-only worker entry point that runs the moves queue with the worker class you name, so the
benchmark can compare them.

    .venv/bin/python -m bench.worker --class pool|simple|fork|spawn [--concurrency C] [--burst] [--name NAME]

- pool:   the app's own worker (webapp.runtime.worker.PoolWorker through run_worker, exactly what
          `flask --app webapp worker --concurrency C` runs): C slots, each a thread running one move.
- simple: rq.SimpleWorker, the app's choice before the pool: one job at a time in the worker process.
- fork:   rq.Worker: every job runs in a child forked from the worker (os.fork per job). The parent
          imports the job code and warms the SDK (two model calls to the in-process demo model) so
          each child inherits them, and each child drops the inherited database pool (connections
          must not cross a fork). SQLAlchemy's statement cache still starts empty in every child.
- spawn:  rq.SpawnWorker: every job runs in a new interpreter (os.posix_spawn per job), which must
          import the app and build it before the move can run.

The others run like the app's worker did before the pool: inside the app context, with RQ's scheduler
and the sweep ticker, on the moves queue only. All of them stop as the app's worker does (PromptWorker's
unsubscribe): with redis-py 8.2, RQ's own stop can wait a minute on its command channel.
"""

from __future__ import annotations

import argparse
import threading

from rq import SpawnWorker, Worker

from webapp.runtime.worker import PromptWorker

_spawned_app = None


class ForkWorker(Worker):
    """rq.Worker, with the inherited SQLAlchemy pool dropped in each forked child."""

    unsubscribe = PromptWorker.unsubscribe

    def main_work_horse(self, job, queue):
        from webapp.runtime.extensions import db

        db.engine.dispose(close=False)  # the parent's connections stay the parent's
        return super().main_work_horse(job, queue)


class AppSpawnWorker(SpawnWorker):
    """rq.SpawnWorker whose horse (a fresh interpreter) builds the app and enters its context."""

    unsubscribe = PromptWorker.unsubscribe

    def main_work_horse(self, job, queue):
        global _spawned_app
        if _spawned_app is None:
            from webapp import create_app

            _spawned_app = create_app()
            _spawned_app.app_context().push()
        return super().main_work_horse(job, queue)


CLASSES = {"simple": PromptWorker, "fork": ForkWorker, "spawn": AppSpawnWorker}
KINDS = ("pool", "people", *CLASSES)  # people: a PoolWorker of the people queue alone (worker --people-only)
LABELS = {
    "pool": "PoolWorker",
    "people": "PoolWorker --people-only",
    "simple": "rq.SimpleWorker",
    "fork": "rq.Worker",
    "spawn": "rq.SpawnWorker",
}


def label(kind: str, concurrency: int | None = None) -> str:
    """The class as the tables show it: the pool with its slots per process."""
    if kind == "pool" and concurrency:
        return f"{LABELS[kind]} x{concurrency} slots"
    return LABELS[kind]


def warm_up(client, tools: list[dict]) -> None:
    """Two model calls through the SDK (a tool call and a text answer) in the parent, so forked
    children inherit the SDK's built pydantic schemas instead of each building them (~0.3 s)."""
    system = [{"type": "text", "text": "warm-up"}]
    client.generate(system=system, tools=tools, messages=[{"role": "user", "content": "Look up customer 4471"}])
    client.generate(system=system, tools=tools, messages=[{"role": "user", "content": "Hello"}])


def run(kind: str, burst: bool = False, name: str | None = None, concurrency: int | None = None) -> bool:
    from webapp import create_app
    from webapp.llm.choice import model_client
    from webapp.runtime.services import services
    from webapp.runtime.worker import run_worker, start_sweep_ticker

    app = create_app()
    if kind in ("pool", "people"):
        return run_worker(app, burst=burst, name=name, concurrency=concurrency, people_only=kind == "people")
    with app.app_context():
        desk = services()
        import jobs.moves  # noqa: F401  (imported once here, inherited by forked children)

        if kind == "fork":
            warm_up(model_client(desk.config), desk.tools.definitions())
        worker = CLASSES[kind](desk.dispatcher.move_queues, connection=desk.dispatcher.redis, name=name)
        stop = threading.Event()
        if not burst:
            start_sweep_ticker(app, stop)
        try:
            return worker.work(burst=burst, with_scheduler=True, logging_level="WARNING")
        finally:
            stop.set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--class", dest="kind", choices=KINDS, default="pool")
    parser.add_argument("--concurrency", type=int, default=None, help="pool: slots (default WORKER_CONCURRENCY)")
    parser.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    parser.add_argument("--name", default=None, help="worker name (default: RQ's)")
    args = parser.parse_args()
    if args.concurrency is not None and args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    run(args.kind, burst=args.burst, name=args.name, concurrency=args.concurrency)


if __name__ == "__main__":
    # Run from the imported module, not __main__: SpawnWorker's horse must import the worker class.
    from bench.worker import main as imported_main

    imported_main()
