"""Running the desk: `flask worker`, `flask desk scheduler`, `flask desk redis start|stop` (the
embedded Redis of a checkout) and `flask sweep`. Their names and arguments are a contract."""

from __future__ import annotations

import click
from flask import Flask, current_app
from flask.cli import AppGroup, with_appcontext

from webapp.runtime import embedded_redis
from webapp.runtime.queue import SWEEP_JOB
from webapp.tools.presenting import plural


@click.command("worker")
@click.option("--burst", is_flag=True, help="Exit when the queue is empty.")
@click.option("--name", default=None, help="Worker name (default: RQ's).")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1, max=2000),
    default=None,
    help="Jobs run at once, each in a slot of its own (default: WORKER_CONCURRENCY, 20).",
)
@click.option(
    "--people-only",
    is_flag=True,
    help="Take only the moves that follow a person's act (a process of its own beside the pool workers).",
)
@with_appcontext
def worker_command(burst, name, concurrency, people_only) -> None:
    """Run a worker: moves, retries and the periodic sweeper, several moves at once."""
    from webapp.runtime.worker import run_worker

    app = current_app._get_current_object()  # the slots push contexts of their own app
    run_worker(app, burst=burst, name=name, concurrency=concurrency, people_only=people_only)


@click.command("scheduler")
@click.option("--once", is_flag=True, help="Enqueue the retries that are due and one sweep, then exit.")
@with_appcontext
def scheduler_command(once: bool) -> None:
    """Run RQ's scheduler for the move queues (retries after their backoff) and the sweep ticker,
    without working jobs. One per fleet is enough; more are harmless (RQ's scheduler takes a lock,
    the sweep job's id is unique per interval)."""
    import threading

    import redis
    from rq.scheduler import RQScheduler

    from webapp.runtime.services import services
    from webapp.runtime.worker import start_sweep_ticker

    desk = services()
    queues = desk.dispatcher.move_queues
    try:
        desk.dispatcher.redis.ping()
        scheduler = RQScheduler(queues, connection=desk.dispatcher.redis, interval=1, logging_level="WARNING")
        if once:
            click.echo(f"{_schedule_once(desk, scheduler, queues)}, and a sweep.")
            return
    except (redis.RedisError, OSError) as exc:
        raise click.ClickException(f"Redis is unreachable ({type(exc).__name__}); check REDIS_URL.") from None
    click.echo(
        f"Scheduler for queues {', '.join(queue.name for queue in queues)}: retries and a sweep every "
        f"{desk.config.sweep_interval_seconds:g} s."
    )
    stop = threading.Event()
    start_sweep_ticker(current_app._get_current_object(), stop)
    try:
        scheduler.work()  # until SIGTERM or SIGINT
    finally:
        stop.set()


def _schedule_once(desk, scheduler, queues) -> str:
    """`desk scheduler --once`: enqueue the jobs that are due (unless another scheduler holds the
    queues' lock) and one sweep; returns what was done, in words."""
    import time

    scheduler.acquire_locks()
    if scheduler.acquired_locks:
        now = int(time.time())
        due = sum(len(queue.scheduled_job_registry.get_jobs_to_schedule(now)) for queue in queues)
        try:
            scheduler.register_birth()
            scheduler.enqueue_scheduled_jobs()
        finally:
            scheduler.release_locks()
            scheduler.register_death()
        message = f"Enqueued {plural(due, 'due job')}"
    else:
        message = "Another scheduler holds the lock of these queues; it enqueues the due jobs"
    desk.dispatcher.enqueue_sweep(int(time.time() // desk.config.sweep_interval_seconds))
    return message


@click.command("start")
@with_appcontext
def redis_start_command() -> None:
    """Start the embedded Redis, unless a process of this checkout already did."""
    config = current_app.extensions["desk"].config
    if config.redis_url:
        raise click.ClickException("REDIS_URL is set, so there is no embedded Redis to start.")
    try:
        url = embedded_redis.ensure_running(config.instance_path)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"Embedded Redis answering on {url}")


@click.command("stop")
@with_appcontext
def redis_stop_command() -> None:
    """Stop the embedded Redis (every process of this checkout loses its queue until one starts it)."""
    config = current_app.extensions["desk"].config
    stopped = not config.redis_url and embedded_redis.stop(config.instance_path)
    click.echo("Embedded Redis stopped." if stopped else "No embedded Redis was running.")


@click.command("sweep")
@with_appcontext
def sweep_command() -> None:
    """Re-enqueue conversations that should be moving but have no live move."""
    from rq.utils import import_attribute

    # The sweep job itself, run here rather than queued: found by the dotted path the queue names it
    # by, as a worker finds it (webapp imports nothing of jobs/).
    sweep = import_attribute(SWEEP_JOB)
    click.echo(f"Re-enqueued {plural(sweep(), 'conversation')}.")


def register(app: Flask) -> None:
    """worker, desk scheduler, desk redis start|stop, sweep."""
    redis_group = AppGroup("redis", help="The embedded Redis of this checkout (used when REDIS_URL is unset).")
    redis_group.add_command(redis_start_command)
    redis_group.add_command(redis_stop_command)
    desk_group = AppGroup("desk", help="Running the desk in production.")
    desk_group.add_command(scheduler_command)
    desk_group.add_command(redis_group)
    app.cli.add_command(worker_command)
    app.cli.add_command(desk_group)
    app.cli.add_command(sweep_command)
