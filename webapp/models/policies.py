"""When a tool's calls wait for people, and who may use it: policies and their changes waiting for a
second admin, the defaults of pack tools, operators' ceilings, access per tenant."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from webapp.models.base import Base, JSONType, UTCDateTime, utcnow

if TYPE_CHECKING:
    from webapp.models.people import User


class ToolPolicy(Base):
    """When a tool's calls wait for people, and how many, in one tenant. Every change bumps the version;
    each call keeps a copy of the policy it was flagged under."""

    __tablename__ = "tool_policies"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    tool_name: Mapped[str] = mapped_column(String(128))
    mode: Mapped[str] = mapped_column(String(32))  # never | always | above_amount
    amount_threshold_cents: Mapped[int | None] = mapped_column(Integer)
    approvals_required: Mapped[int] = mapped_column(Integer, default=1)
    ttl_seconds: Mapped[int] = mapped_column(Integer, default=24 * 3600)
    # how long a call waits before the tenant's channels are reminded; NULL: the default (agent/policies.py)
    remind_after_seconds: Mapped[int | None] = mapped_column(Integer)
    # what may run with no person, added up (webapp/agent/policies.py Limits); NULL: the tool's defaults
    limits: Mapped[dict | None] = mapped_column(JSONType)
    version: Mapped[int] = mapped_column(Integer, default=1)
    updated_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (UniqueConstraint("tenant_id", "tool_name", name="uq_tool_policies_tenant_tool"),)


class PolicyChange(Base):
    """A change to a tool's policy that would let calls wait less than before (a rule, a threshold,
    fewer approvals, a limit raised or cleared, an accepted MCP change that loosens its hints). It is
    not in force until a second admin of the tenant, or an operator, approves it (webapp/accounts/
    policy_actions.py); tightening needs no such row."""

    __tablename__ = "policy_changes"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    tool_name: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending|approved|rejected|withdrawn|superseded
    # the policy's settings as asked (mode, amount_threshold_cents, approvals_required, ttl_seconds,
    # limits, remind_after_seconds), the policy in force when asked (its snapshot), and its version
    proposed: Mapped[dict] = mapped_column(JSONType)
    before: Mapped[dict] = mapped_column(JSONType)
    base_version: Mapped[int] = mapped_column(Integer)
    loosens: Mapped[list] = mapped_column(JSONType)  # what lets calls wait less, in sentences for people
    source: Mapped[str] = mapped_column(String(32), default="policy")  # policy | mcp_change
    requested_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    requested_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    decided_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    decided_by_label: Mapped[str | None] = mapped_column(String(255))  # "command line" for the operator's CLI
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    reason: Mapped[str | None] = mapped_column(Text)
    applied_version: Mapped[int | None] = mapped_column(Integer)

    requested_by: Mapped[User | None] = relationship(foreign_keys=[requested_by_id])
    decided_by: Mapped[User | None] = relationship(foreign_keys=[decided_by_id])


class ToolDefault(Base):
    """The default policy in force for a pack's tool (its settings, as policies.settings keeps them),
    recorded by the sweep: a release whose default for the tool is looser stays `held` until an
    operator accepts it (`flask policy-defaults accept`), and the recorded one stays in force; a
    stricter one is in force at once (agent/gate.py)."""

    __tablename__ = "tool_defaults"

    tool_name: Mapped[str] = mapped_column(String(128), primary_key=True)
    settings: Mapped[dict] = mapped_column(JSONType)
    held: Mapped[dict | None] = mapped_column(JSONType)  # the release's looser default, not in force
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ToolCeiling(Base):
    """An operator's ceiling on one tool, for every tenant: above this amount no policy lets a call run
    without a person. No row: the tool's own default (Tool.ceiling_cents); a row with NULL: none."""

    __tablename__ = "tool_ceilings"

    id: Mapped[int] = mapped_column(primary_key=True)
    tool_name: Mapped[str] = mapped_column(String(128), unique=True)
    ceiling_cents: Mapped[int | None] = mapped_column(Integer)
    set_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    set_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ToolAccess(Base):
    """Who may have the assistant use a tool in one tenant: everyone (no row), only the people who hold
    one of `roles` or are among `user_ids`, or no one (the tool is disabled). The model is offered
    only the tools a conversation's owner may use."""

    __tablename__ = "tool_access"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    tool_name: Mapped[str] = mapped_column(String(128))
    who: Mapped[str] = mapped_column(String(16))  # everyone | chosen | nobody
    roles: Mapped[list] = mapped_column(JSONType, default=list)
    user_ids: Mapped[list] = mapped_column(JSONType, default=list)
    version: Mapped[int] = mapped_column(Integer, default=1)
    updated_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (UniqueConstraint("tenant_id", "tool_name", name="uq_tool_access_tenant_tool"),)
