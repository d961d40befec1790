"""The RQ entry point of the batch runs' pump (the work: webapp/runtime/work.py and webapp/agent/batches.py)."""

from __future__ import annotations

from webapp.runtime import work
from webapp.runtime.job_logs import bind_job


@bind_job
def pump() -> str:
    """Send the batch runs' waiting requests, look at the open batches, wake the answered conversations."""
    return work.pump_batches()
