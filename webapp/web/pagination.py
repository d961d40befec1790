"""Keyset pagination: one cursor format for every list people page through (conversations, the
approval inbox, the audit log and its API).

A page is ordered by one or more keys (the last one unique, usually the id); the cursor names the
keys of the page's last row, so the next page starts right after it however many rows were added
meanwhile. On the wire a cursor is an opaque, URL-safe string; a cursor that does not decode is a
`BadCursor` whose message says what to do."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, TypeDecorator, tuple_
from sqlalchemy.orm import Session

from webapp.web.ids import fits


class BadCursor(ValueError):
    """A cursor that is not one of ours (edited by hand, or cut short when copied)."""


@dataclass(frozen=True)
class Page:
    rows: list
    next_cursor: str | None  # None on the last page


def page_or_problem(read: Callable[[], Page]) -> tuple[Page, str | None]:
    """The page `read` returns and no problem; for a bad cursor, an empty page and the sentence
    saying what to do (a list page shows it where the rows would be)."""
    try:
        return read(), None
    except BadCursor as exc:
        return Page([], None), str(exc)


def encode_cursor(values: Sequence[Any]) -> str:
    """The cursor of a row whose keys have these values."""
    plain = [value.isoformat() if isinstance(value, datetime) else value for value in values]
    return base64.urlsafe_b64encode(json.dumps(plain, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(raw: str, keys: Sequence[ColumnElement]) -> tuple:
    """The key values a cursor names, typed as the keys are; BadCursor when it is not a cursor."""
    try:
        values = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise BadCursor("This page link is not valid any more; go back to the first page.") from None
    if not isinstance(values, list) or len(values) != len(keys):
        raise BadCursor("This page link is not valid any more; go back to the first page.")
    typed = []
    for value, key in zip(values, keys, strict=True):
        kind = _python_type(key)
        try:
            if kind is datetime and isinstance(value, str):
                moment = datetime.fromisoformat(value)
                if moment.tzinfo is None:  # every timestamp we store is UTC, so a cursor's is too
                    raise ValueError
                typed.append(moment)
            elif isinstance(value, kind) and not isinstance(value, bool):
                if isinstance(value, int) and not fits(value, key):  # no row has it; the database cannot compare it
                    raise ValueError
                typed.append(value)
            else:
                raise TypeError
        except (TypeError, ValueError):
            raise BadCursor("This page link is not valid any more; go back to the first page.") from None
    return tuple(typed)


def _python_type(key: ColumnElement) -> type:
    kind = key.type
    while isinstance(kind, TypeDecorator):  # UTCDateTime and the like: the type they store
        kind = kind.impl_instance
    return kind.python_type


def keyset_page(
    session: Session,
    statement: Select,
    keys: Sequence[ColumnElement],
    cursor: str | None,
    size: int,
    *,
    key_values: Callable[[Any], Sequence[Any]],
    descending: bool = True,
    scalars: bool = True,
) -> Page:
    """`size` rows of `statement` ordered by `keys` (all descending, or all ascending), starting
    after the row the cursor names (from the first row when it is None or empty). `key_values` gives
    a row's values of the keys, for the next cursor. `scalars`: each row is its first entity (else
    the row of everything selected). Raises BadCursor."""
    if cursor:
        after = decode_cursor(cursor, keys)
        if len(keys) == 1:
            statement = statement.where(keys[0] < after[0] if descending else keys[0] > after[0])
        else:
            row = tuple_(*keys)  # compared with a plain tuple, each value is bound with its key's type
            statement = statement.where(row < after if descending else row > after)
    order = [key.desc() if descending else key.asc() for key in keys]
    statement = statement.order_by(None).order_by(*order).limit(size + 1)
    rows = list(session.scalars(statement) if scalars else session.execute(statement))
    more = len(rows) > size
    rows = rows[:size]
    return Page(rows, encode_cursor(key_values(rows[-1])) if more and rows else None)
