"""Reading a request into its body's model, and refusing it in words: `body(Model)` reads and
validates the JSON object; a failure is a 422 whose message names every bad field in words of our own
(each field's `Rule`), never pydantic's; `query(Model)` does the same for query parameters. Every
error answers the one `Error` body."""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from flask import request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from webapp.api.bodies import QueryParameters, RequestBody, Rule, ToolArguments
from webapp.tools import described
from webapp.web.errors import Refused


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
