"""The MCP servers page for operators (/ops/mcp): every tenant's servers (the URL or the command, and
the names of their headers and variables, never a value), a form that adds a server the desk starts
(a command, its NAME=value variables, a working directory) for a chosen tenant, and removing one.
A command runs a program on the desk's host, so only operators add one: here or with `flask mcp add
--command`, with the same checks and messages (webapp/settings/mcp_actions.py, audited on the
tenant's chain, a refused attempt too). A refused form keeps what was typed."""

from __future__ import annotations

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_login import current_user
from sqlalchemy import select

from webapp import identity
from webapp.models import OPERATIONS_SLUG, OPERATOR, McpServer, Tenant
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.settings import mcp_actions
from webapp.tools import mcp
from webapp.tools.presenting import plural
from webapp.web.forms import unknown_fields
from webapp.web.security import roles_required

bp = Blueprint("ops_mcp", __name__, url_prefix="/ops/mcp")
ADD_FIELDS = frozenset({"csrf_token", "tenant", "name", "command", "environment", "working_directory"})


@bp.get("")
@roles_required(OPERATOR)
def index():
    return _page()


@bp.post("")
@roles_required(OPERATOR)
def create():
    form = request.form
    actor = current_user._get_current_object()
    environment = form.get("environment", "").splitlines()
    tenant = _tenant(form.get("tenant", ""))
    refusal = unknown_fields(form, ADD_FIELDS)
    if refusal is None and tenant is None:
        refusal = "Choose the tenant whose assistant gets the server's tools."
    elif refusal is None and not form.get("command", "").strip():
        refusal = "Give the command that starts the server, e.g. python -m inventory_server."
    if refusal:
        mcp_actions.refused_add(
            db.session,
            tenant.id if tenant else None,
            actor,
            form.get("name", ""),
            refusal,
            command=form.get("command"),
            environment=environment,
            tenant=None if tenant else form.get("tenant", ""),
        )
        return _page(error=refusal, typed=form), 422
    try:
        server, report = mcp_actions.add(
            db.session,
            tenant.id,
            actor,
            form.get("name", ""),
            command=form.get("command", ""),
            environment=environment,
            working_directory=form.get("working_directory"),
        )
    except mcp.McpError as exc:
        return _page(error=str(exc), typed=form), 422
    refused = " ".join(f"Refused {name}: {why}." for name, why in report.refused)
    flash(f"Added {server.name} to {tenant.slug} with {plural(len(server.tools), 'tool')}. {refused}".strip(), "info")
    return redirect(url_for(".index"), code=303)


@bp.post("/<tenant>/<name>/remove")
@roles_required(OPERATOR)
def remove(tenant: str, name: str):
    owner = _tenant(tenant)
    if owner is None:
        return _page(error=f"There is no tenant {tenant!r}."), 422
    try:
        names = mcp_actions.remove(db.session, owner.id, current_user._get_current_object(), name)
    except mcp.McpError as exc:
        return _page(error=str(exc)), 422
    flash(
        f"Removed {name} of {owner.slug} and its {plural(len(names), 'tool')}; its assistant no longer has them.",
        "info",
    )
    return redirect(url_for(".index"), code=303)


def _tenant(slug: str) -> Tenant | None:
    """A tenant that owns data (never the operators' own), by its slug."""
    return identity.tenant_of(db.session, slug)


def _page(error: str | None = None, typed=None) -> str:
    prefix = services().config.mcp_secret_prefix
    query = select(McpServer, Tenant.slug).join(Tenant, Tenant.id == McpServer.tenant_id)
    servers = db.session.execute(query.order_by(Tenant.slug, McpServer.name)).all()
    tenants = db.session.scalars(select(Tenant.slug).where(Tenant.slug != OPERATIONS_SLUG).order_by(Tenant.slug))
    return render_template(
        "ops/mcp.html",
        servers=[
            {
                "server": server,
                "tenant": slug,
                "headers": mcp.header_words(server, prefix),
                "environment": mcp.environment_words(server),
            }
            for server, slug in servers
        ],
        tenants=list(tenants),
        error=error,
        typed=typed or {},
    )
