"""The policy changes page, for operators: every tenant's changes that let calls wait less and wait
for a second pair of eyes, to approve or reject. A tenant with one admin has no one else to ask, so
the desk's operator decides; the same action as the tenant's own admins and `flask policy-change`
(webapp/accounts/policy_actions.py), audited on the tenant's chain with the operator's name."""

from __future__ import annotations

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_login import current_user
from sqlalchemy import select

from webapp.accounts import policy_actions
from webapp.models import OPERATOR, Tenant
from webapp.runtime.extensions import db
from webapp.web.errors import Refused
from webapp.web.security import roles_required

bp = Blueprint("policy_changes", __name__, url_prefix="/ops/policy-changes")


@bp.get("")
@roles_required(OPERATOR)
def index():
    return _page()


@bp.post("/<int:change_id>")
@roles_required(OPERATOR)
def decide(change_id: int):
    form = request.form
    try:
        unknown = set(form) - {"csrf_token", "decision", "reason"}
        if unknown:
            raise Refused(422, "unknown_field", f"Unknown field {sorted(unknown)[0]!r}; use the form on this page.")
        saved = policy_actions.decide(
            db.session, current_user._get_current_object(), change_id, form.get("decision", ""), form.get("reason")
        )
    except Refused as exc:
        db.session.rollback()
        return _page(refusal=(change_id, exc.message, form.get("reason", ""))), exc.status
    change = saved.change
    flash(f"{change.status.capitalize()} the change of {change.tool_name} (#{change.id}).", "info")
    return redirect(url_for(".index"), code=303)


def _page(refusal: tuple | None = None) -> str:
    pending = policy_actions.changes(db.session, None)
    tenant_ids = {change.tenant_id for change in pending}
    tenants = dict(db.session.execute(select(Tenant.id, Tenant.name).where(Tenant.id.in_(tenant_ids))).all())
    return render_template(
        "ops/policy_changes.html",
        pending=pending,
        tenants=tenants,
        admins={tenant_id: policy_actions.admin_count(db.session, tenant_id) for tenant_id in tenant_ids},
        asked_for=policy_actions.asked_for,
        refusal=refusal,
    )
