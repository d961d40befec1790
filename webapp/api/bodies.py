"""What every request and answer body of the JSON API is made of: the strict, closed pydantic bases,
the field types more than one resource uses, and reading a request into its model.

Requests are strict (no "5" for a number, no number for a text) and closed (an unknown field is refused,
not ignored). `body(Model)` reads and validates the request; a failure is a 422 whose message names
every bad field in words of our own (`Rule`), never pydantic's. Answers are built with `View.of(...)`
and sent as `model_dump(mode="json")` (`base.answer`). `Model.model_json_schema()` describes each of them.

The domain functions (webapp.conversations.actions, webapp.approvals.actions) keep their own checks,
since the HTML forms call them too; the limits in the resources' bodies are theirs, imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal, TypeVar

from flask import request
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    RootModel,
    ValidationError,
    WithJsonSchema,
)

from webapp.audit.queries import API_MAX_LIMIT
from webapp.tools import described
from webapp.web.errors import Refused

# --- the bases and the fields they share ------------------------------------------------------------


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


def page_limit(what: str, default: int) -> Any:
    """A list's `limit`: how many `what` a page holds."""
    return whole_number(
        1,
        API_MAX_LIMIT,
        f"{what} per page, {default} unless given (at most {API_MAX_LIMIT}).",
        f"must be a whole number from 1 to {API_MAX_LIMIT}",
    )


Cursor = Annotated[
    str | None,
    Field(max_length=400, description="The next_cursor of an earlier answer, unchanged; left out: the first page."),
    Rule("must be the next_cursor of an earlier answer"),
]
NextCursor = Annotated[str | None, Field(description="Send it as `cursor` for the next page; null on the last page.")]

Timestamp = Annotated[
    datetime,
    PlainSerializer(lambda value: value.isoformat(), return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time", "description": "ISO 8601, UTC (+00:00)."}),
]

# --- refusing a request -----------------------------------------------------------------------------


class FieldProblem(BaseModel):
    field: str = Field(description="The request field, as sent.")
    problem: str = Field(description='What is wrong with it, e.g. "must be a whole number from 1 to 1000".')


class ErrorBody(BaseModel):
    """Every error: a stable code for programs and a sentence for people; a request whose fields are wrong
    (invalid_field, invalid_input) also names each bad field in `fields`."""

    model_config = ConfigDict(title="Error")

    error: str = Field(description="A stable code, e.g. not_found, conversation_busy, already_decided.")
    message: str = Field(description="What happened and what to do, for people.")
    fields: list[FieldProblem] = Field(
        default_factory=list,
        description="Each bad field of the request, with invalid_field and invalid_input only.",
    )


class InvalidFieldsBody(ErrorBody):
    """A request whose fields are wrong (422): every bad field, named."""

    model_config = ConfigDict(title="InvalidFields")

    error: Literal["invalid_field"] = "invalid_field"
    fields: list[FieldProblem]


class InvalidFields(Refused):
    """A body that is JSON but not what the endpoint takes; `view()` is the 422 answer."""

    def __init__(self, problems: list[FieldProblem], advice: list[str], unlisted: int = 0) -> None:
        clauses = [f'"{_shown(p.field)}" {p.problem}' for p in problems]
        if unlisted:
            clauses.append(f"and {unlisted} more {'field is' if unlisted == 1 else 'fields are'} wrong")
        super().__init__(422, "invalid_field", " ".join(["; ".join(clauses) + ".", *advice]))
        self.problems = problems

    @classmethod
    def at_most(cls, problems: list[FieldProblem], advice: list[str]) -> InvalidFields:
        """The refusal naming the first MAX_PROBLEMS problems, and counting the rest."""
        return cls(problems[:MAX_PROBLEMS], advice, unlisted=max(0, len(problems) - MAX_PROBLEMS))

    def view(self) -> InvalidFieldsBody:
        return InvalidFieldsBody(message=self.message, fields=self.problems)


MAX_PROBLEMS = 20  # a body of a thousand unknown fields is answered with twenty, and a count
EMPTY = frozenset({"missing", "string_too_short", "string_pattern_mismatch"})

M = TypeVar("M", bound=RequestBody)
Q = TypeVar("Q", bound=QueryParameters)


def query(model: type[Q]) -> Q:
    """The request's query parameters as `model`: 422 invalid_field naming every unknown or bad one. A
    name given twice is read once, as given first."""
    return _validated(model, {name: request.args.get(name) for name in request.args})


def known_names(model: type[QueryParameters]) -> None:
    """Refuse query parameters `model` does not have (422 invalid_field naming them), leaving their values
    to a check of the route's own (the audit log's filters, whose sentences the pages share). Every
    parameter of such a model is optional, so None stands for each one given."""
    _validated(model, dict.fromkeys(request.args))


def body(model: type[M]) -> M:
    """The request's JSON object as `model`: 400 invalid_json when it is not a JSON object, 422
    invalid_field naming every bad field when it does not fit."""
    try:
        data = request.get_json(silent=True)
    except RecursionError:  # deeper than the parser goes; no request of ours nests more than a few levels
        message = "The JSON is nested too deeply; send a JSON object of the documented fields."
        raise Refused(400, "invalid_json", message) from None
    return parse(model, data)


def optional_body(model: type[M]) -> M:
    """As body(), for a route whose every field is optional: no body at all is the model's defaults."""
    return body(model) if request.get_data() else model()


def parse(model: type[M], data: object) -> M:
    if not isinstance(data, dict):
        raise Refused(400, "invalid_json", "Send a JSON object with Content-Type: application/json.")
    odd = _odd_fields(model, data)
    if odd:
        raise InvalidFields.at_most(odd, [])
    return _validated(model, data)


def _validated(model: type[BaseModel], data: dict) -> Any:
    """`data` as `model`, or the 422 naming each of its bad fields in our words."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _refusal(model, exc) from None


def _refusal(model: type[BaseModel], exc: ValidationError) -> InvalidFields:
    problems: dict[str, FieldProblem] = {}
    advice: list[str] = []
    for error in exc.errors(include_url=False, include_context=False, include_input=False):
        name, field = _field_at(model, error["loc"])
        if name in problems:
            continue  # one problem per field: its whole rule
        rule = next((m for m in field.metadata if isinstance(m, Rule)), None) if field else None
        if error["type"] == "extra_forbidden" or field is None:
            problem = "is not a field of this request"
        elif error["type"] == "string_unicode":  # a lone surrogate, e.g. "\ud800": no text can hold it
            problem = "holds a lone surrogate (half of a UTF-16 pair, such as \\ud800), which is not text; remove it"
        elif rule is None:
            problem = "is not valid"
        elif error["type"] == "missing":
            problem = f"is required and {rule.must}"
        else:
            problem = rule.must
        if rule and rule.when_empty and error["type"] in EMPTY:
            advice.append(rule.when_empty)
        problems[name] = FieldProblem(field=name, problem=problem)
    return InvalidFields.at_most(list(problems.values()), advice)


def _field_at(model: type[BaseModel], loc: tuple) -> tuple[str, Any]:
    """The field an error is about, and its dotted name: into a nested request body ("policy.approvals"),
    so its own rule is said; None for a name the body does not have."""
    if not loc:
        return "(body)", None
    names, field, inside = [], None, model
    for part in loc:
        if isinstance(part, int) and names and _listed_body(_annotations(field)):
            names[-1] += f"[{part}]"  # an item of a list of bodies: "items[3]", then its own field
            continue
        if inside is None or not isinstance(part, str):
            break
        field = _model_field(inside, part)
        names.append(part)
        if field is None:
            break
        kinds = _annotations(field)
        inside = _nested_body(kinds) or _listed_body(kinds)
    return ".".join(names), field


def _is_body(kind: object) -> bool:
    return isinstance(kind, type) and issubclass(kind, RequestBody)


def _nested_body(kinds: tuple) -> type[RequestBody] | None:
    """The request body a field holds (SetPolicy in DeclareTool.policy), if it holds one."""
    return next((kind for kind in kinds if _is_body(kind)), None)


# What a field holding what no text or number the desk keeps can be is told (described.odd_value's kinds).
_ODD = {
    described.NUL: "must not contain the NUL character (\\u0000), in its text or in any name or text inside it",
    described.LONE_SURROGATE: (
        "cannot be read: the JSON holds text that is not valid Unicode (a lone surrogate); send whole characters"
    ),
    described.NOT_FINITE: (
        "holds a number that is not finite: 1e400 is too large for a number, and NaN and Infinity are not JSON"
    ),
}


def _odd_fields(model: type[BaseModel], data: dict) -> list[FieldProblem]:
    """The fields of a body that hold a NUL character, a lone surrogate or a number that is not finite
    (1e400, read as infinity), in a name or a value at any depth: no column or audit record can keep
    them. Named as _refusal names fields, into nested bodies and lists of them ("items[3].message") and
    into a tool's arguments ("input.memo"); deeper, the problem says where. (Walked without
    recursion: a body's nesting is as deep as its sender likes.)"""
    problems: dict[str, FieldProblem] = {}
    pending: list[tuple[type[BaseModel] | None, dict, str]] = [(model, data, "")]
    while pending:
        inside, value, prefix = pending.pop()
        for key, item in value.items():
            name = f"{prefix}.{_printable(key)}" if prefix else _printable(key)
            field = _model_field(inside, key) if inside is not None else None
            kinds = _annotations(field)
            if (what := described.oddity(key)) is not None:
                problems.setdefault(name, FieldProblem(field=name, problem=_ODD[what]))
            elif isinstance(item, dict) and (nested := _nested_body(kinds)):
                pending.append((nested, item, name))
            elif isinstance(item, dict) and ToolArguments in kinds:
                pending.append((None, item, name))  # each argument a field of its own, as the tool names them
            elif isinstance(item, list) and (nested := _listed_body(kinds)):
                for index, element in enumerate(item):
                    if isinstance(element, dict):
                        pending.append((nested, element, f"{name}[{index}]"))
                    elif (found := described.odd_value(element)) is not None:
                        problems.setdefault(f"{name}[{index}]", _odd_problem(f"{name}[{index}]", *found))
            elif (found := described.odd_value(item)) is not None:
                problems.setdefault(name, _odd_problem(name, *found))
    return sorted(problems.values(), key=lambda problem: problem.field)


def _odd_problem(name: str, where: str, what: str) -> FieldProblem:
    return FieldProblem(field=name, problem=_ODD[what] + (f" (at {where})" if where else ""))


def _printable(name: str) -> str:
    """A name as sent, a lone surrogate in it written as its escape (\\ud800) so the answer is text."""
    return name.encode("utf-8", "backslashreplace").decode()


def _model_field(model: type[BaseModel], name: str) -> Any:
    return model.model_fields.get(name) or next((f for f in model.model_fields.values() if f.alias == name), None)


def _annotations(field: Any) -> tuple:
    """A field's type and, for an optional or a union, the types it may be."""
    if field is None:
        return ()
    return (field.annotation, *getattr(field.annotation, "__args__", ()))


def _listed_body(kinds: tuple) -> type[RequestBody] | None:
    """The body each item of a list field is (list[RunItemIn]: RunItemIn), if it is one."""
    for kind in kinds:
        if getattr(kind, "__origin__", None) is list:
            (item,) = kind.__args__
            if _is_body(item):
                return item
    return None


def _shown(name: str) -> str:
    return name if len(name) <= 60 else name[:57] + "..."
