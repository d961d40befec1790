"""/api/external-tools: the tools agents that run elsewhere ask about before they run them (POST
/api/calls), declared by an admin with their schema and the policy their calls wait under; with the
bodies those routes take and answer."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from flask import g
from pydantic import BaseModel, Field

from webapp.agent import policies as policy_rules
from webapp.api.base import answer, bp, documented, refused_with_fields
from webapp.api.bodies import RequestBody, Rule, Timestamp, required_text
from webapp.api.policies import PolicyChangeView, PolicyView, SetPolicy, pending_changes, policy_refused, policy_values
from webapp.api.reading import body
from webapp.runtime.extensions import db
from webapp.settings import external_tools
from webapp.tools import external
from webapp.web.security import api_roles


def _argument_name(description: str) -> Any:
    """A declaration's field naming one of the tool's arguments, or null."""
    return Annotated[
        str | None,
        Field(max_length=128, description=description),
        Rule("must be the name of one of the schema's arguments, or null"),
    ]


class DeclareTool(RequestBody):
    """A tool an agent that runs elsewhere will ask about (admins): what it does, its arguments' JSON
    schema, the policy its calls wait under, and which arguments are its money and its subject."""

    description: required_text(2000, "What the tool does, for reviewers (and for the audit log).")
    input_schema: Annotated[
        dict[str, Any],
        Field(description='The JSON schema of its arguments: {"type": "object", "properties": {...}}.'),
        Rule('must be a JSON schema object, like {"type": "object", "properties": {...}}'),
    ]
    policy: Annotated[
        SetPolicy | None,
        Field(
            description="When its calls wait for people (as PUT /api/policies/{tool}); left out: as now, or, for a "
            "new tool, every call waits for one approval. A loosening waits for another admin."
        ),
        Rule("must be a policy object (mode, threshold_cents, approvals, ...), or null"),
    ] = None
    amount: _argument_name("The argument that is the money a call moves, for amount rules and limits.") = None
    amount_unit: Annotated[
        Literal["cents", "dollars"],
        Field(description="What `amount` counts: whole cents (the default) or dollars (a number, or its text)."),
        Rule('must be "cents" or "dollars"'),
    ] = "cents"
    subject: _argument_name("The argument that names what a call acts on, for limits per subject.") = None


class ExternalToolView(BaseModel):
    """A tool that agents running elsewhere ask about, and the policy its calls wait under."""

    name: str
    description: str
    input_schema: dict[str, Any]
    amount: str | None = Field(description="The argument that is the money a call moves.")
    amount_unit: Literal["cents", "dollars"]
    subject: str | None = Field(description="The argument that names what a call acts on.")
    policy: PolicyView
    updated_at: Timestamp

    @classmethod
    def of(cls, row: Any, policy: Any, pending: list[int] = ()) -> ExternalToolView:
        return cls(
            name=row.name,
            description=row.description,
            input_schema=row.input_schema,
            amount=row.amount_argument,
            amount_unit=row.amount_unit,
            subject=row.subject_argument,
            policy=PolicyView.of(policy, pending),
            updated_at=row.updated_at,
        )


class ExternalToolDeclared(ExternalToolView):
    """The tool as declared now; `change`: the policy asked for loosens it, so it waits for another admin."""

    change: PolicyChangeView | None = Field(description="A policy change waiting for a second admin, if one does.")


class ExternalToolList(BaseModel):
    tools: list[ExternalToolView]


@bp.get("/external-tools")
@documented("List the tools outside agents ask about", responses={200: ExternalToolList})
@api_roles("admin")
def list_external_tools():
    rows = external.declared(db.session, g.user.tenant_id)
    return answer(ExternalToolList(tools=[external_tool_view(row) for row in rows]))


@bp.put("/external-tools/<name>")
@documented(
    "Declare a tool that outside agents ask about",
    body=DeclareTool,
    responses={200: ExternalToolDeclared},
    errors={
        422: "invalid_tool: a name, schema or argument the desk cannot take (`fields` says which); "
        "invalid_policy: a policy the tool cannot have.",
    },
)
@api_roles("admin")
def declare_external_tool(name: str):
    """Declare it, or declare it again (the policy given is set as PUT /api/policies/{tool} sets it: a
    loosening waits for another admin, and `change` says so)."""
    sent = body(DeclareTool)
    declaration = external.Declaration(
        description=sent.description,
        input_schema=sent.input_schema,
        amount=sent.amount,
        amount_unit=sent.amount_unit,
        subject=sent.subject,
    )
    try:
        declared = external_tools.declare(
            db.session, g.user, name, declaration, policy_values(sent.policy) if sent.policy is not None else None
        )
    except external.DeclarationError as exc:
        fields = [{"field": exc.field, "problem": str(exc)}] if exc.field and exc.field != "name" else []
        return refused_with_fields(422, "invalid_tool", str(exc), fields)
    except policy_rules.PolicyError as exc:
        return policy_refused(exc, "policy.")
    change = declared.saved.change if declared.saved is not None else None
    view = external_tool_view(declared.row)
    return answer(
        ExternalToolDeclared(**view.model_dump(), change=PolicyChangeView.of(change) if change is not None else None)
    )


@bp.delete("/external-tools/<name>")
@documented("Remove a declared tool", responses={200: ExternalToolView})
@api_roles("admin")
def remove_external_tool(name: str):
    """Outside agents can no longer ask for it; its calls so far, and its policy, stay."""
    row = external_tools.find_tool(db.session, g.user, name)
    view = external_tool_view(row)
    external_tools.remove(db.session, g.user, name)
    return answer(view)


def external_tool_view(row) -> ExternalToolView:
    """The declared tool with the policy its calls wait under, and the changes of it that wait."""
    policy = policy_rules.policy_for(db.session, row.tenant_id, external.OutsideTool(row))
    return ExternalToolView.of(row, policy, pending_changes(row.tenant_id).get(row.name, []))
