"""Gunicorn settings for the web tier:

    gunicorn -c gunicorn.conf.py 'webapp:create_app()'

Worker class: gthread. Every signed-in page holds a server-sent-events stream open (webapp/live.py,
up to 5 minutes, then the browser reconnects), and a stream occupies one thread of a process for
as long as it is open. A sync worker would be taken whole by a single stream; gthread gives each
process a pool of threads, so one process serves hundreds of open streams and still answers the
ordinary requests between them (bench/streams.py: 1,000 streams on one process, other requests in
~5 ms). A stream holds no database connection (it releases its session before streaming), so the
thread count is bounded by memory, not by the database pool: threads that need the database share
the process's SQLAlchemy pool (10 connections + 10 overflow) and wait their turn for one.

gthread's `timeout` is the worker's heartbeat to the master, not a limit per request, so a
5-minute stream is never killed for being long.

Settings from the environment (each has a default that suits a small machine):

    PORT              8000   the port to listen on (all interfaces)
    WEB_CONCURRENCY   2      processes; about one per core
    WEB_THREADS       200    threads per process = open live pages it can hold, plus requests
    WEB_TIMEOUT       30     seconds of silence from a process before the master restarts it
    LOG_FORMAT/LOG_LEVEL     as for the app (README, "Logs"): gunicorn's own lines are JSON too
"""

from __future__ import annotations

import os
import sys


def _int(name: str, default: int, minimum: int = 1) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SystemExit(f"Configuration error: {name} must be a whole number, got {raw!r}") from None
    if value < minimum:
        raise SystemExit(f"Configuration error: {name} must be at least {minimum}, got {value}")
    return value


bind = f"0.0.0.0:{_int('PORT', 8000)}"
workers = _int("WEB_CONCURRENCY", 2)
worker_class = "gthread"
threads = _int("WEB_THREADS", 200)
worker_connections = max(1000, threads * 2)  # gthread: open connections per process, streams included
timeout = _int("WEB_TIMEOUT", 30)
graceful_timeout = 30  # on restart, open streams get this long; browsers then reconnect to a new process
keepalive = 5
preload_app = False  # each process opens its own database pool and Redis connections after the fork
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")  # the proxy that ends TLS

# One log stream: gunicorn's own lines go through the app's handler (webapp/logs.py) as JSON lines.
# No access log: the app logs every request itself (logger desk.request) with its request id, the
# conversation of its URL and its duration.
accesslog = None
_log_format = (os.environ.get("LOG_FORMAT") or ("text" if sys.stderr.isatty() else "json")).strip().lower()
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "root": {"level": (os.environ.get("LOG_LEVEL") or "INFO").upper(), "handlers": ["desk"]},
    "loggers": {
        "gunicorn.error": {"level": "INFO", "handlers": [], "propagate": True},
        "gunicorn.access": {"level": "WARNING", "handlers": [], "propagate": False},  # desk.request instead
    },
    "handlers": {"desk": {"()": "webapp.logs.make_handler", "log_format": _log_format}},
    "formatters": {},
}
