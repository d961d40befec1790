"""What the JSON API's request and answer bodies are made of: the strict, closed pydantic bases and the
field types more than one resource uses (reading.py reads a request into them).

Requests are strict (no "5" for a number, no number for a text) and closed (an unknown field is refused,
not ignored); each field carries its `Rule`, the words a refusal says of it. Answers are built with
`View.of(...)` and sent as `model_dump(mode="json")` (`base.answer`). `Model.model_json_schema()`
describes each of them.

The domain functions (webapp.conversations.actions, webapp.approvals.actions) keep their own checks,
since the HTML forms call them too; the limits in the resources' bodies are theirs, imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    RootModel,
    WithJsonSchema,
)


@dataclass(frozen=True)
class Rule:
    """What a request field must be, in words for people: the whole rule, whatever part of it failed.
    `when_empty` is one more sentence for a field that is missing or blank (what the pages say too)."""

    must: str
    when_empty: str | None = None


class RequestBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class QueryParameters(BaseModel):
    """A route's query parameters: closed (an unknown name is refused with 422, naming it) and typed; a
    number is decimal digits only."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=False)


class ToolArguments(RootModel[dict[str, Any]]):
    """A tool call's arguments: a JSON object as the tool's input schema describes it."""


NO_NUL = r"^[^\x00]*$"  # no text the desk keeps may hold a NUL character (PostgreSQL's text cannot)
MAX_ID = 2**63 - 1  # ids are 64-bit; a larger number names nothing (404 in a path, 422 in a query)


def nonblank(max_chars: int) -> Any:
    """A string with something besides whitespace in it, of at most max_chars characters, without NUL."""
    return Field(min_length=1, max_length=max_chars, pattern=r"^[^\x00]*[^\s\x00][^\x00]*$")


def required_text(max_chars: int, description: str, when_empty: str | None = None) -> Any:
    """A request field of text that must be there and not blank: at most max_chars characters."""
    return Annotated[
        str,
        nonblank(max_chars),
        Field(description=description),
        Rule(f"must be a non-empty string of at most {max_chars:,} characters", when_empty),
    ]


def optional_text(max_chars: int, description: str) -> Any:
    """A request field of text that may be left out or null: at most max_chars characters, no NUL."""
    return Annotated[
        str | None,
        Field(max_length=max_chars, pattern=NO_NUL, description=description),
        Rule(f"must be a string of at most {max_chars:,} characters, or null"),
    ]


def decision_field(description: str) -> Any:
    """A second pair of eyes' decision: approve or reject (a call, a policy change)."""
    return Annotated[
        Literal["approve", "reject"],
        Field(description=description),
        Rule('must be "approve" or "reject"'),
    ]


def from_digits(value: object) -> object:
    """A query parameter that is a plain decimal number, as an int; anything else as sent (and refused
    as not a whole number): no "+5", "5.0" or "5_000"."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20:
        return int(value)
    return value


def or_empty(schema: dict[str, Any]) -> dict[str, Any]:
    """A parameter's schema that also lets it be sent empty, meaning the same as leaving it out (as the
    audit page's form sends a filter nobody filled in)."""
    return {"anyOf": [schema, {"type": "string", "maxLength": 0}]}


def whole_number(smallest: int, largest: int, description: str, must: str) -> Any:
    """A query parameter that is a whole number from smallest to largest, or left out."""
    return Annotated[
        Annotated[int, Field(ge=smallest, le=largest)] | None,
        BeforeValidator(from_digits),
        Field(description=description),
        Rule(must),
    ]


Timestamp = Annotated[
    datetime,
    PlainSerializer(lambda value: value.isoformat(), return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time", "description": "ISO 8601, UTC (+00:00)."}),
]
