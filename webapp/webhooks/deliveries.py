"""From the tenant's chain to deliveries: collected past the subscription's place, which may go now
in order, an attempt claimed, signed and sent, settled with its retries, sent again on request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx2
from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session
from standardwebhooks import Webhook

from webapp import audit_chain, outbound
from webapp.config import Config
from webapp.models import AuditEvent, User, WebhookDelivery, WebhookSubscription, utcnow
from webapp.secrets import sealing
from webapp.webhooks.events import ACTIONS, envelope, event_id, event_of
from webapp.webhooks.subscriptions import SECRET_PURPOSE

SENDING_LEASE = timedelta(minutes=2)  # an attempt whose worker died is tried again after this
COLLECT_BATCH = 500  # audit events read at a time
SEND_BATCH = 100  # deliveries looked at a time
SENDS_AT_ONCE = 8  # deliveries of different conversations a job sends at the same time


def collect(session: Session, subscription: WebhookSubscription) -> int:
    """Turn the tenant's events past the subscription's place on its chain into deliveries (the types
    it subscribed to), moving its place on; how many deliveries were made. The caller holds the
    subscription's row locked, so two collectors never make the same delivery twice."""
    made = 0
    wanted = set(subscription.events)
    while True:
        events = list(
            session.scalars(
                select(AuditEvent)
                .where(AuditEvent.chain == str(subscription.tenant_id), AuditEvent.seq > subscription.through_seq)
                .order_by(AuditEvent.seq)
                .limit(COLLECT_BATCH)
            )
        )
        if not events:
            return made
        now = utcnow()
        for event in events:
            found = event_of(event) if event.action in ACTIONS else None
            if found is None or found[0] not in wanted:
                continue
            event_type, data = found
            session.add(
                WebhookDelivery(
                    subscription_id=subscription.id,
                    event_id=event_id(event),
                    event_type=event_type,
                    conversation_id=event.conversation_id,
                    body=envelope(event_type, event, data),
                    status="pending",
                    attempts=0,
                    next_attempt_at=now,
                    created_at=now,
                )
            )
            made += 1
        subscription.through_seq = events[-1].seq
        session.flush()


def sendable(session: Session, subscription_id: int, now: datetime) -> list[WebhookDelivery]:
    """The pending deliveries that may go now, oldest first: due, and with nothing earlier of their
    conversation still pending (which holds them back, to keep the order)."""
    ready: list[WebhookDelivery] = []
    held: set[int | None] = set()
    after = 0
    while len(ready) < SEND_BATCH:
        batch = list(
            session.scalars(
                select(WebhookDelivery)
                .where(
                    WebhookDelivery.subscription_id == subscription_id,
                    WebhookDelivery.status == "pending",
                    WebhookDelivery.id > after,
                )
                .order_by(WebhookDelivery.id)
                .limit(SEND_BATCH)
                # as the database has them now (an admin's redelivery may have changed one this job read)
                .execution_options(populate_existing=True)
            )
        )
        if not batch:
            break
        for delivery in batch:
            if delivery.conversation_id in held:
                continue
            held.add(delivery.conversation_id)  # its later events wait for this one
            if delivery.next_attempt_at is None or delivery.next_attempt_at <= now:
                ready.append(delivery)
        after = batch[-1].id
    return ready


def take(session: Session, deliveries: Sequence[WebhookDelivery], now: datetime) -> list[WebhookDelivery]:
    """Claim an attempt of each delivery that is still pending and due, in one statement (another
    job's claim moved its time on, so two jobs never send one at once); each attempt is counted and
    its delivery due again after SENDING_LEASE, in case this worker dies sending. The ones claimed."""
    if not deliveries:
        return []
    claimed = set(
        session.scalars(
            update(WebhookDelivery)
            .where(
                WebhookDelivery.id.in_([delivery.id for delivery in deliveries]),
                WebhookDelivery.status == "pending",
                or_(WebhookDelivery.next_attempt_at.is_(None), WebhookDelivery.next_attempt_at <= now),
            )
            .values(attempts=WebhookDelivery.attempts + 1, next_attempt_at=now + SENDING_LEASE)
            .returning(WebhookDelivery.id)
            .execution_options(synchronize_session=False)
        )
    )
    taken = [delivery for delivery in deliveries if delivery.id in claimed]
    for delivery in taken:  # (the statement left the objects as they were)
        delivery.attempts += 1
    return taken


@dataclass(frozen=True)
class Attempt:
    delivered: bool
    http_status: int | None = None
    error: str | None = None


def send(config: Config, subscription: WebhookSubscription, delivery: WebhookDelivery) -> Attempt:
    """POST the delivery's body to the subscription's address, signed (webhook-id, webhook-timestamp,
    webhook-signature: v1,<base64>). Only a 2xx is delivered; the receiver's body is never read."""
    try:
        secret = sealing.unseal(config.secret_key, SECRET_PURPOSE, subscription.secret_sealed)
    except sealing.InvalidToken:
        return Attempt(
            False, error="The webhook's secret cannot be read (the desk's SECRET_KEY changed); make it again."
        )
    moment = utcnow()
    signature = Webhook(secret).sign(delivery.event_id, moment, delivery.body)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "approval-desk",
        "webhook-id": delivery.event_id,
        "webhook-timestamp": str(int(moment.timestamp())),
        "webhook-signature": signature,
    }
    seconds = config.notify_timeout_seconds
    try:
        with outbound.client(config.outbound_allow, timeout=seconds) as client:
            with client.stream("POST", subscription.url, content=delivery.body.encode(), headers=headers) as response:
                status = response.status_code
    except outbound.OutboundError as exc:
        return Attempt(False, error=str(exc))
    except httpx2.HTTPError:
        return Attempt(False, error=f"The webhook could not be reached ({outbound.no_answer(seconds)}).")
    if 200 <= status < 300:
        return Attempt(True, status)
    return Attempt(False, status, f"The webhook answered HTTP {status} (its receiver's own log says why).")


def settle(delivery: WebhookDelivery, attempt: Attempt, retries: Sequence[float], now: datetime) -> None:
    """Record an attempt: delivered; or due again after the next of `retries` (seconds); or, past the
    last, failed (the conversation's later events then go on)."""
    delivery.http_status, delivery.error = attempt.http_status, attempt.error
    if attempt.delivered:
        delivery.status, delivery.delivered_at, delivery.next_attempt_at = "delivered", now, None
    elif delivery.attempts > len(retries):
        delivery.status, delivery.next_attempt_at = "failed", None
    else:
        delivery.next_attempt_at = now + timedelta(seconds=retries[delivery.attempts - 1])


def redeliver(session: Session, actor: User, delivery: WebhookDelivery) -> None:
    """Send a delivery again, the same body under the same id, at the next job (a delivered or failed
    one as a new series of attempts); audited."""
    delivery.status, delivery.attempts, delivery.next_attempt_at = "pending", 0, utcnow()
    audit_chain.record(
        session,
        "webhook_redelivered",
        tenant_id=actor.tenant_id,
        actor=actor,
        data={"webhook_id": delivery.subscription_id, "delivery_id": delivery.id, "event_id": delivery.event_id},
    )


def next_due(session: Session, subscription_id: int) -> datetime | None:
    """When the subscription's next pending delivery is due (None: nothing is pending)."""
    return session.scalar(
        select(func.min(WebhookDelivery.next_attempt_at)).where(
            WebhookDelivery.subscription_id == subscription_id, WebhookDelivery.status == "pending"
        )
    )
