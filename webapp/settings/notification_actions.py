"""What tenant admins do with their notification channels, shared by the Notifications page: where the
tenant is told that calls wait (a webhook, signed with a secret the desk makes and returns once; e-mail to
a list of addresses), a test message per channel, a channel removed. Each change is audited and
committed; a ChannelError (webapp/notify/) says what is wrong with what was typed."""

from __future__ import annotations

from urllib.parse import urlsplit

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from webapp import audit_chain, notify
from webapp.config import Config
from webapp.models import NotificationChannel, NotificationDelivery, User, utcnow
from webapp.settings import SettingsRefused
from webapp.settings.outbound_refusals import audit_refused_address


def _channel_data(channel: NotificationChannel) -> dict:
    """What the audit log keeps of a channel: the webhook's host (its address may carry a token), the
    e-mail addresses; never the secret."""
    if channel.kind == "webhook":
        return {"channel_id": channel.id, "kind": "webhook", "host": urlsplit(channel.url or "").hostname}
    return {"channel_id": channel.id, "kind": "email", "recipients": list(channel.recipients or [])}


def _saved(session: Session, actor: User, channel: NotificationChannel, action: str) -> None:
    try:
        session.flush()
        audit_chain.record(session, action, tenant_id=actor.tenant_id, actor=actor, data=_channel_data(channel))
        session.commit()
    except IntegrityError:  # another admin made this channel a moment ago
        session.rollback()
        raise notify.ChannelError(
            "Another admin has just set this channel up; reload the page and try again."
        ) from None


def save_webhook(session: Session, config: Config, actor: User, url: str) -> tuple[NotificationChannel, str | None]:
    """Set the tenant's webhook address; a new webhook gets a signing secret, returned this once
    (None when only the address changed). ChannelError says what is wrong with the address; a
    refused address is audited."""
    try:
        url = notify.webhook_url(url, config.outbound_allow)
    except notify.ChannelError as exc:
        audit_refused_address(session, exc, "webhook", actor.tenant_id, actor)
        raise
    channel = notify.channels(session, actor.tenant_id).get("webhook")
    secret = None
    if channel is None:
        secret = notify.new_secret()
        channel = NotificationChannel(
            tenant_id=actor.tenant_id, kind="webhook", secret_sealed=notify.seal_secret(config, secret)
        )
        channel.created_by_id = actor.id
        session.add(channel)
    channel.url, channel.updated_at = url, utcnow()
    _saved(session, actor, channel, "notification_channel_saved")
    return channel, secret


def rotate_webhook_secret(session: Session, config: Config, actor: User) -> str:
    """A new signing secret for the tenant's webhook, returned this once; the old one stops at once."""
    channel = notify.channels(session, actor.tenant_id).get("webhook")
    if channel is None:
        raise SettingsRefused("missing", "not_found", "There is no webhook to rotate the secret of; set one up first.")
    secret = notify.new_secret()
    channel.secret_sealed, channel.updated_at = notify.seal_secret(config, secret), utcnow()
    _saved(session, actor, channel, "notification_secret_rotated")
    return secret


def save_email(session: Session, actor: User, addresses: str) -> NotificationChannel:
    """Set the addresses the tenant's reminders are e-mailed to. ChannelError names a bad one."""
    found = notify.recipients(addresses)
    channel = notify.channels(session, actor.tenant_id).get("email")
    if channel is None:
        channel = NotificationChannel(tenant_id=actor.tenant_id, kind="email", created_by_id=actor.id)
        session.add(channel)
    channel.recipients, channel.updated_at = found, utcnow()
    _saved(session, actor, channel, "notification_channel_saved")
    return channel


def remove_channel(session: Session, actor: User, kind: str) -> bool:
    """Stop notifying through this channel; its deliveries stay in the log. False if there was none."""
    channel = notify.channels(session, actor.tenant_id).get(kind)
    if channel is None:
        return False
    session.execute(
        update(NotificationDelivery).where(NotificationDelivery.channel_id == channel.id).values(channel_id=None)
    )
    data = _channel_data(channel)
    session.delete(channel)
    audit_chain.record(session, "notification_channel_removed", tenant_id=actor.tenant_id, actor=actor, data=data)
    session.commit()
    return True


def send_test(session: Session, config: Config, actor: User, kind: str) -> NotificationDelivery:
    """Send a test message through the channel now and log it; the delivery says how it went."""
    channel = notify.channels(session, actor.tenant_id).get(kind)
    if channel is None:
        raise SettingsRefused("missing", "not_found", "There is no such channel to test; set it up first.")
    outcome = notify.send(session, config, channel, notify.test_notice(config, actor.tenant))
    row = notify.record(session, channel, None, "test", outcome, 1)
    session.commit()
    return row
