"""What tenant admins do with their event webhooks, for the API (and the Notifications page): subscribe,
remove, read the delivery log, send a delivery again. Each change is audited and committed; what
cannot be done is a SettingsRefused saying what to fix, with nothing written (an address the outbound guard
refuses is audited, as for every door to the outside). The events and their delivery are
webapp/webhooks/."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from webapp import webhooks
from webapp.models import User, WebhookDelivery, WebhookSubscription
from webapp.runtime.services import services
from webapp.settings import SettingsRefused
from webapp.settings.outbound_refusals import audit_refused_address
from webapp.web.pagination import Page, keyset_page


def subscribe(session: Session, admin: User, url: str, events: Sequence[str]) -> tuple[WebhookSubscription, str]:
    """A new subscription and its secret (shown this once)."""
    desk = services()
    try:
        subscription, secret = webhooks.subscribe(session, desk.config, admin, url, events)
    except webhooks.WebhookError as exc:
        session.rollback()
        audit_refused_address(session, exc, "webhook", admin.tenant_id, admin)
        raise SettingsRefused("invalid", "invalid_webhook", str(exc)) from None
    session.commit()
    desk.subscribed.forget()  # this process sends its next events at once
    return subscription, secret


def find(session: Session, admin: User, subscription_id: int, removed_too: bool = False) -> WebhookSubscription:
    """The tenant's webhook (with `removed_too`, one removed since too); 404 for any other."""
    subscription = webhooks.find(session, admin.tenant_id, subscription_id, removed_too)
    if subscription is None:
        raise SettingsRefused("missing", "not_found", f"No webhook {subscription_id} in your account.")
    return subscription


def remove(session: Session, admin: User, subscription_id: int) -> WebhookSubscription:
    subscription = find(session, admin, subscription_id)
    webhooks.unsubscribe(session, admin, subscription)
    session.commit()
    services().subscribed.forget()
    return subscription


def deliveries(session: Session, admin: User, subscription_id: int, cursor: str | None, size: int) -> Page:
    """The subscription's deliveries, newest first (raises BadCursor); a removed one's log stays readable."""
    find(session, admin, subscription_id, removed_too=True)
    return keyset_page(
        session,
        select(WebhookDelivery).where(WebhookDelivery.subscription_id == subscription_id),
        [WebhookDelivery.id],
        cursor,
        size,
        key_values=lambda delivery: (delivery.id,),
    )


def redeliver(session: Session, admin: User, subscription_id: int, delivery_id: int) -> WebhookDelivery:
    """Send one delivery again (the same body and id), at once."""
    find(session, admin, subscription_id)
    delivery = session.scalar(
        select(WebhookDelivery).where(
            WebhookDelivery.id == delivery_id, WebhookDelivery.subscription_id == subscription_id
        )
    )
    if delivery is None:
        raise SettingsRefused("missing", "not_found", f"No delivery {delivery_id} of webhook {subscription_id}.")
    webhooks.redeliver(session, admin, delivery)
    session.commit()
    services().dispatcher.enqueue_webhooks(subscription_id)
    return delivery
