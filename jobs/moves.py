"""The move job and the sweeper job. Both run inside the worker's app context (see webapp.worker)."""

from __future__ import annotations

import logging
import os
import socket

from rq import get_current_job

from webapp.agent import decisions, moves, sweeper
from webapp.agent.moves import advance
from webapp.extensions import db
from webapp.logs import bind_job
from webapp.models import Conversation
from webapp.queue import move_job_id
from webapp.services import services

log = logging.getLogger(__name__)


@bind_job
def advance_conversation(conversation_id: int, version: int) -> str:
    """Make the conversation's next move if it is still at this version; enqueue the one after."""
    desk = services()
    job = get_current_job()
    owner = f"{socket.gethostname()}:{os.getpid()}:{job.id if job else 'inline'}"
    try:
        result = advance(
            db.session,
            conversation_id,
            version,
            owner=owner,
            make_loop=desk.loop,
            lease_seconds=desk.config.lease_seconds,
            final_attempt=not (job and job.retries_left),
        )
    finally:
        db.session.remove()
    if result.next_version is not None:
        desk.dispatcher.enqueue_move(conversation_id, result.next_version)
    if result.wake_at is not None:
        desk.dispatcher.schedule_wake(conversation_id, result.wake_at)
    if result.tenant_id is not None:
        desk.dispatcher.changed(result.tenant_id, conversation_id, move_done=True)
    return result.outcome


@bind_job
def sweep() -> int:
    """Re-enqueue every conversation that should be moving but has no live move, settle the tool calls
    whose time to decide ran out, and wake parked conversations that should be moving (a task due, a
    call approved) but were never woken; returns how many conversations were re-enqueued."""
    desk = services()
    dispatcher = desk.dispatcher
    recovered = []
    try:
        for conversation in sweeper.stalled(db.session, grace_seconds=desk.config.sweep_interval_seconds):
            cid = conversation.id

            def alive(version: int, recoveries: int, cid=cid) -> bool:
                return dispatcher.job_alive(move_job_id(cid, version)) or (
                    recoveries > 0 and dispatcher.job_alive(move_job_id(cid, version, recoveries))
                )

            claim = sweeper.recover(db.session, conversation, alive)
            db.session.commit()
            if claim:
                recovered.append((cid, *claim))
        woken = list(decisions.expire_due(db.session))
        db.session.commit()
        for conversation in sweeper.stranded(db.session, grace_seconds=desk.config.sweep_interval_seconds):
            cid, tenant_id = conversation.id, conversation.tenant_id
            version = moves.wake(db.session, conversation)
            db.session.commit()
            if version is not None:
                woken.append((cid, version, tenant_id))
    finally:
        db.session.remove()
    for cid, version, tenant_id in woken:
        dispatcher.enqueue_move(cid, version)
        dispatcher.changed(tenant_id, cid)
    for cid, version, recovery in recovered:
        dispatcher.enqueue_move(cid, version, recovery)
        log.info("sweeper re-enqueued conversation %s at version %s", cid, version)
    return len(recovered)


@bind_job
def wake_for_tasks(conversation_id: int) -> bool:
    """Scheduled for when a parked conversation's next task is due: queue a move to hand it back to
    its tool. Returns whether the conversation was woken (a moving one picks the task up itself)."""
    desk = services()
    try:
        conversation = db.session.get(Conversation, conversation_id)
        due = conversation is not None and sweeper.has_due_task(db.session, conversation_id)
        version = moves.wake(db.session, conversation) if due else None
        tenant_id = conversation.tenant_id if conversation is not None else None
        db.session.commit()
    finally:
        db.session.remove()
    if version is None:
        return False
    desk.dispatcher.enqueue_move(conversation_id, version)
    desk.dispatcher.changed(tenant_id, conversation_id)
    return True
