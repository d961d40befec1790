"""What an admin maps of an MCP tool's arguments: its amount and unit, its subject, and the read-only
tool its facts come from."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from webapp.models import McpTool
from webapp.tools import presenting
from webapp.tools.described import UNITS
from webapp.tools.mcp.base import McpError
from webapp.tools.mcp.guard import read_only_and_destructive
from webapp.tools.registry import Fact

FACTS_SECONDS = 10.0  # the longest a decision page waits for a tool's facts


def set_mapping(
    session: Session,
    tenant_id: int,
    registry_name: str,
    *,
    amount: str | None = None,
    unit: str = "cents",
    subject: str | None = None,
    facts_tool: str | None = None,
    facts_arguments: dict[str, str] | None = None,
    weighs_money: bool = False,
    weighs_subject: bool = False,
) -> tuple[dict | None, dict | None]:
    """Map which of the tool's arguments is the money it moves (and its unit), which names what it
    acts on, and which read-only tool of the same server gives its facts (with which of this call's
    arguments); None or empty clears each. `weighs_money` / `weighs_subject`: the tool's policy weighs
    the amount (an amount rule, money limits) / the subject (limits per subject), so changing what
    they read is refused (it could let calls wait less). Returns (before, after); the caller commits.
    McpError says what to fix."""
    row = session.scalar(select(McpTool).where(McpTool.tenant_id == tenant_id, McpTool.registry_name == registry_name))
    if row is None:
        raise McpError(f"There is no MCP tool named {registry_name!r} in this tenant.")
    properties = (row.input_schema or {}).get("properties") or {}
    mapping: dict = {}
    if amount:
        if amount not in properties:
            raise McpError(f"{registry_name} has no argument {amount!r}; its arguments: {_names(properties)}.")
        if unit not in UNITS:
            raise McpError(f"The unit must be {' or '.join(UNITS)}.")
        kinds = _kinds(properties[amount])
        wanted = {"integer"} if unit == "cents" else {"integer", "number", "string"}
        if kinds and not kinds & wanted:
            raise McpError(
                f"{amount} is {'/'.join(sorted(kinds))} in {registry_name}'s schema: not an amount in {unit}."
            )
        mapping["amount"] = {"argument": amount, "unit": unit}
    if subject:
        if subject not in properties:
            raise McpError(f"{registry_name} has no argument {subject!r}; its arguments: {_names(properties)}.")
        mapping["subject"] = {"argument": subject}
    if facts_tool:
        mapping["facts"] = _facts_mapping(row, registry_name, properties, facts_tool, facts_arguments)
    before = row.mapping or {}
    if weighs_money and before.get("amount") != mapping.get("amount"):
        raise McpError(
            f"{registry_name}'s policy weighs the money its calls move (an amount rule or money limits), so what it "
            "reads as the amount cannot change under it: set the policy to always wait first, then map the amount."
        )
    if weighs_subject and before.get("subject") != mapping.get("subject"):
        raise McpError(
            f"{registry_name}'s policy has limits per subject, so what it reads as the subject cannot change under "
            "it: clear those limits first, then map the subject."
        )
    row.mapping = mapping or None
    row.server.version += 1  # the tenant's registries are built again
    session.flush()
    return before or None, row.mapping


def _facts_mapping(
    row: McpTool, registry_name: str, properties: dict, facts_tool: str, facts_arguments: dict[str, str] | None
) -> dict:
    """The facts part of a mapping: the read-only tool of the same server a reviewer's page calls, and
    which of this tool's arguments fills each of its arguments. McpError says what to fix."""
    companion = next((t for t in row.server.tools if facts_tool in (t.remote_name, t.registry_name)), None)
    if companion is None or companion.id == row.id:
        others = ", ".join(t.remote_name for t in row.server.tools if t.id != row.id) or "none"
        raise McpError(f"{facts_tool!r} is not another tool of the server {row.server.name} (its tools: {others}).")
    read_only, destructive = read_only_and_destructive(companion.annotations or {})
    if not read_only or destructive or companion.held:
        raise McpError(
            f"{companion.remote_name} cannot give facts: the desk calls it whenever a reviewer opens a call, so "
            "it must be a tool its server marks read-only (and not destructive), accepted as it is now."
        )
    theirs = (companion.input_schema or {}).get("properties") or {}
    given = dict(facts_arguments or {})
    for their_name, our_name in given.items():
        if their_name not in theirs:
            raise McpError(f"{companion.remote_name} has no argument {their_name!r}; its arguments: {_names(theirs)}.")
        if our_name not in properties:
            raise McpError(f"{registry_name} has no argument {our_name!r}; its arguments: {_names(properties)}.")
    missing = [name for name in (companion.input_schema or {}).get("required", []) if name not in given]
    if missing:
        raise McpError(
            f"{companion.remote_name} needs {', '.join(missing)}: say which of {registry_name}'s arguments "
            f"gives each (its arguments: {_names(properties)})."
        )
    return {"tool": companion.remote_name, "arguments": given}


def mapping_words(mapping: dict | None) -> list[str]:
    """A tool's mapping for people."""
    mapping = mapping or {}
    said = []
    if "amount" in mapping:
        said.append(f"Money: {mapping['amount']['argument']} ({mapping['amount']['unit']})")
    if "subject" in mapping:
        said.append(f"Acts on: {mapping['subject']['argument']}")
    if "facts" in mapping:
        given = ", ".join(f"{k} = {v}" for k, v in mapping["facts"]["arguments"].items())
        said.append(f"Facts from: {mapping['facts']['tool']}" + (f" ({given})" if given else ""))
    return said


def _kinds(schema: dict) -> set[str]:
    kind = schema.get("type")
    found = set(kind) if isinstance(kind, list) else ({kind} if kind else set())
    for branch in schema.get("anyOf", []) + schema.get("oneOf", []):
        found |= _kinds(branch)
    return found


def _names(properties: dict) -> str:
    return ", ".join(properties) or "none"


def facts_of(result: Any) -> list[Fact]:
    """A read-only tool's result as facts for people: a JSON object (or text that is one) key by key,
    anything else whole."""
    if isinstance(result, str):
        try:
            result = json.loads(result) if result.lstrip().startswith("{") else result
        except ValueError:
            pass
    if isinstance(result, dict) and result:
        shown = list(result.items())[:20]
        return [
            Fact(presenting.label(str(k)), presenting.shorten(presenting.value_text(str(k), v), 500)) for k, v in shown
        ]
    text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
    return [Fact("Result", presenting.shorten(text, 2000) or "(empty)")]


def _fact(key: str, value: Any) -> Fact:
    return Fact(presenting.label(key), presenting.shorten(presenting.value_text(key, value), 500))
