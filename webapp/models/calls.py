"""Tool calls, as the model asked for them, and the people's decisions on them."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import BigInteger, Boolean, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from webapp.models.base import Base, JSONType, UTCDateTime, utcnow

if TYPE_CHECKING:
    from webapp.models.people import User


class ToolCall(Base):
    """One row per tool_use block the model emitted; it carries the call's state and its result."""

    __tablename__ = "tool_calls"

    id: Mapped[int] = mapped_column(primary_key=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id"))
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    message_id: Mapped[int] = mapped_column(ForeignKey("messages.id"))
    position: Mapped[int] = mapped_column(Integer)  # index among the message's tool_use blocks
    tool_use_id: Mapped[str] = mapped_column(String(128))
    name: Mapped[str] = mapped_column(String(128))
    input: Mapped[dict] = mapped_column(JSONType)
    status: Mapped[str] = mapped_column(String(32), index=True)
    acting_user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    # the money it moves and what it acts on ("customer:4471"), as its tool says (Tool.amount,
    # Tool.subject), for above-amount rules and the limits per subject
    money_cents: Mapped[int | None] = mapped_column(BigInteger)  # non-negative whole cents, at most MAX_MONEY_CENTS
    subject: Mapped[str | None] = mapped_column(String(200))
    # The reviewer whose edit widened the call (a higher amount, another subject, an argument added):
    # they count as the one who asked, so their approval does not count and another reviewer's must.
    widened_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    requires_approval: Mapped[bool] = mapped_column(Boolean, default=False)
    approvals_required: Mapped[int] = mapped_column(Integer, default=0)
    policy: Mapped[dict | None] = mapped_column(JSONType)  # the policy (with its version) that flagged it
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, index=True)
    original_input: Mapped[dict | None] = mapped_column(JSONType)  # the model's arguments, when a person edited them
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    result: Mapped[str | None] = mapped_column(Text)  # the tool_result content the model receives
    is_error: Mapped[bool] = mapped_column(Boolean, default=False)
    decided_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    decision_reason: Mapped[str | None] = mapped_column(Text)
    # who is reviewing it now, while it waits, and until when (a claim others see and may take over)
    claimed_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    claimed_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # while it waits: when to remind the tenant's channels and when to escalate to its admins (each
    # set to NULL by the sweep that sends it, so it is sent once), and when each was sent
    remind_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    escalate_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    reminded_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    escalated_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    duration_ms: Mapped[float | None] = mapped_column()
    # An open task (webapp/tools/tasks.py) while the call waits on one; the last state once settled.
    task: Mapped[dict | None] = mapped_column(JSONType)
    task_due_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # when the loop looks at it again
    task_progress_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # its last change
    task_input: Mapped[str | None] = mapped_column(Text)  # a person's input, until the loop hands it over
    source: Mapped[str | None] = mapped_column(String(64))  # its conversation's: the outside agent that asked
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    decided_by: Mapped[User | None] = relationship(foreign_keys=[decided_by_id])
    claimed_by: Mapped[User | None] = relationship(foreign_keys=[claimed_by_id])

    __table_args__ = (
        UniqueConstraint("conversation_id", "tool_use_id", name="uq_tool_calls_conversation_tool_use_id"),
        Index("ix_tool_calls_conversation_message", "conversation_id", "message_id", "position"),
        # the inbox: a tenant's waiting calls, oldest first
        Index("ix_tool_calls_tenant_status_created", "tenant_id", "status", "created_at", "id"),
        # the sweeper: waiting tasks that are due
        Index("ix_tool_calls_status_task_due", "status", "task_due_at"),
        # /metrics: tool calls by status, oldest first
        Index("ix_tool_calls_status_created", "status", "created_at"),
        # a policy's limits: one tool's recent calls in a tenant
        Index("ix_tool_calls_tenant_name_created", "tenant_id", "name", "created_at"),
        # the sweep: waiting calls whose reminder or escalation is due
        Index("ix_tool_calls_status_remind", "status", "remind_at"),
        Index("ix_tool_calls_status_escalate", "status", "escalate_at"),
    )


class Decision(Base):
    """One person's decision on one tool call (append-only). A call needing N approvals collects N rows."""

    __tablename__ = "decisions"

    id: Mapped[int] = mapped_column(primary_key=True)
    tool_call_id: Mapped[int] = mapped_column(ForeignKey("tool_calls.id"), index=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    reviewer_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    decision: Mapped[str] = mapped_column(String(16))  # approve | reject
    reason: Mapped[str | None] = mapped_column(Text)
    arguments_hash: Mapped[str] = mapped_column(String(64))  # of the arguments the decision is about
    edited_input: Mapped[dict | None] = mapped_column(JSONType)
    policy_version: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    reviewer: Mapped[User] = relationship()

    __table_args__ = (UniqueConstraint("tool_call_id", "reviewer_id", name="uq_decisions_call_reviewer"),)
