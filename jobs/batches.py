"""The batch runs' pump: their model requests through the Message Batches API. What is sent, how an
answer or a failure settles its conversation, and when a batch is abandoned are the desk's rules
(webapp/agent/batch_pump.py and batches.py); this job calls the model clients between them, with no
transaction open while the service answers, and wakes the answered conversations."""

from __future__ import annotations

import logging
from datetime import timedelta

from jobs.moves import queue_move
from webapp.agent import batch_pump
from webapp.agent.batches import CUSTOM_ID
from webapp.llm.choice import choice_for
from webapp.llm.client import ModelError
from webapp.models import utcnow
from webapp.runtime.extensions import db
from webapp.runtime.job_logs import bind_job
from webapp.runtime.services import Services, services

log = logging.getLogger(__name__)

BATCHES_REFUSED = (
    "The model endpoint serving this run takes no message batches (it speaks the text protocol); start the run "
    "again without batch."
)


@bind_job
def pump() -> str:
    """Send the batch runs' requests that are ready, one batch per model client; look at each open
    batch; settle the answers of those ended and wake their conversations. While any request is open,
    the next pump is due in BATCH_POLL_SECONDS."""
    desk = services()
    poll = timedelta(seconds=desk.config.batch_poll_seconds)
    try:
        sent, woken = _send_ready(desk, poll)
        looked, settled, answered = _look_at_open(desk)
        woken += answered
        again = batch_pump.has_work(db.session)
        db.session.commit()
    finally:
        db.session.remove()
    for conversation in woken:
        queue_move(desk, conversation.conversation_id, conversation.version)
        desk.live_events.changed(conversation.tenant_id, conversation.conversation_id)
    if again:
        desk.dispatcher.enqueue_batch_pump(at=utcnow() + poll)
    return f"{sent} batch(es) sent, {settled} of {looked} open answered, {len(woken)} conversation(s) woken"


def _send_ready(desk: Services, poll: timedelta) -> tuple[int, list[batch_pump.Woken]]:
    """Send the requests ready to go: (batches sent, conversations woken by a refusal)."""
    woken: list[batch_pump.Woken] = []
    sent = 0
    batches = _batches(desk, batch_pump.ready_to_send(db.session, utcnow(), poll))
    db.session.commit()  # (read before: on SQLite a transaction holds the write lock)
    for client, items in batches:
        ids = [row_id for row_id, _ in items]
        try:
            if not client.takes_batches:
                raise ModelError("batch_refused", BATCHES_REFUSED, transient=False)
            batch_id = client.send_batch([(CUSTOM_ID.format(row_id), params) for row_id, params in items])
        except ModelError as error:
            if error.transient:
                log.warning("%s request(s) were not sent; the next pump tries again: %s", len(ids), error)
                batch_pump.mark_unsent(db.session, ids)
            else:
                woken += batch_pump.fail(db.session, batch_pump.rows(db.session, ids), error, utcnow())
        else:
            batch_pump.mark_sent(db.session, ids, batch_id, utcnow())
            sent += 1
        db.session.commit()
    return sent, woken


def _look_at_open(desk: Services) -> tuple[int, int, list[batch_pump.Woken]]:
    """Look at each open batch (cancelled at the service when every conversation of it was stopped):
    (batches looked at, batches settled, conversations woken)."""
    woken: list[batch_pump.Woken] = []
    settled = 0
    open_batches = batch_pump.open_batches(db.session)
    for batch_id, tenant_id in open_batches:
        client = choice_for(db.session, desk.config, tenant_id).client
        abandoned = batch_pump.abandoned(db.session, batch_id)
        db.session.commit()
        try:
            status = client.batch_state(batch_id).status
            if status == "in_progress" and abandoned:
                client.cancel_batch(batch_id)
                status = client.batch_state(batch_id).status
            if status != "ended":
                continue
            results = client.batch_results(batch_id)
        except ModelError as error:
            if error.transient:
                continue
            woken += batch_pump.fail_batch(db.session, batch_id, error, utcnow())
        else:
            woken += batch_pump.settle(db.session, batch_id, results, utcnow())
            settled += 1
        db.session.commit()
    return len(open_batches), settled, woken


def _batches(desk: Services, rows: list) -> list[tuple]:
    """The requests as the batches they go in: (the model client that serves their tenant, its
    (id, params) items), one batch per client unless the API's limits cut it."""
    groups: dict = {}
    for row in rows:
        client = choice_for(db.session, desk.config, row.tenant_id).client
        groups.setdefault(client, []).append((row.id, row.params))
    return [(client, batch) for client, items in groups.items() for batch in batch_pump.in_batches(items)]
