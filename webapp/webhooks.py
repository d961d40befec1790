"""Event webhooks: what happened in a tenant, sent to the addresses its admins subscribe, signed as the
Standard Webhooks specification says (https://www.standardwebhooks.com), so a receiver verifies each
with the off-the-shelf `standardwebhooks` library and the subscription's `whsec_...` secret.

The events are the tenant's audit chain read again: every change the desk makes is audited in the
transaction that makes it, and a chain's `seq` is given under a lock on its head, so a chain's events
commit in seq order with no gap. A subscription keeps `through_seq`, how far along its tenant's
chain it has turned events into deliveries; `collect` reads on from there. Nothing is written in a
move for a webhook, and no event is lost between a commit and a send: a delivery is made from what
committed.

A delivery is sent at least once: retried after each of WEBHOOK_RETRY_INTERVALS (about a day in all),
then marked failed. Events of one conversation go out in their order: one not yet delivered holds back the
conversation's later ones (for that subscription only). The body is built once, when the delivery is
made, so every attempt and every redelivery sends the same bytes under the same `webhook-id`.

The jobs that run this (jobs/webhooks.py `deliver`) are enqueued after a commit that
audited an event of a subscribed tenant, and by every sweep for subscriptions with work left.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx2
from sqlalchemy import String, cast, func, or_, select, update
from sqlalchemy.orm import Session
from standardwebhooks import Webhook

from webapp import audit_chain, outbound, sealing
from webapp.agent.decisions import arguments_hash
from webapp.config import Config
from webapp.models import AuditEvent, AuditHead, User, WebhookDelivery, WebhookSubscription, utcnow
from webapp.notify import ChannelError, new_secret, webhook_url

# The event types (a contract: names integrators subscribe to), each with what it says.
EVENT_TYPES = {
    "approval.requested": "A tool call waits for a decision.",
    "approval.decided": "A person approved (perhaps with edited arguments) or rejected a call, or it expired.",
    "approval.reminder": "A call has waited past its policy's reminder time.",
    "approval.escalated": "A call's time to decide has nearly run out.",
    "conversation.awaiting_approval": "A conversation stopped to wait for decisions on its calls.",
    "conversation.completed": "The assistant answered and the conversation is done until someone writes again.",
    "conversation.failed": "A conversation failed; `error` says why.",
    "task.finished": "A long-running task of a tool call ended (done, failed or timed out).",
    "policy.changed": "A tool's policy changed (in force now).",
}
# The audit actions that are events; the rest of the chain is read past.
ACTIONS = frozenset(
    {
        "approval_requested",
        "approval_decided",
        "approval_expired",
        "approval_reminded",
        "approval_escalated",
        "conversation_waiting",
        "conversation_completed",
        "conversation_failed",
        "task_finished",
        "policy_changed",
    }
)
SENDING_LEASE = timedelta(minutes=2)  # an attempt whose worker died is tried again after this
SECRET_PURPOSE = "event webhook secrets"
MAX_SUBSCRIPTIONS = 20  # per tenant
COLLECT_BATCH = 500  # audit events read at a time
SEND_BATCH = 100  # deliveries looked at a time
SENDS_AT_ONCE = 8  # deliveries of different conversations a job sends at the same time


class WebhookError(ValueError):
    """A subscription that cannot be made; the message says what to fix."""


# --- events --------------------------------------------------------------------------------------


def event_of(event: AuditEvent) -> tuple[str, dict] | None:
    """The webhook event an audit event is (its type and its data), or None when it is none."""
    data = event.data or {}
    call = {
        "call_id": event.tool_call_id,
        "conversation_id": event.conversation_id,
        "tool": event.tool_name,
        "source": data.get("source"),  # the outside agent that asked (webapp/agent/outside.py); None: the assistant
    }
    if event.action == "approval_requested":
        asked = data.get("input") or {}
        return "approval.requested", call | {"input": asked, "arguments_hash": arguments_hash(asked)}
    if event.action in ("approval_decided", "approval_expired"):
        edited = data.get("edited_to")
        return "approval.decided", call | {
            "decision": data.get("decision") or "expired",
            "decided_by": event.actor_label if event.action == "approval_decided" else None,
            "reason": data.get("reason") or None,
            "input": edited if edited is not None else data.get("input"),
            "edited": edited is not None,
            "status": event.outcome,  # approved, rejected, expired; awaiting_approval while more must approve
            "approvals": data.get("approvals"),
            "approvals_required": data.get("approvals_required"),
        }
    if event.action in ("approval_reminded", "approval_escalated"):
        kind = "approval.reminder" if event.action == "approval_reminded" else "approval.escalated"
        return kind, call | {"expires_at": data.get("expires_at")}
    if event.action == "conversation_waiting":
        if event.outcome != "awaiting_approval":
            return None
        return "conversation.awaiting_approval", {"conversation_id": event.conversation_id}
    if event.action == "conversation_completed":
        return "conversation.completed", {
            "conversation_id": event.conversation_id,
            "stop_reason": data.get("stop_reason"),
        }
    if event.action == "conversation_failed":
        return "conversation.failed", {
            "conversation_id": event.conversation_id,
            "error": {"code": data.get("code"), "message": data.get("message")},
        }
    if event.action == "task_finished":
        return "task.finished", call | {"status": event.outcome}
    if event.action == "policy_changed":
        after = data.get("after") or {}
        return "policy.changed", {
            "tool": event.tool_name,
            "policy": after,
            "changed_by": event.actor_label,
            "change_id": data.get("change_id"),
        }
    return None


def envelope(event_type: str, event: AuditEvent, data: dict) -> str:
    """The body as sent: {"type", "timestamp", "data"}."""
    return json.dumps(
        {"type": event_type, "timestamp": event.created_at.isoformat(), "data": data},
        separators=(",", ":"),
        sort_keys=True,
    )


def event_id(event: AuditEvent) -> str:
    return f"evt_{event.id}"


# --- subscriptions -------------------------------------------------------------------------------


def checked_events(events: Sequence[str]) -> list[str]:
    unknown = [name for name in events if name not in EVENT_TYPES]
    if unknown:
        raise WebhookError(
            f"No event is called {', '.join(repr(name) for name in unknown)}; the events are "
            + ", ".join(EVENT_TYPES)
            + "."
        )
    if not events:
        raise WebhookError("Name at least one event to send, e.g. approval.requested.")
    return list(dict.fromkeys(events))


def subscribe(
    session: Session, config: Config, actor: User, url: str, events: Sequence[str]
) -> tuple[WebhookSubscription, str]:
    """A new subscription of the actor's tenant (from the next event on), audited; and its secret,
    which is shown this once. WebhookError says what to change."""
    events = checked_events(events)
    try:
        url = webhook_url(url, config.outbound_allow)
    except ChannelError as exc:
        raise WebhookError(str(exc)) from exc
    if len(subscriptions(session, actor.tenant_id)) >= MAX_SUBSCRIPTIONS:
        raise WebhookError(f"A tenant has at most {MAX_SUBSCRIPTIONS} webhooks; remove one first.")
    # From the next event on: the chain's head as this transaction sees it (a commit in between is
    # collected too, which sends one event more, never one less).
    head = session.scalar(select(AuditHead.seq).where(AuditHead.chain == str(actor.tenant_id)))
    secret = new_secret()  # (the reminder channel's kind: whsec_ and base64)
    subscription = WebhookSubscription(
        tenant_id=actor.tenant_id,
        url=url,
        events=events,
        secret_sealed=sealing.seal(config.secret_key, SECRET_PURPOSE, secret),
        through_seq=head or 0,
        created_by_id=actor.id,
    )
    session.add(subscription)
    session.flush()
    audit_chain.record(
        session,
        "webhook_subscribed",
        tenant_id=actor.tenant_id,
        actor=actor,
        data={"webhook_id": subscription.id, "url": url, "events": events},
    )
    return subscription, secret


def subscriptions(session: Session, tenant_id: int) -> list[WebhookSubscription]:
    """The tenant's subscriptions in force, oldest first."""
    return list(
        session.scalars(
            select(WebhookSubscription)
            .where(WebhookSubscription.tenant_id == tenant_id, WebhookSubscription.deleted_at.is_(None))
            .order_by(WebhookSubscription.id)
        )
    )


def find(
    session: Session, tenant_id: int, subscription_id: int, removed_too: bool = False
) -> WebhookSubscription | None:
    """The tenant's subscription; with `removed_too`, one removed since as well (its log stays readable)."""
    query = select(WebhookSubscription).where(
        WebhookSubscription.id == subscription_id, WebhookSubscription.tenant_id == tenant_id
    )
    return session.scalar(query if removed_too else query.where(WebhookSubscription.deleted_at.is_(None)))


def unsubscribe(session: Session, actor: User, subscription: WebhookSubscription) -> None:
    """No more deliveries to it (its log stays readable by id); audited."""
    subscription.deleted_at = utcnow()
    audit_chain.record(
        session,
        "webhook_removed",
        tenant_id=actor.tenant_id,
        actor=actor,
        data={"webhook_id": subscription.id, "url": subscription.url},
    )


def tenants_subscribed(session: Session) -> dict[int, list[int]]:
    """Every tenant with a subscription in force, and their ids."""
    found: dict[int, list[int]] = {}
    rows = session.execute(
        select(WebhookSubscription.tenant_id, WebhookSubscription.id)
        .where(WebhookSubscription.deleted_at.is_(None))
        .order_by(WebhookSubscription.id)
    )
    for tenant_id, subscription_id in rows:
        found.setdefault(tenant_id, []).append(subscription_id)
    return found


def with_work(session: Session, now: datetime) -> list[int]:
    """The subscriptions with something to do: events past their place on the chain, or a delivery
    due. (What a sweep enqueues a job for.)"""
    behind = (
        select(WebhookSubscription.id)
        .join(AuditHead, AuditHead.chain == cast(WebhookSubscription.tenant_id, String))
        .where(WebhookSubscription.deleted_at.is_(None), AuditHead.seq > WebhookSubscription.through_seq)
    )
    due = (
        select(WebhookDelivery.subscription_id)
        .join(WebhookSubscription, WebhookSubscription.id == WebhookDelivery.subscription_id)
        .where(
            WebhookSubscription.deleted_at.is_(None),
            WebhookDelivery.status == "pending",
            WebhookDelivery.next_attempt_at <= now,
        )
    )
    return sorted(set(session.scalars(behind)) | set(session.scalars(due)))


# --- from the chain to deliveries ----------------------------------------------------------------


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
