"""The RQ entry point of reminders and escalations of waiting calls (the work: webapp/notify/,
run through webapp/runtime/work.py)."""

from __future__ import annotations

from rq import get_current_job

from webapp.runtime import work
from webapp.runtime.job_logs import bind_job


@bind_job
def deliver(channel_id: int, tool_call_id: int, kind: str) -> str:
    """Send one call's reminder or escalation through one channel; raises to be retried."""
    return work.deliver_notice(channel_id, tool_call_id, kind, job=get_current_job())
