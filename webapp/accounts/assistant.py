"""The assistant admin page: how the tenant's assistant writes (its register), extra rules for its
system prompt, and one tool call per reply; which model serves the tenant (set by an operator with
`flask tenant set-model`). Every save makes a new version and is audited."""

from __future__ import annotations

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_login import current_user
from sqlalchemy import select

from webapp import audit_chain
from webapp.agent import assistant_settings
from webapp.models import ModelEndpoint, Tenant
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.web.security import roles_required

bp = Blueprint("assistant", __name__, url_prefix="/admin/assistant")
FIELDS = frozenset({"csrf_token", "register", "rules", "one_call_per_reply"})


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
    }
    unknown = sorted(set(request.form) - FIELDS)
    try:
        if unknown:
            raise assistant_settings.SettingsError("", f"This form has no field {', '.join(unknown)}; reload the page.")
        before, after = assistant_settings.save(db.session, admin.tenant_id, **typed, by_user_id=admin.id)
    except assistant_settings.SettingsError as exc:
        db.session.rollback()
        return _page(typed, {exc.field: str(exc)}), 422
    audit_chain.record(
        db.session,
        "assistant_settings_changed",
        tenant_id=admin.tenant_id,
        actor=admin,
        data={"before": assistant_settings.snapshot(before), "after": assistant_settings.snapshot(after)},
    )
    db.session.commit()
    flash(f"Saved as version {after.version}: the assistant's next reply follows it.", "info")
    return redirect(url_for(".index"), code=303)


def _page(typed: dict | None = None, errors: dict | None = None) -> str:
    tenant_id = current_user.tenant_id
    now = assistant_settings.current(db.session, tenant_id)
    shown = typed or {
        "register": now.register if now else "",
        "rules": now.rules if now else "",
        "one_call_per_reply": now.one_call_per_reply if now else False,
    }
    endpoint = db.session.scalar(
        select(ModelEndpoint).join(Tenant, Tenant.endpoint_id == ModelEndpoint.id).where(Tenant.id == tenant_id)
    )
    return render_template(
        "accounts/assistant.html",
        shown=shown,
        errors=errors or {},
        now=now,
        history=assistant_settings.history(db.session, tenant_id),
        endpoint=endpoint,
        default_model=services().config.model,
        limits={"register": assistant_settings.MAX_REGISTER, "rules": assistant_settings.MAX_RULES},
    )
