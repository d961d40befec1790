"""The RQ entry point that starts a bulk run's items as conversations (the work: webapp/runs/actions.py)."""

from __future__ import annotations

from webapp.runs import actions
from webapp.runtime.extensions import db
from webapp.runtime.job_logs import bind_job


@bind_job
def start(run_id: int) -> str:
    """Start the run's items not started yet, a chunk per transaction, and queue their first moves."""
    try:
        return f"{actions.start_all(db.session, run_id)} conversation(s) started"
    finally:
        db.session.remove()
