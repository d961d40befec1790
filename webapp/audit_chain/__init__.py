"""An append-only, hash-chained audit log, written in the same transaction as the change it records.

record() queues an event on the session. At commit, a listener (see install()) appends the queued
events to their chain (one per tenant, plus "global") under a lock on the chain's head row, so the
events commit or roll back together with the change. Each event's hash covers its content and the
hash of the event before it, so verify() finds a row that was edited, deleted or reordered.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal

from sqlalchemy import bindparam, event, func, insert, inspect, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, SessionTransaction, scoped_session

from webapp.models import AuditEvent, AuditHead, User, utcnow

GENESIS = "0" * 64  # the prev_hash of the first event of a chain
GLOBAL_CHAIN = "global"
HASHED_FIELDS = (
    "chain",
    "seq",
    "tenant_id",
    "created_at",
    "action",
    "actor_id",
    "actor_label",
    "conversation_id",
    "tool_call_id",
    "tool_name",
    "outcome",
    "data",
    "prev_hash",
)
_CONTENT = tuple(name for name in HASHED_FIELDS if name not in ("seq", "prev_hash"))
_QUEUE = "audit.queue"  # key in session.info
# key in session.info: (tenant_id, action) of each event the commit under way wrote, for listeners
# of after_commit (the webhooks' trigger, webapp/runtime/webhook_trigger.py); dropped on rollback
WRITTEN = "audit.written"
_EVENTS = AuditEvent.__table__
_HEADS = AuditHead.__table__
_UPSERT = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}
# Built once (every commit with events runs them): see the statements at the top of agent/workspace.py.
_LOCK_HEAD = select(_HEADS.c.seq, _HEADS.c.hash).where(_HEADS.c.chain == bindparam("head_chain")).with_for_update()
_INSERT_EVENTS = insert(_EVENTS)
_MOVE_HEAD = (
    update(_HEADS)
    .where(_HEADS.c.chain == bindparam("head_chain"))
    .values(seq=bindparam("head_seq"), hash=bindparam("head_hash"))
)


# --- writing ------------------------------------------------------------------------------------


def record(
    session: Session,
    action: str,
    *,
    tenant_id: int | None,
    actor: User | None = None,
    actor_label: str | None = None,
    conversation_id: int | None = None,
    tool_call_id: int | None = None,
    tool_name: str | None = None,
    outcome: str | None = None,
    data: Mapping | None = None,
) -> None:
    """Queue an audit event on `session`, stamped now; it is written when the session commits and
    dropped if the transaction (or the savepoint it was recorded in) rolls back. Emits no SQL.

    The event goes on the chain of `tenant_id`, or on "global" when it is None. `actor_label`
    defaults to the actor's email. `data` must be JSON-serialisable (datetimes become ISO strings);
    it is copied, so changing the dict afterwards does not change the event.
    """
    session = _unscoped(session)
    tenant_id = _int(tenant_id)
    queued = {
        "chain": GLOBAL_CHAIN if tenant_id is None else str(tenant_id),
        "tenant_id": tenant_id,
        "created_at": utcnow(),
        "action": action,
        "actor_id": None,
        "actor_label": actor_label,
        "conversation_id": _int(conversation_id),
        "tool_call_id": _int(tool_call_id),
        "tool_name": tool_name,
        "outcome": outcome,
        "data": _json_copy(data),
        "_savepoint": session.get_nested_transaction(),
    }
    if actor is not None:
        # Read what is already loaded: touching an expired attribute would run a SELECT (and, on
        # SQLite, BEGIN IMMEDIATE) now. What is missing, such as the id of an unflushed user, is
        # read at commit.
        state = inspect(actor)
        queued["actor_id"] = state.identity[0] if state.identity else None
        if actor_label is None:
            queued["actor_label"] = state.dict.get("email")
        if queued["actor_id"] is None or queued["actor_label"] is None:
            queued["_actor"] = actor
    session.info.setdefault(_QUEUE, []).append(queued)


def install() -> None:
    """Register the listeners that write queued events at commit and drop them on rollback, on the
    Session class, so they serve Flask-SQLAlchemy's sessions and plain ones alike. Idempotent."""
    for name, listener in (
        ("before_commit", _write_queued),
        ("after_soft_rollback", _drop_rolled_back),
        ("after_transaction_end", _drop_unwritten),
    ):
        if not event.contains(Session, name, listener):
            event.listen(Session, name, listener)


def _write_queued(session: Session) -> None:
    queue = session.info.get(_QUEUE)
    # Releasing a savepoint also fires before_commit; the events wait for the real commit.
    if not queue or session.in_nested_transaction():
        return
    session.flush()  # the change itself first: new rows get their ids, and the head lock comes last
    by_chain: dict[str, list[dict]] = {}
    for queued in queue:
        row = {name: queued[name] for name in _CONTENT}
        if actor := queued.get("_actor"):
            row["actor_id"] = row["actor_id"] or actor.id
            row["actor_label"] = row["actor_label"] if row["actor_label"] is not None else actor.email
        by_chain.setdefault(row["chain"], []).append(row)
    # One lock order for every writer, so two commits that touch the same chains cannot deadlock.
    for chain in sorted(by_chain):
        seq, prev_hash = _lock_head(session, chain)
        rows = by_chain[chain]
        for row in rows:
            seq += 1
            row.update(seq=seq, prev_hash=prev_hash)
            row["hash"] = prev_hash = event_hash(row)
        connection = session.connection(bind_arguments={"mapper": AuditEvent})  # Core statements: no ORM layer
        connection.execute(_INSERT_EVENTS, rows[0] if len(rows) == 1 else rows)  # (one row: no executemany)
        connection.execute(_MOVE_HEAD, {"head_chain": chain, "head_seq": seq, "head_hash": prev_hash})
    session.info.setdefault(WRITTEN, []).extend((queued["tenant_id"], queued["action"]) for queued in queue)
    # Cleared only once written: a commit that failed above and is retried must not lose its events.
    queue.clear()


def _lock_head(session: Session, chain: str) -> tuple[int, str]:
    """The chain's head (seq, hash), locked until commit. SQLite ignores FOR UPDATE, but there every
    transaction is BEGIN IMMEDIATE, so a writer already holds the database's write lock."""
    head = session.connection(bind_arguments={"mapper": AuditHead}).execute(_LOCK_HEAD, {"head_chain": chain}).first()
    if head is None:
        # Of two first writers of a chain, the second waits on the first's row, then finds it.
        upsert = _UPSERT[session.get_bind(AuditHead).dialect.name]
        session.execute(
            upsert(_HEADS).values(chain=chain, seq=0, hash=GENESIS).on_conflict_do_nothing(index_elements=["chain"])
        )
        head = session.execute(_LOCK_HEAD, {"head_chain": chain}).one()
    return head.seq, head.hash


def _drop_rolled_back(session: Session, previous_transaction: SessionTransaction) -> None:
    queue = session.info.get(_QUEUE)
    if queue and previous_transaction.nested:
        queue[:] = [queued for queued in queue if not _within(queued["_savepoint"], previous_transaction)]


def _drop_unwritten(session: Session, transaction: SessionTransaction) -> None:
    # The outermost transaction ended: after a commit the queue is already empty; after a rollback
    # or close() its events belong to a change that never happened.
    if transaction.parent is None:
        if session.info.get(_QUEUE):
            session.info[_QUEUE].clear()
        session.info.pop(WRITTEN, None)  # after_commit's listeners have read it (it runs before this)


def _within(savepoint: SessionTransaction | None, outer: SessionTransaction) -> bool:
    while savepoint is not None:
        if savepoint is outer:
            return True
        savepoint = savepoint.parent
    return False


def _unscoped(session: Session | scoped_session) -> Session:
    # Flask-SQLAlchemy's db.session is a scoped_session, which does not proxy the transaction calls.
    return session() if isinstance(session, scoped_session) else session


def _int(value) -> int | None:
    # A "5" would be stored as 5 by SQLite's column affinity and then hash differently on reading.
    return None if value is None else int(value)


def _json_copy(data: Mapping | None) -> dict:
    if data is None:
        return {}
    try:  # a JSON round trip: the copy is exactly what the column will give back
        return json.loads(json.dumps(dict(data), default=_iso, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"audit data must be JSON-serialisable: {exc}") from None


def _iso(value):
    if isinstance(value, date | datetime):
        return value.isoformat()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# --- hashing ------------------------------------------------------------------------------------


def canonical(event_fields: Mapping) -> str:
    """The exact text an event's hash covers: its content fields and prev_hash (HASHED_FIELDS) as
    compact JSON with sorted keys, not ASCII-escaped. Other keys (id, hash) are ignored, so a row
    of an export can be passed as it is; created_at may be an aware datetime or its ISO string."""
    fields = {name: event_fields[name] for name in HASHED_FIELDS}
    fields["created_at"] = _timestamp(fields["created_at"])
    fields["data"] = _numbers(fields["data"])
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def event_hash(event_fields: Mapping) -> str:
    """sha256 hex of canonical(event_fields): what the event's `hash` column must hold."""
    return hashlib.sha256(canonical(event_fields).encode("utf-8")).hexdigest()


def _timestamp(value: datetime | str) -> str:
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    if moment.tzinfo is None:
        raise ValueError("an audit timestamp must be timezone-aware")
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def _numbers(value):
    # PostgreSQL's jsonb keeps numbers as numeric, and prints 1e16 back as 10000000000000000, which
    # reads back as an int; hashing every integral float as that int gives one hash on both sides.
    if isinstance(value, float) and value.is_integer():
        return int(Decimal(repr(value)))
    if isinstance(value, dict):
        return {key: _numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_numbers(item) for item in value]
    return value


# --- verifying ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyResult:
    """What verify() found: ok, how many events it checked, and the first broken link if any."""

    ok: bool
    checked: int  # events whose link and hash were checked
    problem: str | None = None  # the first broken link, in words
    chains: int = 0


def verify(session: Session, chain: str | None = None, *, batch_size: int = 5000) -> VerifyResult:
    """Walk every chain (or one) in seq order and check that no event is missing, each links to the
    one before, each hash matches its content, and the head matches the last event. Reads
    `batch_size` rows at a time, so memory stays flat on any number of events. Stops at the first
    break and names it."""
    read = _reader(_unscoped(session))
    if chain is not None:
        chains = [chain]
    else:
        chains = sorted(row[0] for row in read(select(_HEADS.c.chain).union(select(_EVENTS.c.chain))))
    checked = 0
    for name in chains:
        count, problem = _verify_chain(read, name, batch_size)
        checked += count
        if problem:
            return VerifyResult(False, checked, problem, len(chains))
    return VerifyResult(True, checked, None, len(chains))


def _verify_chain(read: Callable, chain: str, batch_size: int) -> tuple[int, str | None]:
    where = _EVENTS.c.chain == chain
    head_query = select(_HEADS.c.seq, _HEADS.c.hash).where(_HEADS.c.chain == chain)
    # The head is read first and the walk stops at its seq: events appended while we walk are
    # younger than this check, not a break.
    head = next(iter(read(head_query)), None)
    expected, prev_hash, checked = 1, GENESIS, 0
    while True:
        query = select(_EVENTS).where(where, _EVENTS.c.seq >= expected).order_by(_EVENTS.c.seq).limit(batch_size)
        if head is not None:
            query = query.where(_EVENTS.c.seq <= head.seq)
        rows = read(query)
        for row in rows:
            fields = row._mapping
            seq, ident = fields["seq"], fields["id"]
            if seq != expected:
                return checked, _missing(chain, expected, seq)
            if fields["prev_hash"] != prev_hash:
                before = f"seq {seq - 1}" if seq > 1 else "the start of the chain"
                return checked, f"chain {chain}: event seq {seq} (id {ident}) does not link to {before} (reordered?)"
            if event_hash(fields) != fields["hash"]:
                return checked, (
                    f"chain {chain}: event seq {seq} (id {ident}) was altered: its hash does not match its content"
                )
            prev_hash, expected, checked = fields["hash"], expected + 1, checked + 1
        if len(rows) < batch_size:
            break
    last = expected - 1
    if head is None:
        if checked:
            return checked, f"chain {chain}: it has {checked} events but no head row (the head was deleted?)"
        return checked, f"chain {chain}: no such chain (no head, no events)"
    if last < head.seq:
        return checked, (
            f"chain {chain}: the head says seq {head.seq} but the last event is seq {last} "
            "(the newest events were deleted?)"
        )
    if head.hash != prev_hash:
        return checked, f"chain {chain}: the head's hash does not match event seq {last} (altered?)"
    # The newest seq before a fresh head: a writer commits both at once, so only an event written
    # behind the app's back can lie beyond the head.
    newest = read(select(func.max(_EVENTS.c.seq)).where(where))[0][0] or 0
    if newest > head.seq and (fresh := read(head_query)[0]).seq < newest:
        return checked, (
            f"chain {chain}: event seq {newest} lies beyond the head (seq {fresh.seq}); "
            "it was written behind the app's back?"
        )
    return checked, None


def _missing(chain: str, expected: int, found: int) -> str:
    gone = f"seq {expected} is" if found == expected + 1 else f"seqs {expected} to {found - 1} are"
    where = f"between {expected - 1} and {found}" if expected > 1 else f"before seq {found}"
    return f"chain {chain}: {gone} missing (deleted?) {where}"


def _reader(session: Session) -> Callable:
    """A function that runs a query and returns its rows: in the caller's transaction if one is open
    (so it sees its own writes and does not wait on its own SQLite lock); otherwise on a short
    connection per query, so a walk over millions of rows holds neither SQLite's write lock (every
    transaction is BEGIN IMMEDIATE) nor one PostgreSQL snapshot for minutes."""
    if session.in_transaction():
        return lambda query: session.execute(query).all()
    engine = session.get_bind(AuditEvent)

    def run(query):
        with engine.connect() as connection:
            return connection.execute(query).all()

    return run
