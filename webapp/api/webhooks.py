"""/api/webhooks: event webhooks, subscribed to event types and signed as Standard Webhooks say, and
their deliveries, read and sent again; with the bodies those routes take and answer. The bodies the
webhooks are sent are in events.py."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from flask import g
from pydantic import BaseModel, Field, Strict
from sqlalchemy import select

from webapp import webhooks
from webapp.api.base import answer, bp, documented
from webapp.api.bodies import NO_NUL, QueryParameters, RequestBody, Rule, Timestamp
from webapp.api.paging import Cursor, NextCursor, a_page, page_limit
from webapp.api.reading import body, optional_body, query
from webapp.models import User, WebhookDelivery, WebhookSubscription
from webapp.runtime.extensions import db
from webapp.settings import webhook_actions
from webapp.web.security import api_roles
from webapp.webhooks import EVENT_TYPES

# --- requests -----------------------------------------------------------------------------------------

# The event types as one enumeration of the document (a generated client's EventType).
EventType = StrEnum("EventType", {name.replace(".", "_").upper(): name for name in EVENT_TYPES})


class CreateWebhook(RequestBody):
    """Send the tenant's events of these types to this address, signed as Standard Webhooks say (admins)."""

    url: Annotated[
        str,
        Field(min_length=1, max_length=2000, pattern=NO_NUL, description="An https:// address the desk may call."),
        Rule("must be the receiver's address, like https://example.com/hooks/desk"),
    ]
    events: Annotated[
        # (each not strict: a strict enum takes only its members, and JSON sends their values as strings)
        list[Annotated[EventType, Strict(False)]],
        Field(min_length=1, max_length=len(EVENT_TYPES), description="The event types to send."),
        Rule("must be a list of event types: " + ", ".join(EVENT_TYPES)),
    ]


class RemoveWebhook(RequestBody):
    """Removing a webhook takes no fields; a body, if sent, must be an empty JSON object."""


class DeliveriesQuery(QueryParameters):
    """A page of a webhook's deliveries, newest first."""

    cursor: Cursor = None
    limit: page_limit("Deliveries", 50) = None


# --- answers ------------------------------------------------------------------------------------------


class WebhookView(BaseModel):
    """An event webhook of the tenant: where its events go (never its secret, which is shown once)."""

    id: int
    url: str
    events: list[str]
    created_by: str | None = Field(description="The email of the admin who made it.")
    created_at: Timestamp
    deleted_at: Timestamp | None = Field(description="When it was removed; null while it is in force.")

    @classmethod
    def of(cls, subscription: WebhookSubscription, created_by: str | None) -> WebhookView:
        return cls(
            id=subscription.id,
            url=subscription.url,
            events=list(subscription.events),
            created_by=created_by,
            created_at=subscription.created_at,
            deleted_at=subscription.deleted_at,
        )


class WebhookCreated(WebhookView):
    """A new event webhook, with its signing secret: shown this once, kept sealed. Give the whole
    string, `whsec_` included, to the `standardwebhooks` library's Webhook(secret)."""

    secret: str = Field(description="The signing secret, whsec_ and base64.")


class WebhookList(BaseModel):
    webhooks: list[WebhookView]


class WebhookDeliveryView(BaseModel):
    """One event's delivery to a webhook: where it stands and its last attempt."""

    id: int
    event_id: str = Field(description="The webhook-id header it is sent with (the same at every attempt).")
    event_type: str
    conversation_id: int | None
    status: Literal["pending", "delivered", "failed"] = Field(
        description="pending: not delivered yet (retried with backoff for a day); failed: given up."
    )
    attempts: int
    http_status: int | None = Field(description="What the receiver answered at the last attempt.")
    error: str | None = Field(description="Why the last attempt failed, in words.")
    next_attempt_at: Timestamp | None
    created_at: Timestamp
    delivered_at: Timestamp | None

    @classmethod
    def of(cls, delivery: WebhookDelivery) -> WebhookDeliveryView:
        return cls.model_validate(delivery, from_attributes=True)


class WebhookDeliveryList(BaseModel):
    """A page of a webhook's deliveries, newest first."""

    deliveries: list[WebhookDeliveryView]
    next_cursor: NextCursor


# --- routes -------------------------------------------------------------------------------------------


@bp.post("/webhooks")
@documented(
    "Subscribe a webhook to events",
    body=CreateWebhook,
    responses={201: WebhookCreated},
    errors={422: "invalid_webhook: an address the desk may not call, or too many webhooks; in words."},
)
@api_roles("admin")
def create_webhook():
    """Send the tenant's events of the given types to `url` from now on, signed as Standard Webhooks
    say; the answer holds the signing secret, shown this once."""
    sent = body(CreateWebhook)
    subscription, secret = webhook_actions.subscribe(db.session, g.user, sent.url, [str(name) for name in sent.events])
    return answer(WebhookCreated(**WebhookView.of(subscription, g.user.email).model_dump(), secret=secret), 201)


@bp.get("/webhooks")
@documented("List the webhooks", responses={200: WebhookList})
@api_roles("admin")
def list_webhooks():
    return answer(WebhookList(webhooks=webhook_views(webhooks.subscriptions(db.session, g.user.tenant_id))))


@bp.delete("/webhooks/<int:webhook_id>")
@documented("Remove a webhook", body=RemoveWebhook, body_required=False, responses={200: WebhookView})
@api_roles("admin")
def delete_webhook(webhook_id: int):
    """No more events go to it; its delivery log stays readable."""
    optional_body(RemoveWebhook)  # (it takes no field: only an empty body, or {})
    (view,) = webhook_views([webhook_actions.remove(db.session, g.user, webhook_id)])
    return answer(view)


@bp.get("/webhooks/<int:webhook_id>/deliveries")
@documented("Read a webhook's deliveries", query=DeliveriesQuery, responses={200: WebhookDeliveryList})
@api_roles("admin")
def webhook_deliveries(webhook_id: int):
    asked = query(DeliveriesQuery)
    page = a_page(lambda: webhook_actions.deliveries(db.session, g.user, webhook_id, asked.cursor, asked.limit or 50))
    return answer(
        WebhookDeliveryList(deliveries=[WebhookDeliveryView.of(row) for row in page.rows], next_cursor=page.next_cursor)
    )


@bp.post("/webhooks/<int:webhook_id>/deliveries/<int:delivery_id>/redeliver")
@documented("Send a delivery again", responses={202: WebhookDeliveryView})
@api_roles("admin")
def redeliver_webhook(webhook_id: int, delivery_id: int):
    """The same body under the same webhook-id, at once, then retried as a new delivery would be."""
    delivery = webhook_actions.redeliver(db.session, g.user, webhook_id, delivery_id)
    return answer(WebhookDeliveryView.of(delivery), 202)


def webhook_views(subscriptions: list[WebhookSubscription]) -> list[WebhookView]:
    """Each webhook with the email of the admin who made it (one query for them all)."""
    emails = _people_emails(row.created_by_id for row in subscriptions)
    return [WebhookView.of(row, emails.get(row.created_by_id)) for row in subscriptions]


def _people_emails(ids) -> dict[int, str]:
    wanted = {person for person in ids if person is not None}
    if not wanted:
        return {}
    return dict(db.session.execute(select(User.id, User.email).where(User.id.in_(wanted))).all())
