"""A tool's background work: a tool starts it with
`context.background.start_work("package.module:function", *args, ...)` (webapp/runtime/background.py),
and this job calls function(work, *args) with a webapp.tools.tasks.BackgroundWork: a session, the
settings, progress told in the job's meta and live on the call's conversation page, and whether the
tool asked it to stop."""

from __future__ import annotations

import importlib

from rq import get_current_job

from webapp.runtime.extensions import db
from webapp.runtime.job_logs import bind_job
from webapp.runtime.services import services
from webapp.tools.tasks import BackgroundWork


@bind_job
def run(target: str, *args):
    """Run the tool's work named by `target` with these arguments; what it returns is the job's result."""
    job = get_current_job()
    desk = services()
    follower = (job.meta or {}) if job is not None else {}
    conversation_id, tool_call_id = follower.get("conversation_id"), follower.get("tool_call_id")

    def cancelled() -> bool:
        return job is not None and desk.background.cancelled(job.id)

    def tell(status: str, fraction: float, message: str) -> None:
        if conversation_id is not None and tool_call_id is not None:
            desk.live_events.task_progress(conversation_id, tool_call_id, status, message, fraction)

    def progress(fraction: float, message: str) -> None:
        if job is not None:
            job.meta.update(progress=fraction, message=message)
            job.save_meta()
        tell("working", fraction, message)

    work = BackgroundWork(db.session, desk.config, progress, tell, cancelled, db.session.remove)
    try:
        return _work_function(target)(work, *args)
    finally:
        db.session.remove()


def _work_function(target: str):
    """The function a "package.module:function" target names."""
    module_name, _, name = target.partition(":")
    function = getattr(importlib.import_module(module_name), name, None)
    if not callable(function):
        raise ValueError(f"{target!r} names no function of a tool's background work")
    return function
