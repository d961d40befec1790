"""Engine settings that make SQLite behave under several processes, and PostgreSQL pool settings; and the
queries by tenant that several features share."""

from __future__ import annotations

import select
import time
from typing import Any

import sqlalchemy
from sqlalchemy import Select, event, exc
from sqlalchemy.engine import Engine
from sqlalchemy.orm import InstrumentedAttribute, Session

POOL_TIMEOUT_SECONDS = 600  # a full pool makes a request or a move wait for a connection, not fail
# A PostgreSQL connection idle in the pool this long is pinged (a round trip) before it is handed out;
# one back from use more recently is only looked at (no round trip): see _check_on_checkout.
PING_IDLE_SECONDS = 30.0


def engine_options(url: str, pool_size: int = 10) -> dict:
    """`pool_size` connections kept per process, as many again when busy; SQLite's file has one writer
    at a time whatever the pool, and waits up to its busy timeout."""
    pool = {"pool_size": pool_size, "max_overflow": pool_size, "pool_timeout": POOL_TIMEOUT_SECONDS}
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": 30, "check_same_thread": False}, **pool}
    return pool  # (checked on checkout by prepare_engine, instead of SQLAlchemy's pool_pre_ping)


def prepare_engine(engine: Engine) -> Engine:
    """On SQLite: WAL, a busy timeout, and BEGIN IMMEDIATE so a transaction that reads then writes
    never fails on a snapshot another process moved past (the loop keeps its transactions short).
    On PostgreSQL: a connection is checked before the pool hands it out (_check_on_checkout)."""
    if getattr(engine, "_desk_prepared", False):
        return engine
    if engine.dialect.name == "postgresql":
        _check_on_checkout(engine)
        engine._desk_prepared = True
        return engine
    if engine.dialect.name != "sqlite":
        return engine

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record):
        dbapi_connection.isolation_level = None  # let SQLAlchemy's begin event issue BEGIN
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection):
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine._desk_prepared = True
    return engine


def _check_on_checkout(engine: Engine) -> None:
    """A dead connection is never handed out, without a round trip per checkout.

    SQLAlchemy's pool_pre_ping pings at every checkout, and a move checks a connection out twice
    (before and after its model call or tool: a commit gives it back), so pinging cost two round trips
    of the dozen a move makes. A backend the server ended (terminated, restarted, failed over) has
    sent its last message and closed its socket, so the socket reads as ready: a connection is
    pinged when its socket has something to read, or when it sat idle past PING_IDLE_SECONDS (a
    silent network cut sends nothing). A failed ping raises DisconnectionError, on which the pool
    connects afresh (SQLAlchemy's "pessimistic" checkout event)."""

    @event.listens_for(engine, "checkin")
    def _back(dbapi_connection, record) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _out(dbapi_connection, record, proxy) -> None:
        idle_since = record.info.pop("idle_since", None)
        if idle_since is None:  # just connected
            return
        if time.monotonic() - idle_since < PING_IDLE_SECONDS and not _readable(dbapi_connection):
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as error:
            raise exc.DisconnectionError(f"the database connection was lost: {error}") from error


def _readable(dbapi_connection) -> bool:
    """Whether an idle connection's socket has anything to read: a healthy idle one has nothing."""
    try:
        ready, _, _ = select.select([dbapi_connection.fileno()], [], [], 0)
    except (OSError, ValueError):  # closed already
        return True
    return bool(ready)


def ids_by_tenant(session: Session, query: Select) -> dict[int, list[int]]:
    """The ids a query of (tenant id, id) rows finds, by tenant, in the query's order."""
    found: dict[int, list[int]] = {}
    for tenant_id, row_id in session.execute(query):
        found.setdefault(tenant_id, []).append(row_id)
    return found


def newest_of_tenant(
    session: Session, model: type, newest_by: InstrumentedAttribute, tenant_id: int, limit: int
) -> list[Any]:
    """A tenant's rows of the model, the newest (highest newest_by) first, at most limit of them."""
    query = sqlalchemy.select(model).where(model.tenant_id == tenant_id).order_by(newest_by.desc()).limit(limit)
    return list(session.scalars(query))
