"""Tenants and their people: accounts, roles and who keyed whom, the admin role asked for, API tokens,
sign-in sessions, and how a tenant's admins want the assistant to work."""

from __future__ import annotations

import secrets
from datetime import datetime

from sqlalchemy import Boolean, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from webapp.models.base import Base, JSONType, UTCDateTime, utcnow


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(primary_key=True)
    slug: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # the endpoint that serves this tenant's conversations; None: the configured default model
    endpoint_id: Mapped[int | None] = mapped_column(ForeignKey("model_endpoints.id"))
    # the small endpoint that classifies each new question (routing by difficulty); None: no routing
    small_endpoint_id: Mapped[int | None] = mapped_column(ForeignKey("model_endpoints.id"))
    # moved on by the database (triggers of migration 0023) with every change to who may use the tenant's
    # tools and to its MCP servers and their tools: a process keeps the tenant's registry and access
    # rules while it holds (webapp/runtime/services.py)
    tools_version: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class AssistantSettings(Base):
    """How a tenant's admins want the assistant to work: its register (one line), extra rules for its
    system prompt, and one tool call per reply. Every save is a new version; the newest is in force,
    and each model call records the version it was sent."""

    __tablename__ = "assistant_settings"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    version: Mapped[int] = mapped_column(Integer)
    register: Mapped[str] = mapped_column(String(200), default="")
    rules: Mapped[str] = mapped_column(Text, default="")
    one_call_per_reply: Mapped[bool] = mapped_column(Boolean, default=False)
    # routing rules, checked before the small model is asked: words (one a line) or a length in
    # characters past which a question is complex and goes to the large endpoint
    complex_words: Mapped[str | None] = mapped_column(Text)
    complex_length: Mapped[int | None] = mapped_column(Integer)
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (UniqueConstraint("tenant_id", "version", name="uq_assistant_settings_tenant_version"),)


# What a person does in their tenant. A person holds one or more of these, or is an operator.
ROLES = ("agent", "reviewer", "auditor", "admin")
# Runs the desk itself: the fleet's workers, queue and failed jobs (/ops) and its metrics (/metrics),
# never a tenant's conversations, approvals, audit log or admin pages. Operators are made only with
# `flask create-operator`, hold no other role, and belong to the operations tenant, which owns no data.
OPERATOR = "operator"
# The operations tenant's slug: outside identity.SLUG_RE on purpose, so no tenant a person or the
# command line makes (get_or_create_tenant) can ever be it.
OPERATIONS_SLUG = "~operations"


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    email: Mapped[str] = mapped_column(String(254), unique=True)
    display_name: Mapped[str] = mapped_column(String(200), default="")
    password_hash: Mapped[str] = mapped_column(String(255), default="")
    roles: Mapped[list] = mapped_column(JSONType, default=list)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    # Part of every session cookie; changing it (disable, password reset) ends all sessions at once.
    session_token: Mapped[str] = mapped_column(String(64), default=lambda: secrets.token_hex(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    tenant: Mapped[Tenant] = relationship()

    def has_role(self, role: str) -> bool:
        return role in (self.roles or [])

    @property
    def is_operator(self) -> bool:
        """Runs the desk's operations (fleet-wide) and belongs to no tenant that owns data."""
        return self.has_role(OPERATOR)

    # What Flask-Login asks of a user (kept here so the model needs no Flask import).
    is_authenticated = True
    is_anonymous = False

    @property
    def is_active(self) -> bool:
        return self.active

    def get_id(self) -> str:
        """The session's user id: the token changes when the user is disabled or their password reset."""
        return f"{self.id}:{self.session_token}"

    @property
    def label(self) -> str:
        return self.display_name or self.email


class UserKeying(Base):
    """Someone set another person's credentials or gave them a role (made the account, reset its
    password, issued it a token, granted it the admin role): the person keyed may hold what the one
    who keyed it knows, so an admin keyed by someone never decides that someone's loosenings."""

    __tablename__ = "user_keyings"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    by_user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    kind: Mapped[str] = mapped_column(String(32))  # created | password_reset | token_issued | role_granted
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class RoleChange(Base):
    """The admin role asked for a person (granted, on a new account, or given back after their
    credentials were reset by someone else): not in force until a second admin of the tenant who was
    not keyed by the requester, or an operator, approves it."""

    __tablename__ = "role_changes"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    role: Mapped[str] = mapped_column(String(32), default="admin")
    why: Mapped[str] = mapped_column(String(32))  # granted | created | password_reset | token_issued
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending|approved|rejected|withdrawn
    requested_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    requested_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    decided_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    decided_by_label: Mapped[str | None] = mapped_column(String(255))
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    reason: Mapped[str | None] = mapped_column(Text)

    user: Mapped[User] = relationship(foreign_keys=[user_id])
    requested_by: Mapped[User | None] = relationship(foreign_keys=[requested_by_id])
    decided_by: Mapped[User | None] = relationship(foreign_keys=[decided_by_id])


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex; the token is shown once
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # What people see of a token: the name its owner gave it and its first characters (never the rest).
    name: Mapped[str] = mapped_column(String(100), default="", server_default="")
    prefix: Mapped[str] = mapped_column(String(16), default="", server_default="", index=True)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # None: until revoked

    user: Mapped[User] = relationship()


class UserSession(Base):
    """One signed-in browser session. The cookie names it by a random key (only its sha256 is stored);
    signing out ends it for good, and it ends when idle longer than the idle limit (counted from the
    person's own last request) or older than the longest a session may last."""

    __tablename__ = "user_sessions"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
