"""The pump's steps of the batch path (see webapp/agent/batches.py): which waiting requests go now,
what became of each sent batch, and the conversations woken for the answers. The pump's job
(jobs/batches.py) calls the model client between them, with no transaction open."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import exists, func, select, update
from sqlalchemy.orm import Session

from webapp.agent import moves
from webapp.agent.batches import CUSTOM_ID, DISCARDED, OPEN, SENDING, SENDING_FOR, SENT, UNANSWERED, WAITING
from webapp.agent.states import MOVING, ConversationStatus
from webapp.llm.client import BatchItemResult, ModelError
from webapp.models import BatchRequest, Conversation


def has_work(session: Session) -> bool:
    """Whether any request waits to be sent or answered."""
    return bool(session.scalar(select(exists().where(BatchRequest.status.in_(OPEN)))))


def ready_to_send(session: Session, now: datetime, gather: timedelta) -> list[BatchRequest]:
    """The waiting requests that may go now: all of a run's when none of its conversations is still
    moving (the round is complete) or its oldest has waited `gather`; then claimed for sending, so
    that two pumps never send one twice. The caller commits."""
    session.execute(
        update(BatchRequest)
        .where(BatchRequest.status == SENDING, BatchRequest.sent_at < now - SENDING_FOR)
        .values(status=WAITING, sent_at=None)
    )
    waiting = session.execute(
        select(BatchRequest, Conversation.run_id)
        .join(Conversation, Conversation.id == BatchRequest.conversation_id)
        .where(BatchRequest.status == WAITING)
        .order_by(BatchRequest.id)
    ).all()
    by_run: dict[int | None, list[BatchRequest]] = {}
    for row, run_id in waiting:
        by_run.setdefault(run_id, []).append(row)
    moving = set(
        session.scalars(
            select(Conversation.run_id)
            .where(Conversation.run_id.in_([r for r in by_run if r is not None]), Conversation.status.in_(MOVING))
            .distinct()
        )
    )
    chosen = [
        row
        for run_id, rows in by_run.items()
        for row in rows
        if run_id not in moving or min(r.created_at for r in rows) <= now - gather
    ]
    if not chosen:
        return []
    claimed = session.execute(
        update(BatchRequest)
        .where(BatchRequest.id.in_([row.id for row in chosen]), BatchRequest.status == WAITING)
        .values(status=SENDING, sent_at=now)
        .returning(BatchRequest.id)
    ).scalars()
    ids = set(claimed)
    return [row for row in chosen if row.id in ids]


# The Message Batches API takes at most 100,000 requests and 256 MB in one batch: the pump's batches
# stay well inside both.
MOST_REQUESTS = 10_000
MOST_BYTES = 200 * 1024 * 1024


def in_batches(
    items: list[tuple[int, dict]], most_requests: int = MOST_REQUESTS, most_bytes: int = MOST_BYTES
) -> Iterator[list[tuple[int, dict]]]:
    """(id, params) items cut into batches the API takes, in order."""
    batch: list[tuple[int, dict]] = []
    size = 0
    for item in items:
        weight = len(json.dumps(item[1]))
        if batch and (len(batch) >= most_requests or size + weight > most_bytes):
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += weight
    if batch:
        yield batch


def mark_sent(session: Session, ids: list[int], batch_id: str, now: datetime) -> None:
    """The claimed requests went in this batch."""
    session.execute(
        update(BatchRequest)
        .where(BatchRequest.id.in_(ids), BatchRequest.status == SENDING)
        .values(status=SENT, batch_id=batch_id, sent_at=now)
    )


def mark_unsent(session: Session, ids: list[int]) -> None:
    """Requests a batch could not take (the service failed for a moment): back to waiting, for the
    next pump."""
    session.execute(
        update(BatchRequest)
        .where(BatchRequest.id.in_(ids), BatchRequest.status == SENDING)
        .values(status=WAITING, sent_at=None)
    )


def rows(session: Session, ids: list[int]) -> list[BatchRequest]:
    return list(session.scalars(select(BatchRequest).where(BatchRequest.id.in_(ids)).with_for_update()))


def open_batches(session: Session) -> list[tuple[str, int]]:
    """The batches sent and not answered yet, each with a tenant whose model client polls it."""
    return list(
        session.execute(
            select(BatchRequest.batch_id, func.min(BatchRequest.tenant_id))
            .where(BatchRequest.status == SENT)
            .group_by(BatchRequest.batch_id)
            .order_by(BatchRequest.batch_id)
        ).all()
    )


def abandoned(session: Session, batch_id: str) -> bool:
    """Whether no conversation waits for this open batch any more (every one was stopped): the batch
    is worth cancelling, rather than paying for answers no move will take."""
    waiting = (
        select(BatchRequest.id)
        .join(Conversation, Conversation.id == BatchRequest.conversation_id)
        .where(
            BatchRequest.batch_id == batch_id,
            BatchRequest.status == SENT,
            Conversation.status == ConversationStatus.AWAITING_BATCH,
            Conversation.version == BatchRequest.version,
        )
    )
    return not session.scalar(select(exists(waiting)))


@dataclass(frozen=True)
class Woken:
    conversation_id: int
    version: int
    tenant_id: int


def settle(session: Session, batch_id: str, results: Iterable[BatchItemResult], now: datetime) -> list[Woken]:
    """Each answer of a finished batch into its row, and its conversation woken for the move that
    takes it (one that moved on meanwhile leaves the answer discarded). The caller commits, then
    enqueues the moves returned."""
    by_id = {CUSTOM_ID.format(row.id): row for row in _sent_rows(session, batch_id)}
    woken = []
    for result in results:
        row = by_id.pop(result.custom_id, None)
        if row is None:
            continue  # not ours, or settled by another pump
        _answer(row, result, now)
        woken += _wake(session, row)
    for row in by_id.values():  # the batch ended without a line for it
        row.status, row.error, row.done_at = "errored", UNANSWERED, now
        woken += _wake(session, row)
    return woken


def fail_batch(session: Session, batch_id: str, error: ModelError, now: datetime) -> list[Woken]:
    """A batch the service no longer knows (or refuses to say anything of, for good): its requests
    fail with the service's words."""
    return fail(session, _sent_rows(session, batch_id), error, now)


def fail(session: Session, rows: Iterable[BatchRequest], error: ModelError, now: datetime) -> list[Woken]:
    """Requests no batch will answer (the service refused them for good): each fails its conversation
    with the service's words, through the move that would have taken its answer."""
    woken = []
    for row in rows:
        row.status, row.error, row.done_at = "errored", error.message, now
        woken += _wake(session, row)
    return woken


def _sent_rows(session: Session, batch_id: str) -> list[BatchRequest]:
    return list(
        session.scalars(
            select(BatchRequest).where(BatchRequest.batch_id == batch_id, BatchRequest.status == SENT).with_for_update()
        )
    )


def _answer(row: BatchRequest, result: BatchItemResult, now: datetime) -> None:
    row.status, row.done_at = result.outcome, now
    if result.reply is not None:
        reply = result.reply
        row.result = {
            "content": reply.content,
            "stop_reason": reply.stop_reason,
            "model": reply.model,
            "usage": reply.usage,
            "request_id": reply.request_id,
        }
    else:
        row.error = result.error or UNANSWERED


def _wake(session: Session, row: BatchRequest) -> list[Woken]:
    conversation = session.get(Conversation, row.conversation_id, populate_existing=True)
    version = None
    if conversation is not None and conversation.version == row.version:
        version = moves.wake(session, conversation, from_statuses=(ConversationStatus.AWAITING_BATCH,))
    if version is None:
        row.status = DISCARDED
        return []
    row.answer_version = version
    return [Woken(conversation.id, version, conversation.tenant_id)]
