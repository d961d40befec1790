"""A tenant's subscriptions: made with a secret each (sealed), listed, found, removed; which tenants
have any and which subscriptions have deliveries to send."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import String, cast, select
from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.config import Config
from webapp.database import ids_by_tenant
from webapp.models import AuditHead, User, WebhookDelivery, WebhookSubscription, utcnow
from webapp.notify import ChannelError, new_secret, webhook_url
from webapp.secrets import sealing
from webapp.webhooks.events import EVENT_TYPES

SECRET_PURPOSE = "event webhook secrets"
MAX_SUBSCRIPTIONS = 20  # per tenant


class WebhookError(ValueError):
    """A subscription that cannot be made; the message says what to fix."""


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
    in_force = WebhookSubscription.deleted_at.is_(None)
    query = select(WebhookSubscription.tenant_id, WebhookSubscription.id).where(in_force)
    return ids_by_tenant(session, query.order_by(WebhookSubscription.id))


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
