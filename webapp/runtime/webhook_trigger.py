"""After a commit that audited an event of a tenant with webhooks, the jobs that send its
subscriptions' deliveries are enqueued (webapp/webhooks/ says what is sent and how).

A listener of every session's after_commit reads which tenants' events the commit wrote
(audit_chain.WRITTEN) and asks the process's `Subscribed` which of them have subscriptions. That is
kept per process and read again at most every REFRESH_SECONDS, by a listener of before_commit on the
committing transaction's own connection (after_commit may emit no SQL, and a second connection
would wait on a pool that the committing one may be the last of), so a move of a tenant without
webhooks costs no query and no round trip to Redis. An event a stale copy missed (a subscription
made in the last seconds, in another process) is sent by the next sweep, which enqueues every
subscription with work left."""

from __future__ import annotations

import logging
import threading
import time

from flask import current_app, has_app_context
from sqlalchemy import event
from sqlalchemy.orm import Session

from webapp import audit_chain, webhooks

log = logging.getLogger(__name__)
REFRESH_SECONDS = 2.0


class Subscribed:
    """Which tenants have webhook subscriptions, and their ids, as of at most REFRESH_SECONDS ago."""

    def __init__(self) -> None:
        self._by_tenant: dict[int, list[int]] = {}
        self._read_at = -REFRESH_SECONDS
        self._lock = threading.Lock()

    def stale(self) -> bool:
        return time.monotonic() - self._read_at >= REFRESH_SECONDS

    def refresh(self, session: Session) -> None:
        """Read them again, in the session's transaction."""
        with self._lock:
            self._by_tenant = webhooks.tenants_subscribed(session)
            self._read_at = time.monotonic()

    def ids(self, tenant_ids: set[int]) -> list[int]:
        return [sid for tenant_id in tenant_ids for sid in self._by_tenant.get(tenant_id, ())]

    def forget(self) -> None:
        """Read again at the next commit (this process just changed the subscriptions)."""
        self._read_at = -REFRESH_SECONDS


def install() -> None:
    for name, listener in (("before_commit", _before_commit), ("after_commit", _after_commit)):
        if not event.contains(Session, name, listener):
            event.listen(Session, name, listener)


def _tenants(session: Session) -> set[int]:
    """The tenants of the webhook events the commit under way wrote (audit_chain's before_commit,
    installed first, has written them)."""
    written = session.info.get(audit_chain.WRITTEN)
    if not written or not has_app_context() or "desk" not in current_app.extensions:
        return set()
    return {tenant_id for tenant_id, action in written if action in webhooks.ACTIONS and tenant_id is not None}


def _before_commit(session: Session) -> None:
    if session.in_nested_transaction() or not _tenants(session):
        return
    subscribed = current_app.extensions["desk"].subscribed
    if subscribed.stale():
        subscribed.refresh(session)


def _after_commit(session: Session) -> None:
    tenants = _tenants(session)
    if not tenants:
        return
    desk = current_app.extensions["desk"]
    try:
        for subscription_id in desk.subscribed.ids(tenants):
            desk.dispatcher.enqueue_webhooks(subscription_id)
    except Exception:  # the change is committed; the next sweep sends what this did not
        log.exception("could not enqueue the webhooks of tenants %s", sorted(tenants))
