"""The assistant admin page: which model serves the tenant (an endpoint an operator allowed for the
tenant, or the desk's default) and the small endpoint that routes simple questions to itself; how the assistant
writes (its register), extra rules for its system prompt, one tool call per reply, and the routing
rules that make a question complex before the small model is asked. Every save of the settings makes
a new version; every change is audited. The page lists only the endpoints the tenant may use; a form
naming any other is refused (403), and the attempt audited."""

from __future__ import annotations

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_login import current_user

from webapp.agent import assistant_settings
from webapp.llm import choice, endpoints, errors, grants
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.settings import assistant_actions as actions
from webapp.web.forms import unknown_fields
from webapp.web.security import roles_required

bp = Blueprint("assistant", __name__, url_prefix="/admin/assistant")
FIELDS = frozenset({"csrf_token", "register", "rules", "one_call_per_reply", "complex_words", "complex_length"})
MODEL_FIELDS = frozenset({"csrf_token", "endpoint", "small_endpoint"})
DEFAULT, NONE = "default", ""  # the form's values for the desk's default model and for no small endpoint


@bp.get("")
@roles_required("admin")
def index():
    return _page()


@bp.post("")
@roles_required("admin")
def save():
    admin = current_user._get_current_object()
    typed = {
        "register": request.form.get("register", ""),
        "rules": request.form.get("rules", ""),
        "one_call_per_reply": request.form.get("one_call_per_reply") == "on",
        "complex_words": request.form.get("complex_words", ""),
        "complex_length": request.form.get("complex_length", ""),
    }
    unknown = unknown_fields(request.form, FIELDS)
    try:
        if unknown:
            raise assistant_settings.SettingsError("", unknown)
        after = actions.save_settings(db.session, admin, **typed)
    except assistant_settings.SettingsError as exc:
        db.session.rollback()
        return _page(typed=typed, errors={exc.field: str(exc)}), 422
    flash(f"Saved as version {after.version}: the assistant's next reply follows it.", "info")
    return redirect(url_for(".index"), code=303)


@bp.post("/model")
@roles_required("admin")
def set_model():
    admin = current_user._get_current_object()
    chosen = {
        "endpoint": request.form.get("endpoint", DEFAULT),
        "small_endpoint": request.form.get("small_endpoint", NONE),
    }
    unknown = unknown_fields(request.form, MODEL_FIELDS)
    try:
        if unknown:
            raise endpoints.EndpointError(unknown)
        chosen_now = actions.set_tenant_models(
            db.session,
            admin.tenant.slug,
            None if chosen["endpoint"] == DEFAULT else chosen["endpoint"],
            chosen["small_endpoint"] or None,
            actor=admin,
        )
    except endpoints.EndpointError as exc:
        db.session.rollback()
        status = 403 if isinstance(exc, errors.EndpointNotAllowed) else 422
        return _page(chosen=chosen, model_errors={exc.field: str(exc)}), status
    routing = f"; simple questions go to {chosen_now.small_endpoint}" if chosen_now.small_endpoint else ""
    flash(
        f"The assistant is now served by {chosen_now.endpoint}{routing}. New runs follow within "
        f"{choice.CHOICE_SECONDS:g} seconds.",
        "info",
    )
    return redirect(url_for(".index"), code=303)


def _page(
    typed: dict | None = None, errors: dict | None = None, chosen: dict | None = None, model_errors: dict | None = None
) -> str:
    tenant = current_user.tenant
    now = assistant_settings.current(db.session, tenant.id)
    shown = typed or {
        "register": now.register if now else "",
        "rules": now.rules if now else "",
        "one_call_per_reply": now.one_call_per_reply if now else False,
        "complex_words": (now.complex_words or "") if now else "",
        "complex_length": (now.complex_length or "") if now else "",
    }
    registered = grants.usable_endpoints(db.session, tenant.id)
    # (an endpoint withdrawn since it was chosen serves no more: the page says the default serves, as it does)
    by_id = {endpoint.id: endpoint for endpoint in registered}
    endpoint, small = by_id.get(tenant.endpoint_id), by_id.get(tenant.small_endpoint_id)
    chosen = chosen or {
        "endpoint": endpoint.name if endpoint else DEFAULT,
        "small_endpoint": small.name if small else NONE,
    }
    return render_template(
        "settings/assistant.html",
        shown=shown,
        errors=errors or {},
        now=now,
        history=assistant_settings.history(db.session, tenant.id),
        endpoint=endpoint,
        small=small,
        registered=registered,
        chosen=chosen,
        model_errors=model_errors or {},
        default_model=services().config.model,
        limits={"register": assistant_settings.MAX_REGISTER, "rules": assistant_settings.MAX_RULES},
    )
