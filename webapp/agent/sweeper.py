"""Finding conversations that should be moving but are not, and handing them a fresh move.

A worker that died holds a lease that expires; a job that Redis lost (or that was never enqueued
because the process died between commit and enqueue) leaves a queued conversation with no job.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.agent.states import MOVING, CallStatus, ConversationStatus
from webapp.models import Conversation, ToolCall, utcnow


def stalled(
    session: Session, grace_seconds: float, limit: int = 500, tenant_id: int | None = None
) -> list[Conversation]:
    """Conversations whose lease expired, or queued without a lease for longer than the grace (of
    one tenant, for its operations page, or of all)."""
    now = utcnow()
    scope = [Conversation.tenant_id == tenant_id] if tenant_id is not None else []
    return list(
        session.scalars(
            select(Conversation)
            .where(
                *scope,
                Conversation.status.in_(MOVING),
                or_(
                    Conversation.lease_expires_at < now,
                    and_(
                        Conversation.lease_owner.is_(None),
                        Conversation.updated_at < now - timedelta(seconds=grace_seconds),
                    ),
                ),
            )
            .order_by(Conversation.updated_at)
            .limit(limit)
        )
    )


def recover(
    session: Session, conversation: Conversation, job_alive: Callable[[int, int], bool]
) -> tuple[int, int] | None:
    """Claim the right to re-enqueue this conversation's move (compare-and-set on its recovery
    counter); returns (version, recovery number) to enqueue after commit, or None to leave it."""
    lease_expired = conversation.lease_expires_at is not None and conversation.lease_expires_at < utcnow()
    if not lease_expired and job_alive(conversation.version, conversation.recoveries):
        return None
    recovery = conversation.recoveries + 1
    done = session.execute(
        update(Conversation)
        .where(
            Conversation.id == conversation.id,
            Conversation.version == conversation.version,
            Conversation.recoveries == conversation.recoveries,
            Conversation.status.in_(MOVING),
        )
        .values(
            recoveries=recovery,
            lease_owner=None,
            lease_expires_at=None,
            status=ConversationStatus.QUEUED,
            updated_at=utcnow(),
        )
        .execution_options(synchronize_session=False)
    ).rowcount
    return (conversation.version, recovery) if done else None


def _due_tasks(now):
    return (ToolCall.status == CallStatus.AWAITING_TASK) & (
        ToolCall.task_input.is_not(None) | (ToolCall.task_due_at <= now)
    )


def has_due_task(session: Session, conversation_id: int) -> bool:
    """Whether a call of the conversation waits on a task that should be handed back to its tool now."""
    return (
        session.scalar(
            select(ToolCall.id).where(ToolCall.conversation_id == conversation_id, _due_tasks(utcnow())).limit(1)
        )
        is not None
    )


def stranded(session: Session, grace_seconds: float, limit: int = 500) -> list[Conversation]:
    """Parked conversations that should be moving for longer than the grace: a task is due (its
    wake-up was lost: Redis restarted, or the process died between its commit and scheduling it), or
    a call was approved and nothing woke the conversation (the process died before enqueueing)."""
    late = utcnow() - timedelta(seconds=grace_seconds)
    approved = (ToolCall.status == CallStatus.APPROVED) & (ToolCall.decided_at <= late)
    return list(
        session.scalars(
            select(Conversation)
            .where(
                Conversation.status.in_((ConversationStatus.AWAITING_APPROVAL, ConversationStatus.AWAITING_TASK)),
                Conversation.id.in_(select(ToolCall.conversation_id).where(_due_tasks(late) | approved)),
            )
            .limit(limit)
        )
    )


# A waiting call's reminder and escalation: each column holds when it is due, and the sweep that
# sends it sets it to NULL in the same UPDATE that finds it.
NOTICE_DUE = {"reminder": (ToolCall.remind_at, "reminded_at"), "escalation": (ToolCall.escalate_at, "escalated_at")}


NOTICE_ACTIONS = {"reminder": "approval_reminded", "escalation": "approval_escalated"}


def due_notices(session: Session, kind: str, limit: int = 500) -> list[tuple[int, int]]:
    """Mark the waiting calls whose reminder (or escalation) is due as sent, audit each (what the
    tenant's event webhooks send as approval.reminder or approval.escalated), and return them as
    (call id, tenant id). One guarded UPDATE: a call is returned to exactly one sweep, however many run
    at once (a second finds its column already NULL; PostgreSQL re-checks the condition on the row
    another sweep just updated)."""
    due_at, sent_at = NOTICE_DUE[kind]
    now = utcnow()
    waiting = (ToolCall.status == CallStatus.AWAITING_APPROVAL, due_at <= now)
    batch = select(ToolCall.id).where(*waiting).order_by(due_at).limit(limit).scalar_subquery()
    rows = session.execute(
        update(ToolCall)
        .where(ToolCall.id.in_(batch), *waiting)
        .values({due_at.key: None, sent_at: now})
        .returning(ToolCall.id, ToolCall.tenant_id, ToolCall.conversation_id, ToolCall.name, ToolCall.expires_at)
        .execution_options(synchronize_session=False)
    ).all()
    for call_id, tenant_id, conversation_id, name, expires_at in sorted(rows):
        audit_chain.record(
            session,
            NOTICE_ACTIONS[kind],
            tenant_id=tenant_id,
            actor_label="approval desk",
            conversation_id=conversation_id,
            tool_call_id=call_id,
            tool_name=name,
            outcome=CallStatus.AWAITING_APPROVAL,
            data={"expires_at": expires_at.isoformat() if expires_at else None},
        )
    return [(call_id, tenant_id) for call_id, tenant_id, *_ in rows]
