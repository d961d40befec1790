"""Which audit events an auditor asked for: the query parameters and their rules (read here once, for
the log page, its exports and GET /api/audit, whose AuditQuery only documents them), the events they
select in a tenant's chain, and pages of them, newest first, with the project's keyset cursors
(webapp/web/pagination.py).

Everything is scoped to one tenant, i.e. to its chain. No Flask here: the functions take a session.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import ColumnElement, Text, cast, func, select
from sqlalchemy.orm import Session

from webapp.audit import costs
from webapp.audit.exports import record
from webapp.models import MAX_ROW_ID, AuditEvent, User
from webapp.refusals import Refusal
from webapp.web.ids import fits
from webapp.web.pagination import BadCursor, Page, decode_cursor, keyset_page


class AuditRefused(Refusal):
    """What the audit log refuses: filters or a cursor that do not read."""


PAGE_SIZE = 50
API_LIMIT = 100
API_MAX_LIMIT = 500
TIMELINE_LIMIT = 5000
SHORT_PERIOD = 20_000  # events in a date range below which reading it by time and sorting is cheaper
MAX_TEXT = 200
MAX_DASHBOARD_DAYS = 366
EARLIEST_DAY, LATEST_DAY = date(1970, 1, 1), date(2999, 12, 31)  # the days a date filter may name
DEFAULT_DASHBOARD_DAYS = 30
ACTIONS = (
    "conversation_started",
    "message_sent",
    "model_call",
    "tool_call_requested",
    "approval_requested",
    "approval_viewed",
    "approval_decided",
    "approval_expired",
    "tool_call_executed",
    "task_updated",
    "task_input_given",
    "task_finished",
    "cancel_requested",
    "conversation_cancelled",
    "retry_requested",
    "budget_extended",
    "budget_exhausted",
    "conversation_failed",
    "conversation_waiting",
    "approval_reminded",
    "approval_escalated",
    "conversation_completed",
    "call_outcome_reported",
    "call_cancelled",
    "external_tool_declared",
    "external_tool_removed",
    "sign_in",
    "sign_in_failed",
    "sign_in_blocked",
    "sign_out",
    "user_created",
    "user_roles_changed",
    "user_disabled",
    "user_enabled",
    "user_password_reset",
    "user_unlocked",
    "api_token_created",
    "api_token_revoked",
    "mcp_server_added",
    "mcp_server_add_refused",
    "mcp_server_synced",
    "mcp_tool_accepted",
    "mcp_tool_held",
    "mcp_tool_released",
    "mcp_server_removed",
    "outbound_refused",
)
OUTCOMES = (
    "succeeded",
    "failed",
    "awaiting_approval",
    "approved",
    "rejected",
    "expired",
    "cancelled",
    "awaiting_task",
    "working",
    "input_required",
    "end_turn",
    "tool_use",
    "max_tokens",
    "refused",
)
API_BAD_CURSOR = (
    "“cursor” must be the next_cursor of an earlier answer, unchanged; leave it out to start from the newest events."
)
# The query parameters and how a sentence names each. A parameter sent empty is no filter.
DAYS = {"from": "“From”", "to": "“To”"}  # a date, from EARLIEST_DAY to LATEST_DAY
TEXTS = {  # text without NUL, of at most so many characters
    "person": ("The person", 254),
    "action": ("The action", 64),
    "tool": ("The tool", 128),
    "outcome": ("The outcome", 32),
    "q": ("The search text", MAX_TEXT),
}
MAX_CONVERSATION = MAX_ROW_ID  # "conversation": a number, 0 up to this (a leading # is allowed)
# every parameter GET /api/audit takes; the page and its exports take the same but "limit"
PARAMETERS = (*DAYS, *TEXTS, "conversation", "cursor", "limit")


# --- filters ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Filters:
    """What an auditor asked for; empty strings and None mean "any"."""

    start: date | None = None
    end: date | None = None
    person: str = ""
    action: str = ""
    tool: str = ""
    conversation: int | None = None
    outcome: str = ""
    text: str = ""

    def args(self) -> dict[str, str]:
        """The filters as query parameters, for links that keep them."""
        values = {
            "from": self.start.isoformat() if self.start else "",
            "to": self.end.isoformat() if self.end else "",
            "person": self.person,
            "action": self.action,
            "tool": self.tool,
            "conversation": "" if self.conversation is None else str(self.conversation),
            "outcome": self.outcome,
            "q": self.text,
        }
        return {name: value for name, value in values.items() if value}

    @property
    def any(self) -> bool:
        return bool(self.args())


def parse_filters(args: Mapping[str, str]) -> tuple[Filters, list[str]]:
    """Filters from query parameters (from, to, person, action, tool, conversation, outcome, q),
    and a sentence for each bad value; a bad value is left out of the filters."""
    errors: list[str] = []

    def text(name: str) -> str:
        label, limit = TEXTS[name]
        value = (args.get(name) or "").strip()
        if len(value) > limit:
            errors.append(f"{label} is at most {limit} characters; yours has {len(value)}.")
            return ""
        if "\x00" in value:  # no text the desk stores has one (PostgreSQL's text cannot)
            errors.append(f"{label} cannot contain the NUL character (\\u0000).")
            return ""
        return value

    def day(name: str) -> date | None:
        label, value = DAYS[name], (args.get(name) or "").strip()
        if not value:
            return None
        try:
            day = date.fromisoformat(value)
        except ValueError:
            errors.append(f"{label} must be a date like 2026-11-29; “{value[:40]}” is not one.")
            return None
        if not EARLIEST_DAY <= day <= LATEST_DAY:  # the day after 9999-12-31 has no date, for one
            errors.append(f"{label} must be a date from {EARLIEST_DAY} to {LATEST_DAY}; “{value[:40]}” is not.")
            return None
        return day

    start, end = day("from"), day("to")
    if start and end and start > end:
        errors.append(f"“From” ({start}) is after “To” ({end}); swap them.")
        start = end = None
    conversation = None
    raw = (args.get("conversation") or "").strip().lstrip("#")
    if raw:
        if raw.isascii() and raw.isdigit() and len(raw) <= 12 and int(raw) <= MAX_CONVERSATION:
            conversation = int(raw)
        else:
            errors.append(f"The conversation is a number, like 42; “{raw[:40]}” is not one.")
    filters = Filters(
        start=start,
        end=end,
        person=text("person").lower(),
        action=text("action"),
        tool=text("tool"),
        conversation=conversation,
        outcome=text("outcome"),
        text=text("q"),
    )
    return filters, errors


def parse_cursor(raw: str | None) -> tuple[str | None, str | None]:
    """The cursor of a page link or of an earlier answer's next_cursor (None when there is none),
    or None and the sentence saying what to do when it was edited, cut short or names no event."""
    raw = (raw or "").strip()
    if not raw:
        return None, None
    try:
        decode_cursor(raw, [AuditEvent.id])
    except BadCursor as exc:
        return None, str(exc)
    return raw, None


@dataclass(frozen=True)
class Query:
    """What an auditor asked of the log: the filters, where the page starts (a cursor), how many events
    it holds, and a sentence for each value that could not be read (left out of the rest)."""

    filters: Filters
    cursor: str | None
    size: int
    errors: list[str]


def read_query(args: Mapping[str, str], api: bool = False) -> Query:
    """The log's query parameters (PARAMETERS), read as the page reads them; `api`: as GET /api/audit
    reads them, which also takes "limit" and words a bad cursor for programs."""
    filters, errors = parse_filters(args)
    cursor, problem = parse_cursor(args.get("cursor"))
    if problem:
        errors.append(API_BAD_CURSOR if api else problem)
    size = PAGE_SIZE
    if api:
        size = API_LIMIT
        if args.get("limit"):
            raw = args["limit"].strip()
            if raw.isascii() and raw.isdigit() and 1 <= int(raw) <= API_MAX_LIMIT:
                size = int(raw)
            else:
                errors.append(f"“limit” must be a whole number from 1 to {API_MAX_LIMIT}.")
    return Query(filters, cursor, size, errors)


def parse_range(args: Mapping[str, str]) -> tuple[date, date, list[str]]:
    """The dashboard's days: from/to, by default the last 30 days up to today (UTC)."""
    today = datetime.now(UTC).date()
    filters, errors = parse_filters({"from": args.get("from", ""), "to": args.get("to", "")})
    end = filters.end or today
    start = filters.start or min(end, today) - timedelta(days=DEFAULT_DASHBOARD_DAYS - 1)
    if start > end:
        errors.append(f"“From” ({start}) is after “To” ({end}).")
        start = end - timedelta(days=DEFAULT_DASHBOARD_DAYS - 1)
    if (end - start).days >= MAX_DASHBOARD_DAYS:
        errors.append(f"The dashboard covers at most {MAX_DASHBOARD_DAYS} days; showing the last of them.")
        start = end - timedelta(days=MAX_DASHBOARD_DAYS - 1)
    return start, end, errors


# --- selecting ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """Some of a tenant's events: the WHERE clauses, and the expression that orders them by id."""

    where: list
    by_id: ColumnElement  # AuditEvent.id, or an expression of it that steers the planner


def select_events(tenant_id: int, filters: Filters, session: Session) -> Selection:
    """The tenant's events matching `filters`. The person is matched as the actor: a tenant user's
    email or id by actor_id (indexed); any other text, such as "assistant" or an email typed at a
    failed sign-in, by the actor label."""
    e = AuditEvent
    where, by_id = [], e.id
    actor_id = None
    if filters.person.isascii() and filters.person.isdigit() and fits(int(filters.person)):
        actor_id = int(filters.person)
    elif filters.person:
        actor_id = session.scalar(select(User.id).where(User.tenant_id == tenant_id, User.email == filters.person))
        if actor_id is None:
            where.append(e.actor_label == filters.person)
    if actor_id is not None:
        where.append(e.actor_id == actor_id)
    if filters.conversation is not None:
        where.append(e.conversation_id == filters.conversation)
    # Without statistics SQLite weighs the tenant's index like the conversation's or the actor's and
    # may walk all the tenant's events; "+ 0" keeps it off the tenant's (PostgreSQL chooses well).
    narrow = actor_id is not None or filters.conversation is not None
    where.append((e.tenant_id + 0 if narrow else e.tenant_id) == tenant_id)
    for column, value in ((e.action, filters.action), (e.tool_name, filters.tool), (e.outcome, filters.outcome)):
        if value:
            where.append(column == value)
    if filters.start or filters.end:
        # Neither database knows that ids grow with time. A short period is cheapest read through
        # the time index and sorted ("id + 0" cannot be read from an index); a long one by walking
        # the ids from the newest and checking each time ("coalesce" keeps the time index out).
        short = not narrow and _period_size(session, tenant_id, filters, e.created_at) < SHORT_PERIOD
        if short:
            by_id = e.id + 0
        stamp = e.created_at if short or narrow else func.coalesce(e.created_at, e.created_at)
        where += _period(filters, stamp)
    if filters.text:
        stored = _as_stored(filters.text, session.get_bind().dialect.name)
        where.append(cast(e.data, Text).icontains(stored, autoescape=True))
    return Selection(where, by_id)


def _period(filters: Filters, stamp) -> list:
    """Clauses keeping `stamp` within the filters' days (UTC)."""
    clauses = []
    if filters.start:
        clauses.append(stamp >= costs.day_bounds(filters.start, filters.start)[0])
    if filters.end:
        clauses.append(stamp < costs.day_bounds(filters.end, filters.end)[1])
    return clauses


def _period_size(session: Session, tenant_id: int, filters: Filters, stamp) -> int:
    """How many of the tenant's events lie in the filters' days, counted up to SHORT_PERIOD."""
    some = select(AuditEvent.id).where(AuditEvent.tenant_id == tenant_id, *_period(filters, stamp))
    return session.scalar(select(func.count()).select_from(some.limit(SHORT_PERIOD).subquery()))


def _as_stored(text: str, dialect: str) -> str:
    # The search runs over the JSON text of `data`, so quotes and backslashes appear escaped there;
    # SQLite's column holds json.dumps output (non-ASCII as \uXXXX), PostgreSQL's jsonb prints it raw.
    return json.dumps(text, ensure_ascii=dialect == "sqlite")[1:-1]


# --- reading ------------------------------------------------------------------------------------


def newest_first(session: Session, selection: Selection, cursor: str | None, size: int) -> Page:
    """`size` of the selected events, newest first, after the one `cursor` names (from the newest
    when it is None), and the cursor of the next page. Raises BadCursor (see parse_cursor)."""
    return keyset_page(
        session,
        select(AuditEvent).where(*selection.where),
        [selection.by_id],
        cursor,
        size,
        key_values=lambda event: (event.id,),
    )


def timeline(session: Session, tenant_id: int, conversation_id: int, limit: int = TIMELINE_LIMIT):
    """The conversation's events, oldest first, at most `limit` of them; and whether there are more."""
    selection = select_events(tenant_id, Filters(conversation=conversation_id), session)
    query = select(AuditEvent).where(*selection.where).order_by(selection.by_id).limit(limit + 1)
    events = list(session.scalars(query))
    return events[:limit], len(events) > limit


def api_page(session: Session, user: User, args: Mapping[str, str]) -> dict:
    """GET /api/audit: the filtered events, newest first, `limit` per page from `cursor` on, with
    `next_cursor` (None on the last page). Bad filters raise AuditRefused (invalid) naming each problem."""
    asked = read_query(args, api=True)
    if asked.errors:
        raise AuditRefused("invalid", "invalid_filter", " ".join(asked.errors))
    page = newest_first(session, select_events(user.tenant_id, asked.filters, session), asked.cursor, asked.size)
    return {"events": [record(event) for event in page.rows], "next_cursor": page.next_cursor}
