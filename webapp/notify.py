"""Telling a tenant's people that tool calls wait for them: a reminder when a call has waited past its
policy's reminder time, an escalation to the tenant's admins when its time to decide nearly ran out.

A tenant's channels are a webhook (a Slack-compatible JSON body, signed with the tenant's secret) and
e-mail through the desk's SMTP server. The sweep marks what is due (agent/sweeper.py `due_notices`)
and enqueues one delivery job per channel; each job sends one notice here and logs the attempt in
`notification_deliveries`, and RQ retries a failed one with backoff. Messages are written for people:
the tool in words (tools/presenting.py), never the text written for the model.

A webhook reaches only public addresses (webapp/outbound.py; OUTBOUND_ALLOW names the exceptions):
its address is checked when saved and every send connects through the guard. What the receiver
answers is never shown beyond its HTTP status, and every failure to get an answer reads the same.

The webhook is signed twice. As the Standard Webhooks specification says (as the tenant's event
webhooks are, webapp/webhooks.py): `webhook-id` (the notice's, the same at every attempt),
`webhook-timestamp` and `webhook-signature: v1,<base64>`, which the `standardwebhooks` library checks
with the channel's `whsec_` secret. And, as before, as Slack signs its own requests: `X-Desk-Timestamp`
(Unix seconds) and `X-Desk-Signature: v1=<hex>`, the HMAC-SHA256 with the secret of
`v1:<timestamp>:<body>`. (A secret made before the first signature existed, not base64 after its
prefix, signs only the second: rotating it gives one that signs both.)
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import smtplib
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from email.message import EmailMessage
from urllib.parse import urlsplit

import httpx2
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from standardwebhooks import Webhook

from webapp import outbound, sealing
from webapp.agent.states import CallStatus
from webapp.config import Config
from webapp.models import NotificationChannel, NotificationDelivery, Tenant, ToolCall, User, utcnow
from webapp.tools.presenting import arguments, duration
from webapp.tools.registry import ToolRegistry

KINDS = ("reminder", "escalation")  # what the sweep sends; a "test" is sent from the admin page
CHANNEL_KINDS = ("webhook", "email")
SECRET_PURPOSE = "notification webhook secrets"
MAX_RECIPIENTS = 20
_EMAIL = re.compile(r"^[^@\s,;<>]+@[^@\s,;<>]+\.[^@\s,;<>]+$")


class ChannelError(ValueError):
    """A channel setting that cannot be saved; the message says what to fix."""


class DeliveryFailed(RuntimeError):
    """Raised by a delivery job whose attempt failed, so RQ retries it after its backoff."""


# --- the settings of a channel ------------------------------------------------------------------


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
    found: dict[int, list[int]] = {}
    if tenant_ids:
        rows = session.execute(
            select(NotificationChannel.tenant_id, NotificationChannel.id)
            .where(NotificationChannel.tenant_id.in_(tenant_ids))
            .order_by(NotificationChannel.id)
        )
        for tenant_id, channel_id in rows:
            found.setdefault(tenant_id, []).append(channel_id)
    return found


def recent_deliveries(session: Session, tenant_id: int, limit: int = 50) -> list[NotificationDelivery]:
    return list(
        session.scalars(
            select(NotificationDelivery)
            .where(NotificationDelivery.tenant_id == tenant_id)
            .order_by(NotificationDelivery.id.desc())
            .limit(limit)
        )
    )


# --- what a notice says --------------------------------------------------------------------------


@dataclass(frozen=True)
class Notice:
    kind: str  # reminder | escalation | test
    title: str  # the subject line, and the message's first line
    lines: tuple[str, ...]
    url: str  # the decision page (the inbox for a test)
    id: str = ""  # the webhook-id it is sent with: a call's reminder keeps it at every attempt

    @property
    def text(self) -> str:
        return "\n".join((self.title, *self.lines, f"Decide: {self.url}"))


def notice_for(session: Session, config: Config, tools: ToolRegistry, call: ToolCall, kind: str) -> Notice:
    """The reminder or the escalation of a waiting call, in words for people."""
    now = utcnow()
    tool = tools.get(call.name)
    title = tool.title if tool else call.name
    shown = [
        f"{item.label}: {item.text}" for item in arguments(tool.argument_names() if tool else [], call.input or {})
    ]
    shown = [line if len(line) <= 200 else line[:199] + "…" for line in shown]
    requester = session.get(User, call.acting_user_id)
    waited = duration((now - call.created_at).total_seconds())
    asker = f"the outside agent {call.source}" if call.source else "the assistant"
    lines = [f"{title}, asked by {asker} for {requester.label if requester else 'someone'}.", *shown]
    lines.append(f"Waiting for a decision for {waited}.")
    if call.expires_at is not None:
        left = duration((call.expires_at - now).total_seconds())
        lines.append(f"Expires at {call.expires_at:%Y-%m-%d %H:%M} UTC (in {left}); then nothing is done.")
    if kind == "escalation":
        heading = f"Escalation: “{title}” is about to expire undecided (waiting {waited})"
    else:
        heading = f"Reminder: “{title}” has waited {waited} for a decision"
    return Notice(kind, heading, tuple(lines), f"{config.public_url}/approvals/{call.id}", f"ntf_{kind}_{call.id}")


def test_notice(config: Config, tenant: Tenant) -> Notice:
    return Notice(
        "test",
        f"Test from the approval desk of {tenant.name}",
        ("This channel works: reminders of calls waiting for a decision, and escalations, will arrive here.",),
        f"{config.public_url}/approvals",
        f"ntf_test_{secrets.token_hex(8)}",
    )


def webhook_body(notice: Notice) -> bytes:
    """Slack-compatible: `text` for notifications and clients without blocks, `blocks` for the message."""
    blocks = [
        {"type": "header", "text": {"type": "plain_text", "text": notice.title[:150]}},
        {"type": "section", "text": {"type": "plain_text", "text": "\n".join(notice.lines)[:3000]}},
        {
            "type": "actions",
            "elements": [
                {
                    "type": "button",
                    "text": {"type": "plain_text", "text": "Open the decision page"},
                    "url": notice.url,
                    **({"style": "danger"} if notice.kind == "escalation" else {}),
                }
            ],
        },
    ]
    mark = ":rotating_light: " if notice.kind == "escalation" else ""
    return json.dumps({"text": f"{mark}{notice.title}: {notice.url}", "blocks": blocks}).encode()


def email_message(config: Config, notice: Notice, to: list[str]) -> EmailMessage:
    message = EmailMessage()
    message["Subject"] = notice.title
    message["From"] = config.smtp_from
    message["To"] = ", ".join(to)
    if notice.kind == "escalation":
        message["Importance"] = "high"
    message.set_content(notice.text + "\n")
    return message


# --- sending ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    delivered: bool
    http_status: int | None = None
    error: str | None = None
    retry: bool = True  # worth trying again (False: a setting must change first)


def send_webhook(config: Config, channel: NotificationChannel, notice: Notice) -> Outcome:
    try:
        secret = channel_secret(config, channel)
    except ChannelError as exc:
        return Outcome(False, error=str(exc), retry=False)
    body = webhook_body(notice)
    moment = utcnow()
    timestamp = str(int(moment.timestamp()))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "approval-desk",
        **standard_headers(secret, notice.id, moment, body),
        "X-Desk-Timestamp": timestamp,
        "X-Desk-Signature": signature(secret, timestamp, body),
        "X-Desk-Kind": notice.kind,
    }
    seconds = config.notify_timeout_seconds
    try:
        with outbound.client(config.outbound_allow, timeout=seconds) as client:
            with client.stream("POST", channel.url, content=body, headers=headers) as response:
                status = response.status_code  # the body is never read: what a receiver says is not repeated
    except outbound.OutboundError as exc:  # a setting to change, not worth another try
        return Outcome(False, error=str(exc), retry=False)
    except httpx2.HTTPError:
        return Outcome(
            False,
            error=f"The webhook could not be reached ({outbound.no_answer(seconds)}). Check its address, and that "
            "the receiver is up.",
        )
    if 200 <= status < 300:
        return Outcome(True, status)
    return Outcome(
        False,
        status,
        f"The webhook answered HTTP {status} (its receiver's own log says why).",
        retry=status in (408, 425, 429) or status >= 500,
    )


def send_email(config: Config, to: list[str], notice: Notice) -> Outcome:
    if not config.smtp_host:
        return Outcome(False, error="No SMTP server is set up for the desk (SMTP_HOST); ask its operator.", retry=False)
    if not to:
        return Outcome(False, error="Nobody to write to: the e-mail channel has no addresses.", retry=False)
    try:
        with smtplib.SMTP(config.smtp_host, config.smtp_port, timeout=config.notify_timeout_seconds) as smtp:
            if config.smtp_starttls:
                smtp.starttls(context=ssl.create_default_context())
            if config.smtp_username:
                smtp.login(config.smtp_username, config.smtp_password or "")
            refused = smtp.send_message(email_message(config, notice, to))
    except smtplib.SMTPRecipientsRefused as exc:
        return Outcome(False, error=f"The SMTP server refused every address: {_refusals(exc.recipients)}", retry=False)
    except smtplib.SMTPResponseException as exc:
        answer = exc.smtp_error.decode(errors="replace") if isinstance(exc.smtp_error, bytes) else str(exc.smtp_error)
        return Outcome(False, error=f"The SMTP server answered {exc.smtp_code} {answer}"[:500])
    except (smtplib.SMTPException, OSError) as exc:
        where = f"{config.smtp_host}:{config.smtp_port}"
        return Outcome(False, error=f"Could not send through {where}: {exc or type(exc).__name__}"[:500])
    if refused:
        return Outcome(True, error=f"Delivered, but the SMTP server refused {_refusals(refused)}")
    return Outcome(True)


def _refusals(refused: dict) -> str:
    parts = []
    for address, (code, answer) in refused.items():
        text = answer.decode(errors="replace") if isinstance(answer, bytes) else str(answer)
        parts.append(f"{address} ({code} {text})")
    return "; ".join(parts)[:400]


def admin_addresses(session: Session, tenant_id: int) -> list[str]:
    """Where an escalation is e-mailed: the tenant's active admins."""
    people = session.scalars(select(User).where(User.tenant_id == tenant_id, User.active.is_(True)).order_by(User.id))
    return [person.email for person in people if person.has_role("admin")]


def send(session: Session, config: Config, channel: NotificationChannel, notice: Notice) -> Outcome:
    """Send one notice through one channel (an escalation e-mail goes to the tenant's admins)."""
    if channel.kind == "webhook":
        return send_webhook(config, channel, notice)
    to = list(channel.recipients or [])
    if notice.kind == "escalation":
        to = admin_addresses(session, channel.tenant_id) or to
    return send_email(config, to, notice)


def record(
    session: Session, channel: NotificationChannel, call_id: int | None, kind: str, outcome: Outcome, attempt: int
) -> NotificationDelivery:
    row = NotificationDelivery(
        tenant_id=channel.tenant_id,
        channel_id=channel.id,
        channel_kind=channel.kind,
        tool_call_id=call_id,
        kind=kind,
        attempt=attempt,
        status="delivered" if outcome.delivered else "failed",
        http_status=outcome.http_status,
        error=outcome.error,
    )
    session.add(row)
    session.flush()
    return row


def deliver(
    session: Session, config: Config, tools: ToolRegistry, channel_id: int, call_id: int, kind: str
) -> tuple[NotificationDelivery | None, Outcome | None]:
    """One attempt to send a call's reminder or escalation through one channel, logged. Nothing is
    sent for a channel removed since, or a call of another tenant; a call decided since is logged as
    skipped. The caller commits."""
    channel = session.get(NotificationChannel, channel_id)
    call = session.get(ToolCall, call_id)
    if channel is None or call is None or call.tenant_id != channel.tenant_id or kind not in KINDS:
        return None, None
    attempt = 1 + session.scalar(
        select(func.count(NotificationDelivery.id)).where(
            NotificationDelivery.channel_id == channel.id,
            NotificationDelivery.tool_call_id == call.id,
            NotificationDelivery.kind == kind,
        )
    )
    if call.status != CallStatus.AWAITING_APPROVAL:
        outcome = Outcome(True, error="Not sent: the call was decided (or expired) before it could be.", retry=False)
        row = record(session, channel, call.id, kind, outcome, attempt)
        row.status = "skipped"
        return row, outcome
    outcome = send(session, config, channel, notice_for(session, config, tools, call, kind))
    return record(session, channel, call.id, kind, outcome, attempt), outcome
