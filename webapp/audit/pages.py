"""The auditors' pages: the audit log browser, a conversation's timeline, exports that can be verified
outside the app, and the cost and approvals dashboard. Also the filters GET /api/audit shares, and a
generator of synthetic, valid events for performance tests (`flask audit generate`).

Everything is scoped to the person's tenant, i.e. to its chain. Lists are keyset-paginated by id,
newest first. Exports and the dashboard read in batches on short connections: on SQLite every
transaction holds the write lock (BEGIN IMMEDIATE), so a long read would stop every writer.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

import pygal
from flask import Blueprint, Response, abort, current_app, render_template, request
from flask_login import current_user
from pygal.style import Style
from sqlalchemy import ColumnElement, Text, cast, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine

from webapp.audit import costs
from webapp.audit_chain import GENESIS, HASHED_FIELDS, event_hash
from webapp.models import AuditEvent, AuditHead, Conversation, Tenant, User
from webapp.runtime.extensions import db
from webapp.web.errors import Refused
from webapp.web.security import roles_required

bp = Blueprint("audit", __name__, url_prefix="/audit", cli_group=None)

AUDITORS = ("auditor", "admin")
PAGE_SIZE = 50
API_LIMIT = 100
API_MAX_LIMIT = 500
EXPORT_BATCH = 2000
TIMELINE_LIMIT = 5000
SHORT_PERIOD = 20_000  # events in a date range below which reading it by time and sorting is cheaper
MAX_TEXT = 200
MAX_DASHBOARD_DAYS = 366
DEFAULT_DASHBOARD_DAYS = 30
CHART_REUSE_SECONDS = 60
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
    "sign_in",
    "sign_in_failed",
    "sign_out",
    "user_created",
    "user_roles_changed",
    "user_disabled",
    "user_enabled",
    "user_password_reset",
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
)
EXPORT_FIELDS = ("id", *HASHED_FIELDS, "hash")
_INT_FIELDS = ("id", "seq", "tenant_id", "actor_id", "conversation_id", "tool_call_id")
_TOOL_ACTIONS = ("tool_call_requested", "approval_requested", "tool_call_executed")


@bp.record_once
def _load_prices(state) -> None:
    # Read once at boot, so a bad MODEL_PRICES stops the app with a sentence, like Config does.
    try:
        state.app.extensions["audit.prices"] = costs.prices_from_env(os.environ)
    except costs.PriceError as exc:
        raise SystemExit(f"Configuration error: {exc}") from None


def prices() -> costs.PriceTable:
    """The app's price table (defaults with MODEL_PRICES laid over them)."""
    return current_app.extensions["audit.prices"]


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

    def text(name: str, label: str, limit: int = MAX_TEXT) -> str:
        value = (args.get(name) or "").strip()
        if len(value) > limit:
            errors.append(f"{label} is at most {limit} characters; yours has {len(value)}.")
            return ""
        return value

    def day(name: str, label: str) -> date | None:
        value = (args.get(name) or "").strip()
        if not value:
            return None
        try:
            return date.fromisoformat(value)
        except ValueError:
            errors.append(f"{label} must be a date like 2026-11-29; “{value[:40]}” is not one.")
            return None

    start, end = day("from", "“From”"), day("to", "“To”")
    if start and end and start > end:
        errors.append(f"“From” ({start}) is after “To” ({end}); swap them.")
        start = end = None
    conversation = None
    raw = (args.get("conversation") or "").strip().lstrip("#")
    if raw:
        if raw.isascii() and raw.isdigit() and len(raw) <= 12:
            conversation = int(raw)
        else:
            errors.append(f"The conversation is a number, like 42; “{raw[:40]}” is not one.")
    filters = Filters(
        start=start,
        end=end,
        person=text("person", "The person", 254).lower(),
        action=text("action", "The action", 64),
        tool=text("tool", "The tool", 128),
        conversation=conversation,
        outcome=text("outcome", "The outcome", 32),
        text=text("q", "The search text"),
    )
    return filters, errors


def parse_cursor(raw: str | None, name: str) -> tuple[int | None, str | None]:
    """A keyset cursor (an event id), or the sentence saying why it is not one."""
    raw = (raw or "").strip()
    if not raw:
        return None, None
    if raw.isascii() and raw.isdigit() and len(raw) <= 19:
        return int(raw), None
    return None, f"“{name}” must be an event number from a “next” link; “{raw[:40]}” is not one."


@dataclass(frozen=True)
class Selection:
    """Some of a tenant's events: the WHERE clauses, and the expression that orders them by id."""

    where: list
    by_id: ColumnElement  # AuditEvent.id, or an expression of it that steers the planner


def select_events(tenant_id: int, filters: Filters, session) -> Selection:
    """The tenant's events matching `filters`. The person is matched as the actor: a tenant user's
    email or id by actor_id (indexed); any other text, such as "assistant" or an email typed at a
    failed sign-in, by the actor label."""
    e = AuditEvent
    where, by_id = [], e.id
    actor_id = None
    if filters.person.isascii() and filters.person.isdigit():
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
        dialect = session.get_bind().dialect.name
        where.append(cast(e.data, Text).ilike(f"%{_like_escape(_as_stored(filters.text, dialect))}%", escape="\\"))
    return Selection(where, by_id)


def _period(filters: Filters, stamp) -> list:
    """Clauses keeping `stamp` within the filters' days (UTC)."""
    clauses = []
    if filters.start:
        clauses.append(stamp >= costs.day_bounds(filters.start, filters.start)[0])
    if filters.end:
        clauses.append(stamp < costs.day_bounds(filters.end, filters.end)[1])
    return clauses


def _period_size(session, tenant_id: int, filters: Filters, stamp) -> int:
    """How many of the tenant's events lie in the filters' days, counted up to SHORT_PERIOD."""
    some = select(AuditEvent.id).where(AuditEvent.tenant_id == tenant_id, *_period(filters, stamp))
    return session.scalar(select(func.count()).select_from(some.limit(SHORT_PERIOD).subquery()))


def _as_stored(text: str, dialect: str) -> str:
    # The search runs over the JSON text of `data`, so quotes and backslashes appear escaped there;
    # SQLite's column holds json.dumps output (non-ASCII as \uXXXX), PostgreSQL's jsonb prints it raw.
    return json.dumps(text, ensure_ascii=dialect == "sqlite")[1:-1]


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


# --- reading ------------------------------------------------------------------------------------


def newest_first(selection: Selection, before: int | None, limit: int):
    """A page of the selected events, newest first, older than the `before` id; returns the rows
    and the cursor of the next page (None on the last)."""
    query = select(AuditEvent).where(*selection.where)
    if before is not None:
        query = query.where(AuditEvent.id < before)
    rows = list(db.session.scalars(query.order_by(selection.by_id.desc()).limit(limit + 1)))
    return rows[:limit], (rows[limit - 1].id if len(rows) > limit else None)


def record(event) -> dict:
    """An event as exported: its id, every hashed field (created_at as ISO 8601) and its hash, so
    audit.event_hash(record) can be checked against record["hash"] outside the app."""
    fields = {name: getattr(event, name) for name in EXPORT_FIELDS}
    fields["created_at"] = event.created_at.isoformat(timespec="microseconds")
    return fields


def record_from_csv(row: Mapping[str, str]) -> dict:
    """A row of the CSV export typed again (ids as numbers, empty cells as null, data parsed), ready
    for audit.canonical() and audit.event_hash()."""
    fields = {name: (row[name] if row[name] != "" else None) for name in EXPORT_FIELDS}
    for name in _INT_FIELDS:
        fields[name] = None if fields[name] is None else int(fields[name])
    fields["data"] = json.loads(row["data"])
    return fields


def ascending(engine: Engine, selection: Selection, batch_size: int | None = None) -> Iterator[list[tuple]]:
    """Every selected event in id order, as tuples of EXPORT_FIELDS with created_at in ISO
    8601 and data as its stored JSON text (exports copy it rather than parse and re-encode it).
    `batch_size` (default EXPORT_BATCH) rows per short connection, so memory stays flat and no
    transaction outlives a batch."""
    columns = [cast(AuditEvent.data, Text) if name == "data" else getattr(AuditEvent, name) for name in EXPORT_FIELDS]
    at = EXPORT_FIELDS.index("created_at")
    batch_size = batch_size or EXPORT_BATCH
    after = 0
    while True:
        query = select(*columns).where(*selection.where, AuditEvent.id > after)
        query = query.order_by(selection.by_id).limit(batch_size)
        with engine.connect() as connection:
            rows = connection.execute(query).all()
        yield [(*row[:at], row[at].isoformat(timespec="microseconds"), *row[at + 1 :]) for row in rows]
        if len(rows) < batch_size:
            return
        after = rows[-1][0]


def csv_chunks(batches: Iterator[list[tuple]]) -> Iterator[str]:
    """The CSV export: a header (EXPORT_FIELDS), then one row per event; data is JSON, null an empty cell."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(EXPORT_FIELDS)
    for rows in batches:
        writer.writerows(rows)  # csv writes None as an empty cell
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()


def jsonl_chunks(batches: Iterator[list[tuple]]) -> Iterator[str]:
    """The JSON Lines export: one object per event, keyed by EXPORT_FIELDS."""
    names = [name for name in EXPORT_FIELDS if name != "data"]
    at = EXPORT_FIELDS.index("data")
    for rows in batches:
        lines = []
        for row in rows:
            head = json.dumps(dict(zip(names, row[:at] + row[at + 1 :], strict=True)), ensure_ascii=False)
            lines.append(f'{head[:-1]}, "data": {row[at]}}}\n')
        yield "".join(lines)


def api_page(user: User, args: Mapping[str, str]) -> dict:
    """GET /api/audit: the filtered events, newest first, `limit` per page from `cursor` on, with
    `next_cursor`. Bad filters raise Refused 422 naming each problem."""
    filters, errors = parse_filters(args)
    cursor, problem = parse_cursor(args.get("cursor"), "cursor")
    errors += [problem] if problem else []
    limit = API_LIMIT
    if args.get("limit"):
        raw = args["limit"].strip()
        if raw.isascii() and raw.isdigit() and 1 <= int(raw) <= API_MAX_LIMIT:
            limit = int(raw)
        else:
            errors.append(f"“limit” must be a whole number from 1 to {API_MAX_LIMIT}.")
    if errors:
        raise Refused(422, "invalid_filter", " ".join(errors))
    rows, next_cursor = newest_first(select_events(user.tenant_id, filters, db.session), cursor, limit)
    return {
        "events": [record(row) for row in rows],
        "next_cursor": None if next_cursor is None else str(next_cursor),
    }


def summary(event) -> str:
    """One line saying what happened, for the list (the full data is shown beside it)."""
    data = event.data or {}
    if event.action == "model_call":
        return (
            f"{data.get('model')}: {data.get('input_tokens', 0):,} in, {data.get('output_tokens', 0):,} out, "
            f"cache {data.get('cache_read_input_tokens', 0):,} read / {data.get('cache_creation_input_tokens', 0):,} "
            f"written; {data.get('latency_ms', 0)} ms"
        )
    if event.action in ("conversation_started", "message_sent"):
        text = str(data.get("message", ""))
    elif event.action == "approval_decided":
        text = f"{data.get('decision', event.outcome)}" + (f": {data['reason']}" if data.get("reason") else "")
    elif event.action in _TOOL_ACTIONS and "input" in data:
        text = json.dumps(data["input"], ensure_ascii=False)
    else:
        text = json.dumps(data, ensure_ascii=False) if data else ""
    return text if len(text) <= 160 else text[:159] + "…"


# --- pages --------------------------------------------------------------------------------------


def _wants_fragment() -> bool:
    # htmx restoring history asks with HX-Request too, and needs the whole page.
    return bool(request.headers.get("HX-Request")) and not request.headers.get("HX-History-Restore-Request")


def _page(template: str, fragment: str, status: int = 200, **context):
    response = Response(render_template(fragment if _wants_fragment() else template, **context), status)
    response.vary.add("HX-Request")
    return response


def _choices(filters: Filters) -> dict:
    """The options of the filter form; a value typed into the URL stays selectable."""
    from webapp.runtime.services import services

    tools = services().tools.names()
    return {
        "actions": ACTIONS if filters.action in ("", *ACTIONS) else (*ACTIONS, filters.action),
        "tools": tools if filters.tool in ("", *tools) else [*tools, filters.tool],
        "outcomes": OUTCOMES,
    }


@bp.get("")
@roles_required(*AUDITORS)
def index():
    filters, errors = parse_filters(request.args)
    before, problem = parse_cursor(request.args.get("before"), "before")
    errors += [problem] if problem else []
    events, next_cursor = [], None
    if not errors:
        selection = select_events(current_user.tenant_id, filters, db.session)
        events, next_cursor = newest_first(selection, before, PAGE_SIZE)
    return _page(
        "audit/index.html",
        "audit/_results.html",
        422 if errors else 200,
        filters=filters,
        errors=errors,
        events=events,
        before=before,
        next_cursor=next_cursor,
        summary=summary,
        **_choices(filters),
    )


@bp.get("/conversations/<int:conversation_id>")
@roles_required(*AUDITORS)
def conversation(conversation_id: int):
    tenant_id = current_user.tenant_id
    found = db.session.scalar(
        select(Conversation).where(Conversation.id == conversation_id, Conversation.tenant_id == tenant_id)
    )
    selection = select_events(tenant_id, Filters(conversation=conversation_id), db.session)
    query = select(AuditEvent).where(*selection.where).order_by(selection.by_id).limit(TIMELINE_LIMIT + 1)
    events = list(db.session.scalars(query))
    if found is None and not events:
        abort(404, description=f"No conversation {conversation_id} in your account's audit log.")
    return _page(
        "audit/conversation.html",
        "audit/_timeline.html",
        conversation_id=conversation_id,
        conversation=found,
        owner=db.session.get(User, found.user_id) if found else None,
        events=events[:TIMELINE_LIMIT],
        cut=len(events) > TIMELINE_LIMIT,
        summary=summary,
    )


def _export(kind: str, chunks: Callable[[Iterator], Iterator[str]], mimetype: str):
    filters, errors = parse_filters(request.args)
    if errors:
        return index()
    selection = select_events(current_user.tenant_id, filters, db.session)
    slug = current_user.tenant.slug
    engine = db.engine
    # The generator runs after the request's session is gone, on its own short connections.
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    return Response(
        chunks(ascending(engine, selection)),
        mimetype=mimetype,
        headers={
            "Content-Disposition": f'attachment; filename="audit-{slug}-{stamp}.{kind}"',
            "Cache-Control": "no-store",
        },
    )


@bp.get("/export.csv")
@roles_required(*AUDITORS)
def export_csv():
    return _export("csv", csv_chunks, "text/csv")


@bp.get("/export.jsonl")
@roles_required(*AUDITORS)
def export_jsonl():
    return _export("jsonl", jsonl_chunks, "application/jsonl")


# --- dashboard ----------------------------------------------------------------------------------


def parse_range(args: Mapping[str, str], today: date | None = None) -> tuple[date, date, list[str]]:
    """The dashboard's days: from/to, by default the last 30 days up to today (UTC)."""
    today = today or datetime.now(UTC).date()
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


def _figures(tenant_id: int, start: date, end: date, parts: tuple[str, ...], fresh: bool) -> costs.Dashboard:
    """The dashboard's figures; the page computes them afresh, and its charts, fetched right after
    it, reuse them for CHART_REUSE_SECONDS rather than each computing them again."""
    cache = current_app.extensions.setdefault("audit.figures", {})
    key, now = (tenant_id, start, end), time.monotonic()
    kept = cache.get(key)
    if not fresh and kept and now - kept[0] < CHART_REUSE_SECONDS and set(parts) <= set(kept[1]):
        return kept[2]
    board = costs.dashboard(db.engine, tenant_id, start, end, prices(), parts)
    if len(cache) >= 100:
        cache.clear()
    cache[key] = (now, parts, board)
    return board


def _release_session() -> None:
    # The dashboard reads on short connections of its own; on SQLite the request's transaction (opened
    # when the signed-in user was loaded) holds the write lock, which those connections would wait for.
    db.session.commit()


@bp.get("/dashboard")
@roles_required(*AUDITORS)
def dashboard():
    start, end, errors = parse_range(request.args)
    tenant_id = current_user.tenant_id
    _release_session()
    board = _figures(tenant_id, start, end, costs.PARTS, fresh=True)
    return _page(
        "audit/dashboard.html",
        "audit/_dashboard.html",
        board=board,
        errors=errors,
        charts={name: spec.title for name, spec in CHARTS.items()},
        range_args={"from": start.isoformat(), "to": end.isoformat()},
        no_tool=costs.NO_TOOL,
        **FORMATS,
    )


FORMATS = {
    "fmt_usd": lambda amount: f"${amount:,.4f}",
    "fmt_int": lambda number: f"{round(number):,}",
    "fmt_num": lambda number: f"{number:,.0f}" if number == round(number) else f"{number:,.2f}",
    "fmt_pct": lambda share: "—" if share is None else f"{100 * share:.1f} %",
    "fmt_s": lambda seconds: "—" if seconds is None else f"{seconds:,.1f} s",
}


@bp.get("/dashboard/chart.svg")
@roles_required(*AUDITORS)
def chart():
    spec = CHARTS.get(request.args.get("name", ""))
    if spec is None:
        abort(404, description=f"No such chart; there are: {', '.join(CHARTS)}.")
    start, end, _ = parse_range(request.args)
    tenant_id = current_user.tenant_id
    _release_session()
    board = _figures(tenant_id, start, end, (spec.part,), fresh=False)
    drawing = spec.draw(board)
    drawing.title = spec.title
    return Response(drawing.render(), mimetype="image/svg+xml", headers={"Cache-Control": "private, max-age=60"})


# An SVG shown through <img> is a document of its own: pygal's stylesheet is inline, and no script
# runs in it (js=[] and default-src 'none').
chart.talisman_view_options = {
    "content_security_policy": {"default-src": "'none'", "style-src": "'unsafe-inline'", "frame-ancestors": "'self'"}
}


@dataclass(frozen=True)
class ChartSpec:
    title: str
    part: str
    draw: Callable[[costs.Dashboard], object]  # a pygal chart, not yet rendered


CHART_LOOK = {
    "background": "#ffffff",
    "plot_background": "#ffffff",
    "foreground": "#1d2330",
    "foreground_strong": "#1d2330",
    "foreground_subtle": "#5b6475",
    "font_family": "system-ui, sans-serif",
}
CHART_COLORS = ("#2456c9", "#7a5af8", "#f79009", "#0e9384", "#b42318", "#12b76a")
DECISION_COLORS = ("#12b76a", "#b42318", "#f79009")  # approved, rejected, expired


def _new(kind, board: costs.Dashboard | None = None, colors: tuple[str, ...] = CHART_COLORS, **options):
    chart = kind(
        js=[],
        style=Style(colors=colors, **CHART_LOOK),
        width=720,
        height=320,
        legend_at_bottom=True,
        truncate_label=-1,
        print_values=False,
        no_data_text="No data in this range",
        **options,
    )
    chart.add_xml_filter(_without_scripts)
    if board is not None:
        chart.x_labels = [day.strftime("%m-%d") for day in board.days]
        chart.x_label_rotation = 45
        chart.show_minor_x_labels = len(board.days) <= 14
        chart.x_labels_major_every = max(1, len(board.days) // 10)
    return chart


def _without_scripts(root):
    # Even with js=[] pygal writes its settings for pygal.js into a <script>; these charts are images.
    for parent in list(root.iter()):
        for child in list(parent):
            if str(child.tag).rpartition("}")[2] == "script":
                parent.remove(child)
    return root


def _per_day(board: costs.Dashboard, kind, series: dict[str, Callable], source: str, **options):
    chart = _new(kind, board, **options)
    rows = getattr(board, source)
    for label, value in series.items():
        chart.add(label, [value(rows[day]) for day in board.days])
    return chart


def _ranked(rows: dict, value: Callable, label: str, **options):
    chart = _new(pygal.HorizontalBar, show_legend=False, **options)
    chart.x_labels = list(rows)
    chart.add(label, [value(row) for row in rows.values()])
    return chart


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


CHARTS: dict[str, ChartSpec] = {
    "cost": ChartSpec(
        "Cost per day (USD)",
        "usage",
        lambda b: _per_day(b, pygal.Bar, {"USD": lambda u: float(u.cost)}, "usage_by_day", show_legend=False),
    ),
    "tokens": ChartSpec(
        "Tokens per day",
        "usage",
        lambda b: _per_day(
            b,
            pygal.StackedBar,
            {
                "input": lambda u: int(u.input_tokens),
                "output": lambda u: int(u.output_tokens),
                "cache write": lambda u: int(u.cache_write_tokens),
                "cache read": lambda u: int(u.cache_read_tokens),
            },
            "usage_by_day",
        ),
    ),
    "people": ChartSpec(
        "Cost per person (USD)",
        "usage",
        lambda b: _ranked(b.usage_by_person, lambda u: float(u.cost), "USD"),
    ),
    "tools": ChartSpec(
        "Cost per tool (USD)", "usage", lambda b: _ranked(b.usage_by_tool, lambda u: float(u.cost), "USD")
    ),
    "approvals": ChartSpec(
        "Decisions per day",
        "approvals",
        lambda b: _per_day(
            b,
            pygal.StackedBar,
            {"approved": lambda a: a.approved, "rejected": lambda a: a.rejected, "expired": lambda a: a.expired},
            "approvals_by_day",
            colors=DECISION_COLORS,
        ),
    ),
    "latency": ChartSpec(
        "Decision latency (seconds)",
        "approvals",
        lambda b: _per_day(
            b,
            pygal.Line,
            {"median": lambda a: _seconds(a.median), "p95": lambda a: _seconds(a.p95)},
            "approvals_by_day",
            allow_interruptions=True,
        ),
    ),
    "errors": ChartSpec(
        "Tool error rate (%)",
        "tools",
        lambda b: _ranked(b.tools, lambda t: round(100 * (t.error_rate or 0), 1), "% failed", range=(0, 100)),
    ),
}


# --- synthetic events for performance tests ----------------------------------------------------

SYNTHETIC_BASE = 1_000_000_000  # conversation and tool-call ids of synthetic events start here
_UPSERT = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}
_REASONS = (
    "Amount is above the agent's limit",
    "Customer already got a goodwill credit this quarter",
    "We tell customers by phone",
    "Suspected chargeback fraud",
    "Wrong invoice",
)
_TOOLS = (
    ("lookup_customer", False, lambda r: {"query": str(r.randint(4400, 4480))}),
    ("lookup_invoices", False, lambda r: {"customer_id": r.randint(4400, 4480)}),
    (
        "issue_refund",
        True,
        lambda r: {"invoice_id": r.randint(4400, 4480), "amount_cents": r.randint(1, 400) * 100, "reason": "late"},
    ),
    ("send_email", True, lambda r: {"customer_id": r.randint(4400, 4480), "body": "Your refund is on its way"}),
    ("delete_account", True, lambda r: {"customer_id": r.randint(4400, 4480), "reason": "customer asked"}),
)


def generate_events(
    engine: Engine,
    tenant_id: int,
    count: int,
    *,
    days: int = 90,
    batch_size: int = 10_000,
    seed: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Append `count` synthetic, valid events to the tenant's chain: conversations of its agents with
    model calls, tool calls, approvals by its reviewers and executions, dated over the last `days`
    days. Each batch is one transaction that locks the chain's head, hashes with audit.event_hash,
    bulk-inserts and moves the head, so the chain verifies and the app can write in between.
    Conversation and tool-call ids start at SYNTHETIC_BASE and name no real row. Returns `count`."""
    rng = random.Random(seed)
    with engine.connect() as connection:
        people = connection.execute(select(User.id, User.email, User.roles).where(User.tenant_id == tenant_id)).all()
        highest = connection.scalar(
            select(func.max(AuditEvent.conversation_id)).where(AuditEvent.conversation_id >= SYNTHETIC_BASE)
        )
        highest_call = connection.scalar(
            select(func.max(AuditEvent.tool_call_id)).where(AuditEvent.tool_call_id >= SYNTHETIC_BASE)
        )
    agents = [(p.id, p.email) for p in people if "agent" in (p.roles or [])] or [(None, "agent@synthetic")]
    reviewers = [(p.id, p.email) for p in people if "reviewer" in (p.roles or [])] or [(None, "reviewer@synthetic")]
    ids = {"conversation": (highest or SYNTHETIC_BASE - 1) + 1, "tool_call": (highest_call or SYNTHETIC_BASE - 1) + 1}
    end = datetime.now(UTC)
    step = timedelta(days=days) / max(count, 1)
    script = _conversations(rng, agents, reviewers, ids)
    chain = str(tenant_id)
    upsert = _UPSERT[engine.dialect.name]
    heads, written = AuditHead.__table__, 0
    while written < count:
        size = min(batch_size, count - written)
        with engine.begin() as connection:
            locked = select(heads.c.seq, heads.c.hash).where(heads.c.chain == chain).with_for_update()
            head = connection.execute(locked).first()
            if head is None:
                connection.execute(
                    upsert(heads)
                    .values(chain=chain, seq=0, hash=GENESIS)
                    .on_conflict_do_nothing(index_elements=["chain"])
                )
                head = connection.execute(locked).one()
            seq, prev_hash = head.seq, head.hash
            rows = []
            for n in range(size):
                seq += 1
                row = next(script)
                row.update(
                    chain=chain,
                    seq=seq,
                    tenant_id=tenant_id,
                    created_at=end - step * (count - written - n),
                    prev_hash=prev_hash,
                )
                row["hash"] = prev_hash = event_hash(row)
                rows.append(row)
            connection.execute(insert(AuditEvent.__table__), rows)
            connection.execute(update(heads).where(heads.c.chain == chain).values(seq=seq, hash=prev_hash))
        written += size
        if progress:
            progress(written)
    if engine.dialect.name == "postgresql":
        # After a bulk load the planner's statistics are stale until autovacuum notices (if it runs):
        # it would then sort the tenant's whole chain to show one page.
        with engine.begin() as connection:
            connection.exec_driver_sql("ANALYZE audit_events")
    return count


def _conversations(rng: random.Random, agents: list, reviewers: list, ids: dict) -> Iterator[dict]:
    """An endless stream of plausible conversations, event by event, in the order the app writes them."""

    def event(action, actor, conversation_id=None, call=None, tool=None, outcome=None, data=None):
        return {
            "action": action,
            "actor_id": actor[0] if actor else None,
            "actor_label": actor[1] if actor else "assistant",
            "conversation_id": conversation_id,
            "tool_call_id": call,
            "tool_name": tool,
            "outcome": outcome,
            "data": data or {},
        }

    def model_call(conversation_id, stop):
        return event(
            "model_call",
            None,
            conversation_id,
            outcome=stop,
            data={
                "model": "claude-sonnet-5",
                "latency_ms": round(rng.uniform(300, 4000), 1),
                "request_id": f"req_{rng.getrandbits(48):012x}",
                "input_tokens": rng.randint(200, 4000),
                "output_tokens": rng.randint(20, 600),
                "cache_read_input_tokens": rng.choice((0, rng.randint(1000, 3000))),
                "cache_creation_input_tokens": rng.choice((0, 0, rng.randint(500, 1500))),
            },
        )

    while True:
        agent = rng.choice(agents)
        conversation_id = ids["conversation"]
        ids["conversation"] += 1
        if rng.random() < 0.2:
            yield event("sign_in", agent, outcome="succeeded", data={"address": "127.0.0.1"})
        yield event("conversation_started", agent, conversation_id, data={"message": "Please help customer 4471"})
        for _ in range(rng.randint(1, 3)):
            yield model_call(conversation_id, "tool_use")
            for name, sensitive, make_input in rng.sample(_TOOLS, rng.randint(1, 2)):
                call, arguments = ids["tool_call"], make_input(rng)
                ids["tool_call"] += 1
                status = "awaiting_approval" if sensitive else "pending"
                yield event("tool_call_requested", None, conversation_id, call, name, status, {"input": arguments})
                if sensitive:
                    yield event("approval_requested", None, conversation_id, call, name, status, {"input": arguments})
                    approve = rng.random() < 0.85
                    reason = "" if approve else rng.choice(_REASONS)
                    decision = {"decision": "approve" if approve else "reject", "reason": reason, "input": arguments}
                    outcome = "approved" if approve else "rejected"
                    yield event(
                        "approval_decided", rng.choice(reviewers), conversation_id, call, name, outcome, decision
                    )
                    if not approve:
                        continue
                failed = rng.random() < 0.05
                yield event(
                    "tool_call_executed",
                    agent,
                    conversation_id,
                    call,
                    name,
                    "failed" if failed else "succeeded",
                    {
                        "input": arguments,
                        "duration_ms": round(rng.uniform(1, 80), 1),
                        "result_chars": 200,
                        "attempt": 1,
                    },
                )
        yield model_call(conversation_id, "end_turn")


def tenant_for(slug: str | None) -> Tenant | None:
    """The tenant with this slug, or the first one when no slug is given."""
    query = select(Tenant).order_by(Tenant.id)
    return db.session.scalar(query.where(Tenant.slug == slug) if slug else query.limit(1))
