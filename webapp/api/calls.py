"""/api/calls: an agent that runs elsewhere asks before it runs a declared tool, waits for the
decision, then reports what the call did (or gives it up); with the bodies those routes take and
answer."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from flask import current_app, g
from pydantic import BaseModel, Field

from webapp.agent import outside
from webapp.agent.decisions import approvals_so_far
from webapp.agent.outside import STATUS as OUTSIDE_STATUS
from webapp.agent.states import CallStatus
from webapp.api.approvals import FactView
from webapp.api.base import answer, bp, documented
from webapp.api.bodies import (
    NO_NUL,
    QueryParameters,
    RequestBody,
    Rule,
    Timestamp,
    ToolArguments,
    nonblank,
    optional_text,
    required_text,
    whole_number,
)
from webapp.api.reading import body, optional_body, query
from webapp.approvals import outside as outside_actions
from webapp.approvals.outside import MAX_WAIT_SECONDS
from webapp.models import ROLES, ToolCall
from webapp.runtime.extensions import db
from webapp.web.security import api_roles

# --- requests -----------------------------------------------------------------------------------------


class CallFact(RequestBody):
    label: Annotated[
        str, nonblank(100), Field(description='What it is, e.g. "Balance"'), Rule("must be 1 to 100 characters")
    ]
    value: Annotated[str, nonblank(1000), Field(description='e.g. "$1,200.00"'), Rule("must be 1 to 1,000 characters")]


class AskCall(RequestBody):
    """An outside agent asks before it runs a declared tool (a person with the agent role)."""

    source: Annotated[
        str,
        Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}$", description="The agent's name, shown to reviewers."),
        Rule(
            "must be the agent's name: 1 to 64 letters, digits, spaces, dots, _ or -, starting with a letter or a digit"
        ),
    ]
    tool: Annotated[
        str,
        Field(min_length=1, max_length=128, pattern=NO_NUL, description="A declared tool (GET /api/external-tools)."),
        Rule("must be the name of a declared tool"),
    ]
    input: Annotated[
        ToolArguments,
        Field(description="The arguments the agent would run the tool with, as its schema describes them."),
        Rule("must be a JSON object of the tool's arguments"),
    ]
    context: required_text(4000, "What the reviewer should know: why the agent wants this. Shown as the agent's words.")
    facts: Annotated[
        list[CallFact] | None,
        Field(max_length=20, description="Up to 20 facts beside the call, shown as supplied by the agent."),
        Rule('must be a list of at most 20 {"label", "value"} objects, or null'),
    ] = None
    idempotency_key: Annotated[
        str,
        Field(min_length=1, max_length=200, pattern=NO_NUL, description="The same key returns the same call."),
        Rule("must be a string of 1 to 200 characters, unique per call"),
    ]


class ReportOutcome(RequestBody):
    """What happened when the agent ran an approved call."""

    ok: Annotated[bool, Field(description="It did what it was asked."), Rule("must be true or false")]
    summary: required_text(2000, 'What it did, in a sentence for people, e.g. "Sent $200.00 to account 17."')
    output: Annotated[
        Any,
        Field(description="What the tool returned, as JSON (at most 64,000 characters)."),
        Rule("must be JSON"),
    ] = None


class CancelCall(RequestBody):
    """The agent no longer needs a call that waits."""

    reason: optional_text(2000, "Why, for the reviewers and the audit log.") = None


class CallQuery(QueryParameters):
    """How long to wait for a decision before answering."""

    wait: whole_number(
        0,
        MAX_WAIT_SECONDS,
        "Seconds, up to 60: answer as soon as the call is decided, or when they run out.",
        f"must be a whole number of seconds from 0 to {MAX_WAIT_SECONDS}",
    ) = None


# --- answers ------------------------------------------------------------------------------------------


class CallOutcomeView(BaseModel):
    ok: bool
    summary: str
    output: Any = None
    reported_at: Timestamp


class CallView(BaseModel):
    """A call an outside agent asked about: the decision, and the arguments to run it with."""

    id: int = Field(description="The same id as in the inbox and GET /api/approvals.")
    source: str
    tool: str
    status: Literal["waiting", "approved", "rejected", "expired", "cancelled"] = Field(
        description="approved: run it with `input` (then report what happened); the others: do not run it."
    )
    input: ToolArguments = Field(description="The arguments to run it with: a reviewer's edit, if one was made.")
    edited: bool = Field(description="A reviewer changed the arguments the agent asked for.")
    asked_input: ToolArguments = Field(description="The arguments the agent asked for.")
    reason: str | None = Field(description="The reviewer's reason, or why the desk settled it.")
    decided_by: str | None = Field(description="The email of the reviewer who settled it; null: its policy did.")
    decided_at: Timestamp | None
    approvals: int = Field(description="Approvals so far.")
    approvals_required: int = Field(description="0: its policy let it run with no person.")
    rule: str | None = Field(description="The policy it waits under, in words (null: it did not wait).")
    expires_at: Timestamp | None = Field(description="When it expires undecided, while it waits.")
    context: str
    facts: list[FactView]
    outcome: CallOutcomeView | None = Field(description="What the agent reported it did; null until it reports.")
    created_at: Timestamp

    @classmethod
    def of(cls, call: ToolCall, asked: Any, approvals: int) -> CallView:
        settled_by_desk = call.status in (CallStatus.EXPIRED, CallStatus.CANCELLED)
        outcome = None
        if asked.outcome_ok is not None:
            outcome = CallOutcomeView(
                ok=asked.outcome_ok,
                summary=asked.outcome_summary or "",
                output=asked.outcome_output,
                reported_at=asked.outcome_at,
            )
        return cls(
            id=call.id,
            source=call.source,
            tool=call.name,
            status=OUTSIDE_STATUS[call.status],
            input=call.input,
            edited=call.original_input is not None,
            asked_input=call.original_input or call.input,
            reason=call.result if settled_by_desk else call.decision_reason,
            decided_by=call.decided_by.email if call.decided_by else None,
            decided_at=call.decided_at,
            approvals=approvals,
            approvals_required=call.approvals_required,
            rule=(call.policy or {}).get("rule") if call.requires_approval else None,
            expires_at=call.expires_at if call.status == CallStatus.AWAITING_APPROVAL else None,
            context=asked.context,
            facts=[FactView(label=fact["label"], value=fact["value"]) for fact in asked.facts or []],
            outcome=outcome,
            created_at=call.created_at,
        )


# --- routes -------------------------------------------------------------------------------------------


@bp.post("/calls")
@documented(
    "Ask before running a declared tool (outside agents)",
    body=AskCall,
    responses={201: CallView, 200: CallView},
    errors={
        409: "idempotency_conflict: the key was used for another request.",
        422: "unknown_tool: no declared tool has that name; invalid_input: `input` does not fit its schema.",
    },
)
@api_roles("agent")
def ask_call():
    """201: a new call, approved at once or waiting in the inbox; 200: the call made before with the
    same idempotency key (the same request)."""
    sent = body(AskCall)
    call, created = outside_actions.ask(
        db.session,
        g.user,
        source=sent.source,
        tool=sent.tool,
        arguments=sent.input.root,
        context=sent.context,
        facts=[fact.model_dump() for fact in sent.facts or []],
        idempotency_key=sent.idempotency_key,
    )
    return answer(call_view(call), 201 if created else 200)


@bp.get("/calls/<int:call_id>")
@documented(
    "Read an outside agent's call, waiting for its decision",
    query=CallQuery,
    responses={200: CallView},
    errors={403: "forbidden: the call is another agent's.", 429: "too_many_streams: too many waits open."},
)
@api_roles(*ROLES)
def get_call(call_id: int):
    """With `wait`: answers as soon as the call is decided, or after that many seconds as it is."""
    asked = query(CallQuery)
    call = outside_actions.find(db.session, g.user, call_id)
    call = outside_actions.wait(current_app._get_current_object(), g.user, call, asked.wait or 0)
    return answer(call_view(call))


@bp.post("/calls/<int:call_id>/outcome")
@documented(
    "Report what an approved call did",
    body=ReportOutcome,
    responses={200: CallView},
    errors={
        403: "not_yours: only the agent whose token asked reports.",
        409: "not_approved: the call may not run; already_reported: another report was kept.",
    },
)
@api_roles("agent")
def report_call(call_id: int):
    sent = body(ReportOutcome)
    call = outside_actions.report(db.session, g.user, call_id, ok=sent.ok, summary=sent.summary, output=sent.output)
    return answer(call_view(call))


@bp.post("/calls/<int:call_id>/cancel")
@documented(
    "Give up a call that waits",
    body=CancelCall,
    body_required=False,
    responses={200: CallView},
    errors={403: "not_yours: only the agent whose token asked gives it up."},
)
@api_roles("agent")
def cancel_call(call_id: int):
    """It settles as cancelled and leaves the inbox; a call that no longer waits is answered as it is."""
    sent = optional_body(CancelCall)
    return answer(call_view(outside_actions.cancel(db.session, g.user, call_id, (sent.reason or "").strip())))


def call_view(call: ToolCall) -> CallView:
    return CallView.of(call, outside.details(db.session, call), len(approvals_so_far(db.session, call)))
