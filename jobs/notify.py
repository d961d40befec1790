"""Reminders and escalations of waiting calls: the sweep marks each due and enqueues one job per
channel of the call's tenant; this job sends it through that channel (webapp/notify/ says what
and how) and logs the attempt."""

from __future__ import annotations

from rq import get_current_job

from webapp import notify
from webapp.models import ToolCall
from webapp.runtime.extensions import db
from webapp.runtime.job_logs import bind_job
from webapp.runtime.services import services


@bind_job
def deliver(channel_id: int, tool_call_id: int, kind: str) -> str:
    """Send one call's reminder or escalation through one channel, logging the attempt; a failed
    attempt raises DeliveryFailed while the job has retries left, so RQ tries again after its
    backoff. Returns the delivery's status."""
    job = get_current_job()
    desk = services()
    try:
        call = db.session.get(ToolCall, tool_call_id)
        tools = desk.tools_for(db.session, call.tenant_id) if call is not None else desk.tools  # its MCP tools too
        row, outcome = notify.deliver(db.session, desk.config, tools, channel_id, tool_call_id, kind)
        db.session.commit()
    finally:
        db.session.remove()
    if row is None:
        return "nothing to send"
    if not outcome.delivered and outcome.retry and job is not None and job.retries_left:
        raise notify.DeliveryFailed(outcome.error)
    return row.status
