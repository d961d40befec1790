"""The policy changes page, for operators: every tenant's changes that let calls wait less and wait
for a second pair of eyes, to approve or reject, and beside them the admin role asked for a person
(accounts/actions.py: role changes). A tenant with one admin (or whose other admins the asker made or
re-keyed) has no one else to ask, so the desk's operator decides; the same actions as the tenant's own
admins, `flask policy-change` and `flask role-change`, audited on the tenant's chain with the
operator's name."""

from __future__ import annotations

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_login import current_user
from sqlalchemy import select

from webapp.accounts import actions as account_actions
from webapp.accounts import four_eyes
from webapp.models import OPERATOR, Tenant
from webapp.refusals import Refusal
from webapp.runtime.extensions import db
from webapp.settings import policy_actions
from webapp.web.errors import status_of
from webapp.web.forms import decision_fields
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
        decision, reason = decision_fields(form)
        saved = policy_actions.decide(db.session, current_user._get_current_object(), change_id, decision, reason)
    except Refusal as exc:
        db.session.rollback()
        return _page(refusal=(change_id, exc.message, form.get("reason", ""))), status_of(exc)
    change = saved.change
    flash(f"{change.status.capitalize()} the change of {change.tool_name} (#{change.id}).", "info")
    return redirect(url_for(".index"), code=303)


@bp.post("/roles/<int:change_id>")
@roles_required(OPERATOR)
def decide_role(change_id: int):
    """The operator approves or rejects the admin role asked for a person of a tenant."""
    form = request.form
    try:
        decision, reason = decision_fields(form)
        change = account_actions.decide_role_change(
            db.session, current_user._get_current_object(), change_id, decision, reason
        )
    except Refusal as exc:
        db.session.rollback()
        return _page(role_refusal=(change_id, exc.message, form.get("reason", ""))), status_of(exc)
    flash(f"{change.status.capitalize()} the admin role for {change.user.email} (#{change.id}).", "info")
    return redirect(url_for(".index"), code=303)


def _page(refusal: tuple | None = None, role_refusal: tuple | None = None) -> str:
    pending = policy_actions.changes(db.session, None)
    roles = account_actions.role_changes(db.session, None)
    tenant_ids = {change.tenant_id for change in [*pending, *roles]}
    tenants = dict(db.session.execute(select(Tenant.id, Tenant.name).where(Tenant.id.in_(tenant_ids))).all())
    return render_template(
        "settings/policy_changes.html",
        pending=pending,
        roles=roles,
        tenants=tenants,
        admins={tenant_id: policy_actions.admin_count(db.session, tenant_id) for tenant_id in tenant_ids},
        only_you={
            change.id: not four_eyes.deciders(db.session, change.tenant_id, change.requested_by_id) for change in roles
        },
        asked_for=policy_actions.asked_for,
        why_words=account_actions.role_change_why,
        refusal=refusal,
        role_refusal=role_refusal,
    )
