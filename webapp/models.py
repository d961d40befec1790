"""The database schema: plain SQLAlchemy 2 typed models, importable without Flask.

Flask-SQLAlchemy is handed this metadata in create_app(); the agent domain uses ordinary
sqlalchemy.orm.Session objects, so it stays free of Flask and RQ.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator):
    """Timestamps stored as UTC and always read back timezone-aware, on SQLite and PostgreSQL alike."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


JSONType = JSON().with_variant(JSONB(), "postgresql")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


# --- people -------------------------------------------------------------------------------------


class ModelEndpoint(Base):
    """A model endpoint an operator registered (`flask endpoint add`): an Anthropic-compatible server,
    the model to ask there, and how to talk to it. Its API key is stored encrypted, or read from the
    environment variable it names; none for local servers that ignore keys."""

    __tablename__ = "model_endpoints"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    base_url: Mapped[str] = mapped_column(String(500))
    model: Mapped[str] = mapped_column(String(120))
    protocol: Mapped[str] = mapped_column(String(16), default="tools")  # tools | react
    context_window: Mapped[int | None] = mapped_column(Integer)  # None: CONTEXT_WINDOW_TOKENS
    api_key_encrypted: Mapped[str | None] = mapped_column(Text)
    api_key_env: Mapped[str | None] = mapped_column(String(120))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class EndpointGrant(Base):
    """A tenant that may use a model endpoint: an operator allowed it (`flask endpoint allow`, the
    endpoint's page, or `flask tenant set-model`). Only then may the tenant's admins choose it, and
    only then does it serve the tenant; no row, no use (the operator's key is never a tenant's to take)."""

    __tablename__ = "endpoint_tenants"

    endpoint_id: Mapped[int] = mapped_column(ForeignKey("model_endpoints.id"), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), primary_key=True, index=True)
    granted_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


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
# The largest id a row can have: the tables' ids are INTEGER, 32-bit on PostgreSQL, which refuses to
# compare a larger number with them at all; so a larger id names nothing, and is never sent to it.
MAX_ROW_ID = 2**31 - 1
# The most money one call may move, in minor units (cents): every door refuses more (agent/gate.py).
MAX_MONEY_CENTS = 10**12


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


# --- the loop -----------------------------------------------------------------------------------


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


class McpServer(Base):
    """A Model Context Protocol server of a tenant: reached over streamable HTTP at `url` (added by the
    tenant's admins or an operator), or started by the desk from `command` (stdio, added only by an
    operator: the command line or /ops/mcp). `headers` are sent with every HTTP request: a list of
    {"name", "sealed", "operator"} (the value encrypted with a key derived from SECRET_KEY) or
    {"name", "env", "operator"} (read from that environment variable at each use; "operator" says an
    operator set it, else only a secret granted to the tenant is read, SecretGrant); values are never
    shown back.
    A started server's process gets PATH and `environment` only (the same {"name", "sealed"} or
    {"name", "env"} entries), in `working_directory` when set. `command_by_operator`: an operator
    set the command; a command a tenant's admin set before only operators could is never started.
    `version` goes up with every change to the server or its tools, so each process rebuilds the
    tenant's tool registry when it moves (webapp/runtime/services.py)."""

    __tablename__ = "mcp_servers"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(40))
    url: Mapped[str | None] = mapped_column(String(500))
    command: Mapped[str | None] = mapped_column(Text)
    headers: Mapped[list] = mapped_column(JSONType, default=list)
    environment: Mapped[list] = mapped_column(JSONType, default=list)
    working_directory: Mapped[str | None] = mapped_column(String(500))
    command_by_operator: Mapped[bool] = mapped_column(Boolean, default=False)
    version: Mapped[int] = mapped_column(Integer, default=1)
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    synced_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    tools: Mapped[list[McpTool]] = relationship(
        back_populates="server", cascade="all, delete-orphan", order_by="McpTool.remote_name"
    )

    __table_args__ = (UniqueConstraint("tenant_id", "name", name="uq_mcp_servers_tenant_name"),)


class SecretGrant(Base):
    """An environment variable the operator lets one tenant's admins name (an MCP server's header or
    environment, `$NAME`): a tenant admin can name only the secrets granted to their tenant."""

    __tablename__ = "secret_grants"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    granted_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    granted_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (UniqueConstraint("name", "tenant_id", name="uq_secret_grants_name_tenant"),)


class McpTool(Base):
    """One tool of an MCP server, as it joins its tenant's registry under `registry_name`. The
    description, input schema and annotations an admin accepted are what the model is offered; the
    server's current ones are kept beside them. When they differ (their fingerprints), the tool is
    `held`: not offered, and a call of it refused, until an admin accepts the change."""

    __tablename__ = "mcp_tools"

    id: Mapped[int] = mapped_column(primary_key=True)
    server_id: Mapped[int] = mapped_column(ForeignKey("mcp_servers.id", ondelete="CASCADE"), index=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    registry_name: Mapped[str] = mapped_column(String(128))
    remote_name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="")
    input_schema: Mapped[dict] = mapped_column(JSONType)
    annotations: Mapped[dict] = mapped_column(JSONType, default=dict)
    fingerprint: Mapped[str] = mapped_column(String(64))
    current_description: Mapped[str] = mapped_column(Text, default="")
    current_input_schema: Mapped[dict] = mapped_column(JSONType)
    current_annotations: Mapped[dict] = mapped_column(JSONType, default=dict)
    current_fingerprint: Mapped[str] = mapped_column(String(64))
    held: Mapped[bool] = mapped_column(Boolean, default=False)
    accepted_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    accepted_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # what an admin told the desk of its arguments (webapp/tools/mcp/mapping.py set_mapping): which is the money
    # it moves and in what unit, which names what it acts on, and a read-only tool of the same server
    # whose live result a reviewer sees as the facts: {"amount": {"argument", "unit"}, "subject":
    # {"argument"}, "facts": {"tool", "arguments": {its argument: the call's argument}}}
    mapping: Mapped[dict | None] = mapped_column(JSONType)

    server: Mapped[McpServer] = relationship(back_populates="tools")

    __table_args__ = (UniqueConstraint("tenant_id", "registry_name", name="uq_mcp_tools_tenant_registry_name"),)


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


class NotificationChannel(Base):
    """Where a tenant is told that calls wait: a webhook (Slack-compatible, signed with the tenant's
    secret, kept sealed) or e-mail to a list of addresses. At most one of each kind per tenant."""

    __tablename__ = "notification_channels"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    kind: Mapped[str] = mapped_column(String(16))  # webhook | email
    url: Mapped[str | None] = mapped_column(String(2000))  # webhook
    secret_sealed: Mapped[str | None] = mapped_column(Text)  # webhook: the signing secret (webapp/sealing.py)
    recipients: Mapped[list | None] = mapped_column(JSONType)  # email: addresses
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (UniqueConstraint("tenant_id", "kind", name="uq_notification_channels_tenant_kind"),)


class NotificationDelivery(Base):
    """One attempt to deliver one notice (a reminder, an escalation, a test) through one channel."""

    __tablename__ = "notification_deliveries"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    channel_id: Mapped[int | None] = mapped_column(ForeignKey("notification_channels.id"))  # NULL: removed since
    channel_kind: Mapped[str] = mapped_column(String(16))
    tool_call_id: Mapped[int | None] = mapped_column(ForeignKey("tool_calls.id"))  # NULL: a test
    kind: Mapped[str] = mapped_column(String(16))  # reminder | escalation | test
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    status: Mapped[str] = mapped_column(String(16))  # delivered | failed | skipped
    http_status: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)  # why it failed (an HTTP status, the SMTP server's answer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (
        Index("ix_notification_deliveries_tenant_id", "tenant_id", "id"),
        Index("ix_notification_deliveries_call", "tool_call_id", "channel_id", "kind"),
    )


class WebhookSubscription(Base):
    """A tenant's event webhook (webapp/webhooks.py): where the events it names are sent, signed with
    its own secret (kept sealed) as Standard Webhooks say. `through_seq`: the tenant's audit chain up to
    which events have been turned into its deliveries (the chain's seq is in commit order, gap-free)."""

    __tablename__ = "webhook_subscriptions"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    url: Mapped[str] = mapped_column(String(2000))
    events: Mapped[list] = mapped_column(JSONType)  # event types, e.g. ["approval.requested"]
    secret_sealed: Mapped[str] = mapped_column(Text)
    through_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # no more deliveries; its log stays


class WebhookDelivery(Base):
    """One event for one subscription: the body as sent (the same at every attempt and redelivery),
    where it stands, and its last attempt. Events of one conversation go out in order."""

    __tablename__ = "webhook_deliveries"

    id: Mapped[int] = mapped_column(primary_key=True)
    subscription_id: Mapped[int] = mapped_column(ForeignKey("webhook_subscriptions.id"))
    event_id: Mapped[str] = mapped_column(String(40))  # the webhook-id header: "evt_<audit event id>"
    event_type: Mapped[str] = mapped_column(String(64))
    conversation_id: Mapped[int | None] = mapped_column(Integer)  # the order key (None: the tenant's own)
    body: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending | delivered | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # pending: not before then
    http_status: Mapped[int | None] = mapped_column(Integer)  # of the last attempt
    error: Mapped[str | None] = mapped_column(Text)  # the last attempt's failure, in words
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        UniqueConstraint("subscription_id", "event_id", name="uq_webhook_deliveries_event"),
        Index("ix_webhook_deliveries_pending", "subscription_id", "status", "id"),
    )


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
