"""The batch path of a bulk run's model moves: the Message Batches API instead of one streamed call.

A conversation of a batch run (`runs.batch`) makes its generate move as any other until the model
call: there, with no answer waiting for it, the move stores the request (a `batch_requests` row)
and parks the conversation `awaiting_batch`, guarded as any park (a cancel asked meanwhile re-queues
it instead). The pump (webapp/agent/batch_pump.py, run by jobs/batches.py `pump`
every BATCH_POLL_SECONDS and after each such park) sends the waiting requests together, one batch
per model client, polls the open batches, and settles each answer: the row takes it, and the
conversation is woken at the version it parked at (compare-and-set), naming the version of the
move that takes the answer (`answer_version`). That move finds the answer in place of the model
call and goes on exactly as a generate move does (the reply's calls added and flagged, tools run
by the workers between rounds), so one answer is one move, tools run once, and stop, budgets and
cancel hold as for any move. An item the API could not answer (expired, errored, cancelled) fails
its conversation with a sentence; a retry asks again.

A run's waiting requests are held back while some of its conversations are still moving, for at
most the poll interval, so that one round of a run goes in one batch rather than in dribs.

No Flask, RQ or Redis here (nor in the pump's steps): the pump's glue lives in the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from webapp.agent.states import ConversationStatus
from webapp.llm.client import ModelError, ModelReply
from webapp.models import BatchRequest, Conversation, Run

WAITING, SENDING, SENT = "waiting", "sending", "sent"  # then succeeded, errored, expired or canceled
DISCARDED = "discarded"  # answered after its conversation moved on (stopped, say): no move takes it
OPEN = (WAITING, SENDING, SENT)
# A request claimed for sending by a pump that died before it said what became of it goes back to
# waiting after this long (sent twice at worst: the first answer settles it, the second is ignored).
SENDING_FOR = timedelta(minutes=10)
CUSTOM_ID = "desk-{}"  # a batch item's custom_id: the batch_requests row's id
UNANSWERED = "The Message Batches API did not answer this request."


@dataclass
class BatchTurn:
    """A batch run's generate move: the answer the pump woke it for, or none yet (the move parks)."""

    answer: BatchRequest | None
    parked: bool = False


def is_batched(session: Session, conversation: Conversation) -> bool:
    """Whether the conversation's model moves go through the Message Batches API."""
    if conversation.run_id is None:
        return False
    return bool(session.scalar(select(Run.batch).where(Run.id == conversation.run_id)))


def answer_for(session: Session, conversation: Conversation) -> BatchRequest | None:
    """The batch's answer this move takes, if the pump woke the conversation for it."""
    return session.scalar(
        select(BatchRequest).where(
            BatchRequest.conversation_id == conversation.id, BatchRequest.answer_version == conversation.version
        )
    )


def park(session: Session, conversation: Conversation, params: dict, endpoint: str | None) -> None:
    """Store the move's request for the next batch; the move then ends as `awaiting_batch`, at the
    version after this move's, which is the version the pump wakes it from."""
    session.add(
        BatchRequest(
            conversation_id=conversation.id,
            tenant_id=conversation.tenant_id,
            version=conversation.version + 1,
            params=params,
            endpoint=endpoint,
            status=WAITING,
        )
    )
    conversation.status = ConversationStatus.AWAITING_BATCH


def reply_of(row: BatchRequest) -> ModelReply:
    """The stored answer as the model's reply; an item the API did not answer fails the move."""
    if row.status != "succeeded":
        raise ModelError(f"batch_{row.status}", row.error or UNANSWERED, transient=False)
    result = row.result
    return ModelReply(
        result["content"],
        result["stop_reason"],
        result["model"],
        result["usage"],
        result.get("request_id"),
        0.0,
    )
