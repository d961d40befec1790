"""The MCP servers admin page: a tenant's servers with their tools and what each does by default,
adding one at a URL (headers whose values are never shown back; a $NAME only among the secrets the
desk's operator granted to the tenant, which the form lists by name), syncing, removing, and the tools
held because their server changed them: what changed, side by side, and Accept. Servers the desk
starts are listed (an operator added them, on /ops/mcp or the command line) but never added here: a
form that carries a command, or any field the form does not have, is refused in words and audited,
and nothing starts. Every change goes through webapp/settings/mcp_actions.py (audited); a refused
form keeps what was typed."""

from __future__ import annotations

import difflib
import json

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_login import current_user
from sqlalchemy import select

from webapp.models import McpServer
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.secrets import secret_grants
from webapp.settings import mcp_actions
from webapp.tools import mcp
from webapp.tools.presenting import plural
from webapp.web.forms import unknown_fields
from webapp.web.security import roles_required

bp = Blueprint("mcp", __name__, url_prefix="/admin/mcp")
ADD_FIELDS = frozenset({"csrf_token", "name", "url", "headers"})


@bp.get("")
@roles_required("admin")
def index():
    return _page()


@bp.post("")
@roles_required("admin")
def add():
    form = request.form
    actor = current_user._get_current_object()
    headers = form.get("headers", "").splitlines()
    unknown = unknown_fields(form, ADD_FIELDS)
    if unknown:  # a command (even empty) is a door of the operator's; nothing was started
        status, said = (403, mcp.ONLY_OPERATORS_START) if "command" in form else (422, unknown)
        mcp_actions.refused_add(
            db.session,
            current_user.tenant_id,
            actor,
            form.get("name", ""),
            said,
            url=form.get("url"),
            command=form.get("command"),
            headers=headers,
        )
        return _page(error=said, typed=form), status
    try:
        server, report = mcp_actions.add(
            db.session, current_user.tenant_id, actor, form.get("name", ""), url=form.get("url"), headers=headers
        )
    except mcp.McpError as exc:
        return _page(error=str(exc), typed=form), 422
    flash(f"Added {server.name} with {plural(len(server.tools), 'tool')}. " + " ".join(_said(report)), "info")
    return redirect(url_for(".index"), code=303)


@bp.post("/<name>/sync")
@roles_required("admin")
def sync(name: str):
    return _changed(
        mcp_actions.sync, name, lambda report: [f"Synced {name}. " + (" ".join(_said(report)) or "Nothing changed.")]
    )


@bp.post("/<name>/remove")
@roles_required("admin")
def remove(name: str):
    return _changed(
        mcp_actions.remove,
        name,
        lambda names: [f"Removed {name} and its {plural(len(names), 'tool')}; the assistant no longer has them."],
    )


@bp.post("/tools/<tool_name>/accept")
@roles_required("admin")
def accept(tool_name: str):
    def said(change) -> list[str]:
        words = [f"Accepted the change to {tool_name}; the assistant is offered it again."]
        if change is not None:
            words.append(
                "Its policy stays as it was: letting its calls wait less, as its new hints would, waits for another "
                "admin on the Policies page."
            )
        return words

    return _changed(mcp_actions.accept, tool_name, said)


def _changed(change, name: str, said):
    """Make one of mcp_actions' changes to the server or tool `name` as the signed-in admin, flash the
    sentences `said` makes of its result and go back to the page; a refused change is the page with
    the reason (422)."""
    try:
        result = change(db.session, current_user.tenant_id, current_user._get_current_object(), name)
    except mcp.McpError as exc:
        return _page(error=str(exc)), 422
    for words in said(result):
        flash(words, "info")
    return redirect(url_for(".index"), code=303)


MAP_FIELDS = frozenset({"csrf_token", "amount", "unit", "subject", "facts_tool", "facts_arguments"})


@bp.post("/tools/<tool_name>/map")
@roles_required("admin")
def map_tool(tool_name: str):
    """What the tool's arguments mean: the money, the subject, the facts (anything left empty is cleared)."""
    form = request.form
    typed = {"map": tool_name, **{key: form.get(key, "") for key in MAP_FIELDS - {"csrf_token"}}}
    try:
        unknown = unknown_fields(form, MAP_FIELDS)
        if unknown:
            raise mcp.McpError(unknown)
        mapping = mcp_actions.map_tool(
            db.session,
            current_user.tenant_id,
            current_user._get_current_object(),
            tool_name,
            amount=form.get("amount", "").strip() or None,
            unit=form.get("unit", "cents"),
            subject=form.get("subject", "").strip() or None,
            facts_tool=form.get("facts_tool", "").strip() or None,
            facts_arguments=_pairs(form.get("facts_arguments", "")),
        )
    except mcp.McpError as exc:
        db.session.rollback()
        return _page(error=str(exc), typed=typed), 422
    said = "; ".join(mcp.mapping_words(mapping)) or "nothing mapped"
    flash(f"Saved what {tool_name}'s arguments mean: {said}.", "info")
    return redirect(url_for(".index", _anchor=f"tool-{tool_name}"), code=303)


def _pairs(text: str) -> dict[str, str]:
    """ "theirs = ours" lines, one a line."""
    pairs = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        theirs, equals, ours = line.partition("=")
        if not equals or not theirs.strip() or not ours.strip():
            raise mcp.McpError(
                f"{line.strip()!r} is not “its argument = this call's argument”, e.g. repo_path = repo_path."
            )
        pairs[theirs.strip()] = ours.strip()
    return pairs


def _said(report: mcp.SyncReport) -> list[str]:
    """A sync's findings in sentences."""
    said = []
    if report.added:
        said.append(f"New: {', '.join(report.added)}.")
    if report.held:
        said.append(f"Held until you accept their change: {', '.join(report.held)}.")
    if report.removed:
        said.append(f"Gone from the server: {', '.join(report.removed)}.")
    said.extend(f"Refused {name}: {why}." for name, why in report.refused)
    return said


def _page(error: str | None = None, typed=None) -> str:
    tenant_id = current_user.tenant_id
    query = select(McpServer).where(McpServer.tenant_id == tenant_id).order_by(McpServer.name)
    servers = list(db.session.scalars(query))
    registry = services().tools_for(db.session, tenant_id)
    secrets = sorted(secret_grants.granted(db.session, tenant_id))
    return render_template(
        "settings/mcp.html",
        servers=servers,
        registry=registry,
        headers={server.id: mcp.header_words(server, granted=secrets) for server in servers},
        environment={server.id: mcp.environment_words(server) for server in servers},
        secrets=secrets,
        changes={tool.id: _changes(tool) for server in servers for tool in server.tools if tool.held},
        gate={
            tool.id: mcp_actions.gate_preview(db.session, tenant_id, tool)
            for server in servers
            for tool in server.tools
            if tool.held
        },
        hint_words=mcp.hint_words,
        mapping_words=mcp.mapping_words,
        units=mcp.UNITS,
        error=error,
        typed=typed or {},
    )


def _changes(tool) -> list[tuple[str, str, str]]:
    """What a held tool's server changed: (what, before, now), and the schema's lines that differ."""
    found = []
    if tool.description != tool.current_description:
        found.append(("Description", tool.description, tool.current_description))
    if tool.annotations != tool.current_annotations:
        found.append(("Hints", _json(tool.annotations), _json(tool.current_annotations)))
    if tool.input_schema != tool.current_input_schema:
        diff = difflib.unified_diff(
            _json(tool.input_schema).splitlines(), _json(tool.current_input_schema).splitlines(), lineterm="", n=2
        )
        found.append(("Input schema", _json(tool.input_schema), "\n".join(list(diff)[2:])))
    return found


def _json(value) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
