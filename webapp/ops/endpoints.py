"""The model endpoints page, for operators: the Anthropic-compatible servers the desk may talk to
(fleet-wide records, no tenant's), with a form to register one and one to change each. The same
checks and messages as `flask endpoint add` (webapp/llm/endpoints.py, through ops/actions.py). A key
is write-only: it is stored encrypted and never shown back, not even after a refused form; the page
says only where it comes from ("key stored encrypted", "key from $MODEL_KEY_...", "no key"), and flags a
variable the desk will not read. Which tenants may use an endpoint is ticked when it is registered
and on its page (the same checks and words as `flask endpoint allow|disallow`); a tenant's admins
choose among the endpoints their tenant may use, on their assistant page."""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for
from flask_login import current_user
from sqlalchemy import select

from webapp.llm import endpoints, grants, keys
from webapp.models import OPERATIONS_SLUG, OPERATOR, ModelEndpoint, Tenant
from webapp.ops import actions
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.web.security import roles_required

bp = Blueprint("endpoints", __name__, url_prefix="/ops/endpoints")
ADD_FIELDS = frozenset(
    {"csrf_token", "name", "base_url", "model", "protocol", "context_window", "api_key", "api_key_env", "tenant"}
)
EDIT_FIELDS = (ADD_FIELDS - {"name", "tenant"}) | {"forget_key"}
ACCESS_FIELDS = frozenset({"csrf_token", "tenant", "listed"})  # ticked tenants, and every tenant the form listed
RETYPE_KEY = " The key was not kept: type it again."


@bp.get("")
@roles_required(OPERATOR)
def index():
    return _list_page()


@bp.post("")
@roles_required(OPERATOR)
def create():
    typed = _typed(ADD_FIELDS)
    try:
        fields = _fields(ADD_FIELDS)
        endpoint = actions.add_endpoint(
            db.session, services().config, fields.pop("name"), actor=current_user._get_current_object(), **fields
        )
    except endpoints.EndpointError as exc:
        db.session.rollback()
        return _list_page(typed, {exc.field: _said(exc, typed)}), 422
    flash(f"Added {endpoints.describe(endpoint)}. {grants.who_may_use(db.session, endpoint)}", "info")
    return redirect(url_for(".index"), code=303)


@bp.get("/<name>")
@roles_required(OPERATOR)
def edit(name: str):
    return _edit_page(_endpoint(name))


@bp.post("/<name>")
@roles_required(OPERATOR)
def update(name: str):
    endpoint = _endpoint(name)
    typed = _typed(EDIT_FIELDS)
    try:
        fields = _fields(EDIT_FIELDS)
        actions.change_endpoint(
            db.session, services().config, endpoint, actor=current_user._get_current_object(), **fields
        )
    except endpoints.EndpointError as exc:
        db.session.rollback()
        return _edit_page(db.session.get(ModelEndpoint, endpoint.id), typed, {exc.field: _said(exc, typed)}), 422
    flash(f"Changed {endpoints.describe(endpoint)}. Running workers use it from their next model call.", "info")
    return redirect(url_for(".index"), code=303)


@bp.post("/<name>/tenants")
@roles_required(OPERATOR)
def set_access(name: str):
    endpoint = _endpoint(name)
    ticked = request.form.getlist("tenant")
    try:
        unknown = sorted(set(request.form) - ACCESS_FIELDS)
        if unknown:
            raise endpoints.EndpointError(f"This form has no field {', '.join(unknown)}; reload the page.")
        change = actions.set_access(
            db.session,
            endpoint,
            ticked=ticked,
            listed=request.form.getlist("listed"),
            actor=current_user._get_current_object(),
        )
    except endpoints.EndpointError as exc:
        db.session.rollback()
        endpoint = db.session.get(ModelEndpoint, endpoint.id)
        return _edit_page(endpoint, access_typed=ticked, access_error=str(exc)), 422
    flash(" ".join(change.sentences(services().config.model)), "info")
    return redirect(url_for(".edit", name=endpoint.name), code=303)


def _endpoint(name: str) -> ModelEndpoint:
    endpoint = db.session.scalar(select(ModelEndpoint).where(ModelEndpoint.name == name))
    if endpoint is None:
        abort(404, description=f"There is no endpoint {name!r}.")
    return endpoint


def _typed(allowed: frozenset[str]) -> dict:
    """What the person typed, to show back on an error: never the key."""
    typed = {key: request.form.get(key, "") for key in allowed - {"csrf_token", "api_key", "tenant"}}
    typed["tenant"] = request.form.getlist("tenant")
    typed["forget_key"] = request.form.get("forget_key") == "on"
    typed["key_typed"] = bool(request.form.get("api_key", "").strip())
    return typed


def _fields(allowed: frozenset[str]) -> dict:
    unknown = sorted(set(request.form) - allowed)
    if unknown:
        raise endpoints.EndpointError(f"This form has no field {', '.join(unknown)}; reload the page.")
    form = request.form
    window = form.get("context_window", "").strip()
    if window and not window.isdigit():
        raise endpoints.EndpointError(f"{window!r} is not a number of tokens, e.g. 32000.", "context_window")
    fields = {
        "base_url": form.get("base_url", ""),
        "model": form.get("model", ""),
        "protocol": form.get("protocol", "tools"),
        "context_window": int(window) if window else None,
        "api_key": form.get("api_key", "").strip() or None,
        "api_key_env": form.get("api_key_env", "").strip() or None,
    }
    if "name" in allowed:
        fields["name"] = form.get("name", "")
    if "tenant" in allowed:
        fields["tenants"] = form.getlist("tenant")
    if "forget_key" in allowed:
        fields["forget_key"] = form.get("forget_key") == "on"
    return fields


def _said(exc: endpoints.EndpointError, typed: dict) -> str:
    return str(exc) + (RETYPE_KEY if typed["key_typed"] else "")


def _list_page(typed: dict | None = None, errors: dict | None = None) -> str:
    registered = list(db.session.scalars(select(ModelEndpoint).order_by(ModelEndpoint.name)))
    serves: dict[int | None, list[str]] = {}
    classifies: dict[int | None, list[str]] = {}
    tenants = select(Tenant.slug, Tenant.endpoint_id, Tenant.small_endpoint_id).where(Tenant.slug != OPERATIONS_SLUG)
    for slug, endpoint_id, small_id in db.session.execute(tenants.order_by(Tenant.slug)):
        serves.setdefault(endpoint_id, []).append(slug)
        if small_id is not None:
            classifies.setdefault(small_id, []).append(slug)
    return render_template(
        "ops/endpoints.html",
        registered=registered,
        serves=serves,
        classifies=classifies,
        may_use=grants.allowed_tenants(db.session),
        tenants=_tenants(),
        key_source=keys.key_source,
        key_problem=keys.key_problem,
        default_model=services().config.model,
        protocols=endpoints.PROTOCOLS,
        typed=typed or {"protocol": "tools"},
        errors=errors or {},
    )


def _edit_page(
    endpoint: ModelEndpoint,
    typed: dict | None = None,
    errors: dict | None = None,
    access_typed: list[str] | None = None,
    access_error: str = "",
) -> str:
    shown = typed or {
        "base_url": endpoint.base_url,
        "model": endpoint.model,
        "protocol": endpoint.protocol,
        "context_window": endpoint.context_window or "",
        "api_key_env": endpoint.api_key_env or "",
        "forget_key": False,
    }
    tenants = _tenants()
    may_use = grants.allowed_tenants(db.session).get(endpoint.id, [])
    return render_template(
        "ops/endpoint.html",
        endpoint=endpoint,
        key=keys.key_source(endpoint),
        key_problem=keys.key_problem(endpoint),
        tenants=tenants,
        ticked=set(may_use if access_typed is None else access_typed),
        serving={t.slug for t in tenants if t.endpoint_id == endpoint.id},
        routing={t.slug for t in tenants if t.small_endpoint_id == endpoint.id},
        access_error=access_error,
        protocols=endpoints.PROTOCOLS,
        typed=shown,
        errors=errors or {},
    )


def _tenants() -> list[Tenant]:
    """Every tenant an endpoint may be allowed for: all but the operators' own."""
    return list(db.session.scalars(select(Tenant).where(Tenant.slug != OPERATIONS_SLUG).order_by(Tenant.slug)))
