"""The RQ entry point of event webhooks (the work: webapp/webhooks/, run through
webapp/runtime/work.py)."""

from __future__ import annotations

from webapp.runtime import work
from webapp.runtime.job_logs import bind_job


@bind_job
def deliver(subscription_id: int) -> str:
    """Collect a subscription's new events and send what may go now; retries get jobs of their own."""
    return work.deliver_webhooks(subscription_id)
