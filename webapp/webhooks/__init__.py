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

from webapp.webhooks.deliveries import (
    COLLECT_BATCH,
    SEND_BATCH,
    SENDING_LEASE,
    SENDS_AT_ONCE,
    Attempt,
    collect,
    next_due,
    redeliver,
    send,
    sendable,
    settle,
    take,
)
from webapp.webhooks.events import ACTIONS, EVENT_TYPES, envelope, event_id, event_of
from webapp.webhooks.subscriptions import (
    MAX_SUBSCRIPTIONS,
    SECRET_PURPOSE,
    WebhookError,
    checked_events,
    find,
    subscribe,
    subscriptions,
    tenants_subscribed,
    unsubscribe,
    with_work,
)

__all__ = [
    "EVENT_TYPES",
    "ACTIONS",
    "event_of",
    "envelope",
    "event_id",
    "SECRET_PURPOSE",
    "MAX_SUBSCRIPTIONS",
    "WebhookError",
    "checked_events",
    "subscribe",
    "subscriptions",
    "find",
    "unsubscribe",
    "tenants_subscribed",
    "with_work",
    "SENDING_LEASE",
    "COLLECT_BATCH",
    "SEND_BATCH",
    "SENDS_AT_ONCE",
    "collect",
    "sendable",
    "take",
    "Attempt",
    "send",
    "settle",
    "redeliver",
    "next_due",
]
