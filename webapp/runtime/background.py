"""Tools' background jobs as a tool reaches them (`context.background`, docs/tools.md): start a
piece of work once, ask where it stands, stop it. The job that runs the work is jobs/tools.py; it
asks `cancelled` between its steps. The queue it goes on is the dispatcher's (queue.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus

if TYPE_CHECKING:
    from webapp.runtime.queue import Dispatcher


@dataclass(frozen=True)
class BackgroundState:
    status: str  # queued | started | finished | failed | ... (RQ's job statuses)
    meta: dict
    result: object = None
    error: str | None = None


def background_cancel_key(job_id: str) -> str:
    """Set when a tool asked its background job to stop."""
    return f"desk:cancel:{job_id}"


class BackgroundJobs:
    """What a tool's `context.background` offers, over the dispatcher's background queue."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher

    def start_work(self, target: str, *args, job_id: str, timeout: int = 3600, meta: dict | None = None) -> None:
        """Start a tool's background work once (a second start under the same id changes nothing):
        `target` is "package.module:function", called in a worker as function(BackgroundWork, *args)
        (webapp/tools/tasks.py). `meta` starts the job's meta (the conversation and call it works
        for, whose page it tells its progress)."""
        self.dispatcher.enqueue_tool_work(target, *args, job_id=job_id, timeout=timeout, meta=meta)

    def background_state(self, job_id: str) -> BackgroundState | None:
        """Where a background job stands; None when Redis no longer knows it."""
        try:
            job = Job.fetch(job_id, connection=self.dispatcher.redis)
        except NoSuchJobError:
            return None
        status = job.get_status(refresh=False)
        error = None
        if status == JobStatus.FAILED:
            result = job.latest_result()
            error = (result.exc_string or "").strip().splitlines()[-1:] if result else []
            error = error[0] if error else "the job failed"
        return BackgroundState(
            status=str(status.value if hasattr(status, "value") else status),
            meta=dict(job.meta or {}),
            result=job.return_value() if status == JobStatus.FINISHED else None,
            error=error,
        )

    def cancelled(self, job_id: str) -> bool:
        """Whether a tool asked its background job to stop (the job checks between its steps)."""
        return bool(self.dispatcher.redis.exists(background_cancel_key(job_id)))

    def cancel_background(self, job_id: str) -> None:
        """Stop a background job: a waiting one is cancelled, a running one is asked to stop."""
        redis = self.dispatcher.redis
        redis.set(background_cancel_key(job_id), "1", ex=86400)
        try:
            job = Job.fetch(job_id, connection=redis)
        except NoSuchJobError:
            return
        if job.get_status(refresh=False) in (JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.DEFERRED):
            job.cancel()
