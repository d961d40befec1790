"""The auditors' pages (blueprint "audit"): the audit log with its filters, a conversation's timeline,
the CSV and JSON Lines exports, and the costs and approvals dashboard with its charts.

Each view loads what it needs through the modules beside this one and renders it: the filters,
selections and pages in `queries`, the exports in `exports`, the figures in `costs`, the charts in
`charts`. Everything is scoped to the signed-in person's tenant, i.e. to its chain.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime

from flask import Blueprint, Response, abort, current_app, request
from flask_login import current_user
from sqlalchemy import select

from webapp.audit import charts, costs, exports, queries
from webapp.models import Conversation, User
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.tools.presenting import changes
from webapp.web import htmx
from webapp.web.pagination import Page
from webapp.web.security import roles_required

bp = Blueprint("audit", __name__, url_prefix="/audit", cli_group=None)

AUDITORS = ("auditor", "admin")
CHART_REUSE_SECONDS = 60
_TOOL_ACTIONS = ("tool_call_requested", "approval_requested", "tool_call_executed")


def prices() -> costs.PriceTable:
    """The app's price table: the built-in list prices with MODEL_PRICES (`Config.model_prices`, read
    and checked at boot with the other settings) laid over them."""
    return costs.PriceTable(overrides=dict(services().config.model_prices))


def summary(event) -> str:
    """One line saying what happened, for the lists (the full data is shown beside it)."""
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
        if isinstance(data.get("input"), dict) and isinstance(data.get("edited_to"), dict):  # what the edit changed
            text += f" (edited: {changes(data['input'], data['edited_to'])})"
    elif event.action in _TOOL_ACTIONS and "input" in data:
        text = json.dumps(data["input"], ensure_ascii=False)
    else:
        text = json.dumps(data, ensure_ascii=False) if data else ""
    return text if len(text) <= 160 else text[:159] + "…"


# --- the log ------------------------------------------------------------------------------------


def _choices(filters: queries.Filters) -> dict:
    """The options of the filter form; a value typed into the URL stays selectable."""
    actions, tools = queries.ACTIONS, services().tools_for(db.session, current_user.tenant_id).names()
    return {
        "actions": actions if filters.action in ("", *actions) else (*actions, filters.action),
        "tools": tools if filters.tool in ("", *tools) else [*tools, filters.tool],
        "outcomes": queries.OUTCOMES,
    }


@bp.get("")
@roles_required(*AUDITORS)
def index():
    asked = queries.read_query(request.args)
    page = Page([], None)
    if not asked.errors:
        selection = queries.select_events(current_user.tenant_id, asked.filters, db.session)
        page = queries.newest_first(db.session, selection, asked.cursor, asked.size)
    return htmx.render(
        "audit/index.html",
        "audit/_results.html",
        422 if asked.errors else 200,
        filters=asked.filters,
        errors=asked.errors,
        events=page.rows,
        cursor=asked.cursor,
        next_cursor=page.next_cursor,
        summary=summary,
        **_choices(asked.filters),
    )


@bp.get("/conversations/<int:conversation_id>")
@roles_required(*AUDITORS)
def conversation(conversation_id: int):
    tenant_id = current_user.tenant_id
    found = db.session.scalar(
        select(Conversation).where(Conversation.id == conversation_id, Conversation.tenant_id == tenant_id)
    )
    events, cut = queries.timeline(db.session, tenant_id, conversation_id)
    if found is None and not events:
        abort(404, description=f"No conversation {conversation_id} in your account's audit log.")
    return htmx.render(
        "audit/conversation.html",
        "audit/_timeline.html",
        conversation_id=conversation_id,
        conversation=found,
        owner=db.session.get(User, found.user_id) if found else None,
        events=events,
        cut=cut,
        summary=summary,
    )


def _export(kind: str, chunks: Callable[[Iterator], Iterator[str]], mimetype: str):
    filters, errors = queries.parse_filters(request.args)
    if errors:
        return index()
    selection = queries.select_events(current_user.tenant_id, filters, db.session)
    slug = current_user.tenant.slug
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    # The generator runs after the request's session is gone, on its own short connections.
    return Response(
        chunks(exports.ascending(db.engine, selection)),
        mimetype=mimetype,
        headers={
            "Content-Disposition": f'attachment; filename="audit-{slug}-{stamp}.{kind}"',
            "Cache-Control": "no-store",
        },
    )


@bp.get("/export.csv")
@roles_required(*AUDITORS)
def export_csv():
    return _export("csv", exports.csv_chunks, "text/csv")


@bp.get("/export.jsonl")
@roles_required(*AUDITORS)
def export_jsonl():
    return _export("jsonl", exports.jsonl_chunks, "application/jsonl")


# --- the dashboard ------------------------------------------------------------------------------


def _figures(tenant_id: int, start: date, end: date, parts: tuple[str, ...], fresh: bool) -> costs.Dashboard:
    """The dashboard's figures; the page computes them afresh, and its charts, fetched right after
    it, reuse them for CHART_REUSE_SECONDS rather than each computing them again."""
    # The figures are read on short connections of their own; on SQLite the request's transaction
    # (opened when the signed-in user was loaded) holds the write lock, which they would wait for.
    db.session.commit()
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


@bp.get("/dashboard")
@roles_required(*AUDITORS)
def dashboard():
    start, end, errors = queries.parse_range(request.args)
    board = _figures(current_user.tenant_id, start, end, costs.PARTS, fresh=True)
    return htmx.render(
        "audit/dashboard.html",
        "audit/_dashboard.html",
        board=board,
        errors=errors,
        charts={name: spec.title for name, spec in charts.CHARTS.items()},
        range_args={"from": start.isoformat(), "to": end.isoformat()},
        no_tool=costs.NO_TOOL,
        **charts.FORMATS,
    )


@bp.get("/dashboard/chart.svg")
@roles_required(*AUDITORS)
def chart():
    spec = charts.CHARTS.get(request.args.get("name", ""))
    if spec is None:
        abort(404, description=f"No such chart; there are: {', '.join(charts.CHARTS)}.")
    start, end, _ = queries.parse_range(request.args)
    board = _figures(current_user.tenant_id, start, end, (spec.part,), fresh=False)
    svg = charts.svg(spec, board)
    return Response(svg, mimetype="image/svg+xml", headers={"Cache-Control": "private, max-age=60"})


# An SVG shown through <img> is a document of its own: pygal's stylesheet is inline, and no script
# runs in it (js=[] and default-src 'none').
chart.talisman_view_options = {
    "content_security_policy": {"default-src": "'none'", "style-src": "'unsafe-inline'", "frame-ancestors": "'self'"}
}
