"""The RQ entry point of a tool's background work (a tool starts it with
`context.background.start_work("package.module:function", ...)`; webapp/runtime/work.py runs it)."""

from __future__ import annotations

from rq import get_current_job

from webapp.runtime import work
from webapp.runtime.job_logs import bind_job


@bind_job
def run(target: str, *args):
    """Run the tool's work named by `target` with these arguments; what it returns is the job's result."""
    return work.run_tool_work(target, *args, job=get_current_job())
