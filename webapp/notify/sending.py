"""Sending a notice by webhook (through the outbound guard) or SMTP, and logging every attempt."""

from __future__ import annotations

import smtplib
import ssl
from dataclasses import dataclass

import httpx2
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from webapp import outbound
from webapp.agent.states import CallStatus
from webapp.config import Config
from webapp.models import NotificationChannel, NotificationDelivery, ToolCall, User, utcnow
from webapp.notify.channel import KINDS, ChannelError, channel_secret, signature, standard_headers
from webapp.notify.notices import Notice, email_message, notice_for, webhook_body
from webapp.tools.registry import ToolRegistry


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


def send_mail(config: Config, to: list[str], notice: Notice) -> Outcome:
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
    return send_mail(config, to, notice)


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
