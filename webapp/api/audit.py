"""/api/audit: the tenant's audit log, a page at a time, with every hashed field so a client can check
the chain; with the query it takes and the page it answers."""

from __future__ import annotations

from typing import Annotated, Any

from flask import g, request
from pydantic import BaseModel, Field

from webapp.api.base import answer, bp, documented
from webapp.api.bodies import NO_NUL, QueryParameters, or_empty
from webapp.api.paging import NextCursor
from webapp.api.reading import known_names
from webapp.audit import queries as audit_queries
from webapp.audit.queries import API_MAX_LIMIT, MAX_CONVERSATION
from webapp.runtime.extensions import db
from webapp.web.security import api_roles


def _audit_day(description: str) -> Any:
    return Field(json_schema_extra=or_empty({"type": "string", "format": "date"}), description=description)


def _audit_text(name: str, description: str) -> Any:
    return Field(
        json_schema_extra={"maxLength": audit_queries.TEXTS[name][1], "pattern": NO_NUL}, description=description
    )


def _audit_number(largest: int, description: str, smallest: int = 0) -> Any:
    schema = {"type": "integer", "minimum": smallest, "maximum": largest}
    return Field(json_schema_extra=or_empty(schema), description=description)


class AuditQuery(QueryParameters):
    """The audit log's query parameters, as documented. Their values are read by the audit page's own
    reading (webapp.audit.queries.read_query, which holds their rules): a filter sent empty is no
    filter, and a bad value is a 422 invalid_filter in the page's words. So this model names the
    parameters (an unknown one is a 422 invalid_field) and describes them; it checks no value."""

    from_: Annotated[str | None, Field(alias="from"), _audit_day("Events on or after this day (UTC).")] = None
    to: Annotated[str | None, _audit_day("Events on or before this day (UTC).")] = None
    person: Annotated[str | None, _audit_text("person", "The actor's email, or part of it.")] = None
    action: Annotated[str | None, _audit_text("action", "The action, e.g. approval_decided.")] = None
    tool: Annotated[str | None, _audit_text("tool", "The tool's name.")] = None
    outcome: Annotated[str | None, _audit_text("outcome", "The outcome, e.g. rejected.")] = None
    q: Annotated[str | None, _audit_text("q", "Text to look for in the events.")] = None
    conversation: Annotated[str | None, _audit_number(MAX_CONVERSATION, "The conversation's number.")] = None
    cursor: Annotated[
        str | None,
        Field(description="The next_cursor of an earlier answer, unchanged; left out: the newest events."),
    ] = None
    limit: Annotated[
        str | None,
        _audit_number(
            API_MAX_LIMIT,
            f"Events per page, {audit_queries.API_LIMIT} unless given (at most {API_MAX_LIMIT}).",
            smallest=1,
        ),
    ] = None


class AuditEventView(BaseModel):
    """One audit event as exported: its id, every hashed field and its hash, so a client can check the chain
    (webapp/audit_chain/ says how)."""

    id: int
    chain: str = Field(description='The tenant\'s chain, or "global".')
    seq: int = Field(description="Its place in the chain, from 1.")
    tenant_id: int | None
    created_at: str = Field(json_schema_extra={"format": "date-time"}, description="ISO 8601, microseconds.")
    action: str
    actor_id: int | None
    actor_label: str | None
    conversation_id: int | None
    tool_call_id: int | None
    tool_name: str | None
    outcome: str | None
    data: dict[str, Any]
    prev_hash: str
    hash: str


class AuditPage(BaseModel):
    """A page of the tenant's audit events, newest first."""

    events: list[AuditEventView]
    next_cursor: NextCursor


@bp.get("/audit")
@documented(
    "Read the audit log",
    query=AuditQuery,
    responses={200: AuditPage},
    errors={422: "invalid_filter: a filter or cursor that names nothing; the message says what to send."},
)
@api_roles("auditor", "admin")
def audit_events():
    """The tenant's audit events, newest first, a page at a time."""
    known_names(AuditQuery)  # its names; the values are read as the audit page reads them (422 invalid_filter)
    return answer(AuditPage.model_validate(audit_queries.api_page(db.session, g.user, request.args)))
