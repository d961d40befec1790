"""Tool arguments and results in words for people: money in dollars, ids named by their record, a
change as "amount $75.00 → $40.00". Pages and the API use it; the model never reads it.

The conventions are the tools' own: an argument or result key ending in `_cents` is an amount of
money, one ending in `_id` names a record of that kind (`order_id`: an order).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

LONG_TEXT = 120  # longer text arguments are shown as a block of their own


@dataclass(frozen=True)
class Shown:
    """One argument or result value as people read it."""

    name: str  # as the tool has it: total_cents
    label: str  # as people say it: Amount
    text: str  # $75.00
    record: str | None = None  # the kind of record an id names (invoice), for a link
    long: bool = False  # a paragraph of its own (an email's body)


def money(cents: int) -> str:
    """$1,234.56 (and -$5.00)."""
    sign = "-" if cents < 0 else ""
    return f"{sign}${Decimal(abs(cents)) / 100:,.2f}"


def label(name: str) -> str:
    """total_cents: Total; order_id: Order; remaining_refundable_cents: Remaining refundable."""
    for suffix in ("_cents", "_id"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    words = name.replace("_", " ").strip()
    return words[:1].upper() + words[1:]


def value_text(name: str, value: Any) -> str:
    """A value as people read it: money in dollars, yes/no, text as it is, anything else as JSON."""
    if name.endswith("_cents") and isinstance(value, int) and not isinstance(value, bool):
        return money(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "none"
    if isinstance(value, str | int | float):
        return str(value)
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def shown(name: str, value: Any) -> Shown:
    text = value_text(name, value)
    record = name[: -len("_id")] if name.endswith("_id") and isinstance(value, int) else None
    return Shown(
        name, label(name), text, record, long=isinstance(value, str) and (len(text) > LONG_TEXT or "\n" in text)
    )


def arguments(order: list[str], values: dict) -> list[Shown]:
    """A call's arguments in the order of the tool's schema (`order`; unknown ones after), for people."""
    names = [n for n in order if n in values] + [n for n in values if n not in order]
    return [shown(name, values[name]) for name in names]


def changes(before: dict, after: dict) -> str:
    """What an edit changed, argument by argument: "amount $75.00 → $40.00; reason “x” → “y”"."""
    parts = []
    for name in [*before, *(n for n in after if n not in before)]:
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        if name not in after:
            parts.append(f"{label(name).lower()} {_quoted(name, old)} removed")
        elif name not in before:
            parts.append(f"{label(name).lower()} set to {_quoted(name, new)}")
        else:
            parts.append(f"{label(name).lower()} {_quoted(name, old)} → {_quoted(name, new)}")
    return "; ".join(parts)


def _quoted(name: str, value: Any) -> str:
    text = value_text(name, value)
    if isinstance(value, str):
        text = text if len(text) <= 60 else text[:59] + "…"
        return f"“{text}”"
    return text


def result_rows(data: Any) -> list[Shown]:
    """A tool's result as label and value rows (a list of records becomes one row each, briefly)."""
    if isinstance(data, dict):
        return [shown(name, value) for name, value in data.items() if not isinstance(value, list | dict)] + [
            Shown(name, label(name), _brief_list(value)) for name, value in data.items() if isinstance(value, list)
        ]
    if isinstance(data, list):
        return [Shown("items", "Items", _brief_list(data))]
    return [Shown("result", "Result", str(data), long=True)] if data not in (None, "") else []


def _brief_list(items: list) -> str:
    if not items:
        return "none"
    described = []
    for item in items[:10]:
        if isinstance(item, dict):
            described.append(
                ", ".join(f"{label(k).lower()} {value_text(k, v)}" for k, v in item.items() if v is not None)
            )
        else:
            described.append(str(item))
    more = f" (and {len(items) - 10} more)" if len(items) > 10 else ""
    return "; ".join(described) + more


def people(names: list[str]) -> str:
    """A, A and B, A, B and C."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def more_approvals(count: int) -> str:
    """1 more approval from another reviewer; 2 more approvals from other reviewers."""
    return f"{plural(count, 'more approval')} from {'another reviewer' if count == 1 else 'other reviewers'}"


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """1 approval, 2 approvals."""
    return f"{count:,} {noun if count == 1 else (nouns or noun + 's')}"


def duration(seconds: float) -> str:
    """A span of time as people say it: 45s, 12 min, 2 h 10 min, 3 d 4 h."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"


def shorten(text: str, limit: int) -> str:
    """`text` on one line, at most `limit` characters: cut at the last word boundary that fits, with
    an ellipsis; a single word longer than the limit is cut inside it (there is no boundary)."""
    text = " ".join((text or "").split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    boundary = cut.rfind(" ")
    if boundary > 0 and cut[-1].isalnum() and text[limit - 1].isalnum():  # the cut falls inside a word
        cut = cut[:boundary]
    return cut.rstrip(" ,;:.-–—") + "…"
