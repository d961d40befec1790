"""Tools that agents running elsewhere ask about (a team's LangGraph graph, an Agents SDK app, a plain
loop): an admin declares each one (`PUT /api/external-tools/<name>`), and it joins the tenant's
registry beside the built-in and MCP tools, so it has a policy, limits, a ceiling, edits checked
against its schema and a place on the Policies page like any other. It is never offered to the desk's
own model and never runs here: the agent that asked runs it once the desk says it may
(webapp/agent/outside.py).

Nothing here loads Flask, RQ or Redis.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from webapp.models import ExternalCall, ExternalTool, utcnow
from webapp.tools.described import UNITS, DescribedTool, money_in_cents, schema_problem
from webapp.tools.registry import Fact, Record, Review, ToolContext, ToolError

# What the Messages API accepts as a tool's name, so a declared tool reads like any other; "mcp_" is
# the MCP servers' (webapp/tools/mcp/catalogue.py names theirs mcp_<server>__<tool>).
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_DESCRIPTION = 2_000
MAX_SCHEMA_CHARS = 20_000


class DeclarationError(ValueError):
    """A declaration that cannot be kept; the message says what to fix, `field` which field."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class OutsideTool(DescribedTool):
    """A declared tool as its tenant's registry holds it (see the module docstring)."""

    runs_here = False
    default_policy = ("always", None, 1)  # a declared tool waits for a person until an admin says otherwise

    def __init__(self, row: ExternalTool) -> None:
        self.name = row.name
        self.title = row.name.replace("_", " ").capitalize()
        self.description = row.description or row.name
        self.use_schema(row.input_schema)
        self.amount_argument = row.amount_argument
        self.amount_unit = row.amount_unit or "cents"
        self.subject_argument = row.subject_argument

    def moves_money(self) -> bool:
        return self.amount_argument is not None

    def amount(self, input: dict) -> int | None:  # noqa: A002
        return money_in_cents(input.get(self.amount_argument), self.amount_unit) if self.amount_argument else None

    def money_argument(self) -> str | None:
        return self.amount_argument

    def reading(self) -> dict:
        return {"amount": self.amount_argument, "amount_unit": self.amount_unit, "subject": self.subject_argument}

    def subject(self, input: dict, context: ToolContext) -> str | None:  # noqa: A002
        value = input.get(self.subject_argument) if self.subject_argument else None
        return f"{self.subject_argument}:{value}"[:200] if value not in (None, "") else None

    def review(self, input: dict, context: ToolContext) -> Review:  # noqa: A002
        """The facts the agent sent with the call, as its own (the desk did not read them anywhere)."""
        asked = context.session.get(ExternalCall, context.tool_call_id)
        if asked is None or not asked.facts:
            return Review()
        facts = tuple(Fact(str(fact.get("label", "")), str(fact.get("value", ""))) for fact in asked.facts)
        return Review(records=(Record("facts", 0, f"Supplied by {asked.source}, not checked by the desk", facts),))

    def execute(self, input: dict, context: ToolContext) -> Any:  # noqa: A002
        raise ToolError(f"{self.name} is run by the outside agent that asks for it, not by the desk's assistant.")


def tenant_tools(session: Session, tenant_id: int, taken: set[str]) -> list[OutsideTool]:
    """The tenant's declared tools for its registry, leaving out one whose name another tool of the
    tenant took since (an MCP server's tool added later under the same name)."""
    rows = session.scalars(select(ExternalTool).where(ExternalTool.tenant_id == tenant_id).order_by(ExternalTool.name))
    return [OutsideTool(row) for row in rows if row.name not in taken]


@dataclass(frozen=True)
class Declaration:
    """What an admin declares of a tool (PUT /api/external-tools/<name>)."""

    description: str
    input_schema: dict
    amount: str | None = None
    amount_unit: str = "cents"
    subject: str | None = None


def check(name: str, declared: Declaration, taken: set[str], declared_names: Iterable[str] = ()) -> None:
    """DeclarationError unless the tool may be declared so; `taken`: the names of the tenant's tools
    that are not declared ones (built-in and MCP); `declared_names`: the declared ones. A name is the
    tenant's whatever its case: Transfer and transfer would be one tool to people, two to the desk."""
    if not NAME.match(name):
        raise DeclarationError(
            "A tool's name is 1 to 64 letters, digits, _ or -, as the Messages API names tools.", "name"
        )
    if name.lower().startswith("mcp_") or name.lower() in {other.lower() for other in taken}:
        raise DeclarationError(
            f"{name} is the name of one of the desk's own tools or an MCP server's; choose another.", "name"
        )
    same = sorted(other for other in declared_names if other.lower() == name.lower() and other != name)
    if same:
        raise DeclarationError(
            f"The name {name} is taken by the declared tool {same[0]}: names are the same whatever their case. "
            f"Declare {same[0]} again to change it, or choose another name.",
            "name",
        )
    if not declared.description.strip() or len(declared.description) > MAX_DESCRIPTION:
        raise DeclarationError(
            f"Say what the tool does, in 1 to {MAX_DESCRIPTION:,} characters: reviewers read it.", "description"
        )
    if len(json.dumps(declared.input_schema)) > MAX_SCHEMA_CHARS:
        raise DeclarationError(f"The input schema is at most {MAX_SCHEMA_CHARS:,} characters.", "input_schema")
    problem = schema_problem(declared.input_schema)  # (its patterns too: see webapp/tools/described.py)
    if problem:
        raise DeclarationError(f"The tool cannot be declared: {problem}.", "input_schema")
    properties = declared.input_schema.get("properties") or {}
    for field, argument in (("amount", declared.amount), ("subject", declared.subject)):
        if argument is not None and argument not in properties:
            known = ", ".join(sorted(properties)) or "none"
            raise DeclarationError(
                f"{field} must name one of the schema's arguments ({known}), or be null; {argument!r} is not one.",
                field,
            )
    if declared.amount_unit not in UNITS:
        raise DeclarationError(f"amount_unit must be {' or '.join(UNITS)}.", "amount_unit")


def declare(session: Session, tenant_id: int, name: str, declared: Declaration, by_user_id: int | None) -> ExternalTool:
    """Keep the declaration (new, or in place of the one before); checked by `check` first."""
    row = find(session, tenant_id, name)
    if row is None:
        row = ExternalTool(tenant_id=tenant_id, name=name, created_by_id=by_user_id)
        session.add(row)
    row.description = declared.description.strip()
    row.input_schema = declared.input_schema
    row.amount_argument = declared.amount
    row.amount_unit = declared.amount_unit
    row.subject_argument = declared.subject
    row.updated_by_id, row.updated_at = by_user_id, utcnow()
    session.flush()
    return row


def reading(row: ExternalTool) -> dict:
    """What a policy reads of the tool's calls, as declared: the amount's argument and unit, the subject's."""
    return {"amount": row.amount_argument, "amount_unit": row.amount_unit, "subject": row.subject_argument}


def find(session: Session, tenant_id: int, name: str) -> ExternalTool | None:
    return session.scalar(select(ExternalTool).where(ExternalTool.tenant_id == tenant_id, ExternalTool.name == name))


def declared(session: Session, tenant_id: int) -> list[ExternalTool]:
    return list(
        session.scalars(select(ExternalTool).where(ExternalTool.tenant_id == tenant_id).order_by(ExternalTool.name))
    )
