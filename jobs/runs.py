"""A bulk run's items started as conversations (webapp/runs/actions.py starts a chunk in one
transaction); after each chunk's commit this job queues its first moves, behind the moves people
wait for, and tells the tenant's pages."""

from __future__ import annotations

from jobs.moves import queue_move
from webapp.runs import actions
from webapp.runtime.extensions import db
from webapp.runtime.job_logs import bind_job
from webapp.runtime.services import services


@bind_job
def start(run_id: int) -> str:
    """Start the run's items not started yet, a chunk per transaction, and queue their first moves."""
    desk = services()
    total = 0
    try:
        while (started := actions.start_items(db.session, run_id)).moves:
            for conversation_id, version in started.moves:
                queue_move(desk, conversation_id, version)
            desk.live_events.changed(started.tenant_id)
            total += len(started.moves)
    finally:
        db.session.remove()
    return f"{total} conversation(s) started"
