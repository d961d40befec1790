"""A conversation and what it is made of: its messages, the summaries of its older turns, and the
model calls that answered it."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from webapp.models.base import Base, JSONType, UTCDateTime, utcnow

if TYPE_CHECKING:
    from webapp.models.people import User


class Conversation(Base):
    __tablename__ = "conversations"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    title: Mapped[str] = mapped_column(String(200), default="")
    status: Mapped[str] = mapped_column(String(32), default="queued", index=True)
    # Bumped by every committed move and every web-side change; a move job carries the version it was
    # enqueued for, so a duplicate or stale job finds the version moved on and exits.
    version: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(120))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    recoveries: Mapped[int] = mapped_column(Integer, default=0)  # sweeper re-enqueues, for unique job ids
    moves_used: Mapped[int] = mapped_column(Integer, default=0)  # in the current run
    move_budget: Mapped[int] = mapped_column(Integer, default=25)
    run_tokens: Mapped[int] = mapped_column(BigInteger, default=0)  # tokens used in the current run
    token_budget: Mapped[int] = mapped_column(BigInteger, default=0)  # 0: none
    cancel_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cancel_requested_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    # why it was stopped when no one pressed Stop, in words for people ("ann@x's account was disabled")
    cancel_reason: Mapped[str | None] = mapped_column(String(200))
    stop_reason: Mapped[str | None] = mapped_column(String(32))  # of the last model call
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    # the current run's route when its tenant routes by difficulty: "small" or "large" and why
    # (None: not routed yet); every move of the run goes to that endpoint
    route: Mapped[str | None] = mapped_column(String(16))
    route_reason: Mapped[str | None] = mapped_column(String(160))
    # the outside agent whose one call this conversation holds (POST /api/calls, webapp/agent/outside.py):
    # it has no model and no moves, and is done when its call is decided; None: the desk's assistant
    source: Mapped[str | None] = mapped_column(String(64))
    # the bulk run this conversation is an item of (None: a conversation of its own); a batch run's
    # model moves go through the Message Batches API (webapp/agent/batches.py)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)

    user: Mapped[User] = relationship(foreign_keys=[user_id])

    __table_args__ = (Index("ix_conversations_tenant_updated", "tenant_id", "updated_at"),)


class Message(Base):
    """One persisted message row; consecutive rows of one role form one API message."""

    __tablename__ = "messages"

    id: Mapped[int] = mapped_column(primary_key=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id"))
    seq: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[list] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (UniqueConstraint("conversation_id", "seq", name="uq_messages_conversation_seq"),)


class Summary(Base):
    """The older turns of a conversation summarised by the model, so that what is sent stays inside
    the context window: the model is sent the newest summary, then the messages after `through_seq`.
    The messages it summarises stay as they were (rows are append-only)."""

    __tablename__ = "summaries"

    id: Mapped[int] = mapped_column(primary_key=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id"), index=True)
    through_seq: Mapped[int] = mapped_column(Integer)  # the last message it covers
    text: Mapped[str] = mapped_column(Text)
    tokens_before: Mapped[int] = mapped_column(Integer)  # the request's size that called for it
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ModelCall(Base):
    """Usage and timing of one model call."""

    __tablename__ = "model_calls"

    id: Mapped[int] = mapped_column(primary_key=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id"), index=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    model: Mapped[str] = mapped_column(String(120))
    request_id: Mapped[str | None] = mapped_column(String(120))
    stop_reason: Mapped[str | None] = mapped_column(String(32))
    input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cache_read_input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cache_creation_input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    latency_ms: Mapped[float] = mapped_column(default=0.0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # what the model saw: "answer" (a move of the conversation) or "summary" (compacting it), the
    # sha256 of the system prompt and of the tool definitions sent, and the summary it stood on
    purpose: Mapped[str] = mapped_column(String(16), default="answer")
    system_hash: Mapped[str | None] = mapped_column(String(64))
    tools_hash: Mapped[str | None] = mapped_column(String(64))
    summary_id: Mapped[int | None] = mapped_column(ForeignKey("summaries.id"))
    endpoint: Mapped[str | None] = mapped_column(String(64))  # the endpoint that served it; None: the default
    settings_version: Mapped[int | None] = mapped_column(Integer)  # the tenant's AssistantSettings in force
    # why that endpoint served it: "not routed", "small: classified simple", "large: rule 'refund'" ...
    route: Mapped[str | None] = mapped_column(String(160))
    # answered through the Message Batches API (priced at half the list price); its batch's id
    batch_id: Mapped[str | None] = mapped_column(String(120))
