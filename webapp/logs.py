"""Structured logs: one JSON object per line from web and worker processes, each carrying the ids of
what it is about (conversation, tool call, web request, RQ job) wherever they are known.

    configure(config)                 # once per process: JSON (or text) on stderr through the root logger
    with bind(conversation_id=7):     # every record logged inside, in this thread or task, carries it
        log.info("moving")            # {"message": "moving", "conversation_id": 7, ...}

The ids live in a contextvar, so concurrent requests (gunicorn threads) and jobs never see each
other's. This module imports no Flask and no RQ: webapp/agent may use bind() too.
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

ID_FIELDS = ("conversation_id", "tool_call_id", "request_id", "job_id")
FORMATS = ("json", "text")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s%(ids)s"

_ids: ContextVar[dict[str, object]] = ContextVar("desk_log_ids", default={})  # noqa: B039 - never mutated


class ContextFilter(logging.Filter):
    """Copies the bound ids onto every record that passes (installed on the handler, so records
    propagated from any logger get them). An id set explicitly with extra={...} wins."""

    def filter(self, record: logging.LogRecord) -> bool:
        ids = _ids.get()
        for name in ID_FIELDS:
            if name in ids and not hasattr(record, name):
                setattr(record, name, ids[name])
        # For the text format: " conversation_id=7 job_id=move-7-v3", or "".
        record.ids = "".join(f" {name}={getattr(record, name)}" for name in ID_FIELDS if hasattr(record, name))
        return True


class DeskJsonFormatter(JsonFormatter):
    """python-json-logger with our field names: time, level, logger, message, then the ids and any
    extra fields; exceptions as `exc_info` text."""

    def __init__(self) -> None:
        super().__init__(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            reserved_attrs=[*RESERVED_ATTRS, "ids"],
        )

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging's name
        from datetime import UTC, datetime

        return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@contextmanager
def bind(**ids: object) -> Iterator[None]:
    """Add ids (conversation_id, tool_call_id, request_id, job_id) to every log record made inside
    the block; None leaves an id as it was. Nested blocks add to the outer ones."""
    token = push(**ids)
    try:
        yield
    finally:
        _ids.reset(token)


def push(**ids: object) -> Token:
    """bind() without a block, for hooks that open and close in two places (Flask's before and
    teardown request); undo with pop(token)."""
    unknown = set(ids) - set(ID_FIELDS)
    if unknown:
        raise TypeError(f"unknown log id {', '.join(sorted(unknown))}; use {', '.join(ID_FIELDS)}")
    return _ids.set({**_ids.get(), **{name: value for name, value in ids.items() if value is not None}})


def pop(token: Token) -> None:
    try:
        _ids.reset(token)
    except ValueError:  # made in another context (cannot happen with Flask's hooks): just clear
        _ids.set({})


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (test runners swap it), unless given a stream."""

    def __init__(self, stream=None) -> None:
        super().__init__(stream)
        self._fixed = stream is not None

    @property
    def stream(self):
        return self._stream if self._fixed else sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        self._stream = value


def make_handler(log_format: str = "json", stream=None) -> logging.Handler:
    """The handler configure() installs; also usable from logging.config.dictConfig (gunicorn.conf.py)."""
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {log_format!r}")
    handler = _StderrHandler(stream)
    handler.setFormatter(DeskJsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(ContextFilter())
    handler.desk_handler = True  # configure() replaces any handler so marked
    return handler


def configure(app_or_config, stream=None) -> logging.Handler:
    """Send every log record of this process through one handler on the root logger, formatted
    as JSON lines (LOG_FORMAT=json) or readable text (LOG_FORMAT=text), at LOG_LEVEL. Takes a Flask
    app (its desk config) or a Config; calling it again replaces the handler it installed."""
    config = _config_of(app_or_config)
    handler = make_handler(getattr(config, "log_format", "json"), stream)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "desk_handler", False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(config, "log_level", "INFO"))
    return handler


def _config_of(app_or_config):
    extensions = getattr(app_or_config, "extensions", None)
    if isinstance(extensions, dict):  # a Flask app
        if "desk" in extensions:
            return extensions["desk"].config
        return app_or_config.config.get("DESK_CONFIG")
    return app_or_config
