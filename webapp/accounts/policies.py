"""The policies admin page: per tool, whether its calls run at once, always wait for a person, or
wait above an amount; how many reviewers must approve, and how long they have. Every save makes a
new version and is audited."""

from __future__ import annotations

import math

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for
from flask_login import current_user

from webapp import audit_chain
from webapp.agent import policies as policy_rules
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.web.security import roles_required

bp = Blueprint("policies", __name__, url_prefix="/admin/policies")


@bp.get("")
@roles_required("admin")
def index():
    return _policies_page()


@bp.post("/<tool_name>")
@roles_required("admin")
def save_policy(tool_name: str):
    tool = services().tools_for(db.session, _admin().tenant_id).get(tool_name)
    if tool is None:
        abort(404, description=f"There is no tool named {tool_name}.")
    form = request.form
    try:
        threshold = _whole(form.get("amount_threshold"), "The amount limit", scale=100)
        approvals_needed = _whole(form.get("approvals_required") or "0", "Approvals needed")
        ttl_hours = _number(form.get("ttl_hours") or "24", "Hours to decide")
        limits = _limits(form)
        before, after = policy_rules.save_policy(
            db.session,
            _admin().tenant_id,
            tool,
            mode=form.get("mode", ""),
            amount_threshold_cents=threshold,
            approvals_required=approvals_needed,
            ttl_seconds=round(ttl_hours * 3600),
            by_user_id=_admin().id,
            limits=limits,
        )
    except policy_rules.PolicyError as exc:
        db.session.rollback()
        return _policies_page({tool_name: str(exc)}), 422
    audit_chain.record(
        db.session,
        "policy_changed",
        tenant_id=_admin().tenant_id,
        actor=_admin(),
        tool_name=tool_name,
        data={"before": before.snapshot(), "after": after.snapshot()},
    )
    db.session.commit()
    flash(f"Saved: {after.describe()} (version {after.version})", "info")
    return redirect(url_for(".index"), code=303)


def _policies_page(errors: dict[str, str] | None = None) -> str:
    tools = services().tools_for(db.session, _admin().tenant_id)
    rows = [
        (tools.get(name), policy_rules.policy_for(db.session, _admin().tenant_id, tools.get(name)))
        for name in sorted(tools.names())
    ]
    return render_template(
        "accounts/policies.html", rows=rows, errors=errors or {}, modes=policy_rules.MODES, scopes=policy_rules.SCOPES
    )


def _limits(form) -> policy_rules.Limits | None:
    """The limits as typed (None when the form has none: the policy keeps its own)."""
    if not any(key.startswith("limit_") for key in form):
        return None
    values = {}
    for scope, words in policy_rules.SCOPES:
        raw = form.get(f"limit_{scope}_count", "").strip()
        if raw and not raw.isdigit():
            raise policy_rules.PolicyError(f"The most calls {words} must be a whole number, or empty.")
        values[f"{scope}_count"] = int(raw) if raw else None
        values[f"{scope}_cents"] = _whole(form.get(f"limit_{scope}_cents"), f"The most money {words}", scale=100)
    return policy_rules.Limits(**values)


def _whole(raw: str | None, label: str, scale: int = 1) -> int | None:
    if raw is None or raw.strip() == "":
        return None
    return round(_number(raw, label) * scale)


def _number(raw: str, label: str) -> float:
    try:
        number = float(raw)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or abs(number) > 1e12:
        raise policy_rules.PolicyError(f"{label} must be a number.")
    return number


def _admin():
    return current_user._get_current_object()
