"""Engine settings that make SQLite behave under several processes, and PostgreSQL pool settings."""

from __future__ import annotations

from sqlalchemy import event
from sqlalchemy.engine import Engine

POOL_TIMEOUT_SECONDS = 600  # a full pool makes a request or a move wait for a connection, not fail


def engine_options(url: str, pool_size: int = 10) -> dict:
    """`pool_size` connections kept per process, as many again when busy; SQLite's file has one writer
    at a time whatever the pool, and waits up to its busy timeout."""
    pool = {"pool_size": pool_size, "max_overflow": pool_size, "pool_timeout": POOL_TIMEOUT_SECONDS}
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": 30, "check_same_thread": False}, **pool}
    return {"pool_pre_ping": True, **pool}


def prepare_engine(engine: Engine) -> Engine:
    """On SQLite: WAL, a busy timeout, and BEGIN IMMEDIATE so a transaction that reads then writes
    never fails on a snapshot another process moved past (the loop keeps its transactions short)."""
    if engine.dialect.name != "sqlite" or getattr(engine, "_desk_prepared", False):
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
