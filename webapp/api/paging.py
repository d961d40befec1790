"""A list a page at a time: the `cursor` and `limit` a list takes, the `next_cursor` it answers, and
the 422 for a cursor that is not one of ours (webapp/web/pagination.py makes and reads them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import Field

from webapp.api.bodies import Rule, whole_number
from webapp.api.reading import FieldProblem, InvalidFields
from webapp.audit.queries import API_MAX_LIMIT
from webapp.web.pagination import BadCursor, Page

Cursor = Annotated[
    str | None,
    Field(max_length=400, description="The next_cursor of an earlier answer, unchanged; left out: the first page."),
    Rule("must be the next_cursor of an earlier answer"),
]
NextCursor = Annotated[str | None, Field(description="Send it as `cursor` for the next page; null on the last page.")]


def page_limit(what: str, default: int) -> Any:
    """A list's `limit`: how many `what` a page holds."""
    return whole_number(
        1,
        API_MAX_LIMIT,
        f"{what} per page, {default} unless given (at most {API_MAX_LIMIT}).",
        f"must be a whole number from 1 to {API_MAX_LIMIT}",
    )


def a_page(read: Callable[[], Page]) -> Page:
    """The page `read` returns; a cursor that is not an earlier answer's next_cursor is a 422 naming it."""
    try:
        return read()
    except BadCursor:
        problem = FieldProblem(field="cursor", problem="must be the next_cursor of an earlier answer")
        raise InvalidFields([problem], ["Send it unchanged, or leave it out for the first page."]) from None
