"""Tools described by data rather than by a class: a JSON schema for their arguments, and what an
admin said of them (which argument is the money, in what unit, and which names what a call acts on).
An MCP server's tools (webapp/tools/mcp.py) and the tools outside agents declare (webapp/tools/
external.py) are both such tools."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

import jsonschema

from webapp.tools.registry import Concern, InvalidInput, Tool

UNITS = ("cents", "dollars")


def schema_problem(schema: Any) -> str | None:
    """Why an input schema cannot be used (None: it can)."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return "its input schema is not a JSON schema of an object"
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"its input schema is not valid JSON schema ({exc.message})"
    return None


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
    if dollars is None or not dollars.is_finite() or abs(dollars) > 10**15:
        return None
    cents = dollars * 100
    # a negative or too large amount is read as it is: the gate refuses it (agent/gate.py)
    return int(cents) if cents == cents.to_integral_value() else None


class DescribedTool(Tool):
    """A tool whose arguments a JSON schema describes: checked strictly (an argument the schema does not
    name is refused unless the schema allows more), and parsed to a dict."""

    def use_schema(self, schema: dict | None) -> None:
        self._schema = schema or {"type": "object"}
        strict = {**self._schema, "additionalProperties": self._schema.get("additionalProperties", False)}
        self._validator = jsonschema.validators.validator_for(strict)(strict)

    def input_schema(self) -> dict:
        return self._schema

    def definition(self) -> dict:
        return {"name": self.name, "description": self.description, "input_schema": self._schema}

    def parse(self, raw_input: Any) -> dict:
        if not isinstance(raw_input, dict):
            raise InvalidInput("input: must be an object", [Concern("The arguments must be an object.")])
        errors = sorted(self._validator.iter_errors(raw_input), key=lambda e: [str(p) for p in e.path])
        if errors:
            concerns = []
            for error in errors[:5]:
                where = str(error.path[0]) if error.path else None
                concerns.append(Concern(f"{where}: {error.message}." if where else f"{error.message}.", where))
            summary = "; ".join(f"{'.'.join(map(str, e.path)) or 'input'}: {e.message}" for e in errors[:5])
            raise InvalidInput(summary, concerns)
        return dict(raw_input)
