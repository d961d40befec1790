"""Editing a call's arguments before approving it: one form field per argument, from the tool's input
schema (money in dollars, a choice as a list, long text as a text box), read back into arguments,
and checked field by field with sentences that say what to type. The tool's own checks (what is
left to refund) come after, in webapp.approvals.actions.edit_problems.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from webapp.tools.presenting import label, money
from webapp.tools.registry import Tool

TEXT_BOX_CHARS = 300  # text allowed to be longer than this gets a text box, not a line


@dataclass(frozen=True)
class EditField:
    """One argument as a form field: what it is, what is in it now, and what is wrong with it."""

    name: str
    label: str
    kind: str  # money | integer | choice | text | long_text
    value: str  # as the form shows it (dollars for money), or as the reviewer typed it
    required: bool
    help: str
    choices: tuple[str, ...] = ()
    minimum: Any = None
    maximum: Any = None
    max_length: int | None = None
    error: str | None = None


def _properties(tool: Tool) -> tuple[dict, set[str]]:
    schema = tool.input_schema()
    return schema.get("properties", {}), set(schema.get("required", []))


def _kind(name: str, prop: dict) -> str:
    if "enum" in prop:
        return "choice"
    if prop.get("type") == "integer":
        return "money" if name.endswith("_cents") else "integer"
    if (prop.get("maxLength") or 0) > TEXT_BOX_CHARS:
        return "long_text"
    return "text"


def _bounds(prop: dict) -> tuple[int | None, int | None]:
    low = prop.get("minimum")
    if low is None and prop.get("exclusiveMinimum") is not None:
        low = prop["exclusiveMinimum"] + 1
    high = prop.get("maximum")
    if high is None and prop.get("exclusiveMaximum") is not None:
        high = prop["exclusiveMaximum"] - 1
    return low, high


def _shown_value(kind: str, value: Any) -> str:
    if value is None:
        return ""
    if kind == "money" and isinstance(value, int):
        return f"{Decimal(value) / 100:.2f}"
    return str(value)


def fields(tool: Tool, arguments: dict, typed: dict | None = None, errors: dict | None = None) -> list[EditField]:
    """The edit form's fields: the call's arguments, or what the reviewer typed, with each field's error."""
    properties, required = _properties(tool)
    shown = []
    for name, prop in properties.items():
        kind = _kind(name, prop)
        low, high = _bounds(prop)
        if kind == "money":
            low_text = money(low) if low is not None else "$0.01"
            help_text = f"In dollars, from {low_text}" + (f" to {money(high)}" if high is not None else "") + "."
        else:
            help_text = prop.get("description", "")
        value = typed[name] if typed is not None and name in typed else _shown_value(kind, arguments.get(name))
        shown.append(
            EditField(
                name=name,
                label=label(name),
                kind=kind,
                value=value,
                required=name in required,
                help=help_text,
                choices=tuple(prop.get("enum", ())),
                minimum=low,
                maximum=high,
                max_length=prop.get("maxLength"),
                error=(errors or {}).get(name),
            )
        )
    return shown


def read(tool: Tool, form: dict[str, str]) -> tuple[dict, dict[str, str], dict[str, str]]:
    """(arguments, what was typed, errors by field) from a posted edit form. Arguments are only those
    that read cleanly; every field that does not gets a sentence saying what to type."""
    arguments: dict[str, Any] = {}
    typed: dict[str, str] = {}
    errors: dict[str, str] = {}
    for field in fields(tool, {}):
        raw = form.get(f"arg_{field.name}", "")
        typed[field.name] = raw
        text = raw.strip()
        if not text:
            if field.required:
                errors[field.name] = f"{field.label} is required."
            continue
        value, problem = _parse(field, text)
        if problem:
            errors[field.name] = problem
        else:
            arguments[field.name] = value
    return arguments, typed, errors


def _parse(field: EditField, text: str) -> tuple[Any, str | None]:
    low, high = field.minimum, field.maximum
    if field.kind == "money":
        try:
            dollars = Decimal(text.replace(",", "").removeprefix("$").strip())
        except InvalidOperation:
            dollars = None
        if dollars is None or not dollars.is_finite() or dollars != dollars.quantize(Decimal("0.01")):
            return None, f"{field.label}: type an amount in dollars with at most two decimals, like 40 or 40.50."
        cents = int(dollars * 100)
        if (low is not None and cents < low) or (high is not None and cents > high):
            return None, f"{field.label} must be from {money(low or 0)} to {money(high or cents)}."
        return cents, None
    if field.kind == "integer":
        if not text.isascii() or not text.isdigit():
            return None, f"{field.label}: type a whole number, like 4471."
        number = int(text)
        if (low is not None and number < low) or (high is not None and number > high):
            return None, f"{field.label} must be a whole number from {low} to {high}."
        return number, None
    if field.kind == "choice" and text not in field.choices:
        return None, f"{field.label} must be one of: {', '.join(field.choices)}."
    if field.max_length is not None and len(text) > field.max_length:
        return None, f"{field.label} is {len(text):,} characters; at most {field.max_length:,} fit."
    return text, None
