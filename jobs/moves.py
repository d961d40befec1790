"""The loop's jobs: a conversation's moves, the periodic sweep, and the wake-up of a parked
conversation whose task is due. Each takes ids, calls the desk's rules (webapp/agent: moves.py,
sweeper.py, decisions.py), commits, and only then enqueues what follows and tells the live pages."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from rq import get_current_job
from sqlalchemy import select

from webapp import notify, webhooks
from webapp.agent import batch_pump, decisions, gate, sweeper
from webapp.agent import moves as agent_moves
from webapp.models import Conversation, Run, utcnow
from webapp.runtime import worker_state
from webapp.runtime.extensions import db
from webapp.runtime.job_logs import bind_job
from webapp.runtime.queue import QueueUnavailable, move_job_id
from webapp.runtime.services import Services, services

log = logging.getLogger(__name__)


@bind_job
def advance_conversation(conversation_id: int, version: int) -> str:
    """Make the conversation's moves from this version on, back to back while the next one is ready:
    each move claims and ends its lease and commits exactly as a job of its own would, and what each
    changed is published at once. After MOVE_CHAIN_MOVES moves or MOVE_CHAIN_SECONDS (or when the
    worker is stopping), the next move goes back to the queue, so one busy conversation never holds a
    slot for long. The RQ job's id names the lease owner; its retries left say whether a transient
    failure of its first move is final. Returns the outcomes, in order."""
    job = get_current_job()
    desk = services()
    config = desk.config
    owner = worker_state.process_owner() + (job.id if job else "inline")
    until = time.monotonic() + config.move_chain_seconds
    outcomes = []
    while True:
        first = not outcomes
        try:
            result = _one_move(desk, conversation_id, version, owner, final_attempt=_final(job, config, first))
            worker_state.count_move()
        except Exception as error:
            if first:
                raise  # the job's own retries (RQ), as for any job
            # A later move failed: the moves before it are committed, and this one gets a job of its own
            # with the retries every move has (a transient error, a database gone for a moment). Any
            # other error failed the conversation, and that job finds nothing to claim.
            queue_move(desk, conversation_id, version, delay=(config.move_retry_intervals or (0,))[0])
            if isinstance(error, agent_moves.TransientMoveError):
                return " ".join([*outcomes, "handed_back"])
            raise
        outcomes.append(result.outcome)
        if result.next_version is None:
            break
        version = result.next_version
        if len(outcomes) >= config.move_chain_moves or time.monotonic() >= until or worker_state.stopping.is_set():
            queue_move(desk, conversation_id, version)
            break
    return " ".join(outcomes)


def _one_move(
    desk: Services, conversation_id: int, version: int, owner: str, final_attempt: bool
) -> agent_moves.MoveResult:
    """One move and what follows its commit: the task wake-up it scheduled, the pages told."""
    try:
        result = agent_moves.advance(
            db.session,
            conversation_id,
            version,
            owner=owner,
            make_loop=desk.loop,
            lease_seconds=desk.config.lease_seconds,
            final_attempt=final_attempt,
        )
    finally:
        db.session.remove()
    if result.wake_at is not None:
        desk.dispatcher.schedule_wake(conversation_id, result.wake_at)
    if result.outcome == "batched":  # parked for a batch: the pump sends it once its run's round is in
        desk.dispatcher.enqueue_batch_pump()
    if result.tenant_id is not None:
        desk.live_events.changed(result.tenant_id, conversation_id, move_done=True)
    return result


def _final(job, config, first: bool) -> bool:
    """Whether a transient failure of this move is final: the job's retries for its first move; a later
    move would get a job of its own with MOVE_RETRIES."""
    if first:
        return not (job and job.retries_left)
    return not config.move_retries


def queue_move(desk: Services, conversation_id: int, version: int, delay: float = 0) -> None:
    """Enqueue a committed move (the rest of a chain handed back, a conversation woken or started);
    with Redis away (QueueUnavailable) the sweeper enqueues it once Redis is back."""
    try:
        desk.dispatcher.enqueue_move(conversation_id, version, delay=delay)
    except QueueUnavailable:
        pass


@dataclass
class _Swept:
    """What a sweep found and committed, to enqueue once its transactions are over."""

    recovered: list[tuple[int, int, int]] = field(default_factory=list)  # (conversation, version, recovery)
    woken: list[tuple[int, int, int]] = field(default_factory=list)  # (conversation, version, tenant)
    notices: list[tuple[int, int, str]] = field(default_factory=list)  # (call, tenant, kind)
    channels: dict[int, list[int]] = field(default_factory=dict)  # the notices' channels, by tenant
    webhooks_due: list[int] = field(default_factory=list)  # subscriptions with deliveries to send
    runs_to_start: list[int] = field(default_factory=list)
    batch_work: bool = False  # a batch run's request is waiting or open


@bind_job
def sweep() -> int:
    """Re-enqueue every conversation that should be moving but has no live move, settle the tool calls
    whose time to decide ran out, wake parked conversations that should be moving (a task due, a call
    approved) but were never woken, and send the reminders and escalations that are due (one delivery
    job per channel); returns how many conversations were re-enqueued."""
    desk = services()
    swept = _Swept()
    try:
        _recover_stalled(desk, swept)
        _wake_stranded(desk, swept)
        _find_due_work(desk, swept)
    finally:
        db.session.remove()
    _enqueue_swept(desk, swept)
    return len(swept.recovered)


def _recover_stalled(desk: Services, swept: _Swept) -> None:
    """Claim again, one commit each, the conversations whose move has no job that will still run it."""
    dispatcher = desk.dispatcher
    stalled = sweeper.stalled(db.session, grace_seconds=desk.config.sweep_interval_seconds)
    # Every job that may still run a stalled conversation's move, asked of Redis at once.
    candidates = [move_job_id(c.id, c.version, n) for c in stalled for n in {0, c.recoveries}]
    alive_jobs = dispatcher.alive_jobs(candidates, dispatcher.waiting_move_ids()) if stalled else set()
    for conversation in stalled:
        cid = conversation.id

        def alive(version: int, recoveries: int, cid=cid) -> bool:
            return move_job_id(cid, version) in alive_jobs or (
                recoveries > 0 and move_job_id(cid, version, recoveries) in alive_jobs
            )

        claim = sweeper.recover(db.session, conversation, alive)
        db.session.commit()
        if claim:
            swept.recovered.append((cid, *claim))


def _wake_stranded(desk: Services, swept: _Swept) -> None:
    """Settle the calls whose time to decide ran out, and wake the parked conversations that should be
    moving but were never woken; each wake-up is committed before its move is enqueued."""
    swept.woken += decisions.expire_due(db.session)
    db.session.commit()
    for conversation in sweeper.stranded(db.session, grace_seconds=desk.config.sweep_interval_seconds):
        cid, tenant_id = conversation.id, conversation.tenant_id
        version = agent_moves.wake(db.session, conversation)
        db.session.commit()
        if version is not None:
            swept.woken.append((cid, version, tenant_id))


def _find_due_work(desk: Services, swept: _Swept) -> None:
    """The notices due (marked sent in this transaction, so after its commit only the enqueues
    remain), the webhooks with work, whether batches wait, the runs with items left; and the packs'
    defaults recorded as in force (a looser release's held)."""
    swept.notices = [
        (call, tenant, kind) for kind in notify.KINDS for call, tenant in sweeper.due_notices(db.session, kind)
    ]
    swept.channels = notify.channel_ids_by_tenant(db.session, {tenant for _, tenant, _ in swept.notices})
    swept.webhooks_due = webhooks.with_work(db.session, utcnow())
    swept.batch_work = batch_pump.has_work(db.session)
    gate.record_defaults(db.session, desk.tools)
    swept.runs_to_start = list(
        db.session.scalars(select(Run.id).where(Run.started < Run.items, Run.cancelled_at.is_(None)))
    )
    db.session.commit()


def _enqueue_swept(desk: Services, swept: _Swept) -> None:
    """The jobs for what the sweep committed, and the periodic MCP check."""
    dispatcher = desk.dispatcher
    for call_id, tenant_id, kind in swept.notices:
        for channel_id in swept.channels.get(tenant_id, ()):
            dispatcher.enqueue_notice(channel_id, call_id, kind)
    for subscription_id in swept.webhooks_due:
        dispatcher.enqueue_webhooks(subscription_id)
    for cid, version, tenant_id in swept.woken:
        dispatcher.enqueue_move(cid, version)
        desk.live_events.changed(tenant_id, cid)
    for cid, version, recovery in swept.recovered:
        dispatcher.enqueue_move(cid, version, recovery)
        log.info("sweeper re-enqueued conversation %s at version %s", cid, version)
    if desk.config.mcp_check_seconds:
        dispatcher.enqueue_mcp_check(int(time.time() // desk.config.mcp_check_seconds))
    for run_id in swept.runs_to_start:  # (its job takes the run's row first: two at once start nothing twice)
        dispatcher.enqueue_run_start(run_id)
    if swept.batch_work:  # (the pump schedules itself while batches are open; this finds one Redis lost)
        dispatcher.enqueue_batch_pump()


@bind_job
def wake_for_tasks(conversation_id: int) -> bool:
    """Scheduled for when a parked conversation's next task is due: queue a move to hand the task back
    to its tool. Returns whether the conversation was woken (a moving one picks the task up itself)."""
    desk = services()
    try:
        conversation = db.session.get(Conversation, conversation_id)
        due = conversation is not None and sweeper.has_due_task(db.session, conversation_id)
        version = agent_moves.wake(db.session, conversation) if due else None
        tenant_id = conversation.tenant_id if conversation is not None else None
        db.session.commit()
    finally:
        db.session.remove()
    if version is None:
        return False
    desk.dispatcher.enqueue_move(conversation_id, version)
    desk.live_events.changed(tenant_id, conversation_id)
    return True
