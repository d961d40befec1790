"""The states a conversation and a tool call move through, and which of them are settled."""

from __future__ import annotations

from enum import StrEnum


class ConversationStatus(StrEnum):
    QUEUED = "queued"  # a move is enqueued
    RUNNING = "running"  # a worker holds the lease
    AWAITING_APPROVAL = "awaiting_approval"  # a call of the open round waits for a person
    AWAITING_TASK = "awaiting_task"  # a call of the open round waits on a long-running task
    AWAITING_BATCH = "awaiting_batch"  # a batch run's model move waits for the Message Batches API
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"
    BUDGET_EXHAUSTED = "budget_exhausted"


# Statuses in which the loop should be moving: a job exists or the sweeper must make one.
MOVING = frozenset({ConversationStatus.QUEUED, ConversationStatus.RUNNING})
# Statuses in which a person may post a new message (no round open, nothing moving).
IDLE = frozenset(
    {
        ConversationStatus.COMPLETED,
        ConversationStatus.CANCELLED,
        ConversationStatus.FAILED,
        ConversationStatus.BUDGET_EXHAUSTED,
    }
)


class CallStatus(StrEnum):
    PENDING = "pending"  # may run now
    AWAITING_APPROVAL = "awaiting_approval"
    APPROVED = "approved"  # may run now
    RUNNING = "running"  # claimed by a move; the side effect may have happened
    AWAITING_TASK = "awaiting_task"  # ran, and its tool's task goes on (the loop resumes it later)
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # ran and failed, or could not run (invalid input, unknown tool)
    REJECTED = "rejected"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


RUNNABLE = frozenset({CallStatus.PENDING, CallStatus.APPROVED})
SETTLED = frozenset(
    {CallStatus.SUCCEEDED, CallStatus.FAILED, CallStatus.REJECTED, CallStatus.EXPIRED, CallStatus.CANCELLED}
)
