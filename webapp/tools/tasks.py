"""Tasks: a tool's answer "not yet". A tool whose work outlives one move returns a Task instead of a
result; the loop persists it with the call and hands it back to the tool's resume() later, in
whatever process runs the conversation's next move (see webapp/agent/calls.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

WORKING = "working"
INPUT_REQUIRED = "input_required"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
STATUSES = (WORKING, INPUT_REQUIRED, COMPLETED, FAILED, CANCELLED)
OPEN = frozenset({WORKING, INPUT_REQUIRED})

DEFAULT_POLL_SECONDS = 5.0
MAX_MESSAGE_CHARS = 500
MAX_INPUT_CHARS = 500


class TaskError(ValueError):
    """A task that cannot be: a bad status, data that is not JSON with string keys, a bad interval."""


@dataclass(frozen=True)
class Task:
    """Where a tool's long-running work stands.

    status: working (the loop polls it every poll_seconds), input_required (it waits for a person's
    input, described by input_prompt), or completed / failed / cancelled (settled: result is the
    tool's output for completed; message is the error or the notice otherwise).
    data is the tool's own state between polls: JSON-serialisable, with string keys.
    input is what a person typed for an input_required task; the loop sets it, resume() consumes it.
    """

    status: str
    message: str | None = None
    poll_seconds: float | None = None
    data: dict[str, Any] = field(default_factory=dict)
    progress: float | None = None  # 0..1, for a progress bar
    input_prompt: str | None = None
    result: Any = None
    input: str | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise TaskError(f"Task status {self.status!r} is not one of {', '.join(STATUSES)}.")
        if self.message is not None and not isinstance(self.message, str):
            raise TaskError("A task's message is text.")
        if self.poll_seconds is not None and not (
            isinstance(self.poll_seconds, int | float) and math.isfinite(self.poll_seconds) and self.poll_seconds > 0
        ):
            raise TaskError(f"A task's poll interval is a positive number of seconds, not {self.poll_seconds!r}.")
        if self.progress is not None and not (isinstance(self.progress, int | float) and 0 <= self.progress <= 1):
            raise TaskError(f"A task's progress is a fraction from 0 to 1, not {self.progress!r}.")
        _check_json(self.data, "data")
        if self.result is not None:
            _check_json(self.result, "result")

    @property
    def open(self) -> bool:
        return self.status in OPEN

    @property
    def poll_interval(self) -> float:
        return self.poll_seconds or DEFAULT_POLL_SECONDS

    def to_dict(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if value is not None and value != {}}

    @classmethod
    def from_dict(cls, raw: Any) -> Task:
        if not isinstance(raw, dict):
            raise TaskError("A stored task is a JSON object.")
        unknown = set(raw) - {f for f in cls.__dataclass_fields__}
        if unknown:
            raise TaskError(f"A stored task has unknown fields: {', '.join(sorted(unknown))}.")
        if "status" not in raw:
            raise TaskError("A stored task has no status.")
        return cls(**{**raw, "data": raw.get("data") or {}})

    def with_input(self, text: str | None) -> Task:
        return replace(self, input=text)

    def progress_key(self) -> tuple:
        """What counts as progress: any change of status, message, progress, prompt or the tool's data."""
        return (self.status, self.message, self.progress, self.input_prompt, json.dumps(self.data, sort_keys=True))


def _check_json(value: Any, what: str) -> None:
    if what == "data" and not isinstance(value, dict):
        raise TaskError("A task's data is a JSON object (a dict with string keys).")
    try:
        json.dumps(value, allow_nan=False, default=_refuse)
    except (TypeError, ValueError) as exc:
        raise TaskError(f"A task's {what} must be JSON-serialisable with string keys: {exc}.") from None
    _check_keys(value, what)


def _check_keys(value: Any, what: str) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TaskError(f"A task's {what} must have string keys, not {key!r}.")
            _check_keys(item, what)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_keys(item, what)


def _refuse(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON")


@dataclass(frozen=True)
class BackgroundWork:
    """What a tool's background work gets (a job the tool started with
    `context.background.start_work("package.module:function", *args, ...)`; the function is called as
    function(work, *args) in a worker): a database session, the desk's settings, and the job's
    progress, told to the call's page as it goes."""

    session: Any  # a SQLAlchemy session of its own
    config: Any  # webapp.config.Config
    progress: Callable[[float, str], None]  # how far, and what it does now: the job's meta and the page
    tell: Callable[[str, float, str], None]  # a last word for the page: ("failed" | "cancelled", 0.0, words)
    cancelled: Callable[[], bool]  # the tool asked the work to stop (the conversation was stopped)
    end_transaction: Callable[[], None]  # between parts, so no transaction stays open while it paces
