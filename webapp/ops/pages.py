"""The operations page: the queue and its workers, what failed, what is stuck.

Two people use it. An operator (no tenant; made with `flask create-operator`) runs the fleet: they
see the queue's depth, every worker (name, host, pid, current job) and every failed job of every
tenant and of the desk itself, and requeue or delete any of them; no tenant's conversations are
listed to them. A tenant's admin sees their own tenant only: its failed and stuck conversations and
the failed jobs that worked for it (a move or wake-up of one of its conversations, a background job
of one of its tool calls), and of the fleet nothing but its capacity in totals (how many workers,
how many of their slots are busy), never a worker's name, host or pid, the queue's depth or another
tenant's jobs. When Redis is unreachable the page says so and still shows what the database knows.

Every action is a plain form POST answered with a redirect back and a flash message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import redis
from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_login import current_user
from markupsafe import Markup
from rq import Worker
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job
from sqlalchemy import select

from webapp.agent import sweeper
from webapp.agent.states import ConversationStatus
from webapp.conversations import actions as conversations
from webapp.models import OPERATOR, Conversation, Tenant, ToolCall, utcnow
from webapp.ops.metrics import move_queue_counts, worker_slots
from webapp.refusals import Refusal
from webapp.runtime.extensions import db
from webapp.runtime.queue import move_job_id
from webapp.runtime.services import services
from webapp.web.rendering import when
from webapp.web.security import roles_required

bp = Blueprint("ops", __name__, url_prefix="/ops")

LIST_LIMIT = 50
JOB_ID_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$")
# Jobs that work for one conversation (moves, wake-ups) or one tool call (background exports), by id.
CONVERSATION_JOB_RE = re.compile(r"^(?:move-(\d+)-v\d+(?:-r\d+)?|wake-(\d+)-\d+)$")
TOOL_CALL_JOB_RE = re.compile(r"^export-(\d+)$")


@dataclass
class FailedJob:
    id: str
    function: str
    arguments: str
    ended_at: datetime | None
    summary: str  # the exception's last line
    conversation_id: int | None
    tenant: str | None = None  # the slug of the tenant it worked for (shown to operators); None: the desk's own


@dataclass
class RedisView:
    """What Redis tells about the queue; `error` says why the rest is missing. For a tenant's admin
    only the capacity totals and their tenant's failed jobs are filled in."""

    error: str | None = None
    counts: dict[str, int] = field(default_factory=dict)  # operators only
    workers: list[dict] = field(default_factory=list)  # operators only
    capacity: dict[str, int] = field(default_factory=dict)  # workers, slots, busy: totals, for everyone
    failed_jobs: list[FailedJob] = field(default_factory=list)


@bp.get("")
@roles_required("admin", OPERATOR)
def index():
    config = services().config
    if current_user.is_operator:
        return render_template(
            "ops/index.html",
            view=_redis_view(None),
            fleet=True,
            failed=[],
            stuck=[],
            config=config,
            queue_name=config.queue_name,
            chain_moves=config.move_chain_moves,
        )
    now = utcnow()
    tenant = Conversation.tenant_id == current_user.tenant_id
    failed = db.session.scalars(
        select(Conversation)
        .where(tenant, Conversation.status == ConversationStatus.FAILED)
        .order_by(Conversation.updated_at.desc())
        .limit(LIST_LIMIT)
    ).all()
    moving = sweeper.stalled(
        db.session, config.sweep_interval_seconds, limit=LIST_LIMIT, tenant_id=current_user.tenant_id
    )
    waiting_since = now - timedelta(hours=config.stale_approval_hours)
    waiting = db.session.scalars(
        select(Conversation)
        .where(
            tenant,
            Conversation.status == ConversationStatus.AWAITING_APPROVAL,
            Conversation.updated_at < waiting_since,
        )
        .order_by(Conversation.updated_at)
        .limit(LIST_LIMIT)
    ).all()
    view = _redis_view(current_user.tenant_id)
    stuck = [row for row in (_stuck_reason(c, now, view) for c in moving) if row is not None]
    stuck += [
        (c, f"waiting for a decision for {(now - c.updated_at).total_seconds() / 3600:.1f} hours") for c in waiting
    ]
    return render_template(
        "ops/index.html",
        view=view,
        fleet=False,
        failed=failed,
        stuck=stuck,
        config=config,
        queue_name=config.queue_name,
    )


@bp.post("/conversations/<int:conversation_id>/retry")
@roles_required("admin")
def retry_conversation(conversation_id: int):
    """Queue a failed conversation again (the same action as on its page)."""
    try:
        conversation = conversations.find(db.session, current_user, conversation_id)
        conversations.retry(db.session, current_user, conversation)
    except Refusal as exc:
        db.session.rollback()
        flash(exc.message, "error")
    except (redis.RedisError, OSError):  # committed: the sweeper enqueues it once Redis is back
        flash(f"Conversation {conversation_id} is queued again; Redis did not answer, so it starts when it is back.")
    else:
        flash(f"Conversation {conversation_id} is queued again.", "info")
    return redirect(url_for(".index", _anchor="failed-conversations"), code=303)


@bp.post("/jobs/requeue")
@roles_required("admin", OPERATOR)
def requeue_job():
    """Put a failed RQ job back on its queue (a stale move finds its version moved on and exits)."""
    return _job_action("requeue")


@bp.post("/jobs/delete")
@roles_required("admin", OPERATOR)
def delete_job():
    """Remove a failed RQ job and its record (the conversation itself is not touched)."""
    return _job_action("delete")


# --- helpers --------------------------------------------------------------------------------------


def _job_action(action: str):
    job_id = (request.form.get("job_id") or "").strip()
    back = redirect(url_for(".index", _anchor="failed-jobs"), code=303)
    if not JOB_ID_RE.match(job_id):
        flash("Choose a failed job from the list (its id was missing or malformed).", "error")
        return back
    dispatcher = services().dispatcher
    try:
        registry = next(
            (q.failed_job_registry for q in dispatcher.move_queues if job_id in q.failed_job_registry), None
        )
        owner = _owners([job_id]).get(job_id)
        # An operator acts on any failed job; an admin only on one that worked for their tenant.
        if registry is None or not (
            current_user.is_operator or (owner is not None and owner[1] == current_user.tenant_id)
        ):
            flash(f"Job {job_id} is not among the failed jobs any more.", "error")
            return back
        if action == "requeue":
            registry.requeue(job_id)
            flash(f"Job {job_id} is back on the queue.", "info")
        else:
            registry.remove(job_id, delete_job=True)
            flash(f"Job {job_id} is deleted.", "info")
    except (NoSuchJobError, InvalidJobOperation):
        flash(f"Job {job_id} is not among the failed jobs any more.", "error")
    except (redis.RedisError, OSError) as exc:
        flash(f"Redis is unreachable ({type(exc).__name__}); nothing was changed. Try again when it is back.", "error")
    return back


def _owners(job_ids: list[str]) -> dict[str, tuple[int, int]]:
    """Job id -> (conversation id, tenant id) for the jobs that worked for a conversation or one of
    its tool calls; the desk's own jobs, and jobs whose rows are gone, are absent."""
    by_conversation: dict[str, int] = {}
    by_call: dict[str, int] = {}
    for job_id in job_ids:
        if match := CONVERSATION_JOB_RE.match(job_id):
            by_conversation[job_id] = int(match.group(1) or match.group(2))
        elif match := TOOL_CALL_JOB_RE.match(job_id):
            by_call[job_id] = int(match.group(1))
    conversations_found = {
        cid: tenant
        for cid, tenant in db.session.execute(
            select(Conversation.id, Conversation.tenant_id).where(Conversation.id.in_(set(by_conversation.values())))
        )
    }
    calls_found = {
        call_id: (cid, tenant)
        for call_id, cid, tenant in db.session.execute(
            select(ToolCall.id, ToolCall.conversation_id, ToolCall.tenant_id).where(
                ToolCall.id.in_(set(by_call.values()))
            )
        )
    }
    owners = {
        job_id: (cid, conversations_found[cid]) for job_id, cid in by_conversation.items() if cid in conversations_found
    }
    owners.update({job_id: calls_found[call_id] for job_id, call_id in by_call.items() if call_id in calls_found})
    return owners


def _worker_row(worker: Worker, busy: int, slots: int) -> dict:
    """One worker for an operator: what it is doing now and what it has done since it started."""
    jobs = [execution.job_id for execution in worker.get_current_executions()]
    now_on = sorted({int(m.group(1) or m.group(2)) for job in jobs if (m := CONVERSATION_JOB_RE.match(job))})
    moves = worker.connection.hget(worker.key, "moves")
    born = worker.birth_date
    alive = (utcnow() - (born if born.tzinfo else born.replace(tzinfo=UTC))).total_seconds() if born else 0
    return {
        "name": worker.name,
        "state": str(worker.get_state()),
        "busy": busy,
        "slots": slots,
        "now_on": now_on,
        "other_jobs": len(jobs) - len([job for job in jobs if CONVERSATION_JOB_RE.match(job)]),
        "moves": int(moves) if moves is not None else None,  # a PoolWorker says; RQ's own workers do not
        "jobs_done": worker.successful_job_count,
        "jobs_failed": worker.failed_job_count,
        "working": worker.total_working_time,
        "busy_share": worker.total_working_time / (slots * alive) if alive > 0 else None,
        "heartbeat": worker.last_heartbeat,
        "host": f"{worker.hostname}:{worker.pid}",
        "birth": worker.birth_date,
    }


def _redis_view(tenant_id: int | None) -> RedisView:
    """The queue as an operator sees it (tenant_id None: everything) or as a tenant's admin does (the
    fleet's capacity in totals, and the failed jobs that worked for their tenant)."""
    dispatcher = services().dispatcher
    view = RedisView()
    try:
        queue = dispatcher.queue
        workers = sorted(Worker.all(queue=queue), key=lambda w: w.name)
        view.capacity = {"workers": len(workers), "slots": 0, "busy": 0}
        for worker in workers:
            busy, slots = worker_slots(worker)
            view.capacity["slots"] += slots
            view.capacity["busy"] += min(busy, slots)
            if tenant_id is None:
                view.workers.append(_worker_row(worker, busy, slots))
        if tenant_id is None:
            view.counts = move_queue_counts(dispatcher)
        ids = [
            job_id
            for move_queue in dispatcher.move_queues
            for job_id in move_queue.failed_job_registry.get_job_ids(0, 4 * LIST_LIMIT - 1, desc=True, cleanup=False)
        ]
        jobs = [job for job in Job.fetch_many(ids, connection=dispatcher.redis) if job is not None]
        jobs.sort(key=lambda job: job.ended_at.timestamp() if job.ended_at else 0, reverse=True)
        owners = _owners([job.id for job in jobs])
        slugs = (
            {tid: slug for tid, slug in db.session.execute(select(Tenant.id, Tenant.slug))} if tenant_id is None else {}
        )
        for job in jobs:
            owner = owners.get(job.id)
            if len(view.failed_jobs) >= LIST_LIMIT:
                break
            if tenant_id is None:
                view.failed_jobs.append(_failed_job(job, owner and owner[0], slugs.get(owner[1]) if owner else None))
            elif owner is not None and owner[1] == tenant_id:
                view.failed_jobs.append(_failed_job(job, owner[0]))
    except (redis.RedisError, OSError) as exc:
        view.error = (
            f"Redis is unreachable ({type(exc).__name__}): queue depth, workers and failed jobs are unknown, and "
            "new moves cannot be enqueued until it is back. "
            + (
                "The sweeper re-enqueues the waiting conversations once Redis answers."
                if tenant_id is None
                else "Conversations below come from the database; the sweeper re-enqueues them once Redis answers."
            )
        )
    return view


def _failed_job(job: Job, conversation_id: int | None, tenant: str | None = None) -> FailedJob:
    result = job.latest_result()
    text = (getattr(result, "exc_string", None) or "").strip()
    summary = text.splitlines()[-1] if text else "no exception recorded (the job may have been stopped or timed out)"
    try:
        arguments = ", ".join(repr(arg) for arg in job.args)
    except Exception:  # a job whose data no longer unpickles is still listed
        arguments = "(unreadable)"
    return FailedJob(
        id=job.id,
        function=(job.func_name or "?").rsplit(".", 1)[-1],
        arguments=arguments[:200],
        ended_at=job.ended_at,
        summary=summary[:300],
        conversation_id=conversation_id,
        tenant=tenant,
    )


def _stuck_reason(conversation: Conversation, now: datetime, view: RedisView) -> tuple[Conversation, str] | None:
    """Why this queued or running conversation is not moving, or None if a live job will move it."""
    if conversation.lease_expires_at is not None and conversation.lease_expires_at < now:
        owner = conversation.lease_owner or "a worker"
        expired = when(conversation.lease_expires_at, seconds=True, relative=False)
        return conversation, Markup("the lease of {} expired at {}").format(owner, expired)
    if view.error:
        return conversation, "queued with no lease; whether a job waits for it is unknown while Redis is away"
    dispatcher = services().dispatcher
    try:
        ids = [move_job_id(conversation.id, conversation.version)]
        if conversation.recoveries:
            ids.append(move_job_id(conversation.id, conversation.version, conversation.recoveries))
        if any(dispatcher.job_alive(job_id) for job_id in ids):
            return None
    except (redis.RedisError, OSError):
        return conversation, "queued with no lease; Redis did not answer whether a job waits for it"
    return conversation, "queued with no live job (the sweeper re-enqueues it within one sweep interval)"
