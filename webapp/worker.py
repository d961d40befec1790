"""Running RQ workers inside the app: the app context around every job, and a sweep ticker."""

from __future__ import annotations

import threading
import time

from flask import Flask
from rq import SimpleWorker

from webapp.services import services


def start_sweep_ticker(app: Flask, stop: threading.Event) -> threading.Thread:
    """Every sweep interval, enqueue one sweep job for the whole fleet (its id is unique per interval)."""
    desk = services()
    interval = desk.config.sweep_interval_seconds

    def tick() -> None:
        while not stop.is_set():
            try:
                desk.dispatcher.enqueue_sweep(int(time.time() // interval))
            except Exception:  # Redis down: the next tick tries again
                app.logger.warning("could not enqueue the sweeper; retrying next interval")
            stop.wait(interval)

    thread = threading.Thread(target=tick, name="sweep-ticker", daemon=True)
    thread.start()
    return thread


def run_worker(app: Flask, burst: bool = False, name: str | None = None) -> bool:
    """Work the moves queue until stopped (or until empty with burst); returns whether any job ran."""
    with app.app_context():
        desk = services()
        # SimpleWorker runs jobs in this process: no fork per job, so the engine's connection pool
        # stays valid and a move costs no process start (figures in docs/performance.md).
        worker = SimpleWorker([desk.dispatcher.queue], connection=desk.dispatcher.redis, name=name)
        stop = threading.Event()
        if not burst:
            start_sweep_ticker(app, stop)
        try:
            return worker.work(burst=burst, with_scheduler=True, logging_level="WARNING")
        finally:
            stop.set()
