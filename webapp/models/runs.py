"""Bulk runs: a run, its items, and a batch run's model moves parked for the Message Batches API."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import Boolean, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from webapp.models.base import Base, JSONType, UTCDateTime, utcnow

if TYPE_CHECKING:
    from webapp.models.people import User


class Run(Base):
    """A bulk run: many items, each the first question of a conversation of its own, owned by the
    person who started the run (webapp/runs/). With `batch`, its conversations' model moves go
    through the Message Batches API."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    title: Mapped[str] = mapped_column(String(200), default="")  # the uploaded file's name, say
    batch: Mapped[bool] = mapped_column(Boolean, default=False)
    items: Mapped[int] = mapped_column(Integer, default=0)
    started: Mapped[int] = mapped_column(Integer, default=0)  # items that have their conversation
    cancelled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cancelled_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    user: Mapped[User] = relationship(foreign_keys=[user_id])


class RunItem(Base):
    """One item of a run, as it came; its conversation once the run started it."""

    __tablename__ = "run_items"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    position: Mapped[int] = mapped_column(Integer)  # from 1, in the order given
    message: Mapped[str] = mapped_column(Text)
    conversation_id: Mapped[int | None] = mapped_column(ForeignKey("conversations.id"))

    __table_args__ = (UniqueConstraint("run_id", "position", name="uq_run_items_run_position"),)


class BatchRequest(Base):
    """A batch run's model move, parked until the Message Batches API answers it: the request as it
    is sent, the batch it went in, and the answer, which the conversation's next move takes as the
    model's reply (webapp/agent/batches.py)."""

    __tablename__ = "batch_requests"

    id: Mapped[int] = mapped_column(primary_key=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id"), index=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    version: Mapped[int] = mapped_column(Integer)  # the conversation's version while it waits
    params: Mapped[dict] = mapped_column(JSONType)  # the Messages request, as one item of a batch
    endpoint: Mapped[str | None] = mapped_column(String(64))  # the endpoint that serves it; None: the default
    # waiting (to be sent) | sending | sent | succeeded | errored | expired | canceled | discarded
    status: Mapped[str] = mapped_column(String(16), default="waiting", index=True)
    batch_id: Mapped[str | None] = mapped_column(String(120), index=True)
    result: Mapped[dict | None] = mapped_column(JSONType)  # the reply, for succeeded
    error: Mapped[str | None] = mapped_column(Text)  # the sentence for people, for the others
    answer_version: Mapped[int | None] = mapped_column(Integer)  # the move that takes the answer
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    done_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
