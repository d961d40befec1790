"""One move of a conversation under a lease, in two commits, and the wake-ups around it.

advance() is what a job runs: claim the conversation's lease for the version the job was enqueued
for (a stale or duplicate job finds nothing to claim and exits), decide the move and make whatever
must be durable before a side effect (a tool call marked running, the model request read), commit;
then do the work and commit its result together with the lease's release, guarded so that a worker
that lost its lease writes nothing. The caller enqueues the next move for the version returned.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import bindparam, column, func, inspect, literal_column, or_, select, tuple_, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from webapp import audit_chain
from webapp.agent.loop import Loop
from webapp.agent.states import IDLE, MOVING, CallStatus, ConversationStatus
from webapp.agent.workspace import Tail
from webapp.llm.client import ModelError
from webapp.models import Conversation, Message, Summary, Tenant, ToolCall, utcnow
from webapp.tools.tasks import INPUT_REQUIRED, Task, TaskError

log = logging.getLogger(__name__)

_COLUMNS = frozenset(column.key for column in inspect(Conversation).column_attrs)
WAITING_CALLS = (CallStatus.AWAITING_APPROVAL, CallStatus.AWAITING_TASK)
AWAITING = (ConversationStatus.AWAITING_APPROVAL, ConversationStatus.AWAITING_TASK)
# (a conversation waiting for its batch is woken by the batch's answer alone, never by a decision)
PARKED = (*AWAITING, ConversationStatus.AWAITING_BATCH, ConversationStatus.BUDGET_EXHAUSTED)


# The claim every move starts with, built once (see the statements at the top of workspace.py): an
# UPDATE of the table returning its row, loaded as the Conversation (from_statement skips the ORM's
# bulk-update machinery, which cost a third of the claim), and what the move would otherwise read
# first, its Tail: the last row's id, seq and role, the newest summary's id, the tenant's tools version.
_TABLE = Conversation.__table__
# Spelled out: SQLite's RETURNING names its table's columns bare, and a bare "id" inside a subquery
# of messages would be the message's own.
_THIS = literal_column(f"{_TABLE.name}.id")
_MESSAGES, _SUMMARIES, _TENANTS = Message.__table__, Summary.__table__, Tenant.__table__


def _newest(column, table, order):
    return select(column).where(table.c.conversation_id == _THIS).order_by(order.desc()).limit(1).scalar_subquery()


_TAIL = (
    _newest(_MESSAGES.c.id, _MESSAGES, _MESSAGES.c.seq).label("tail_last_id"),
    _newest(_MESSAGES.c.seq, _MESSAGES, _MESSAGES.c.seq).label("tail_last_seq"),
    _newest(_MESSAGES.c.role, _MESSAGES, _MESSAGES.c.seq).label("tail_last_role"),
    _newest(_SUMMARIES.c.id, _SUMMARIES, _SUMMARIES.c.id).label("tail_summary_id"),
    select(_TENANTS.c.tools_version)
    .where(_TENANTS.c.id == literal_column(f"{_TABLE.name}.tenant_id"))
    .scalar_subquery()
    .label("tail_tools_version"),
)
_CLAIM = (
    select(Conversation, *(column(label.name) for label in _TAIL))
    .from_statement(
        update(_TABLE)
        .where(
            _TABLE.c.id == bindparam("claim_id"),
            _TABLE.c.version == bindparam("claim_version"),
            _TABLE.c.status.in_(MOVING),
            or_(_TABLE.c.lease_expires_at.is_(None), _TABLE.c.lease_expires_at < bindparam("claim_now")),
        )
        .values(
            lease_owner=bindparam("claim_owner"),
            lease_expires_at=bindparam("claim_until"),
            status=ConversationStatus.RUNNING,
        )
        .returning(*_TABLE.c, *_TAIL)
    )
    .execution_options(populate_existing=True)
)


class TransientMoveError(Exception):
    """The move failed on a transient model error; its lease is released and it may be retried."""

    def __init__(self, error: ModelError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass(frozen=True)
class MoveResult:
    """What a job did, and the version to enqueue the next move for (None: nothing to enqueue)."""

    outcome: str  # skipped | lost_lease | a Move kind | batched (parked for a batch) | failed
    next_version: int | None = None
    tenant_id: int | None = None  # set when the move changed something people may be looking at
    wake_at: datetime | None = None  # a parked conversation's next due task: wake it then


# (session, the claimed conversation, should_stop, what the claim read of its newest rows) -> its Loop
LoopFactory = Callable[[Session, Conversation, Callable[[], bool], Tail], Loop]


def advance(
    session: Session,
    conversation_id: int,
    version: int,
    *,
    owner: str,
    make_loop: LoopFactory,
    lease_seconds: float,
    final_attempt: bool = True,
) -> MoveResult:
    """Make one move of the conversation if this job may; see the module docstring."""
    lease = timedelta(seconds=lease_seconds)
    now = utcnow()
    claimed = session.execute(
        _CLAIM,
        {
            "claim_id": conversation_id,
            "claim_version": version,
            "claim_now": now,
            "claim_owner": owner,
            "claim_until": now + lease,
        },
    ).one_or_none()
    if claimed is None:
        session.rollback()
        return MoveResult("skipped")
    conversation, *tail = claimed

    watched = stream_watch(session.get_bind()).watch(conversation_id, owner, lease)
    try:
        loop = make_loop(session, conversation, watched.should_stop, Tail(*tail))
        move = loop.next_move()
        loop.begin(move)
        session.commit()  # commit 1: the claim, and what must be durable before a side effect
        return _perform(session, loop, move, conversation, version, owner, final_attempt)
    finally:
        watched.close()


def _perform(
    session: Session, loop: Loop, move, conversation: Conversation, version: int, owner: str, final_attempt: bool
) -> MoveResult:
    """The move's work between its two commits, then commit 2 under the guard."""
    conversation_id = conversation.id
    try:
        loop.perform(move)
    except ModelError as error:
        session.rollback()
        if error.transient and not final_attempt:
            _release(session, conversation_id, version, owner)
            raise TransientMoveError(error) from error
        message = error.message
        if error.transient:  # the job's retries are spent: say so, not "retrying"
            message += " It still failed after retrying; press Retry once the service is back."
        return _fail(session, conversation_id, version, owner, error.code, message)
    except Exception as error:
        if _database_lost(error, final_attempt):
            log.warning("move of conversation %s lost the database; it will be retried: %s", conversation_id, error)
            _release_after_lost_database(session, conversation_id, version, owner)
            raise
        session.rollback()
        log.exception("move of conversation %s failed", conversation_id)
        _fail(
            session,
            conversation_id,
            version,
            owner,
            "internal_error",
            "Something went wrong on our side while the assistant worked; retry, or tell an admin.",
        )
        raise

    # Beyond the lease and the version, which every end of a lease checks: a move that parks does so
    # only if nothing changed meanwhile (no cancel asked; for a wait, no call decided and no task's
    # input given since).
    guard = ("wait" if move.kind == "wait" else "parks") if move.parks else None
    wake_at = None
    if move.kind == "wait":
        wake_at = session.scalar(_NEXT_TASK_DUE, {"conversation_id": conversation_id})
    tenant_id = _end_lease(
        session, conversation_id, version, owner, guard=guard, waiting=move.waiting_count, **_unwritten(conversation)
    )
    if tenant_id is None:
        session.rollback()
        if move.parks:
            tenant_id = _requeue(session, conversation_id, version, owner)
            if tenant_id is not None:
                return MoveResult("requeued", version + 1, tenant_id)
        return MoveResult("lost_lease")
    status = conversation.status
    session.commit()  # commit 2: the move's result and the lease's release
    next_version = version + 1 if status == ConversationStatus.QUEUED else None
    outcome = "batched" if move.batch is not None and move.batch.parked else move.kind
    return MoveResult(outcome, next_version, tenant_id, wake_at)


_GUARDED = frozenset({"id", "version", "lease_owner", "lease_expires_at"})


def _unwritten(conversation: Conversation) -> dict:
    """The conversation's changes the move made and no flush wrote yet (its status, moves used ...),
    marked as written: the guarded UPDATE that ends the move writes them, one round trip instead of two."""
    state = inspect(conversation)
    changes = {
        attr.key: attr.value
        for attr in state.attrs
        if attr.key in _COLUMNS and attr.key not in _GUARDED and attr.history.has_changes()
    }
    for key, value in changes.items():
        set_committed_value(conversation, key, value)
    return changes


class StreamWatch:
    """The model calls streaming in this process, watched together: one short transaction every
    `interval` reads which of their conversations were asked to stop and renews the leases that need
    it, however many stream at once. (A transaction per stream, four times a second, would swamp
    the database with a few hundred conversations in flight, and on SQLite each one takes the write
    lock.) The streams' own watchers only read the flags it sets."""

    def __init__(self, engine, interval: float = 0.25) -> None:
        self.engine = engine
        self.interval = interval
        self._lock = threading.Lock()
        self._watched: dict[int, _Watched] = {}
        self._thread: threading.Thread | None = None

    def watch(self, conversation_id: int, owner: str, lease: timedelta) -> _Watched:
        """A move's entry, watched from the first time its model call's stream asks whether to stop
        (a tool call is not watched: it runs without renewing its lease); `close()` it after."""
        return _Watched(self, conversation_id, owner, lease)

    def add(self, watched: _Watched) -> None:
        with self._lock:
            self._watched[watched.conversation_id] = watched
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="stream-watch", daemon=True)
                self._thread.start()

    def forget(self, watched: _Watched) -> None:
        with self._lock:
            if self._watched.get(watched.conversation_id) is watched:
                del self._watched[watched.conversation_id]

    def check(self) -> None:
        """One pass: renew the leases due for it, and flag the conversations asked to stop."""
        with self._lock:
            watched = list(self._watched.values())
        if not watched:
            return
        now = utcnow()
        due = [w for w in watched if now - w.renewed_at > w.lease / 3]
        with self.engine.begin() as connection:  # its own short transaction, never a move's session
            for lease in {w.lease for w in due}:
                pairs = [(w.conversation_id, w.owner) for w in due if w.lease == lease]
                connection.execute(
                    update(Conversation)
                    .where(tuple_(Conversation.id, Conversation.lease_owner).in_(pairs))
                    .values(lease_expires_at=now + lease)
                )
            stopping = set(
                connection.scalars(
                    select(Conversation.id).where(
                        Conversation.id.in_([w.conversation_id for w in watched]),
                        Conversation.cancel_requested_at.is_not(None),
                    )
                )
            )
        for w in due:
            w.renewed_at = now
        for w in watched:
            w.stop_asked = w.conversation_id in stopping

    def _run(self) -> None:
        while True:
            time.sleep(self.interval)
            try:
                self.check()
            except Exception:  # the database away for a moment: the next pass tries again
                log.warning("could not check the streaming moves for stops and leases", exc_info=True)


class _Watched:
    """One move's entry in its process's StreamWatch."""

    def __init__(self, watch: StreamWatch, conversation_id: int, owner: str, lease: timedelta) -> None:
        self.watch = watch
        self.conversation_id = conversation_id
        self.owner = owner
        self.lease = lease
        self.renewed_at = utcnow()
        self.stop_asked = False
        self.added = False

    def should_stop(self) -> bool:
        if not self.added:
            self.added = True
            self.renewed_at = utcnow()
            self.watch.add(self)
        return self.stop_asked

    def close(self) -> None:
        self.watch.forget(self)


_stream_watches: dict[int, StreamWatch] = {}
_stream_watches_lock = threading.Lock()


def stream_watch(engine) -> StreamWatch:
    """The process's StreamWatch for this database engine."""
    with _stream_watches_lock:
        if id(engine) not in _stream_watches:
            _stream_watches[id(engine)] = StreamWatch(engine)
        return _stream_watches[id(engine)]


def release_leases(session: Session, owner_prefix: str) -> int:
    """Give up every lease held by owners starting with `owner_prefix` (a stopping worker process):
    the leases read as expired, so the sweeper hands the conversations to another worker at its
    next pass, and a move of that process that still tries to commit is refused by its guard. The
    caller commits; returns how many were released."""
    result = session.execute(
        update(Conversation)
        .where(Conversation.lease_owner.startswith(owner_prefix, autoescape=True))
        .values(lease_owner=None, lease_expires_at=utcnow())
    )
    return result.rowcount


def _end_lease(
    session: Session,
    conversation_id: int,
    version: int,
    owner: str,
    *,
    guard: str | None = None,
    waiting: int = 0,
    moves_on: bool = True,
    **changes,
) -> int | None:
    """The one write that ends a move's lease, in every path: only while `owner` still holds the lease
    at `version` (and the `guard` holds: "parks", no cancel asked; "wait", that and still `waiting`
    calls waiting, no task's input given), the lease is given up, `changes` are set and the version
    moves on, so only the next move's job can claim the conversation (`moves_on=False` hands the
    lease back for this same move to be tried again: its job still matches). Returns the
    conversation's tenant id, or None when nothing was written (the lease was lost, or the guard
    failed). The caller commits. (A statement built once on the table and run on the session's
    connection: the ORM's bulk-update machinery would cost as much as the round trip.)"""
    session.flush()  # the move's other rows first, as an ORM statement's autoflush would
    params = {"end_id": conversation_id, "end_owner": owner, "end_version": version, "end_waiting": waiting}
    return session.connection().scalar(
        _END_LEASE[moves_on, guard], {**params, "lease_owner": None, "lease_expires_at": None, **changes}
    )


def _end_lease_statement(moves_on: bool, guard: str | None):
    where = [
        _TABLE.c.id == bindparam("end_id"),
        _TABLE.c.lease_owner == bindparam("end_owner"),
        _TABLE.c.version == bindparam("end_version"),
    ]
    if guard is not None:
        where.append(_TABLE.c.cancel_requested_at.is_(None))
    if guard == "wait":
        calls = ToolCall.__table__
        of_this = calls.c.conversation_id == _TABLE.c.id
        waiting_now = select(func.count()).where(of_this, calls.c.status.in_(WAITING_CALLS)).scalar_subquery()
        input_given = select(func.count()).where(of_this, calls.c.task_input.is_not(None)).scalar_subquery()
        where += [waiting_now == bindparam("end_waiting"), input_given == 0]
    statement = update(_TABLE).where(*where).returning(_TABLE.c.tenant_id)
    # The SET clause is the parameters' columns (lease_owner, lease_expires_at and the changes).
    return statement.values(version=_TABLE.c.version + 1) if moves_on else statement


# Built once (see the statements at the top of workspace.py), by whether the version moves on and
# which guard the end of the lease checks.
_END_LEASE = {
    (moves_on, guard): _end_lease_statement(moves_on, guard)
    for moves_on in (True, False)
    for guard in (None, "parks", "wait")
}
_NEXT_TASK_DUE = select(func.min(ToolCall.task_due_at)).where(
    ToolCall.conversation_id == bindparam("conversation_id"), ToolCall.status == CallStatus.AWAITING_TASK
)


def _release(session: Session, conversation_id: int, version: int, owner: str) -> None:
    """Hand the lease back for the job's retry, the version unchanged."""
    _end_lease(session, conversation_id, version, owner, moves_on=False, status=ConversationStatus.QUEUED)
    session.commit()


def _database_lost(error: Exception, final_attempt: bool) -> bool:
    """A dropped or unreachable database connection: not a bug, so the move is retried (RQ's retries,
    then the sweeper) instead of failing the conversation. Other operational errors (on SQLite,
    "database is locked" after the busy timeout) get the job's retries, then fail it as before."""
    from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, PendingRollbackError

    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, PendingRollbackError) and error.code == "8s2b":
        return True  # the connection dropped earlier in the move (a tool made the drop its own error)
    return isinstance(error, OperationalError | InterfaceError) and not final_attempt


def _release_after_lost_database(session: Session, conversation_id: int, version: int, owner: str) -> None:
    """Roll the move back and hand its lease back if the database answers again; if it does not, the
    lease expires by itself and the sweeper re-enqueues the move."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        session.rollback()
        _release(session, conversation_id, version, owner)
    except SQLAlchemyError as exc:
        log.warning("could not release the lease of conversation %s; it will expire: %s", conversation_id, exc)


def _requeue(session: Session, conversation_id: int, version: int, owner: str) -> int | None:
    """End the move as queued instead of parking it (something changed while it ran); returns the
    tenant id, None when the lease was lost."""
    tenant_id = _end_lease(
        session, conversation_id, version, owner, status=ConversationStatus.QUEUED, updated_at=utcnow()
    )
    session.commit()
    return tenant_id


def _fail(session: Session, conversation_id: int, version: int, owner: str, code: str, message: str) -> MoveResult:
    """End the move as failed, with its code and the sentence a person reads, audited."""
    tenant_id = _end_lease(
        session,
        conversation_id,
        version,
        owner,
        status=ConversationStatus.FAILED,
        error_code=code,
        error_message=message,
        updated_at=utcnow(),
    )
    if tenant_id is not None:
        audit_chain.record(
            session,
            "conversation_failed",
            tenant_id=tenant_id,
            conversation_id=conversation_id,
            actor_label="assistant",
            outcome="failed",
            data={"code": code, "message": message},
        )
    session.commit()
    return MoveResult("failed", tenant_id=tenant_id)


# --- wake-ups from outside a move (web requests, decisions, the sweeper) --------------------------


def lock_conversation(session: Session, conversation: Conversation) -> None:
    """Wait for any move committing on this conversation, then read it afresh (FOR UPDATE on
    PostgreSQL). A change from outside that a parked move must see (a decision, a person's input)
    takes this lock before it writes: a move either sees the change when it checks before parking,
    or has parked by the time the change wakes it."""
    session.execute(select(Conversation.id).where(Conversation.id == conversation.id).with_for_update())
    session.refresh(conversation)


def wake(session: Session, conversation: Conversation, from_statuses=AWAITING) -> int | None:
    """Move a parked conversation back to queued (compare-and-set); returns the version to enqueue.

    The caller commits, then enqueues. None when the conversation was not in one of from_statuses
    (a running move will pick up the change itself). An outside agent's conversation has no move to
    make: it is done once its one call is settled (webapp/agent/outside.py)."""
    version = conversation.version
    if conversation.source is not None:
        session.execute(
            update(Conversation)
            .where(Conversation.id == conversation.id, Conversation.status.in_(from_statuses))
            .values(version=version + 1, status=ConversationStatus.COMPLETED, updated_at=utcnow())
            .execution_options(synchronize_session=False)
        )
        session.refresh(conversation)
        return None
    done = session.execute(
        update(Conversation)
        .where(
            Conversation.id == conversation.id,
            Conversation.version == version,
            Conversation.status.in_(from_statuses),
        )
        .values(version=version + 1, status=ConversationStatus.QUEUED, updated_at=utcnow())
        .execution_options(synchronize_session=False)
    ).rowcount
    if not done:
        return None
    session.refresh(conversation)
    return version + 1


def start_run(session: Session, conversation: Conversation) -> int:
    """After ask_later: bump the version for the new run's first move; returns the version to enqueue."""
    conversation.version += 1
    conversation.updated_at = utcnow()
    session.flush()
    return conversation.version


def request_cancel(
    session: Session, conversation: Conversation, by_user_id: int | None, reason: str | None = None
) -> int | None:
    """Ask the conversation to stop (`reason`: why, in words for people, when no one pressed Stop).
    A parked one gets a move to settle it (returns its version); a moving one honours the flag at its
    next checkpoint."""
    if conversation.status in IDLE - {ConversationStatus.BUDGET_EXHAUSTED}:
        raise ValueError("nothing to cancel")
    session.execute(
        update(Conversation)
        .where(Conversation.id == conversation.id, Conversation.cancel_requested_at.is_(None))
        .values(cancel_requested_at=utcnow(), cancel_requested_by_id=by_user_id, cancel_reason=reason)
        .execution_options(synchronize_session=False)
    )
    session.refresh(conversation)
    return wake(session, conversation, from_statuses=PARKED)


def retry(session: Session, conversation: Conversation) -> int | None:
    """Re-queue a failed conversation; returns the version to enqueue, None if it had not failed."""
    version = wake(session, conversation, from_statuses=(ConversationStatus.FAILED,))
    if version is not None:
        conversation.error_code = conversation.error_message = None
    return version


class InputRefused(Exception):
    """The call cannot take input now; the message says why."""


def give_input(session: Session, call: ToolCall, text: str) -> int | None:
    """Hand a person's input to the call's input_required task: the next move gives it to the tool.
    Returns the version to enqueue (None: a move in flight picks it up). The caller commits."""
    conversation = session.get(Conversation, call.conversation_id)
    lock_conversation(session, conversation)
    locked = session.scalar(
        select(ToolCall).where(ToolCall.id == call.id).with_for_update().execution_options(populate_existing=True)
    )
    if locked.status != CallStatus.AWAITING_TASK:
        raise InputRefused(f"This tool call is {locked.status.replace('_', ' ')}; it is not waiting for input.")
    try:
        task = Task.from_dict(locked.task)
    except TaskError:
        raise InputRefused("This tool call's task cannot be read; it will fail on its next check.") from None
    if task.status != INPUT_REQUIRED:
        raise InputRefused(f"This task is {task.status.replace('_', ' ')}, not waiting for input.")
    if locked.task_input is not None:
        raise InputRefused("The last input is still being checked; wait a moment and look again.")
    locked.task_input = text
    locked.task_due_at = utcnow()
    session.flush()
    return wake(session, conversation)


def extend_budget(session: Session, conversation: Conversation, moves: int = 0, tokens: int = 0) -> int | None:
    """Give a budget-exhausted conversation more room and resume it; returns the version to enqueue."""
    if conversation.status != ConversationStatus.BUDGET_EXHAUSTED:
        return None
    conversation.move_budget = max(conversation.move_budget, conversation.moves_used) + moves
    if conversation.token_budget:
        conversation.token_budget = max(conversation.token_budget, conversation.run_tokens) + tokens
    session.flush()
    return wake(session, conversation, from_statuses=(ConversationStatus.BUDGET_EXHAUSTED,))
