"""Telling a tenant: reminder and escalation channels with their delivery log, and event webhooks with
theirs."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from webapp.models.base import Base, JSONType, UTCDateTime, utcnow


class NotificationChannel(Base):
    """Where a tenant is told that calls wait: a webhook (Slack-compatible, signed with the tenant's
    secret, kept sealed) or e-mail to a list of addresses. At most one of each kind per tenant."""

    __tablename__ = "notification_channels"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    kind: Mapped[str] = mapped_column(String(16))  # webhook | email
    url: Mapped[str | None] = mapped_column(String(2000))  # webhook
    secret_sealed: Mapped[str | None] = mapped_column(Text)  # webhook: the signing secret (webapp/secrets/sealing.py)
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
    """A tenant's event webhook (webapp/webhooks/): where the events it names are sent, signed with
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
