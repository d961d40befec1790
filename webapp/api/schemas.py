"""The JSON API's request and response bodies, as pydantic models.

Requests are strict (no "5" for a number, no number for a text) and closed (an unknown field is refused,
not ignored). `body(Model)` reads and validates the request; a failure is a 422 whose message names
every bad field in words of our own (`Rule`), never pydantic's. Responses are built with `View.of(...)`
and sent as `model_dump(mode="json")`. `Model.model_json_schema()` describes each of them.

The domain functions (webapp.conversations.actions, webapp.approvals.actions) keep their own checks,
since the HTML forms call them too; the limits here are theirs, imported.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

from flask import request
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    RootModel,
    Strict,
    ValidationError,
    WithJsonSchema,
    create_model,
)

from webapp.agent.decisions import arguments_hash
from webapp.agent.outside import STATUS as OUTSIDE_STATUS
from webapp.agent.states import CallStatus, ConversationStatus
from webapp.approvals import queries as inbox_queries
from webapp.approvals.actions import MAX_REASON_CHARS, holder
from webapp.approvals.outside import MAX_WAIT_SECONDS
from webapp.audit import queries as audit_queries
from webapp.audit.queries import API_MAX_LIMIT, MAX_CONVERSATION
from webapp.conversations import cards
from webapp.conversations.actions import MAX_MESSAGE_CHARS
from webapp.models import ApiToken, Conversation, ToolCall, WebhookDelivery, WebhookSubscription
from webapp.tools import described
from webapp.tools.registry import Review, ToolRegistry
from webapp.tools.tasks import INPUT_REQUIRED, MAX_INPUT_CHARS
from webapp.web.errors import Refused
from webapp.webhooks import EVENT_TYPES

# --- requests ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """What a request field must be, in words for people: the whole rule, whatever part of it failed.
    `when_empty` is one more sentence for a field that is missing or blank (what the pages say too)."""

    must: str
    when_empty: str | None = None


class RequestBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ToolArguments(RootModel[dict[str, Any]]):
    """A tool call's arguments: a JSON object as the tool's input schema describes it."""


NO_NUL = r"^[^\x00]*$"  # no text the desk keeps may hold a NUL character (PostgreSQL's text cannot)


def _text(max_chars: int) -> Any:
    """A string with something besides whitespace in it, of at most max_chars characters, without NUL."""
    return Field(min_length=1, max_length=max_chars, pattern=r"^[^\x00]*[^\s\x00][^\x00]*$")


MessageText = Annotated[
    str,
    _text(MAX_MESSAGE_CHARS),
    Field(description="The support agent's question or instruction for the assistant."),
    Rule(f"must be a non-empty string of at most {MAX_MESSAGE_CHARS:,} characters", "Write a message first."),
]


class StartConversation(RequestBody):
    """Start a conversation with its first message; the assistant answers in the background."""

    message: MessageText


class PostMessage(RequestBody):
    """A follow-up message in a conversation whose assistant is not working."""

    message: MessageText


class ExtendBudget(RequestBody):
    """Give a conversation that ran out of moves some more (reviewers and admins)."""

    moves: Annotated[
        int,
        Field(
            ge=1,
            le=1000,
            description="How many more moves (model calls or tool calls) the conversation's run may use.",
        ),
        Rule("must be a whole number from 1 to 1000"),
    ] = 10


class ClaimApproval(RequestBody):
    """Hold a waiting call while you review it; others see who (`claimed_by`) until it runs out."""

    take_over: Annotated[
        bool,
        Field(description="Take the call over from the reviewer who holds it (otherwise that is a 409)."),
        Rule("must be true or false"),
    ] = False


class DecideApproval(RequestBody):
    """A reviewer's decision on a tool call waiting for approval."""

    decision: Annotated[
        Literal["approve", "reject"],
        Field(description="Run the call (approve) or refuse it (reject; the model is told the reason)."),
        Rule('must be "approve" or "reject"'),
    ]
    reason: Annotated[
        str | None,
        Field(
            max_length=MAX_REASON_CHARS,
            pattern=NO_NUL,
            description="Why; required to reject (the model reads it), optional to approve.",
        ),
        Rule(f"must be a string of at most {MAX_REASON_CHARS:,} characters, or null"),
    ] = None
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


class GiveInput(RequestBody):
    """What a person types for a tool call whose task waits for input (a verification code, say)."""

    input: Annotated[
        str,
        _text(MAX_INPUT_CHARS),
        Field(description="The text the task asks for (its prompt is in the task's `input_required`)."),
        Rule(f"must be a non-empty string of at most {MAX_INPUT_CHARS:,} characters", "Type the input first."),
    ]


class RevokeToken(RequestBody):
    """Revoking a token takes no fields; a body, if sent, must be an empty JSON object."""


class CancelConversation(RequestBody):
    """Stopping a conversation takes no fields; a body, if sent, must be an empty JSON object."""


class ReleaseClaim(RequestBody):
    """Giving up a claim takes no fields; a body, if sent, must be an empty JSON object."""


class RemoveWebhook(RequestBody):
    """Removing a webhook takes no fields; a body, if sent, must be an empty JSON object."""


LimitCount = Annotated[
    int | None,
    Field(ge=1, le=100_000, description="The most calls; null: no limit."),
    Rule("must be a whole number from 1 to 100,000, or null"),
]
LimitCents = Annotated[
    int | None,
    Field(ge=1, le=10_000_000, description="The most money, in cents; null: no limit."),
    Rule("must be a whole number of cents from 1 to 10,000,000, or null"),
]


class PolicyLimits(RequestBody):
    """How much of a tool may run with no person, added up, as calls (`_count`) and money in cents
    (`_cents`): per conversation, per subject (what a call acts on, as its tool says: a customer, an
    order), for the whole tenant and per acting person, the last three over 24 hours. A limit left out
    or null is no limit. Past a limit a call waits for a person."""

    conversation_count: LimitCount = None
    conversation_cents: LimitCents = None
    subject_day_count: LimitCount = None
    subject_day_cents: LimitCents = None
    tenant_day_count: LimitCount = None
    tenant_day_cents: LimitCents = None
    person_day_count: LimitCount = None
    person_day_cents: LimitCents = None


class SetPolicy(RequestBody):
    """A tool's policy as an admin sets it. A change that lets any call wait less than before (a looser
    mode, a higher threshold, fewer approvals, a limit raised or cleared) is not in force until another
    admin approves it (202); a stricter one is in force at once (200)."""

    mode: Annotated[
        Literal["never", "always", "above_amount"],
        Field(
            description="never: runs at once; always: every call waits; above_amount: calls above threshold_cents wait."
        ),
        Rule('must be "never", "always" or "above_amount"'),
    ]
    threshold_cents: Annotated[
        int | None,
        Field(ge=0, le=10_000_000, description="With above_amount: calls above this many cents wait for people."),
        Rule("must be a whole number of cents from 0 to 10,000,000 (with above_amount), or null"),
    ] = None
    approvals: Annotated[
        int | None,
        Field(ge=1, le=5, description="How many people must approve a waiting call; left out: as now (at least 1)."),
        Rule("must be a whole number from 1 to 5, or null"),
    ] = None
    limits: Annotated[
        PolicyLimits | None,
        Field(description="What may run with no person, added up; left out: the limits stay as they are."),
        Rule("must be an object of limits (conversation_count, tenant_day_cents, ...), or null"),
    ] = None
    ttl_seconds: Annotated[
        int | None,
        Field(ge=300, le=30 * 24 * 3600, description="How long people have to decide; left out: as now."),
        Rule("must be a whole number of seconds from 300 to 2,592,000, or null"),
    ] = None
    remind_after_seconds: Annotated[
        int | None,
        Field(ge=60, description="When a waiting call reminds the channels; null: the default; left out: as now."),
        Rule("must be a whole number of seconds of at least 60 (less than ttl_seconds), or null"),
    ] = None


class DecidePolicyChange(RequestBody):
    """A second admin's decision on a policy change that waits for one."""

    decision: Annotated[
        Literal["approve", "reject"],
        Field(description="Put the change in force (approve) or leave the policy as it is (reject)."),
        Rule('must be "approve" or "reject"'),
    ]
    reason: Annotated[
        str | None,
        Field(max_length=2000, pattern=NO_NUL, description="Why; required to reject (the admin who asked reads it)."),
        Rule("must be a string of at most 2,000 characters, or null"),
    ] = None


# The event types as one enumeration of the document (a generated client's EventType).
EventType = StrEnum("EventType", {name.replace(".", "_").upper(): name for name in EVENT_TYPES})


class CreateWebhook(RequestBody):
    """Send the tenant's events of these types to this address, signed as Standard Webhooks say (admins)."""

    url: Annotated[
        str,
        Field(min_length=1, max_length=2000, pattern=NO_NUL, description="An https:// address the desk may call."),
        Rule("must be the receiver's address, like https://example.com/hooks/desk"),
    ]
    events: Annotated[
        # (each not strict: a strict enum takes only its members, and JSON sends their values as strings)
        list[Annotated[EventType, Strict(False)]],
        Field(min_length=1, max_length=len(EVENT_TYPES), description="The event types to send."),
        Rule("must be a list of event types: " + ", ".join(EVENT_TYPES)),
    ]


class DeclareTool(RequestBody):
    """A tool an agent that runs elsewhere will ask about (admins): what it does, its arguments' JSON
    schema, the policy its calls wait under, and which arguments are its money and its subject."""

    description: Annotated[
        str,
        _text(2000),
        Field(description="What the tool does, for reviewers (and for the audit log)."),
        Rule("must be a non-empty string of at most 2,000 characters"),
    ]
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
    amount: Annotated[
        str | None,
        Field(max_length=128, description="The argument that is the money a call moves, for amount rules and limits."),
        Rule("must be the name of one of the schema's arguments, or null"),
    ] = None
    amount_unit: Annotated[
        Literal["cents", "dollars"],
        Field(description="What `amount` counts: whole cents (the default) or dollars (a number, or its text)."),
        Rule('must be "cents" or "dollars"'),
    ] = "cents"
    subject: Annotated[
        str | None,
        Field(max_length=128, description="The argument that names what a call acts on, for limits per subject."),
        Rule("must be the name of one of the schema's arguments, or null"),
    ] = None


class CallFact(RequestBody):
    label: Annotated[
        str, _text(100), Field(description='What it is, e.g. "Balance"'), Rule("must be 1 to 100 characters")
    ]
    value: Annotated[str, _text(1000), Field(description='e.g. "$1,200.00"'), Rule("must be 1 to 1,000 characters")]


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
    context: Annotated[
        str,
        _text(4000),
        Field(description="What the reviewer should know: why the agent wants this. Shown as the agent's words."),
        Rule("must be a non-empty string of at most 4,000 characters"),
    ]
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
    summary: Annotated[
        str,
        _text(2000),
        Field(description='What it did, in a sentence for people, e.g. "Sent $200.00 to account 17."'),
        Rule("must be a non-empty string of at most 2,000 characters"),
    ]
    output: Annotated[
        Any,
        Field(description="What the tool returned, as JSON (at most 64,000 characters)."),
        Rule("must be JSON"),
    ] = None


class CancelCall(RequestBody):
    """The agent no longer needs a call that waits."""

    reason: Annotated[
        str | None,
        Field(max_length=2000, pattern=NO_NUL, description="Why, for the reviewers and the audit log."),
        Rule("must be a string of at most 2,000 characters, or null"),
    ] = None


# --- query parameters -------------------------------------------------------------------------------

MAX_ID = 2**63 - 1  # ids are 64-bit; a larger number names nothing (404 in a path, 422 in a query)


def _digits(value: object) -> object:
    """A query parameter that is a plain decimal number, as an int; anything else as sent (and refused
    as not a whole number): no "+5", "5.0" or "5_000"."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20:
        return int(value)
    return value


class QueryParameters(BaseModel):
    """A route's query parameters: closed (an unknown name is refused with 422, naming it) and typed; a
    number is decimal digits only."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=False)


class PolicyChangesQuery(QueryParameters):
    """Which policy changes to list."""

    status: Annotated[
        Literal["pending", "approved", "rejected", "withdrawn", "superseded", "all"] | None,
        Field(description="Only changes in this state; left out: pending."),
        Rule('must be one of "pending", "approved", "rejected", "withdrawn", "superseded", "all"'),
    ] = None


class TokensQuery(QueryParameters):
    """Whose tokens to list."""

    user_id: Annotated[
        Annotated[int, Field(ge=1, le=MAX_ID)] | None,
        BeforeValidator(_digits),
        Field(description="Admins: list this person's tokens (a person of their tenant)."),
        Rule("must be the number of a person of your organisation"),
    ] = None


def _or_empty(schema: dict[str, Any]) -> dict[str, Any]:
    """A parameter's schema that also lets it be sent empty, meaning the same as leaving it out (as the
    audit page's form sends a filter nobody filled in)."""
    return {"anyOf": [schema, {"type": "string", "maxLength": 0}]}


def _audit_day(description: str) -> Any:
    return Field(json_schema_extra=_or_empty({"type": "string", "format": "date"}), description=description)


def _audit_text(name: str, description: str) -> Any:
    return Field(
        json_schema_extra={"maxLength": audit_queries.TEXTS[name][1], "pattern": NO_NUL}, description=description
    )


def _audit_number(largest: int, description: str, smallest: int = 0) -> Any:
    schema = {"type": "integer", "minimum": smallest, "maximum": largest}
    return Field(json_schema_extra=_or_empty(schema), description=description)


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


def _moment(value: object) -> object:
    """A query parameter that is an ISO 8601 moment with its offset (2026-12-04T09:30:00Z) or a day
    (2026-12-04: its midnight, UTC), as an aware datetime; anything else as sent (and refused)."""
    if not isinstance(value, str) or not _MOMENT.match(value):
        return value
    try:
        if len(value) == 10:
            return datetime.combine(date.fromisoformat(value), time(), UTC)
        return datetime.fromisoformat(value).astimezone(UTC)
    except ValueError:  # a month 13, a 25th hour
        return value


_MOMENT = re.compile(r"\d{4}-\d{2}-\d{2}([Tt]\d{2}:\d{2}:\d{2}(\.\d{1,6})?([Zz]|[+-]\d{2}:\d{2}))?\Z")  # RFC 3339


def _page_limit(what: str, default: int) -> Any:
    return Annotated[
        Annotated[int, Field(ge=1, le=API_MAX_LIMIT)] | None,
        BeforeValidator(_digits),
        Field(description=f"{what} per page, {default} unless given (at most {API_MAX_LIMIT})."),
        Rule(f"must be a whole number from 1 to {API_MAX_LIMIT}"),
    ]


Cursor = Annotated[
    str | None,
    Field(max_length=400, description="The next_cursor of an earlier answer, unchanged; left out: the first page."),
    Rule("must be the next_cursor of an earlier answer"),
]


class DeliveriesQuery(QueryParameters):
    """A page of a webhook's deliveries, newest first."""

    cursor: Cursor = None
    limit: _page_limit("Deliveries", 50) = None


class ConversationsQuery(QueryParameters):
    """Which conversations to list, newest first (agents: their own)."""

    status: Annotated[
        ConversationStatus | None,
        BeforeValidator(lambda value: ConversationStatus(value) if value in set(ConversationStatus) else value),
        Field(description="Only conversations in this state."),
        Rule("must be one of " + ", ".join(f'"{status}"' for status in ConversationStatus)),
    ] = None
    started_by: Annotated[
        str | None,
        Field(min_length=1, max_length=254, pattern=NO_NUL, description="Only those started by this email."),
        Rule("must be an email address"),
    ] = None
    since: Annotated[
        datetime | None,
        BeforeValidator(_moment),
        WithJsonSchema({"anyOf": [{"type": "string", "format": "date-time"}, {"type": "string", "format": "date"}]}),
        Field(description="Only those started at or after this moment (ISO 8601 with its offset, or a day, UTC)."),
        Rule("must be a moment like 2026-12-04T09:30:00Z or a day like 2026-12-04"),
    ] = None
    cursor: Cursor = None
    limit: _page_limit("Conversations", 50) = None


class CallQuery(QueryParameters):
    """How long to wait for a decision before answering."""

    wait: Annotated[
        Annotated[int, Field(ge=0, le=MAX_WAIT_SECONDS)] | None,
        BeforeValidator(_digits),
        Field(description="Seconds, up to 60: answer as soon as the call is decided, or when they run out."),
        Rule(f"must be a whole number of seconds from 0 to {MAX_WAIT_SECONDS}"),
    ] = None


def _inbox_number(name: str, description: str) -> Any:
    schema = {"type": "number", "minimum": 0, "maximum": inbox_queries.NUMBERS[name][1]}
    return Field(json_schema_extra=_or_empty(schema), description=description)


class ApprovalsQuery(QueryParameters):
    """A page of the calls waiting for a decision, oldest first, narrowed by the inbox page's filters.
    The filters' values are read as the inbox page reads them (webapp.approvals.queries.InboxFilters):
    a filter sent empty is no filter, a bad one is a 422 invalid_filter in the page's words."""

    cursor: Cursor = None
    limit: _page_limit("Calls", 200) = None
    tool: Annotated[
        str | None,
        Field(json_schema_extra={"maxLength": inbox_queries.TOOL_CHARS}, description="Only this tool's calls."),
    ] = None
    requester: Annotated[
        str | None,
        Field(
            json_schema_extra={"maxLength": inbox_queries.EMAIL_CHARS},
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
            json_schema_extra=_or_empty({"type": "integer", "minimum": 1, "maximum": inbox_queries.LARGEST_ID}),
            description="Only the calls of this bulk run's conversations (its id).",
        ),
    ] = None


# --- refusing a request -----------------------------------------------------------------------------


class FieldProblem(BaseModel):
    field: str = Field(description="The request field, as sent.")
    problem: str = Field(description='What is wrong with it, e.g. "must be a whole number from 1 to 1000".')


class ErrorBody(BaseModel):
    """Every error: a stable code for programs and a sentence for people; a request whose fields are wrong
    (invalid_field, invalid_input) also names each bad field in `fields`."""

    model_config = ConfigDict(title="Error")

    error: str = Field(description="A stable code, e.g. not_found, conversation_busy, already_decided.")
    message: str = Field(description="What happened and what to do, for people.")
    fields: list[FieldProblem] = Field(
        default_factory=list,
        description="Each bad field of the request, with invalid_field and invalid_input only.",
    )


class InvalidFieldsBody(ErrorBody):
    """A request whose fields are wrong (422): every bad field, named."""

    model_config = ConfigDict(title="InvalidFields")

    error: Literal["invalid_field"] = "invalid_field"
    fields: list[FieldProblem]


class InvalidFields(Refused):
    """A body that is JSON but not what the endpoint takes; `view()` is the 422 answer."""

    def __init__(self, problems: list[FieldProblem], advice: list[str], unlisted: int = 0) -> None:
        clauses = [f'"{_shown(p.field)}" {p.problem}' for p in problems]
        if unlisted:
            clauses.append(f"and {unlisted} more {'field is' if unlisted == 1 else 'fields are'} wrong")
        super().__init__(422, "invalid_field", " ".join(["; ".join(clauses) + ".", *advice]))
        self.problems = problems

    def view(self) -> InvalidFieldsBody:
        return InvalidFieldsBody(message=self.message, fields=self.problems)


MAX_PROBLEMS = 20  # a body of a thousand unknown fields is answered with twenty, and a count
EMPTY = frozenset({"missing", "string_too_short", "string_pattern_mismatch"})

M = TypeVar("M", bound=RequestBody)
Q = TypeVar("Q", bound=QueryParameters)


def query(model: type[Q]) -> Q:
    """The request's query parameters as `model`: 422 invalid_field naming every unknown or bad one. A
    name given twice is read once, as given first."""
    try:
        return model.model_validate({name: request.args.get(name) for name in request.args})
    except ValidationError as exc:
        raise _refusal(model, exc) from None


def known_names(model: type[QueryParameters]) -> None:
    """Refuse query parameters `model` does not have (422 invalid_field naming them), leaving their values
    to a check of the route's own (the audit log's filters, whose sentences the pages share). Every
    parameter of such a model is optional, so None stands for each one given."""
    try:
        model.model_validate(dict.fromkeys(request.args))
    except ValidationError as exc:
        raise _refusal(model, exc) from None


def body(model: type[M]) -> M:
    """The request's JSON object as `model`: 400 invalid_json when it is not a JSON object, 422
    invalid_field naming every bad field when it does not fit."""
    try:
        data = request.get_json(silent=True)
    except RecursionError:  # deeper than the parser goes; no request of ours nests more than a few levels
        message = "The JSON is nested too deeply; send a JSON object of the documented fields."
        raise Refused(400, "invalid_json", message) from None
    return parse(model, data)


def optional_body(model: type[M]) -> M:
    """As body(), for a route whose every field is optional: no body at all is the model's defaults."""
    return body(model) if request.get_data() else model()


def parse(model: type[M], data: object) -> M:
    if not isinstance(data, dict):
        raise Refused(400, "invalid_json", "Send a JSON object with Content-Type: application/json.")
    odd = _odd_fields(model, data)
    if odd:
        raise InvalidFields(odd[:MAX_PROBLEMS], [], unlisted=max(0, len(odd) - MAX_PROBLEMS))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _refusal(model, exc) from None


def _refusal(model: type[BaseModel], exc: ValidationError) -> InvalidFields:
    problems: dict[str, FieldProblem] = {}
    advice: list[str] = []
    for error in exc.errors(include_url=False, include_context=False, include_input=False):
        name, field = _field_at(model, error["loc"])
        if name in problems:
            continue  # one problem per field: its whole rule
        rule = next((m for m in field.metadata if isinstance(m, Rule)), None) if field else None
        if error["type"] == "extra_forbidden" or field is None:
            problem = "is not a field of this request"
        elif error["type"] == "string_unicode":  # a lone surrogate, e.g. "\ud800": no text can hold it
            problem = "holds a lone surrogate (half of a UTF-16 pair, such as \\ud800), which is not text; remove it"
        elif rule is None:
            problem = "is not valid"
        elif error["type"] == "missing":
            problem = f"is required and {rule.must}"
        else:
            problem = rule.must
        if rule and rule.when_empty and error["type"] in EMPTY:
            advice.append(rule.when_empty)
        problems[name] = FieldProblem(field=name, problem=problem)
    listed = list(problems.values())
    return InvalidFields(listed[:MAX_PROBLEMS], advice, unlisted=max(0, len(listed) - MAX_PROBLEMS))


def _field_at(model: type[BaseModel], loc: tuple) -> tuple[str, Any]:
    """The field an error is about, and its dotted name: into a nested request body ("policy.approvals"),
    so its own rule is said; None for a name the body does not have."""
    if not loc:
        return "(body)", None
    names, field, inside = [], None, model
    for part in loc:
        if isinstance(part, int) and names and _listed_body(_annotations(field)):
            names[-1] += f"[{part}]"  # an item of a list of bodies: "items[3]", then its own field
            continue
        if inside is None or not isinstance(part, str):
            break
        field = inside.model_fields.get(part) or next(
            (f for f in inside.model_fields.values() if f.alias == part), None
        )
        names.append(part)
        if field is None:
            break
        kinds = _annotations(field)
        inside = next((kind for kind in kinds if _is_body(kind)), None) or _listed_body(kinds)
    return ".".join(names), field


def _is_body(kind: object) -> bool:
    return isinstance(kind, type) and issubclass(kind, RequestBody)


# What a field holding what no text or number the desk keeps can be is told (described.odd_value's kinds).
_ODD = {
    described.NUL: "must not contain the NUL character (\\u0000), in its text or in any name or text inside it",
    described.LONE_SURROGATE: (
        "cannot be read: the JSON holds text that is not valid Unicode (a lone surrogate); send whole characters"
    ),
    described.NOT_FINITE: (
        "holds a number that is not finite: 1e400 is too large for a number, and NaN and Infinity are not JSON"
    ),
}


def _odd_fields(model: type[BaseModel], data: dict) -> list[FieldProblem]:
    """The fields of a body that hold a NUL character, a lone surrogate or a number that is not finite
    (1e400, read as infinity), in a name or a value at any depth: no column or audit record can keep
    them. Named as _refusal names fields, into nested bodies and lists of them ("items[3].message") and
    into a tool's arguments ("input.memo"); deeper, the problem says where. (Walked without
    recursion: a body's nesting is as deep as its sender likes.)"""
    problems: dict[str, FieldProblem] = {}
    pending: list[tuple[type[BaseModel] | None, dict, str]] = [(model, data, "")]
    while pending:
        inside, value, prefix = pending.pop()
        for key, item in value.items():
            name = f"{prefix}.{_printable(key)}" if prefix else _printable(key)
            field = _model_field(inside, key) if inside is not None else None
            kinds = _annotations(field)
            if (what := described.oddity(key)) is not None:
                problems.setdefault(name, FieldProblem(field=name, problem=_ODD[what]))
            elif isinstance(item, dict) and (nested := next((k for k in kinds if _is_body(k)), None)):
                pending.append((nested, item, name))
            elif isinstance(item, dict) and ToolArguments in kinds:
                pending.append((None, item, name))  # each argument a field of its own, as the tool names them
            elif isinstance(item, list) and (nested := _listed_body(kinds)):
                for index, element in enumerate(item):
                    if isinstance(element, dict):
                        pending.append((nested, element, f"{name}[{index}]"))
                    elif (found := described.odd_value(element)) is not None:
                        problems.setdefault(f"{name}[{index}]", _odd_problem(f"{name}[{index}]", *found))
            elif (found := described.odd_value(item)) is not None:
                problems.setdefault(name, _odd_problem(name, *found))
    return sorted(problems.values(), key=lambda problem: problem.field)


def _odd_problem(name: str, where: str, what: str) -> FieldProblem:
    return FieldProblem(field=name, problem=_ODD[what] + (f" (at {where})" if where else ""))


def _printable(name: str) -> str:
    """A name as sent, a lone surrogate in it written as its escape (\\ud800) so the answer is text."""
    return name.encode("utf-8", "backslashreplace").decode()


def _model_field(model: type[BaseModel], name: str) -> Any:
    return model.model_fields.get(name) or next((f for f in model.model_fields.values() if f.alias == name), None)


def _annotations(field: Any) -> tuple:
    """A field's type and, for an optional or a union, the types it may be."""
    if field is None:
        return ()
    return (field.annotation, *getattr(field.annotation, "__args__", ()))


def _listed_body(kinds: tuple) -> type[RequestBody] | None:
    """The body each item of a list field is (list[RunItemIn]: RunItemIn), if it is one."""
    for kind in kinds:
        if getattr(kind, "__origin__", None) is list:
            (item,) = kind.__args__
            if _is_body(item):
                return item
    return None


def _shown(name: str) -> str:
    return name if len(name) <= 60 else name[:57] + "..."


# --- responses --------------------------------------------------------------------------------------

Timestamp = Annotated[
    datetime,
    PlainSerializer(lambda value: value.isoformat(), return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time", "description": "ISO 8601, UTC (+00:00)."}),
]
Progress = Annotated[
    int | float,  # as the tool reported it: 1 stays 1
    WithJsonSchema({"type": "number", "minimum": 0, "maximum": 1}),
]
TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]  # webapp.tools.tasks.STATUSES


class InputRequired(BaseModel):
    prompt: str = Field(description="What the task asks a person to type.")
    pending: bool = Field(description="Input was given and waits for the assistant's next move to read it.")
    url: str = Field(description='Where to POST it: {"input": "..."}.')


class TaskView(BaseModel):
    """A tool call's long-running task as people may see it (the tool's own data stays private)."""

    tool_call_id: int
    tool: str = Field(description="The tool's name.")
    status: TaskStatus
    message: str | None = Field(description='Where the task stands, in the tool\'s words, e.g. "Exported part 2 of 3".')
    progress: Progress | None = Field(description="How far along, from 0 to 1, when the tool says.")
    input_required: InputRequired | None = Field(
        description="Set while the task waits for a person's input, with what it asks and where to send it."
    )
    last_progress_at: Timestamp | None = Field(description="When the task last changed.")
    next_check_at: Timestamp | None = Field(description="When the assistant looks at it again.")

    @classmethod
    def of(cls, call: ToolCall) -> TaskView | None:
        task = call.task
        if not task:
            return None
        waiting_for_input = call.status == CallStatus.AWAITING_TASK and task.get("status") == INPUT_REQUIRED
        return cls(
            tool_call_id=call.id,
            tool=call.name,
            status=task.get("status"),
            message=task.get("message"),
            progress=task.get("progress"),
            input_required=(
                InputRequired(
                    prompt=task.get("input_prompt") or "Input",
                    pending=call.task_input is not None,
                    url=f"/api/tool-calls/{call.id}/input",
                )
                if waiting_for_input
                else None
            ),
            last_progress_at=call.task_progress_at,
            next_check_at=call.task_due_at,
        )


class ToolCallView(BaseModel):
    """One tool call the model asked for: its arguments, its state, who decided it and its result."""

    id: int
    conversation_id: int
    tool_use_id: str = Field(description="The id of the model's tool_use block.")
    name: str = Field(description="The tool's name.")
    source: str | None = Field(
        None, description="The outside agent that asked for the call (POST /api/calls); null: the desk's assistant."
    )
    input: ToolArguments = Field(description="The arguments the tool runs (or ran) with, after any edit.")
    arguments_hash: str = Field(description="The hash of `input`; send it with a decision.")
    status: CallStatus
    requires_approval: bool
    output: Any = Field(
        None,
        description=(
            "The tool's own output, once it ran: its JSON as the tool returned it (text when it returned text); "
            "null before it ran, or when the desk settled the call (rejected, expired, cancelled)."
        ),
    )
    summary: str = Field(description="Where the call stands and what it did, in a sentence for people.")
    result: str | None = Field(
        description=(
            "The text the model was given (the output fenced, with the desk's notes). Kept for earlier clients: "
            "read `output` and `summary` instead."
        ),
        json_schema_extra={"deprecated": True},
    )
    is_error: bool = Field(description="The result is an error (failed, rejected, expired...).")
    decided_by: str | None = Field(description="The email of the reviewer who settled the decision.")
    decided_at: Timestamp | None
    decision_reason: str | None
    claimed_by: str | None = Field(
        description="The email of the reviewer reviewing the call now (a claim, see POST .../claim), while it lasts."
    )
    claimed_until: Timestamp | None = Field(description="When that claim runs out.")
    task: TaskView | None = Field(description="The call's task, when its tool answered with one.")
    created_at: Timestamp

    @classmethod
    def of(cls, call: ToolCall, tools: ToolRegistry) -> ToolCallView:
        """`tools`: the registry of the call's tenant (for its sentence)."""
        return cls(
            id=call.id,
            conversation_id=call.conversation_id,
            tool_use_id=call.tool_use_id,
            name=call.name,
            source=call.source,
            input=call.input,
            arguments_hash=arguments_hash(call.input),
            status=call.status,
            requires_approval=call.requires_approval,
            output=cards.output(call),
            summary=cards.summary(call, tools),
            result=call.result,
            is_error=call.is_error,
            decided_by=call.decided_by.email if call.decided_by else None,
            decided_at=call.decided_at,
            decision_reason=call.decision_reason,
            claimed_by=held.email if (held := holder(call)) else None,
            claimed_until=call.claimed_until if held else None,
            task=TaskView.of(call),
            created_at=call.created_at,
        )


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
    next_cursor: str | None = Field(description="Send it as `cursor` for the next page; null on the last page.")


class PolicyView(BaseModel):
    """A tool's policy in force: when its calls wait for people, how many, and what may run without one."""

    tool: str
    mode: Literal["never", "always", "above_amount"]
    threshold_cents: int | None = Field(description="With above_amount: calls above this wait.")
    approvals: int = Field(description="People who must approve a waiting call (0 with never).")
    limits: PolicyLimits
    ttl_seconds: int = Field(description="How long people have to decide.")
    remind_after_seconds: int | None = Field(description="When a waiting call reminds; null: the default.")
    ceiling_cents: int | None = Field(
        description="The desk operator's ceiling: above it every call waits, whatever the policy; null: none."
    )
    version: int = Field(description="0: the tool's built-in default, never edited.")
    rule: str = Field(description="The policy in words.")
    pending_changes: list[int] = Field(description="Changes of this policy waiting for a second admin.")

    @classmethod
    def of(cls, policy: Any, pending: list[int] = ()) -> PolicyView:
        return cls(
            tool=policy.tool_name,
            mode=policy.mode,
            threshold_cents=policy.amount_threshold_cents,
            approvals=policy.approvals_required,
            limits=PolicyLimits(**dataclasses.asdict(policy.limits)),
            ttl_seconds=policy.ttl_seconds,
            remind_after_seconds=policy.remind_after_seconds,
            ceiling_cents=policy.ceiling_cents,
            version=policy.version,
            rule=policy.describe(),
            pending_changes=list(pending),
        )


class PolicyList(BaseModel):
    """Every tool's policy in the tenant, by tool name."""

    policies: list[PolicyView]


class PolicyChangeView(BaseModel):
    """A change to a policy that lets calls wait less, and where it stands."""

    id: int
    tool: str
    status: Literal["pending", "approved", "rejected", "withdrawn", "superseded"]
    source: Literal["policy", "mcp_change"] = Field(
        description="policy: an admin asked; mcp_change: an accepted MCP change loosens the tool's hints."
    )
    loosens: list[str] = Field(description="What would let calls wait less, in sentences for people.")
    before: dict[str, Any] = Field(description="The policy in force when it was asked (with `rule` in words).")
    after: dict[str, Any] = Field(description="The policy asked for.")
    requested_by: str | None = Field(description="The e-mail of the admin who asked.")
    requested_at: Timestamp
    decided_by: str | None = Field(description="Who approved, rejected or withdrew it.")
    decided_at: Timestamp | None
    reason: str | None

    @classmethod
    def of(cls, change: Any) -> PolicyChangeView:
        return cls(
            id=change.id,
            tool=change.tool_name,
            status=change.status,
            source=change.source,
            loosens=change.loosens,
            before=change.before,
            after=change.proposed,
            requested_by=change.requested_by.email if change.requested_by else None,
            requested_at=change.requested_at,
            decided_by=change.decided_by.email if change.decided_by else change.decided_by_label,
            decided_at=change.decided_at,
            reason=change.reason,
        )


class PolicyChangeList(BaseModel):
    """Policy changes, newest first (at most 200)."""

    changes: list[PolicyChangeView]


class PolicySaved(BaseModel):
    """The policy in force now (a stricter change, or one that changed nothing)."""

    policy: PolicyView


class PolicyChangeWaiting(BaseModel):
    """The change lets calls wait less: it waits for another admin of the tenant (or, with one admin, the
    desk's operator); until then the policy stays as it was."""

    change: PolicyChangeView


class PolicyChangeDecided(BaseModel):
    """The decided change and the policy in force now."""

    change: PolicyChangeView
    policy: PolicyView | None


class TextBlock(BaseModel):
    """Words: a person's message, or the assistant's."""

    type: Literal["text"]
    text: str


class ToolUseBlock(BaseModel):
    """The assistant asks for a tool call; the call itself is in `tool_calls` under `tool_call_id`."""

    type: Literal["tool_use"]
    id: str = Field(description="The block's id, as its tool_result names it (tool_use_id).")
    name: str = Field(description="The tool's name.")
    input: ToolArguments = Field(description="The arguments as the model asked for them (before any edit).")
    tool_call_id: int | None = Field(description="The call in `tool_calls` (and in the inbox) it became.")


class ToolResultBlock(BaseModel):
    """The answer to a tool_use block, as people read it: the tool's structured output is the call's
    `output` in `tool_calls`, and the text the model was given stays out of the API."""

    type: Literal["tool_result"]
    tool_use_id: str
    tool_call_id: int | None
    is_error: bool
    summary: str = Field(description="What the call did, or why it did nothing, in a sentence for people.")


class OtherBlock(BaseModel):
    """A block of a kind the desk keeps but does not describe (a model's thinking, say)."""

    type: Literal["other"]
    kind: str = Field(description="Its type as the Messages API names it.")


ContentBlock = Annotated[TextBlock | ToolUseBlock | ToolResultBlock | OtherBlock, Field(discriminator="type")]


class MessageView(BaseModel):
    """One turn of the conversation, in content blocks."""

    role: Literal["user", "assistant"]
    content: list[ContentBlock]

    @classmethod
    def of(cls, message: dict, calls: dict[str, ToolCall], summaries: dict[int, str]) -> MessageView:
        """`calls`: the conversation's calls by tool_use id; `summaries`: their sentences by call id."""
        blocks: list[Any] = []
        for block in message["content"]:
            kind = block.get("type")
            if kind == "text":
                blocks.append(TextBlock(type="text", text=block.get("text", "")))
            elif kind == "tool_use":
                call = calls.get(block.get("id", ""))
                blocks.append(
                    ToolUseBlock(
                        type="tool_use",
                        id=block.get("id", ""),
                        name=block.get("name", ""),
                        input=block.get("input") or {},
                        tool_call_id=call.id if call else None,
                    )
                )
            elif kind == "tool_result":
                call = calls.get(block.get("tool_use_id", ""))
                blocks.append(
                    ToolResultBlock(
                        type="tool_result",
                        tool_use_id=block.get("tool_use_id", ""),
                        tool_call_id=call.id if call else None,
                        is_error=bool(block.get("is_error")),
                        summary=summaries.get(call.id, "") if call else "",
                    )
                )
            else:
                blocks.append(OtherBlock(type="other", kind=str(kind)))
        return cls(role=message["role"], content=blocks)


class ConversationError(BaseModel):
    code: str
    message: str | None


class Usage(BaseModel):
    """Tokens used by all of the conversation's model calls."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    model_calls: int


class ConversationView(BaseModel):
    """A conversation: its state, its messages, its tool calls, its open tasks and its usage."""

    id: int
    title: str
    status: ConversationStatus
    stop_reason: str | None = Field(description="The stop reason of the last model call.")
    error: ConversationError | None = Field(description="Why a failed conversation failed.")
    cancel_requested: bool
    cancel_reason: str | None = Field(
        description="Why it was stopped when no one pressed Stop (e.g. its owner's account was disabled)."
    )
    moves_used: int = Field(description="Moves (model calls or tool calls) used by the current run.")
    move_budget: int = Field(description="Moves the current run may use before it pauses as budget_exhausted.")
    messages: list[MessageView]
    tool_calls: list[ToolCallView]
    tasks: list[TaskView] = Field(description="The open tasks (calls awaiting a task), with what they wait for.")
    usage: Usage
    created_at: Timestamp
    updated_at: Timestamp

    @classmethod
    def of(
        cls, conversation: Conversation, messages: list[dict], calls: list[ToolCall], usage: Usage, tools: ToolRegistry
    ) -> ConversationView:
        views = [ToolCallView.of(call, tools) for call in calls]
        by_use_id = {call.tool_use_id: call for call in calls}
        summaries = {view.id: view.summary for view in views}
        return cls(
            id=conversation.id,
            title=conversation.title,
            status=conversation.status,
            stop_reason=conversation.stop_reason,
            error=(
                ConversationError(code=conversation.error_code, message=conversation.error_message)
                if conversation.error_code
                else None
            ),
            cancel_requested=conversation.cancel_requested_at is not None,
            cancel_reason=conversation.cancel_reason,
            moves_used=conversation.moves_used,
            move_budget=conversation.move_budget,
            messages=[MessageView.of(message, by_use_id, summaries) for message in messages],
            tool_calls=views,
            tasks=[TaskView.of(call) for call in calls if call.status == CallStatus.AWAITING_TASK and call.task],
            usage=usage,
            created_at=conversation.created_at,
            updated_at=conversation.updated_at,
        )


class ConversationSummary(BaseModel):
    """A conversation as a list shows it: what it is, who started it and where it stands."""

    id: int
    title: str
    status: ConversationStatus
    started_by: str = Field(description="The email of the agent who started it.")
    cancel_requested: bool
    created_at: Timestamp
    updated_at: Timestamp

    @classmethod
    def of(cls, conversation: Conversation, started_by: str) -> ConversationSummary:
        return cls(
            id=conversation.id,
            title=conversation.title,
            status=conversation.status,
            started_by=started_by,
            cancel_requested=conversation.cancel_requested_at is not None,
            created_at=conversation.created_at,
            updated_at=conversation.updated_at,
        )


class ConversationList(BaseModel):
    """A page of the conversations the caller may see, newest first."""

    conversations: list[ConversationSummary]
    next_cursor: str | None = Field(description="Send it as `cursor` for the next page; null on the last page.")


class ConversationState(BaseModel):
    """A conversation's id and status after a change (201 when created, 202 when its work was queued)."""

    id: int
    status: ConversationStatus

    @classmethod
    def of(cls, conversation: Conversation, **more: Any) -> ConversationState:
        return cls(id=conversation.id, status=conversation.status, **more)


class CancelRequested(ConversationState):
    cancel_requested: Literal[True] = True


class BudgetExtended(ConversationState):
    move_budget: int = Field(description="The run's move budget, extension included.")


class TokenView(BaseModel):
    """An API token as its owner and their admins see it: never the token itself, which is shown once."""

    id: int
    name: str = Field(description="What its owner named it.")
    prefix: str = Field(description='Its first characters, e.g. "adk_Ab3dE6gH" (empty for tokens made before names).')
    user_id: int
    email: str = Field(description="Whose token it is.")
    state: Literal["active", "expired", "revoked"]
    created_at: Timestamp
    expires_at: Timestamp | None = Field(description="When it stops working by itself; null: never.")
    revoked_at: Timestamp | None

    @classmethod
    def of(cls, row: ApiToken, state: str) -> TokenView:
        return cls(
            id=row.id,
            name=row.name,
            prefix=row.prefix,
            user_id=row.user_id,
            email=row.user.email,
            state=state,
            created_at=row.created_at,
            expires_at=row.expires_at,
            revoked_at=row.revoked_at,
        )


class TokenList(BaseModel):
    tokens: list[TokenView]


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
    next_cursor: str | None = Field(description="Send it as `cursor` for the next page; null on the last page.")


class WebhookView(BaseModel):
    """An event webhook of the tenant: where its events go (never its secret, which is shown once)."""

    id: int
    url: str
    events: list[str]
    created_by: str | None = Field(description="The email of the admin who made it.")
    created_at: Timestamp
    deleted_at: Timestamp | None = Field(description="When it was removed; null while it is in force.")

    @classmethod
    def of(cls, subscription: WebhookSubscription, created_by: str | None) -> WebhookView:
        return cls(
            id=subscription.id,
            url=subscription.url,
            events=list(subscription.events),
            created_by=created_by,
            created_at=subscription.created_at,
            deleted_at=subscription.deleted_at,
        )


class WebhookCreated(WebhookView):
    """A new event webhook, with its signing secret: shown this once, kept sealed. Give the whole
    string, `whsec_` included, to the `standardwebhooks` library's Webhook(secret)."""

    secret: str = Field(description="The signing secret, whsec_ and base64.")


class WebhookList(BaseModel):
    webhooks: list[WebhookView]


class WebhookDeliveryView(BaseModel):
    """One event's delivery to a webhook: where it stands and its last attempt."""

    id: int
    event_id: str = Field(description="The webhook-id header it is sent with (the same at every attempt).")
    event_type: str
    conversation_id: int | None
    status: Literal["pending", "delivered", "failed"] = Field(
        description="pending: not delivered yet (retried with backoff for a day); failed: given up."
    )
    attempts: int
    http_status: int | None = Field(description="What the receiver answered at the last attempt.")
    error: str | None = Field(description="Why the last attempt failed, in words.")
    next_attempt_at: Timestamp | None
    created_at: Timestamp
    delivered_at: Timestamp | None

    @classmethod
    def of(cls, delivery: WebhookDelivery) -> WebhookDeliveryView:
        return cls.model_validate(delivery, from_attributes=True)


class WebhookDeliveryList(BaseModel):
    """A page of a webhook's deliveries, newest first."""

    deliveries: list[WebhookDeliveryView]
    next_cursor: str | None = Field(description="Send it as `cursor` for the next page; null on the last page.")


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


class SecretList(BaseModel):
    """The secrets the desk's operator granted to the caller's tenant: the environment variables its
    admins may name in an MCP server's header (`X-Key: $NAME`). Names only, never a value."""

    secrets: list[str] = Field(description="Their names, sorted; any other variable is refused.")


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


# --- event webhooks' bodies (the document's `webhooks`; webapp/webhooks/ builds them) ----------------


class _EventData(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _CallEventData(_EventData):
    call_id: int
    conversation_id: int
    tool: str = Field(description="The tool's name.")
    source: str | None = Field(
        description="The outside agent that asked for the call (POST /api/calls); null: the desk's assistant."
    )


class ApprovalRequestedData(_CallEventData):
    input: ToolArguments = Field(description="The arguments the model asked for.")
    arguments_hash: str = Field(description="Send it with a decision (POST /api/approvals/{id}).")


class ApprovalDecidedData(_CallEventData):
    decision: Literal["approve", "reject", "expired"]
    decided_by: str | None = Field(description="The reviewer's email; null when it expired.")
    reason: str | None
    input: ToolArguments = Field(description="The arguments the call runs with: the reviewer's edit, if any.")
    edited: bool = Field(description="The reviewer changed the arguments.")
    status: CallStatus = Field(description="The call's state after it: awaiting_approval while more must approve.")
    approvals: int | None = Field(description="Approvals so far.")
    approvals_required: int | None


class ApprovalNoticeData(_CallEventData):
    expires_at: str | None = Field(description="When the call expires undecided (RFC 3339), if it does.")


class ConversationEventData(_EventData):
    conversation_id: int


class ConversationCompletedData(ConversationEventData):
    stop_reason: str | None = Field(description="The last model call's stop reason.")


class ConversationFailedData(ConversationEventData):
    error: ConversationError


class TaskFinishedData(_CallEventData):
    status: CallStatus = Field(description="The call's state once its task ended.")


class PolicyChangedData(_EventData):
    tool: str
    policy: dict[str, Any] = Field(description="The policy in force now, as GET /api/policies shows its fields.")
    changed_by: str | None = Field(description="Who put it in force (the second admin of a loosening).")
    change_id: int | None = Field(description="The policy change it came from, when it waited for a second admin.")


def _event(event_type: str, data: type[BaseModel]) -> type[BaseModel]:
    name = "".join(part.title() for part in re.split(r"[._]", event_type)) + "Event"
    fields: dict[str, Any] = {
        "type": (Literal[event_type], ...),
        "timestamp": (Timestamp, Field(description="When it happened (the audit event's time).")),
        "data": (data, ...),
    }
    return create_model(name, __doc__=EVENT_TYPES[event_type], __config__=ConfigDict(extra="forbid"), **fields)


EVENT_MODELS: dict[str, type[BaseModel]] = {
    event_type: _event(event_type, data)
    for event_type, data in (
        ("approval.requested", ApprovalRequestedData),
        ("approval.decided", ApprovalDecidedData),
        ("approval.reminder", ApprovalNoticeData),
        ("approval.escalated", ApprovalNoticeData),
        ("conversation.awaiting_approval", ConversationEventData),
        ("conversation.completed", ConversationCompletedData),
        ("conversation.failed", ConversationFailedData),
        ("task.finished", TaskFinishedData),
        ("policy.changed", PolicyChangedData),
    )
}


class OpenApiDocument(BaseModel):
    """This API's OpenAPI 3.1 document."""

    model_config = ConfigDict(extra="allow")

    openapi: str
    info: dict[str, Any]
    paths: dict[str, Any]


# --- bulk runs (webapp/runs/) ----------------------------------------------------------------------

MAX_RUN_ITEMS = 10_000  # webapp.runs.actions.MAX_ITEMS


class RunItemIn(RequestBody):
    """One item of a run: the first question of a conversation of its own."""

    message: MessageText


class StartRun(RequestBody):
    """A bulk run: each item becomes a conversation owned by the caller. With `batch`, the model moves
    of its conversations go through the Message Batches API: answers come within the poll interval
    to hours later, at half the price."""

    items: Annotated[
        list[RunItemIn],
        Field(min_length=1, max_length=MAX_RUN_ITEMS, description=f"From 1 to {MAX_RUN_ITEMS:,} items."),
        Rule(f'must be a list of 1 to {MAX_RUN_ITEMS:,} items, each {{"message": ...}}'),
    ]
    batch: Annotated[bool, Field(description="Send the model moves by Message Batch (half price, slower).")] = False
    title: Annotated[
        str | None,
        Field(max_length=200, pattern=NO_NUL, description="A name for the run; left out: its number of items."),
        Rule("must be text of at most 200 characters"),
    ] = None


class RunCreated(BaseModel):
    """The run's id (201); its conversations start in the background."""

    id: int


class RunCounts(BaseModel):
    """The run's items by where their conversations are (an item not started yet counts as queued)."""

    queued: int
    running: int = Field(description="A move in flight, a task working, or an answer awaited from a batch.")
    awaiting_approval: int
    completed: int
    failed: int = Field(description="Failed, or out of budget.")
    cancelled: int


class RunCost(BaseModel):
    """What the run's model calls cost so far, in USD as decimal strings."""

    usd: str
    interactive_usd: str = Field(description="What the same calls would have cost made one by one, at list price.")
    model_calls: int
    batched_calls: int = Field(description="Model calls answered by a Message Batch.")


class RunView(BaseModel):
    """A bulk run and where its items stand."""

    id: int
    title: str
    status: Literal["starting", "running", "completed", "cancelled"]
    batch: bool
    items: int
    counts: RunCounts
    conversations: list[int] = Field(description="Its conversations' ids, in the order of its items.")
    cost: RunCost
    created_at: Timestamp

    @classmethod
    def of(cls, run: Any, figures: Any) -> RunView:
        return cls(
            id=run.id,
            title=run.title,
            status=figures.status,
            batch=run.batch,
            items=run.items,
            counts=RunCounts(**figures.counts),
            conversations=figures.conversation_ids,
            cost=RunCost(
                usd=str(figures.cost.quantize(Decimal("0.000001"))),
                interactive_usd=str(figures.cost_interactive.quantize(Decimal("0.000001"))),
                model_calls=figures.model_calls,
                batched_calls=figures.batched_calls,
            ),
            created_at=run.created_at,
        )
