"""Schemas the desk did not write (an admin's declared tool, an MCP server's listing) cannot stall it:
their patterns run under a time limit, a call's arguments are checked within half a second however
the schema is built, and what no pattern engine or column could take is refused when the schema comes
in (webapp/tools/described.py). The API's side is in tests/api/test_outside_calls.py."""

from __future__ import annotations

import json
import time

import pytest

from webapp.models import McpTool
from webapp.tools import described
from webapp.tools.described import DescribedTool, schema_problem
from webapp.tools.mcp import Access, McpRemoteTool
from webapp.tools.registry import InvalidInput

# seconds: a bound no check comes near (each takes well under one with the limits, minutes without them),
# generous so that a loaded machine passes: what these tests pin is the state (given up "in time" by the
# desk's own time limits, or checked whole), and this bound only catches a limit that no longer holds.
SLOW = 30.0


def tool(schema: dict) -> DescribedTool:
    made = DescribedTool()
    made.name, made.description = "wire", "Wire money."
    made.use_schema(schema)
    return made


def mcp_tool(schema: dict) -> McpRemoteTool:
    """An MCP server's tool as the tenant's registry holds it (the row is not stored: nothing reads it)."""
    row = McpTool(
        registry_name="mcp_bank__wire",
        remote_name="wire",
        description="Wire money.",
        input_schema=schema,
        annotations={},
        fingerprint="f",
        held=False,
        mapping={},
    )
    return McpRemoteTool(row, Access(server="bank", url="https://bank.example/mcp", command=None))


def refusal(made: DescribedTool, arguments: dict) -> tuple[float, InvalidInput]:
    started = time.monotonic()
    with pytest.raises(InvalidInput) as refused:
        made.parse(arguments)
    return time.monotonic() - started, refused.value


def of_strings(**properties) -> dict:
    return {"type": "object", "properties": properties}


@pytest.mark.parametrize("make", [tool, mcp_tool], ids=["declared", "mcp"])
def test_a_pattern_that_takes_exponential_time_is_given_up_and_said(make):
    made = make(of_strings(account={"type": "string", "pattern": "^(a|aa)+$"}))
    took, refused = refusal(made, {"account": "a" * 40 + "b"})
    assert took < SLOW
    assert refused.concerns[0].field == "account"
    assert "could not be checked against the pattern '^(a|aa)+$' in time" in refused.concerns[0].message
    assert made.parse({"account": "aaaa"}) == {"account": "aaaa"}


def test_a_pattern_hidden_inside_not_still_refuses_the_call():
    """A check given up under "not" would pass as "the pattern did not match": it refuses instead."""
    made = tool(of_strings(account={"not": {"type": "string", "pattern": "^(a|aa)+$"}}))
    took, refused = refusal(made, {"account": "a" * 40 + "b"})
    assert took < SLOW and "could not be checked" in refused.summary


def test_many_slow_patterns_share_one_budget():
    slow = {"type": "string", "pattern": "^(a|aa)+$"}
    made = tool(of_strings(**{f"code{n}": slow for n in range(20)}, codes={"type": "array", "items": slow}))
    arguments = {f"code{n}": "a" * 40 + "b" for n in range(20)} | {"codes": ["a" * 40 + "b"] * 100}
    took, refused = refusal(made, arguments)
    assert took < SLOW and "in time" in refused.summary


def test_pattern_properties_and_additional_properties_run_patterns_in_time_too():
    schema = {"type": "object", "patternProperties": {"^(a|aa)+$": {"type": "integer"}}, "additionalProperties": False}
    took, refused = refusal(tool(schema), {"a" * 40 + "b": 1})
    assert took < SLOW and "could not be checked" in refused.summary
    assert tool(schema).parse({"aaa": 1}) == {"aaa": 1}
    took, refused = refusal(tool(schema), {"x": 1})
    assert "'x' does not match any of the regexes" in refused.summary


def test_a_schema_of_nested_choices_is_given_up_within_the_budget():
    """Nested anyOf under unevaluatedProperties: jsonschema alone takes 12 s for this one (80 KB, as an
    MCP server may list), and four times as long for each level more."""
    nested: dict = {"type": "string"}
    for _ in range(10):
        nested = {"anyOf": [nested, {"anyOf": [nested]}], "unevaluatedProperties": False}
    made = mcp_tool(json.loads(json.dumps(of_strings(note=nested))))
    took, refused = refusal(made, {"note": {"a": 1}})
    assert took < SLOW and "could not be checked against the schema in time" in refused.summary


def test_unique_items_of_thousands_of_objects_is_checked_at_once():
    """jsonschema compares every pair of objects: 5,000 took 20 s."""
    made = tool(of_strings(lines={"type": "array", "uniqueItems": True}))
    lines = [{"n": n} for n in range(5_000)]
    started = time.monotonic()
    assert made.parse({"lines": lines}) == {"lines": lines}
    assert time.monotonic() - started < SLOW
    _, refused = refusal(made, {"lines": [*lines, {"n": 4_999.0}]})  # 4999 and 4999.0 are the same number
    assert "non-unique" in refused.summary
    assert made.parse({"lines": [1, True, "1", [1], {"1": 1}]})  # true is not 1, nor "1"


def test_a_schema_that_refers_to_itself_or_to_nothing_refuses_the_call_in_words():
    looping = {**of_strings(x={"$ref": "#/$defs/a"}), "$defs": {"a": {"$ref": "#/$defs/a"}}}
    _, refused = refusal(tool(looping), {"x": 1})
    assert "refers to itself without end" in refused.summary
    _, refused = refusal(tool(of_strings(x={"$ref": "https://schemas.example/x.json"})), {"x": 1})
    assert "refers to something it does not hold" in refused.summary


@pytest.mark.parametrize(
    ("arguments", "field", "says"),
    [
        ({"amount": float("inf")}, "amount", "not finite"),
        ({"amount": float("nan")}, "amount", "not finite"),
        ({"note": {"lines": ["ok", "\ud800"]}}, "note", "lone surrogate"),
        ({"\udfff": 1}, "\\udfff", "lone surrogate"),  # (named by its escape: the answer is text)
    ],
)
def test_arguments_no_record_can_hold_are_refused_naming_the_argument(arguments, field, says):
    """What a model's call may hold too (the API refuses such a body before): refused, never stored."""
    _, refused = refusal(tool({"type": "object", "additionalProperties": True}), arguments)
    assert refused.concerns[0].field == field and says in refused.summary


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        (of_strings(x={"type": "number", "maximum": float("inf")}), "(at properties.x.maximum)"),
        (of_strings(x={"type": "string", "title": "\ud800"}), "lone surrogate"),
        (of_strings(x={"type": "string", "pattern": "(unclosed"}), "is not a regular expression"),
        (of_strings(x={"type": "string", "pattern": "((a{100}){100}){100}"}), "too large to run"),
        (of_strings(x={"type": "string", "pattern": "(?:(?:[a-z]{50}){50}){50}"}), "too large to run"),
        (of_strings(x={"type": "string", "pattern": "(?x) a  b"}), "verbose"),
        (of_strings(x={"type": "string", "pattern": "(?V1)[[a-z]--[aeiou]]"}), "version 1"),
        ({"type": "object", "patternProperties": {"(": {}}}, "is not a regular expression"),
        (
            {
                "$schema": "http://json-schema.org/draft-04/schema#",
                "type": "object",
                "patternProperties": {"a{100}{100}": {}},
            },
            "is not a regular expression",
        ),
        (
            {"type": "object", "patternProperties": {"^x": {}}, "unevaluatedProperties": False},
            "unevaluatedProperties beside patternProperties",
        ),
        (of_strings(**{f"x{n}": {"pattern": "^a$"} for n in range(described.MAX_PATTERNS + 1)}), "at most 50"),
    ],
)
def test_a_schema_the_desk_cannot_run_in_time_is_refused_when_it_comes_in(schema, says):
    started = time.monotonic()
    problem = schema_problem(schema)
    assert time.monotonic() - started < SLOW
    assert problem is not None and says in problem, problem


@pytest.mark.parametrize(
    "pattern",
    [
        r"^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$",
        r"^\p{Lu}{2}\d{10}$",  # regex's Unicode classes, which Python's re cannot compile
        r"^[^@\s]{1,64}@[^@\s]{1,255}$",
        r"^.{0,65535}$",
    ],
)
def test_the_patterns_schemas_are_made_of_are_taken(pattern):
    schema = of_strings(x={"type": "string", "pattern": pattern}, y={"enum": [{"pattern": "(not one"}]})
    assert schema_problem(schema) is None
    assert tool(schema).parse({"x": "AB1234567890"} if "Lu" in pattern else {"y": {"pattern": "(not one"}})
