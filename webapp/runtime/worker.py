"""Running RQ workers inside the app: the app context around every job, and a sweep ticker."""

from __future__ import annotations

import threading
import time

import redis
from flask import Flask
from rq import SimpleWorker

from webapp import logs
from webapp.runtime.services import services


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
    """Work the moves queue, then tools' background jobs, until stopped (or until both are empty with
    burst); returns whether any job ran."""
    with app.app_context():
        logs.configure(app)  # JSON lines; RQ's own loggers then write through it too
        desk = services()
        # SimpleWorker runs jobs in this process: no fork per job, so the engine's connection pool
        # stays valid and a move costs no process start (figures in the README, "Performance").
        queues = [desk.dispatcher.queue, desk.dispatcher.background_queue]  # moves first, always
        worker = SimpleWorker(queues, connection=desk.dispatcher.redis, name=name)
        stop = threading.Event()
        if not burst:
            start_sweep_ticker(app, stop)
        try:
            while True:
                try:
                    return worker.work(burst=burst, with_scheduler=True, logging_level="WARNING")
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    # RQ quits when Redis vanishes around a job (it cannot record the job's end). The
                    # database holds the state: wait for Redis and work on as a fresh worker.
                    app.logger.warning("lost Redis (%s); working again once it answers", exc)
                    time.sleep(2)
                    worker = SimpleWorker(queues, connection=desk.dispatcher.redis)
        finally:
            stop.set()
