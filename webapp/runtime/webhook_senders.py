"""One sender at a time per webhook subscription, coordinated in Redis: the job sending a
subscription's deliveries (jobs/webhooks.py) holds its lock; a second job that finds it held asks
the sender for one more pass instead of sending beside it. One sender keeps two jobs from sending
one delivery twice, or locking its rows in two orders. The "queued" flag is the dispatcher's
(queue.py enqueue_webhooks): set while a job is queued and not yet started."""

from __future__ import annotations

from typing import TYPE_CHECKING

from redis.exceptions import LockError
from redis.lock import Lock

from webapp.config import Config

if TYPE_CHECKING:
    from webapp.runtime.queue import Dispatcher

WEBHOOKS_FLAG_SECONDS = 60  # a queued webhooks job whose flag outlives this is not waited for


def webhooks_key(subscription_id: int, what: str = "queued") -> str:
    """queued: set while a job sending the subscription's deliveries is queued and not yet started;
    sending: the lock of the job sending them; again: another job asked it for one more pass."""
    return f"desk:webhooks-{what}:{subscription_id}"


def webhooks_job_timeout(config: Config) -> int:
    """How long a webhooks job may run (and so how long its sender's lock holds)."""
    return max(300, int(config.notify_timeout_seconds * 30))


class WebhookSenders:
    """The sending side of a subscription's jobs, over the dispatcher's Redis."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher

    def started(self, subscription_id: int) -> None:
        """The subscription's job starts: a commit from now on enqueues another."""
        self.dispatcher.redis.delete(webhooks_key(subscription_id))

    def sending(self, subscription_id: int) -> Lock | None:
        """Become the one job sending a subscription's deliveries (its lock), or None: another job is,
        and is told to make one more pass (again)."""
        redis, timeout = self.dispatcher.redis, webhooks_job_timeout(self.dispatcher.config)
        lock = redis.lock(webhooks_key(subscription_id, "sending"), timeout=timeout)
        if lock.acquire(blocking=False):
            return lock
        redis.set(webhooks_key(subscription_id, "again"), 1, ex=WEBHOOKS_FLAG_SECONDS)
        # The sender may have let go just now, having found no word: then this job is the sender.
        return lock if lock.acquire(blocking=False) else None

    def again(self, subscription_id: int) -> bool:
        """Whether a job asked the sender for one more pass since it last looked (the word is taken)."""
        return bool(self.dispatcher.redis.getdel(webhooks_key(subscription_id, "again")))

    def done(self, subscription_id: int, lock: Lock) -> None:
        """The sender lets go; a word that came meanwhile gets a job of its own."""
        try:
            lock.release()
        except LockError:  # held past its time: another job may be the sender now
            pass
        if self.again(subscription_id):
            self.dispatcher.enqueue_webhooks(subscription_id)
