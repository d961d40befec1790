"""Ids in URLs (`<int:...>` in every route): a number a database id column (BIGINT) can hold. A
longer one names no row: a 404, never a database error (SQLite cannot compare such a number,
PostgreSQL refuses it)."""

from __future__ import annotations

from werkzeug.exceptions import NotFound
from werkzeug.routing import IntegerConverter

MAX_ID = 2**63 - 1


class IdConverter(IntegerConverter):
    """Werkzeug's int converter for ids; create_app installs it as "int". An id past MAX_ID is a 404
    at once, whatever the method (werkzeug's own `max` would make a POST to it a 405, since the URL
    also has a GET route)."""

    def to_python(self, value: str) -> int:
        number = super().to_python(value)
        if number > MAX_ID:
            raise NotFound("There is no such page: the number in its address is larger than any id.")
        return number
