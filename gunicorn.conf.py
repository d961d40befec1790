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

    PORT                 8000       the port to listen on (all interfaces)
    WEB_CONCURRENCY      2          processes; about one per core
    WEB_THREADS          200        threads per process = open live pages it can hold, plus requests
    WEB_TIMEOUT          30         seconds of silence from a process before the master restarts it
    FORWARDED_ALLOW_IPS  127.0.0.1  the proxy that ends TLS, whose X-Forwarded-* headers are believed
    LOG_FORMAT/LOG_LEVEL            as for the app (docs/operating.md, "Logs"): gunicorn's own lines are JSON too

A bad value stops gunicorn before it starts, with a sentence naming the variable.
"""

from __future__ import annotations

from webapp.config import ConfigError, ServerConfig

try:
    server = ServerConfig.from_env()  # every variable above, checked; webapp/config.py declares them
except ConfigError as exc:  # a sentence per bad variable, not a traceback
    raise SystemExit(f"Configuration error: {exc}") from None

bind = f"0.0.0.0:{server.port}"
workers = server.web_concurrency
worker_class = "gthread"
threads = server.web_threads
worker_connections = max(1000, threads * 2)  # gthread: open connections per process, streams included
timeout = server.web_timeout
graceful_timeout = 30  # on restart, open streams get this long; browsers then reconnect to a new process
keepalive = 5
preload_app = False  # each process opens its own database pool and Redis connections after the fork
forwarded_allow_ips = server.forwarded_allow_ips  # the proxy that ends TLS

# One log stream: gunicorn's own lines go through the app's handler (webapp/logs.py) as JSON lines.
# No access log: the app logs every request itself (logger desk.request) with its request id, the
# conversation of its URL and its duration.
accesslog = None
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "root": {"level": server.log_level, "handlers": ["desk"]},
    "loggers": {
        "gunicorn.error": {"level": "INFO", "handlers": [], "propagate": True},
        "gunicorn.access": {"level": "WARNING", "handlers": [], "propagate": False},  # desk.request instead
    },
    "handlers": {"desk": {"()": "webapp.logs.make_handler", "log_format": server.log_format}},
    "formatters": {},
}
