"""Running the real migrations from an empty database, as an operator upgrading the desk would: a
blank database of the suite's kind, and `flask --app webapp db ...` in a subprocess against it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from sqlalchemy import text

ROOT = Path(__file__).resolve().parent.parent


def revision_before(revision: str) -> str:
    """The revision a migration follows (read from the scripts, so re-chaining one breaks no test)."""
    return ScriptDirectory(str(ROOT / "webapp" / "migrations")).get_revision(revision).down_revision


@pytest.fixture
def blank_database(database_url, tmp_path) -> Iterator[str]:
    """An empty database of the suite's kind, for running migrations from the start."""
    if database_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path / 'migrations.db'}"
        return
    url = sa.make_url(database_url).set(database=f"{sa.make_url(database_url).database}_migrations")
    admin = sa.create_engine(sa.make_url(database_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
        connection.execute(text(f'CREATE DATABASE "{url.database}"'))
    yield url.render_as_string(hide_password=False)
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
    admin.dispose()


def flask_db(base_env, database: str, *args: str) -> None:
    """`flask --app webapp db ...` as an operator runs it, on that database."""
    env = {**os.environ, **base_env, "DATABASE_URL": database}
    done = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "webapp", "db", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def insert_row(connection, table: str, **values) -> None:
    """A row as the schema of that moment takes it: the values given, and a plain value for every other
    column that must have one (so a test names only what it is about, at any revision)."""
    reflected = sa.Table(table, sa.MetaData(), autoload_with=connection)
    for column in reflected.columns:
        if column.name in values or column.nullable or column.primary_key or column.server_default is not None:
            continue
        values[column.name] = _plain_value(column.type)
    connection.execute(reflected.insert().values(**values))


def _plain_value(kind) -> object:
    if isinstance(kind, sa.Boolean):
        return False
    if isinstance(kind, (sa.Integer, sa.Float, sa.Numeric)):
        return 0
    if isinstance(kind, (sa.DateTime, sa.Date)):
        from datetime import UTC, datetime

        return datetime(2026, 1, 1, tzinfo=UTC)
    if isinstance(kind, sa.JSON):
        return {}
    return "x"
