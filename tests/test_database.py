"""The engine's settings: a PostgreSQL connection the server ended is never handed out, and one back
from use is handed out without a round trip."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, event, text

from webapp import database


@pytest.fixture
def postgresql(engine):
    if engine.dialect.name != "postgresql":
        pytest.skip("a server that ends a connection needs PostgreSQL")
    return engine


def backend_pid(engine) -> int:
    with engine.connect() as connection:
        return connection.execute(text("SELECT pg_backend_pid()")).scalar()


def statements_while(engine, action) -> list[str]:
    """What reached the server while `action` ran (pings included: they go through a cursor)."""
    seen: list[str] = []

    def note(_conn, _cursor, statement, *_args) -> None:
        seen.append(statement)

    ping = engine.dialect.do_ping

    def counted_ping(dbapi_connection):
        seen.append("(ping)")
        return ping(dbapi_connection)

    event.listen(engine, "before_cursor_execute", note)
    engine.dialect.do_ping = counted_ping
    try:
        action()
    finally:
        event.remove(engine, "before_cursor_execute", note)
        engine.dialect.do_ping = ping
    return seen


def test_a_connection_whose_backend_the_server_ended_is_replaced_before_anyone_uses_it(postgresql, migrated):
    engine = database.prepare_engine(create_engine(migrated, **database.engine_options(migrated, pool_size=1)))
    try:
        first = backend_pid(engine)  # the pool now keeps this one connection
        with postgresql.connect() as admin:
            # (with a timeout it returns once the backend has ended: its last words sent, its socket closed)
            assert admin.execute(text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": first}).scalar()
            admin.commit()
        with engine.connect() as connection:  # no error: the dead connection was never handed out
            assert connection.execute(text("SELECT pg_backend_pid()")).scalar() != first
    finally:
        engine.dispose()


def test_a_connection_back_from_use_is_handed_out_again_without_a_ping(postgresql, migrated, monkeypatch):
    engine = database.prepare_engine(create_engine(migrated, **database.engine_options(migrated, pool_size=1)))
    try:
        first = backend_pid(engine)
        assert statements_while(engine, lambda: backend_pid(engine)) == ["SELECT pg_backend_pid()"]
        monkeypatch.setattr(database, "PING_IDLE_SECONDS", 0.0)  # idle too long: pinged first
        assert statements_while(engine, lambda: backend_pid(engine))[0] == "(ping)"
        assert backend_pid(engine) == first
    finally:
        engine.dispose()
