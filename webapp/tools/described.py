"""Tools described by data rather than by a class: a JSON schema for their arguments, and what an
admin said of them (which argument is the money, in what unit, and which names what a call acts on).
An MCP server's tools (webapp/tools/mcp/) and the tools outside agents declare (webapp/tools/
external.py) are both such tools.

Their schemas come from outside the desk (an admin's declaration, an MCP server's listing), so
checking arguments against one must not stall the desk: its patterns (`pattern`, and the keys of
`patternProperties`) are run by the `regex` package under a time limit, PATTERN_SECONDS a match and
CHECK_SECONDS for the whole of one call's arguments; a pattern that would take too long to compile
(counted repeats nested into a huge program), or that `regex` cannot compile, is refused when the
schema is declared (`schema_problem`); and `uniqueItems` is checked in linear time. Arguments that
could not be checked in time are refused, saying so."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import jsonschema
import referencing.exceptions
import regex
from jsonschema import FormatChecker, ValidationError

from webapp.tools.registry import Concern, InvalidInput, Tool

UNITS = ("cents", "dollars")
PATTERN_SECONDS = 0.1  # one value matched against one pattern
CHECK_SECONDS = 0.5  # one call's arguments checked against its whole schema
MAX_PATTERNS = 50  # patterns in one schema (`pattern`, and the keys of `patternProperties`)
MAX_PATTERN_WEIGHT = 10_000  # how large a pattern's counted repeats may make it once compiled
# Keywords whose values are data, not schemas: a "pattern" key inside them is no pattern.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})
_COUNT = regex.compile(r"\{(\d*)(?:,(\d*))?\}")
_INLINE_FLAGS = regex.compile(r"\(\?([a-zA-Z0-9-]*)[:)]")


# --- what a schema may hold -----------------------------------------------------------------------


def schema_problem(schema: Any) -> str | None:
    """Why an input schema cannot be used (None: it can)."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return "its input schema is not a JSON schema of an object"
    odd = odd_value(schema)
    if odd is not None:
        where, what = odd
        return f"its input schema holds {what}" + (f" (at {where})" if where else "")
    patterns = list(_patterns(schema))
    if len(patterns) > MAX_PATTERNS:
        return f"its input schema has {len(patterns):,} patterns; the desk runs at most {MAX_PATTERNS} a schema"
    for pattern in patterns:
        if problem := pattern_problem(pattern):
            return f"its input schema's pattern {_shown(pattern)} cannot be used: {problem}"
    if _mentions(schema, "unevaluatedProperties") and _mentions(schema, "patternProperties"):
        return (
            "its input schema has unevaluatedProperties beside patternProperties, which the desk cannot check in time"
        )
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema, format_checker=_schema_formats(cls))
    except jsonschema.SchemaError as exc:
        return f"its input schema is not valid JSON schema ({exc.message})"
    return None


def odd_value(value: Any) -> tuple[str, str] | None:
    """The first thing in this JSON value that no column or audit record can hold, as (where, what):
    a number that is not finite (1e400 is read as infinity), text with a lone surrogate or a NUL
    character (in a string or a name). `where` is the path to it ("properties.x.maximum"). (Walked
    without recursion: a value nests as deep as its sender likes.)"""
    pending: list[tuple[Any, tuple | None]] = [(value, None)]  # (value, (key, its parent's link))
    while pending:
        item, link = pending.pop()
        what = oddity(item)
        if what is None and isinstance(item, dict):
            for key, inner in item.items():
                if (what := oddity(key)) is not None:
                    link = (key, link)
                    break
                pending.append((inner, (key, link)))
        elif what is None and isinstance(item, list):
            pending.extend((inner, (index, link)) for index, inner in enumerate(item))
        if what is not None:
            return _path(link), what
    return None


NOT_FINITE = "a number that is not finite (1e400 is too large for a number; NaN and Infinity are not numbers)"
NUL = "the NUL character (\\u0000)"
LONE_SURROGATE = "text that is not valid Unicode (a lone surrogate)"


def oddity(item: Any) -> str | None:
    """What of odd_value's kinds this one string or number is, if any."""
    if isinstance(item, float) and not math.isfinite(item):
        return NOT_FINITE
    if isinstance(item, str):
        if "\x00" in item:
            return NUL
        try:
            item.encode("utf-8")
        except UnicodeEncodeError:
            return LONE_SURROGATE
    return None


def _path(link: tuple | None) -> str:
    parts: list[str] = []
    while link is not None:
        key, link = link
        shown = key if isinstance(key, int) else str(key).encode("utf-8", "backslashreplace").decode()
        parts.append(f"[{shown}]" if isinstance(key, int) else shown)
    return "".join(part if part.startswith("[") or not i else "." + part for i, part in enumerate(reversed(parts)))


def _patterns(schema: Any) -> Iterator[str]:
    """The schema's patterns: every `pattern` that is text, and every key of `patternProperties`."""
    pending = [schema]
    while pending:
        item = pending.pop()
        if isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, dict):
            if isinstance(item.get("pattern"), str):
                yield item["pattern"]
            if isinstance(item.get("patternProperties"), dict):
                yield from (key for key in item["patternProperties"] if isinstance(key, str))
            pending.extend(inner for key, inner in item.items() if key not in _DATA_KEYWORDS)


def _mentions(schema: Any, keyword: str) -> bool:
    pending = [schema]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            if keyword in item:
                return True
            pending.extend(inner for key, inner in item.items() if key not in _DATA_KEYWORDS)
        elif isinstance(item, list):
            pending.extend(item)
    return False


@functools.lru_cache(maxsize=1024)
def pattern_problem(pattern: str) -> str | None:
    """Why `regex` cannot run this pattern (None: it can), checked before it is compiled: a pattern's
    counted repeats are expanded when it compiles, so ((a{100}){100}){100} would take seconds."""
    for flags in _INLINE_FLAGS.findall(pattern):
        if "x" in flags.partition("-")[0] or "V1" in flags:
            return "the desk takes no verbose (?x) or version 1 (?V1) patterns"
    if _weight(pattern) > MAX_PATTERN_WEIGHT:
        return f"its counted repeats ({{n}}) make it too large to run (more than {MAX_PATTERN_WEIGHT:,} steps)"
    try:
        regex.compile(pattern)
    except (regex.error, ValueError, OverflowError, RecursionError) as exc:
        return f"it is not a regular expression ({exc})"
    return None


def _weight(pattern: str) -> int:
    """How large a pattern is once its counted repeats are expanded, at most: each character, class
    or escape counts one, a repeat {n}, {n,} or {n,m} multiplies what it repeats by n (regex expands the
    n copies that must match; the rest it loops over), nested repeats multiply, and alternatives add up."""
    groups = [[0, 0]]  # per open group: [its weight so far, the weight of its last item]
    at, end = 0, len(pattern)
    while at < end:
        char = pattern[at]
        if char == "\\":
            close = (
                pattern.find("}", at)
                if pattern[at + 1 : at + 2] in ("p", "P", "N", "x", "u") and pattern[at + 2 : at + 3] == "{"
                else -1
            )
            at = (close if close > 0 else at + 1) + 1
            _add(groups, 1)
            continue
        if char == "[":
            at = _class_end(pattern, at)
            _add(groups, 1)
            continue
        if char == "(":
            if pattern.startswith("(?#", at):
                close = pattern.find(")", at)
                at = end if close < 0 else close + 1
                continue
            groups.append([0, 0])
        elif char == ")" and len(groups) > 1:
            inner = groups.pop()[0]
            _add(groups, inner)
        elif char == "{" and (count := _COUNT.match(pattern, at)) and (count.group(1) or count.group(2)):
            times = max(int(count.group(1) or 0), 1)
            total, last = groups[-1]
            groups[-1] = [total - last + last * times, last * times]
            at = count.end()
            continue
        elif char == "|":
            groups[-1][1] = 0
        elif char not in "*+?^$":
            _add(groups, 1)
        at += 1
    while len(groups) > 1:  # (an unclosed group: regex refuses it, but count it)
        inner = groups.pop()[0]
        _add(groups, inner)
    return groups[0][0]


def _add(groups: list[list[int]], weight: int) -> None:
    groups[-1][0] += weight
    groups[-1][1] = weight


def _class_end(pattern: str, at: int) -> int:
    """Where the character class starting at `at` ends (after its "]")."""
    at += 1
    if pattern[at : at + 1] == "^":
        at += 1
    if pattern[at : at + 1] == "]":
        at += 1
    while at < len(pattern) and pattern[at] != "]":
        at += 2 if pattern[at] == "\\" else 1
    return at + 1


def _schema_formats(cls: type) -> FormatChecker:
    """The draft's format checks for checking a schema, with "regex" (a `pattern`'s text) as the
    desk runs patterns: by `regex`, checked by pattern_problem."""
    checker = FormatChecker(())
    checker.checkers = {**cls.FORMAT_CHECKER.checkers, "regex": (_runnable, ValueError)}
    return checker


def _runnable(pattern: object) -> bool:
    if isinstance(pattern, str) and (problem := pattern_problem(pattern)):
        raise ValueError(problem)
    return True


def _shown(text: str) -> str:
    return repr(_short(text))


def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


# --- checking arguments against a schema in time --------------------------------------------------


@dataclass
class _Budget:
    """The time one call's arguments have to be checked in, and what could not be checked in it."""

    deadline: float
    late: str | None = None

    def left(self) -> float:
        return self.deadline - time.monotonic()


_budget: ContextVar[_Budget | None] = ContextVar("schema_budget", default=None)


class _Unchecked(Exception):
    """A value that could not be checked against a pattern (in time, or at all)."""


def _search(pattern: str, text: str) -> bool:
    """Whether the pattern matches somewhere in the text (as JSON schema's "pattern" means), by
    `regex` within PATTERN_SECONDS and the call's budget; _Unchecked when it cannot be told."""
    budget = _budget.get()
    seconds = PATTERN_SECONDS if budget is None else min(PATTERN_SECONDS, budget.left())
    problem = pattern_problem(pattern)
    if problem is None and seconds > 0:
        try:
            return regex.search(pattern, text, timeout=seconds) is not None
        except TimeoutError:
            pass
        message = f"could not be checked against the pattern {_shown(pattern)} in time"
    elif problem is None:
        message = "could not be checked against the schema in time"
    else:
        message = f"could not be checked: the schema's pattern {_shown(pattern)} cannot be used ({problem})"
    if budget is not None:
        budget.late = budget.late or message
    raise _Unchecked(message)


def _pattern(validator, pattern, instance, schema):
    if not validator.is_type(instance, "string"):
        return
    try:
        if not _search(pattern, instance):
            yield ValidationError(f"{_shown(instance)} does not match {pattern!r}")
    except _Unchecked as exc:
        yield ValidationError(str(exc))


def _pattern_properties(validator, patterns, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            try:
                matched = _search(pattern, key)
            except _Unchecked as exc:
                yield ValidationError(f"{_shown(key)} {exc}", path=[key])
                return
            if matched:
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator, allowed, instance, schema):
    """As jsonschema's, with patternProperties' keys matched by _search."""
    if not validator.is_type(instance, "object"):
        return
    properties, patterns = schema.get("properties") or {}, schema.get("patternProperties") or {}
    extras = []
    for key in instance:
        if key in properties:
            continue
        try:
            if any(_search(pattern, key) for pattern in patterns):
                continue
        except _Unchecked as exc:
            yield ValidationError(f"{_shown(key)} {exc}", path=[key])
            return
        extras.append(key)
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], allowed, path=extra)
    elif not allowed and extras:
        listed = ", ".join(repr(extra) for extra in sorted(extras))
        if patterns:
            joined = ", ".join(repr(pattern) for pattern in sorted(patterns))
            yield ValidationError(
                f"{listed} {'does' if len(extras) == 1 else 'do'} not match any of the regexes: {joined}"
            )
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(f"Additional properties are not allowed ({listed} {verb} unexpected)")


def _unique_items(validator, unique, instance, schema):
    """As jsonschema's, in linear time (its own compares every pair of objects: 5,000 of them took 20 s)."""
    if not unique or not validator.is_type(instance, "array"):
        return
    seen = set()
    for item in instance:
        key = _same(item)
        if key in seen:
            yield ValidationError(f"{_short(repr(instance))} has non-unique elements")
            return
        seen.add(key)


def _same(value: Any) -> Any:
    """A key equal for JSON values JSON schema calls equal (1 and 1.0; not 1 and true)."""
    if isinstance(value, bool) or value is None:
        return ("b", value)
    if isinstance(value, int | float):
        return ("n", value)
    if isinstance(value, list):
        return ("l", tuple(_same(item) for item in value))
    if isinstance(value, dict):
        return ("d", frozenset((key, _same(item)) for key, item in value.items()))
    return ("s", value)


def _unable(validator, value, instance, schema):
    message = "could not be checked: its schema's unevaluatedProperties beside patternProperties cannot be run in time"
    budget = _budget.get()
    if budget is not None:
        budget.late = budget.late or message
    yield ValidationError(message)


def _in_time(check: Callable) -> Callable:
    """A keyword's check that gives up once the call's budget is spent (a schema of nested anyOf can
    take exponential time without a single pattern)."""

    def keyword(validator, value, instance, schema):
        budget = _budget.get()
        if budget is not None and budget.left() <= 0:
            budget.late = budget.late or "could not be checked against the schema in time"
            yield ValidationError(budget.late)
            return
        yield from check(validator, value, instance, schema)

    return keyword


@functools.cache
def _validator_class(base: type, unevaluated_beside_patterns: bool) -> type:
    """The draft's validator with patterns run by `regex` in time, uniqueItems in linear time, and every
    keyword within the call's budget."""
    ours = {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
        "uniqueItems": _unique_items,
    }
    if unevaluated_beside_patterns:
        ours["unevaluatedProperties"] = _unable
    keywords = {name: ours.get(name, check) for name, check in base.VALIDATORS.items()}
    return jsonschema.validators.extend(base, {name: _in_time(check) for name, check in keywords.items()})


def validator(schema: dict) -> Any:
    """A validator of this schema that cannot stall (see the module docstring)."""
    base = jsonschema.validators.validator_for(schema)
    both = _mentions(schema, "unevaluatedProperties") and _mentions(schema, "patternProperties")
    return _validator_class(base, both)(schema)


# --- money ----------------------------------------------------------------------------------------


def money_in_cents(value: Any, unit: str) -> int | None:
    """An argument's money in cents: whole cents, or dollars as a number or its text ("12.50")."""
    if isinstance(value, bool) or value is None:
        return None
    if unit == "cents":
        return value if isinstance(value, int) else None
    try:
        dollars = Decimal(str(value)) if isinstance(value, int | float | str) else None
    except InvalidOperation:
        return None
    if dollars is None or not dollars.is_finite():
        return None
    cents = dollars * 100
    return int(cents) if cents == cents.to_integral_value() and abs(cents) < 2**31 else None


class DescribedTool(Tool):
    """A tool whose arguments a JSON schema describes: checked strictly (an argument the schema does not
    name is refused unless the schema allows more), within CHECK_SECONDS, and parsed to a dict."""

    def use_schema(self, schema: dict | None) -> None:
        self._schema = schema or {"type": "object"}
        strict = {**self._schema, "additionalProperties": self._schema.get("additionalProperties", False)}
        self._validator = validator(strict)

    def input_schema(self) -> dict:
        return self._schema

    def definition(self) -> dict:
        return {"name": self.name, "description": self.description, "input_schema": self._schema}

    def parse(self, raw_input: Any) -> dict:
        if not isinstance(raw_input, dict):
            raise InvalidInput("input: must be an object", [Concern("The arguments must be an object.")])
        odd = odd_value(raw_input)
        if odd is not None:
            where, what = odd
            argument = where.split(".")[0].split("[")[0] or None
            message = f"holds {what}" if argument is None else f"{where}: holds {what}"
            raise InvalidInput(message, [Concern(f"{message}.", argument)])
        budget = _Budget(time.monotonic() + CHECK_SECONDS)
        token = _budget.set(budget)
        try:
            errors = sorted(self._validator.iter_errors(raw_input), key=lambda e: [str(p) for p in e.path])
        except referencing.exceptions.Unresolvable as exc:
            problem = f"the tool's schema refers to something it does not hold ({exc})"
            raise InvalidInput(
                f"input: could not be checked: {problem}", [Concern(f"Could not be checked: {problem}.")]
            ) from None
        except RecursionError:
            problem = "the tool's schema refers to itself without end"
            raise InvalidInput(
                f"input: could not be checked: {problem}", [Concern(f"Could not be checked: {problem}.")]
            ) from None
        finally:
            _budget.reset(token)
        if budget.late and not any("could not be checked" in error.message for error in errors):
            errors.append(ValidationError(budget.late))  # (a check given up inside "not" or "oneOf" counts)
        if errors:
            concerns = []
            for error in errors[:5]:
                where = str(error.path[0]) if error.path else None
                concerns.append(Concern(f"{where}: {error.message}." if where else f"{error.message}.", where))
            summary = "; ".join(f"{'.'.join(map(str, e.path)) or 'input'}: {e.message}" for e in errors[:5])
            raise InvalidInput(summary, concerns)
        return dict(raw_input)
