"""/api/approvals: the calls waiting for a decision, read with the facts beside them, claimed while a
reviewer looks, and approved (as asked or edited) or rejected; with the bodies those routes take and
answer."""

from __future__ import annotations

from typing import Annotated, Any

from flask import g, request
from pydantic import BaseModel, ConfigDict, Field

from webapp.agent.decisions import held_words
from webapp.agent.states import CallStatus
from webapp.api.base import answer, bp, documented, tenant_tools
from webapp.api.bodies import (
    NO_NUL,
    QueryParameters,
    RequestBody,
    Rule,
    ToolArguments,
    decision_field,
    optional_text,
    or_empty,
)
from webapp.api.paging import Cursor, NextCursor, a_page, page_limit
from webapp.api.reading import FieldProblem, InvalidFields, body, optional_body, query
from webapp.api.tool_calls import ToolCallView, tool_call_view
from webapp.approvals import actions as approvals
from webapp.approvals import queries as inbox
from webapp.approvals.actions import MAX_REASON_CHARS
from webapp.approvals.queries import InboxFilters
from webapp.models import ToolCall
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.tools.registry import Review, ToolRegistry
from webapp.web.errors import Refused
from webapp.web.security import api_roles

# --- requests -----------------------------------------------------------------------------------------


class ClaimApproval(RequestBody):
    """Hold a waiting call while you review it; others see who (`claimed_by`) until it runs out."""

    take_over: Annotated[
        bool,
        Field(description="Take the call over from the reviewer who holds it (otherwise that is a 409)."),
        Rule("must be true or false"),
    ] = False


class DecideApproval(RequestBody):
    """A reviewer's decision on a tool call waiting for approval."""

    decision: decision_field("Run the call (approve) or refuse it (reject; the model is told the reason).")
    reason: optional_text(MAX_REASON_CHARS, "Why; required to reject (the model reads it), optional to approve.") = None
    arguments_hash: Annotated[
        str | None,
        Field(
            pattern=NO_NUL,
            description=(
                "The `arguments_hash` of the call as the reviewer saw it; the decision is refused (409 "
                "arguments_changed) if the arguments changed since. Omitted: the call's current arguments."
            ),
        ),
        Rule("must be the arguments_hash string shown with the call, or null"),
    ] = None
    input: Annotated[
        ToolArguments | None,
        Field(
            description=(
                'Edit and approve: the arguments the tool runs with instead of the model\'s (with "approve" '
                "only). They are checked against the tool's input schema and its own checks (a refund above what "
                "is left to refund is refused); the model is told who changed what."
            ),
            examples=[{"order": 9001, "value_usd": "50.00", "note": "late delivery"}],
        ),
        Rule("must be a JSON object of the tool's arguments, or null"),
    ] = None
    edited_input: Annotated[
        ToolArguments | None,
        Field(description="The earlier name of `input`, still accepted; send one or the other, not both."),
        Rule("must be a JSON object of the tool's arguments, or null"),
    ] = None

    def edited(self) -> dict[str, Any] | None:
        """The edited arguments, under either name; 422 naming both when both are sent."""
        if self.input is not None and self.edited_input is not None:
            raise InvalidFields(
                [FieldProblem(field="edited_input", problem='is the earlier name of "input"; send only "input"')], []
            )
        sent = self.input if self.input is not None else self.edited_input
        return sent.root if sent is not None else None


class ReleaseClaim(RequestBody):
    """Giving up a claim takes no fields; a body, if sent, must be an empty JSON object."""


def _inbox_number(name: str, description: str) -> Any:
    schema = {"type": "number", "minimum": 0, "maximum": inbox.NUMBERS[name][1]}
    return Field(json_schema_extra=or_empty(schema), description=description)


class ApprovalsQuery(QueryParameters):
    """A page of the calls waiting for a decision, oldest first, narrowed by the inbox page's filters.
    The filters' values are read as the inbox page reads them (webapp.approvals.queries.InboxFilters):
    a filter sent empty is no filter, a bad one is a 422 invalid_filter in the page's words."""

    cursor: Cursor = None
    limit: page_limit("Calls", 200) = None
    tool: Annotated[
        str | None,
        Field(json_schema_extra={"maxLength": inbox.TOOL_CHARS}, description="Only this tool's calls."),
    ] = None
    requester: Annotated[
        str | None,
        Field(
            json_schema_extra={"maxLength": inbox.EMAIL_CHARS},
            description="Only the calls of this person's conversations (their e-mail).",
        ),
    ] = None
    min_age: Annotated[str | None, _inbox_number("min_age", "Only calls waiting at least this many minutes.")] = None
    min_amount: Annotated[str | None, _inbox_number("min_amount", "Only calls moving at least this many dollars.")] = (
        None
    )
    max_amount: Annotated[str | None, _inbox_number("max_amount", "Only calls moving at most this many dollars.")] = (
        None
    )
    run: Annotated[
        str | None,
        Field(
            json_schema_extra=or_empty({"type": "integer", "minimum": 1, "maximum": inbox.LARGEST_ID}),
            description="Only the calls of this bulk run's conversations (its id).",
        ),
    ] = None


# --- answers ------------------------------------------------------------------------------------------


class _FromTool(BaseModel):
    """A view of one of the tool registry's dataclasses (webapp.tools.registry.Review and its parts)."""

    model_config = ConfigDict(from_attributes=True)


class FactView(_FromTool):
    label: str = Field(description='What it is, e.g. "Left to refund".')
    value: str = Field(description='As people read it, e.g. "$89.00".')


class RecordView(_FromTool):
    kind: str = Field(description="The kind of record, as its argument names it without _id, e.g. order.")
    id: int
    title: str = Field(description='e.g. "Order 9001".')
    facts: list[FactView]


class ConcernView(_FromTool):
    field: str | None = Field(description="The argument to change, when one is to blame.")
    message: str = Field(description="Why the call cannot succeed as asked, for people.")


class LetterView(_FromTool):
    to: str
    subject: str
    body: str


class ReviewView(_FromTool):
    """What the call's tool says about it now, read when asked (only while the call waits)."""

    records: list[RecordView] = Field(description="The records the call would change, as they stand now.")
    concerns: list[ConcernView] = Field(description="Why the call would fail as asked; empty when it would run.")
    letter: LetterView | None = Field(description="The message a customer would get, for tools that send one.")


class ApprovalView(ToolCallView):
    """One call a reviewer may decide, with the facts beside it."""

    review: ReviewView | None = Field(description="The facts beside the call while it waits; null once settled.")
    held: str | None = Field(
        None,
        description="Why the call cannot be approved now: its tool is held (its MCP server changed it after the "
        "call was made) until an admin accepts the change; it can still be rejected. Null: nothing holds it.",
    )

    @classmethod
    def of_call(
        cls, call: ToolCall, tools: ToolRegistry, review: Review | None, held: str | None = None
    ) -> ApprovalView:
        review_view = ReviewView.model_validate(review) if review else None
        return cls(**ToolCallView.of(call, tools).model_dump(), review=review_view, held=held)


class ApprovalList(BaseModel):
    """A page of the tenant's tool calls waiting for a decision, oldest first."""

    approvals: list[ToolCallView]
    next_cursor: NextCursor


# --- routes -------------------------------------------------------------------------------------------


@bp.get("/approvals")
@documented(
    "List the calls waiting for a decision",
    query=ApprovalsQuery,
    responses={200: ApprovalList},
    errors={422: "invalid_filter: a filter the inbox page would ignore; the message says what to send."},
)
@api_roles("reviewer")
def list_approvals():
    """The tenant's waiting calls, oldest first, a page at a time: a call that waits is on one page."""
    asked = query(ApprovalsQuery)
    filters, problems = InboxFilters.read(request.args)  # as the inbox page reads them
    if problems:
        raise Refused(422, "invalid_filter", " ".join(problems))
    page = a_page(lambda: inbox.pending_page(db.session, g.user, asked.cursor, asked.limit or 200, filters))
    tools = tenant_tools()
    return answer(
        ApprovalList(approvals=[ToolCallView.of(call, tools) for call in page.rows], next_cursor=page.next_cursor)
    )


@bp.get("/approvals/<int:tool_call_id>")
@documented("Read a call to decide, with the facts beside it", responses={200: ApprovalView})
@api_roles("reviewer")
def get_approval(tool_call_id: int):
    call = approvals.find_call(db.session, g.user, tool_call_id)
    waiting = call.status == CallStatus.AWAITING_APPROVAL
    tool = services().tools_for(db.session, call.tenant_id).get(call.name) if waiting else None
    held = held_words(call.name) if tool is not None and tool.unavailable() else None
    return answer(
        ApprovalView.of_call(call, tenant_tools(), approvals.review(db.session, call) if waiting else None, held)
    )


@bp.post("/approvals/<int:tool_call_id>")
@documented(
    "Approve, edit and approve, or reject a call",
    body=DecideApproval,
    responses={200: ToolCallView},
    errors={
        403: "not_allowed: the reviewer asked for the call themself (four eyes).",
        409: "already_decided, arguments_changed (the message says by whom and when, or what changed), or held.",
        422: "reason_required: a rejection needs a reason; invalid_input: `input` the tool would refuse.",
    },
)
@api_roles("reviewer")
def decide_approval(tool_call_id: int):
    sent = body(DecideApproval)
    call = approvals.decide(
        db.session,
        g.user,
        tool_call_id,
        sent.decision,
        sent.reason,
        arguments_seen=sent.arguments_hash,
        edited_input=sent.edited(),
    )
    return answer(tool_call_view(call))


@bp.post("/approvals/<int:tool_call_id>/claim")
@documented(
    "Hold a waiting call while you review it (again: the time starts over)",
    body=ClaimApproval,
    body_required=False,
    responses={200: ToolCallView},
    errors={
        403: "not_allowed: the call comes from the reviewer's own conversation.",
        409: "claimed: another reviewer holds it (the message names them; send take_over); not_waiting.",
    },
)
@api_roles("reviewer")
def claim_approval(tool_call_id: int):
    sent = optional_body(ClaimApproval)
    return answer(tool_call_view(approvals.claim(db.session, g.user, tool_call_id, take_over=sent.take_over)))


@bp.delete("/approvals/<int:tool_call_id>/claim")
@documented(
    "Give up your claim on a call",
    body=ReleaseClaim,
    body_required=False,
    responses={200: ToolCallView},
    errors={409: "claimed: another reviewer holds it (the message names them)."},
)
@api_roles("reviewer")
def release_approval(tool_call_id: int):
    optional_body(ReleaseClaim)  # (it takes no field: only an empty body, or {})
    return answer(tool_call_view(approvals.release(db.session, g.user, tool_call_id)))
