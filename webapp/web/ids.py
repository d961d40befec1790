"""Ids in URLs (`<int:...>` in every route) and in page cursors: a number the id's column can hold.
Ids are INTEGER columns (PostgreSQL's int4; the audit log's own ids are BIGINT). A larger one names
no row: a 404 or a sentence, never a database error (PostgreSQL refuses to compare it with the
column, SQLite cannot take a number past 2^63)."""

from __future__ import annotations

from sqlalchemy import BigInteger, ColumnElement
from werkzeug.exceptions import NotFound
from werkzeug.routing import IntegerConverter

from webapp.models import MAX_ROW_ID as MAX_ID  # INTEGER

MAX_BIG_ID = 2**63 - 1  # BIGINT


def fits(value: int, column: ColumnElement | None = None) -> bool:
    """Whether a whole number fits `column` (an INTEGER id's range without one)."""
    largest = MAX_BIG_ID if column is not None and isinstance(column.type, BigInteger) else MAX_ID
    return -largest - 1 <= value <= largest


class IdConverter(IntegerConverter):
    """Werkzeug's int converter for ids; create_app installs it as "int". An id of 0 or past MAX_ID is a 404
    at once, whatever the method (werkzeug's own `max` would make a POST to it a 405, since the URL
    also has a GET route)."""

    def to_python(self, value: str) -> int:
        number = super().to_python(value)
        if number < 1 or not fits(number):  # ids start at 1
            raise NotFound("There is no such page: the number in its address is larger than any id.")
        return number
