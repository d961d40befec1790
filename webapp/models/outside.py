"""Agents that run elsewhere: the tools they declare and what they sent with a call they asked about."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, ForeignKey, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from webapp.models.base import Base, JSONType, UTCDateTime, utcnow


class ExternalTool(Base):
    """A tool an agent that runs elsewhere asks about (PUT /api/external-tools/<name>): what it does,
    the JSON schema of its arguments, and which argument is the money it moves (in `amount_unit`) and
    which names what it acts on. It joins its tenant's registry for policies, limits and edits, is
    never offered to the desk's own model, and runs in the agent's code, not here."""

    __tablename__ = "external_tools"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    name: Mapped[str] = mapped_column(String(128))
    description: Mapped[str] = mapped_column(Text, default="")
    input_schema: Mapped[dict] = mapped_column(JSONType)
    amount_argument: Mapped[str | None] = mapped_column(String(128))
    amount_unit: Mapped[str] = mapped_column(String(8), default="cents")  # cents | dollars
    subject_argument: Mapped[str | None] = mapped_column(String(128))
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (UniqueConstraint("tenant_id", "name", name="uq_external_tools_tenant_name"),)


class ExternalCall(Base):
    """What an outside agent sent with a call it asked about (POST /api/calls), beside the call's row:
    who it is, what the reviewer should know (its words, shown as the agent's), the key that makes a
    repeated request the same call, and what the agent reported once it ran the call."""

    __tablename__ = "external_calls"

    tool_call_id: Mapped[int] = mapped_column(ForeignKey("tool_calls.id"), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    asked_by_id: Mapped[int] = mapped_column(ForeignKey("users.id"))  # whose token asked: keys are theirs
    source: Mapped[str] = mapped_column(String(64))
    context: Mapped[str] = mapped_column(Text, default="")
    facts: Mapped[list] = mapped_column(JSONType, default=list)  # [{"label", "value"}], as the agent sent them
    idempotency_key: Mapped[str] = mapped_column(String(200))
    request_hash: Mapped[str] = mapped_column(String(64))  # of the request, to tell a repeat from a reuse of its key
    outcome_ok: Mapped[bool | None] = mapped_column(Boolean)  # None: not reported
    outcome_summary: Mapped[str | None] = mapped_column(Text)
    outcome_output: Mapped[dict | list | str | None] = mapped_column(JSONType)
    outcome_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (
        UniqueConstraint("tenant_id", "asked_by_id", "idempotency_key", name="uq_external_calls_asker_key"),
    )
