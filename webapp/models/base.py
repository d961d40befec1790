"""What every table shares: the declarative base whose metadata holds the desk's tables (and a pack's,
which sit on it too), its naming convention for constraints, timestamps kept in UTC, and JSON that is
JSONB on PostgreSQL; and the bounds every door holds a row id and an amount to."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import JSON, DateTime, MetaData, TypeDecorator
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator):
    """Timestamps stored as UTC and always read back timezone-aware, on SQLite and PostgreSQL alike."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# The largest id a row can have: the tables' ids are INTEGER, 32-bit on PostgreSQL, which refuses to
# compare a larger number with them at all; so a larger id names nothing, and is never sent to it.
MAX_ROW_ID = 2**31 - 1
# The most money one call may move, in minor units (cents): every door refuses more (agent/gate.py).
MAX_MONEY_CENTS = 10**12

JSONType = JSON().with_variant(JSONB(), "postgresql")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
