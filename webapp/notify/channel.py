"""A tenant's notification channels: a webhook's address and secret (sealed) and its signature, e-mail
recipients, and what each channel was sent."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from datetime import datetime
from urllib.parse import urlsplit

from sqlalchemy import select
from sqlalchemy.orm import Session
from standardwebhooks import Webhook

from webapp import outbound
from webapp.config import Config
from webapp.database import ids_by_tenant, newest_of_tenant
from webapp.models import NotificationChannel, NotificationDelivery
from webapp.secrets import sealing

KINDS = ("reminder", "escalation")  # what the sweep sends; a "test" is sent from the admin page
CHANNEL_KINDS = ("webhook", "email")
SECRET_PURPOSE = "notification webhook secrets"
MAX_RECIPIENTS = 20
_EMAIL = re.compile(r"^[^@\s,;<>]+@[^@\s,;<>]+\.[^@\s,;<>]+$")


class ChannelError(ValueError):
    """A channel setting that cannot be saved; the message says what to fix."""


class DeliveryFailed(RuntimeError):
    """Raised by a delivery job whose attempt failed, so RQ retries it after its backoff."""


def webhook_url(raw: str, allow: Iterable[str]) -> str:
    """The webhook's address, checked: http(s), a host, no spaces, and an address the desk may call
    (`allow`: OUTBOUND_ALLOW). A ChannelError caused by an outbound.AddressRefused is a refusal."""
    url = (raw or "").strip()
    if not url:
        raise ChannelError("Give the webhook's address, e.g. https://hooks.slack.com/services/….")
    if len(url) > 2000:
        raise ChannelError("The webhook's address must be at most 2,000 characters.")
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        parts, host = None, None
    if parts is None or parts.scheme not in ("https", "http") or not host or any(c.isspace() for c in url):
        raise ChannelError(
            "The webhook's address must start with https:// (or http://) and name a host, with no spaces, "
            "e.g. https://hooks.slack.com/services/…."
        )
    if parts.username or parts.password:
        raise ChannelError("Leave the user name and password out of the webhook's address; the desk signs its calls.")
    try:
        outbound.check_url(url, allow)
    except outbound.OutboundError as exc:
        raise ChannelError(str(exc)) from exc
    return url


def recipients(raw: str) -> list[str]:
    """E-mail addresses, one a line (or separated by commas), checked."""
    found = [part.strip() for part in re.split(r"[\s,;]+", raw or "") if part.strip()]
    if not found:
        raise ChannelError("Give at least one e-mail address, one a line, e.g. approvals@example.com.")
    for address in found:
        if len(address) > 254 or not _EMAIL.match(address):
            raise ChannelError(f"“{address[:80]}” is not an e-mail address; write them like approvals@example.com.")
    unique = list(dict.fromkeys(address.lower() for address in found))
    if len(unique) > MAX_RECIPIENTS:
        raise ChannelError(f"At most {MAX_RECIPIENTS} addresses; use a mailing list for more.")
    return unique


def new_secret() -> str:
    """A webhook signing secret as Standard Webhooks make them: "whsec_" and 32 random bytes in base64
    (shown once, kept sealed). The whole string, prefix included, is what a receiver gives the
    `standardwebhooks` library."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def seal_secret(config: Config, secret: str) -> str:
    return sealing.seal(config.secret_key, SECRET_PURPOSE, secret)


def channel_secret(config: Config, channel: NotificationChannel) -> str:
    """The webhook's secret; ChannelError when SECRET_KEY changed since it was made."""
    try:
        return sealing.unseal(config.secret_key, SECRET_PURPOSE, channel.secret_sealed or "")
    except sealing.InvalidToken:
        raise ChannelError(
            "The webhook's secret cannot be read (the desk's SECRET_KEY changed); rotate the secret."
        ) from None


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """X-Desk-Signature for this body sent at this timestamp."""
    digest = hmac.new(secret.encode(), b"v1:" + timestamp.encode() + b":" + body, hashlib.sha256).hexdigest()
    return f"v1={digest}"


def standard_headers(secret: str, message_id: str, moment: datetime, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers of this body sent at this moment (none for a secret that is not
    base64 after its prefix: one made before the desk signed so)."""
    try:
        signed = Webhook(secret).sign(message_id, moment, body)
    except ValueError:  # (binascii.Error: not base64)
        return {}
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(moment.timestamp())),
        "webhook-signature": signed,
    }


def channels(session: Session, tenant_id: int) -> dict[str, NotificationChannel]:
    """The tenant's channels by kind."""
    rows = session.scalars(select(NotificationChannel).where(NotificationChannel.tenant_id == tenant_id))
    return {row.kind: row for row in rows}


def channel_ids_by_tenant(session: Session, tenant_ids: set[int]) -> dict[int, list[int]]:
    if not tenant_ids:
        return {}
    query = select(NotificationChannel.tenant_id, NotificationChannel.id).where(
        NotificationChannel.tenant_id.in_(tenant_ids)
    )
    return ids_by_tenant(session, query.order_by(NotificationChannel.id))


def recent_deliveries(session: Session, tenant_id: int, limit: int = 50) -> list[NotificationDelivery]:
    return newest_of_tenant(session, NotificationDelivery, NotificationDelivery.id, tenant_id, limit)
