"""The RQ entry points of the loop: ids in, the work in webapp/runtime/work.py, the outcome out."""

from __future__ import annotations

from rq import get_current_job

from webapp.runtime import work
from webapp.runtime.job_logs import bind_job


@bind_job
def advance_conversation(conversation_id: int, version: int) -> str:
    """Make the conversation's next move if it is still at this version; enqueue the one after."""
    return work.move(conversation_id, version, job=get_current_job())


@bind_job
def sweep() -> int:
    """Re-enqueue stalled conversations, expire undecided calls, wake stranded ones."""
    return work.sweep()


@bind_job
def wake_for_tasks(conversation_id: int) -> bool:
    """Scheduled for when a parked conversation's next task is due."""
    return work.wake_for_tasks(conversation_id)
