"""The append-only audit log, hash-chained per tenant, and the last link of each chain."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from webapp.models.base import Base, JSONType, UTCDateTime, utcnow


class AuditEvent(Base):
    """One append-only audit record, hash-chained to the previous record of its chain (its tenant,
    or "global" for events outside any tenant such as a sign-in with an unknown email)."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    chain: Mapped[str] = mapped_column(String(32))
    seq: Mapped[int] = mapped_column(BigInteger)
    tenant_id: Mapped[int | None] = mapped_column(ForeignKey("tenants.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    action: Mapped[str] = mapped_column(String(64))
    actor_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    actor_label: Mapped[str | None] = mapped_column(String(254))
    conversation_id: Mapped[int | None] = mapped_column(Integer)
    tool_call_id: Mapped[int | None] = mapped_column(Integer)
    tool_name: Mapped[str | None] = mapped_column(String(128))
    outcome: Mapped[str | None] = mapped_column(String(32))
    data: Mapped[dict] = mapped_column(JSONType, default=dict)
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))

    __table_args__ = (
        UniqueConstraint("chain", "seq", name="uq_audit_events_chain_seq"),
        Index("ix_audit_events_tenant_time", "tenant_id", "created_at", "id"),
        Index("ix_audit_events_tenant_action", "tenant_id", "action", "id"),
        Index("ix_audit_events_conversation", "conversation_id", "id"),
        Index("ix_audit_events_actor", "actor_id", "id"),
        Index("ix_audit_events_tenant_id_order", "tenant_id", "id"),  # the audit page's keyset
        Index("ix_audit_events_tenant_tool", "tenant_id", "tool_name", "id"),
    )


class AuditHead(Base):
    """The last link of each chain; locking its row orders concurrent writers of one chain."""

    __tablename__ = "audit_heads"

    chain: Mapped[str] = mapped_column(String(32), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, default=0)
    hash: Mapped[str] = mapped_column(String(64))
