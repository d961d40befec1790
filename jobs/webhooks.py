"""Event webhooks: a subscription's new events turned into deliveries and sent, in order, by one
job at a time (webapp/runtime/webhook_senders.py; a second job asks it for one more pass instead).
What is sent, signed and retried is webapp/webhooks/; this job holds no transaction open while the
receivers answer, and a retry due later gets a job at its time."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from webapp import webhooks
from webapp.models import WebhookSubscription, utcnow
from webapp.runtime.extensions import db
from webapp.runtime.job_logs import bind_job
from webapp.runtime.services import services
from webapp.runtime.webhook_senders import WebhookSenders


@bind_job
def deliver(subscription_id: int) -> str:
    """Collect a subscription's new events and send what may go now, as its one sender (another job
    running asks it for one more pass instead)."""
    dispatcher = services().dispatcher
    senders = WebhookSenders(dispatcher)
    senders.started(subscription_id)
    sending = senders.sending(subscription_id)
    if sending is None:
        return "another job is sending them, and makes one more pass"
    made = sent = failed = 0
    due = None
    try:
        while True:
            passed = _one_pass(subscription_id)
            if passed is None:
                return "no such webhook"
            made, sent, failed = made + passed[0], sent + passed[1], failed + passed[2]
            due = passed[3]
            if not senders.again(subscription_id):
                break
    finally:
        senders.done(subscription_id, sending)
    if due is not None:
        dispatcher.enqueue_webhooks(subscription_id, at=due)
    return f"{made} event(s) collected, {sent} delivered, {failed} attempt(s) failed"


def _one_pass(subscription_id: int) -> tuple[int, int, int, datetime | None] | None:
    """One pass over a subscription: (events collected, delivered, failed attempts, when the next
    pending delivery is due), or None when the subscription is gone."""
    config = services().config
    sent = failed = 0
    try:
        subscription = db.session.get(WebhookSubscription, subscription_id, with_for_update=True)
        if subscription is None or subscription.deleted_at is not None:
            return None
        made = webhooks.collect(db.session, subscription)
        db.session.commit()
        while ready := webhooks.sendable(db.session, subscription_id, utcnow()):
            taken = webhooks.take(db.session, ready, utcnow())
            db.session.commit()  # the attempts count before they are made
            if not taken:
                break
            # One delivery per conversation at most (sendable holds the later ones back), so they go
            # at the same time without changing any conversation's order.
            with ThreadPoolExecutor(min(len(taken), webhooks.SENDS_AT_ONCE)) as pool:
                attempts = list(pool.map(lambda delivery: webhooks.send(config, subscription, delivery), taken))
            now = utcnow()
            for delivery, attempt in zip(taken, attempts, strict=True):
                webhooks.settle(delivery, attempt, config.webhook_retry_intervals, now)
                sent, failed = sent + attempt.delivered, failed + (not attempt.delivered)
            db.session.commit()
            if failed:  # what failed waits for its retry; the rest of this round went
                break
        due = webhooks.next_due(db.session, subscription_id)
        db.session.commit()
    finally:
        db.session.remove()
    return made, sent, failed, due
