"""The RQ job id, and the conversation a job is about, on every log line of a job."""

from __future__ import annotations

import functools
import inspect
import logging
import time

from rq import get_current_job

from webapp.logs import bind

job_log = logging.getLogger("desk.jobs")


def bind_job(func):
    """Decorate a job function: its records carry the RQ job id and, when the function takes a
    `conversation_id` argument, that id."""
    signature = inspect.signature(func)
    takes_conversation = "conversation_id" in signature.parameters

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        job = get_current_job()
        ids: dict[str, object] = {"job_id": job.id if job else None}
        if takes_conversation:
            bound = signature.bind_partial(*args, **kwargs)
            ids["conversation_id"] = bound.arguments.get("conversation_id")
        started = time.perf_counter()
        with bind(**ids):
            try:
                result = func(*args, **kwargs)
            except Exception as exc:
                job_log.warning(
                    "%s raised %s",
                    func.__name__,
                    type(exc).__name__,
                    exc_info=True,
                    extra={"job": func.__name__, "duration_ms": _since(started)},
                )
                raise
            job_log.info(
                "%s done: %s",
                func.__name__,
                result,
                extra={"job": func.__name__, "outcome": str(result)[:100], "duration_ms": _since(started)},
            )
            return result

    return wrapper


def _since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)
