"""The policies admin page: per tool, whether its calls run at once, always wait for a person, or
wait above an amount; how many reviewers must approve, and how long they have; and who may have the
assistant use it at all. Every save makes a new version and is audited. A refused save shows the
page again with what the admin typed, the error beside its field, scrolled to the tool."""

from __future__ import annotations

import json
import math

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for
from flask_login import current_user
from sqlalchemy import func, select

from webapp import audit_chain
from webapp.accounts import four_eyes
from webapp.agent import access as access_rules
from webapp.agent import policies as policy_rules
from webapp.models import ROLES, User
from webapp.refusals import Refusal
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.settings import external_tools, policy_actions
from webapp.tools import external, mcp
from webapp.web.errors import status_of
from webapp.web.forms import decision_fields
from webapp.web.security import roles_required

bp = Blueprint("policies", __name__, url_prefix="/admin/policies")


@bp.get("")
@roles_required("admin")
def index():
    return _policies_page()


@bp.post("/<tool_name>")
@roles_required("admin")
def save_policy(tool_name: str):
    tool = _tool(tool_name)
    form = request.form
    try:
        threshold = _whole(form.get("amount_threshold"), "The amount limit", scale=100, field="amount_threshold")
        approvals_needed = _whole(form.get("approvals_required") or "0", "Approvals needed", field="approvals_required")
        ttl_hours = _number(form.get("ttl_hours") or "24", "Hours to decide", "ttl_hours")
        limits = _limits(form)
        remind = (
            _whole(form.get("remind_after_minutes"), "Remind after (minutes)", scale=60, field="remind_after_minutes")
            if "remind_after_minutes" in form
            else policy_rules.KEEP
        )
        saved = policy_actions.change_policy(
            db.session,
            _admin(),
            tool,
            mode=form.get("mode", ""),
            amount_threshold_cents=threshold,
            approvals_required=approvals_needed,
            ttl_seconds=round(ttl_hours * 3600),
            limits=limits,
            remind_after_seconds=remind,
        )
    except policy_rules.PolicyError as exc:
        db.session.rollback()
        return _policies_page(_Refusal(tool_name, "policy", str(exc), exc.field, form)), 422
    if saved.unchanged:
        flash(f"Nothing changed: that is the rule in force (version {saved.policy.version}).", "info")
    elif saved.change is not None:
        flash(
            f"Not in force yet: this change lets calls wait less ({' '.join(saved.change.loosens)}), so another "
            f"admin of {_admin().tenant.name} has to approve it. Until then the rule stays as it is.",
            "info",
        )
        return redirect(url_for(".index", _anchor=f"change-{saved.change.id}"), code=303)
    else:
        flash(f"Saved: {saved.policy.describe()} (version {saved.policy.version})", "info")
    return redirect(url_for(".index", _anchor=f"policy-{tool_name}"), code=303)


@bp.post("/changes/<int:change_id>")
@roles_required("admin")
def decide_change(change_id: int):
    """A second admin approves or rejects a change that loosens a policy."""
    form = request.form
    try:
        decision, reason = decision_fields(form)
        saved = policy_actions.decide(db.session, _admin(), change_id, decision, reason)
    except Refusal as exc:
        db.session.rollback()
        return _policies_page(change_refusal=(change_id, exc.message, form.get("reason", ""))), status_of(exc)
    change = saved.change
    if change.status == "approved":
        flash(f"Approved: {saved.policy.describe()} (version {saved.policy.version}) is in force.", "info")
    else:
        flash(f"Rejected the change of {change.tool_name}; the rule stays as it is.", "info")
    return redirect(url_for(".index", _anchor=f"policy-{change.tool_name}"), code=303)


@bp.post("/changes/<int:change_id>/withdraw")
@roles_required("admin")
def withdraw_change(change_id: int):
    try:
        change = policy_actions.withdraw(db.session, _admin(), change_id)
    except Refusal as exc:
        db.session.rollback()
        return _policies_page(change_refusal=(change_id, exc.message, "")), status_of(exc)
    flash(f"Withdrew the change of {change.tool_name}; the rule stays as it is.", "info")
    return redirect(url_for(".index", _anchor=f"policy-{change.tool_name}"), code=303)


@bp.post("/<tool_name>/access")
@roles_required("admin")
def save_access(tool_name: str):
    """Who may have the assistant use the tool: everyone, chosen roles and people, or no one."""
    if not _tool(tool_name).runs_here:
        abort(404, description=f"{tool_name} is asked about by outside agents: the assistant never uses it.")
    form = request.form
    admin = _admin()
    try:
        unknown = set(form) - {"csrf_token", "who", "roles", "people"}
        if unknown:
            raise access_rules.AccessError(f"Unknown field {sorted(unknown)[0]!r}; use the form on this page.")
        before, after = access_rules.save_access(
            db.session,
            admin.tenant_id,
            tool_name,
            who=form.get("who", ""),
            roles=form.getlist("roles"),
            user_ids=_people(form.get("people", ""), admin.tenant_id),
            by_user_id=admin.id,
        )
    except access_rules.AccessError as exc:
        db.session.rollback()
        return _policies_page(_Refusal(tool_name, "access", str(exc), None, form)), 422
    audit_chain.record(
        db.session,
        "tool_access_changed",
        tenant_id=admin.tenant_id,
        actor=admin,
        tool_name=tool_name,
        data={"before": before.snapshot(), "after": after.snapshot()},
    )
    db.session.commit()
    flash(f"Saved for {tool_name}: {after.describe(_names(admin.tenant_id, after.user_ids))}", "info")
    return redirect(url_for(".index", _anchor=f"policy-{tool_name}"), code=303)


@bp.post("/external-tools")
@roles_required("admin")
def declare_tool():
    """Declare a tool that agents running elsewhere ask about (as PUT /api/external-tools/<name>)."""
    form = request.form
    name = (form.get("name") or "").strip()
    try:
        unknown = set(form) - {"csrf_token", "name", "description", "input_schema", "amount", "amount_unit", "subject"}
        if unknown:
            raise external.DeclarationError(f"Unknown field {sorted(unknown)[0]!r}; use the form on this page.")
        try:
            schema = json.loads(form.get("input_schema") or "")
        except ValueError as exc:
            raise external.DeclarationError(f"The arguments' schema is not JSON ({exc}).", "input_schema") from None
        declaration = external.Declaration(
            description=form.get("description") or "",
            input_schema=schema,
            amount=(form.get("amount") or "").strip() or None,
            amount_unit=form.get("amount_unit") or "cents",
            subject=(form.get("subject") or "").strip() or None,
        )
        external_tools.declare(db.session, _admin(), name, declaration, None)
    except external.DeclarationError as exc:
        db.session.rollback()
        return _policies_page(_Refusal(name, "declare", str(exc), exc.field, form)), 422
    flash(f"Declared {name}: outside agents may ask for it now. Its calls wait under the rule below.", "info")
    return redirect(url_for(".index", _anchor=f"policy-{name}"), code=303)


@bp.post("/external-tools/<tool_name>/remove")
@roles_required("admin")
def remove_tool(tool_name: str):
    try:
        external_tools.remove(db.session, _admin(), tool_name)
    except Refusal as exc:
        abort(status_of(exc), description=exc.message)
    flash(f"Removed {tool_name}: outside agents can no longer ask for it; its calls so far stay.", "info")
    return redirect(url_for(".index", _anchor="outside-tools"), code=303)


class _Refusal:
    """A refused save: which tool and form, the message, the field to blame, and what was typed."""

    def __init__(self, tool_name: str, form_name: str, message: str, field: str | None, typed) -> None:
        self.tool_name, self.form_name, self.message, self.field = tool_name, form_name, message, field
        self.typed = {key: typed.getlist(key) if key == "roles" else typed.get(key) for key in typed}


def _policies_page(refusal: _Refusal | None = None, change_refusal: tuple | None = None) -> str:
    tenant_id = _admin().tenant_id
    pending = policy_actions.changes(db.session, tenant_id)
    tools = services().tools_for(db.session, tenant_id)
    settings = access_rules.accesses(db.session, tenant_id)
    names = _names(tenant_id, [user_id for setting in settings.values() for user_id in setting.user_ids])
    rows = []
    for name in sorted(tools.names()):
        tool = tools.get(name)
        setting = settings.get(name, access_rules.Access(name))
        rows.append(
            {
                "tool": tool,
                "policy": policy_rules.policy_for(db.session, tenant_id, tool),
                "modes": policy_rules.modes_for(tool),
                "has_amount": policy_rules.has_amount(tool),
                "access": setting,
                "access_words": setting.describe(names),
                "people": ", ".join(sorted(_emails(setting.user_ids, tenant_id))),
                "pending": [change for change in pending if change.tool_name == name],
            }
        )
    return render_template(
        "settings/policies.html",
        rows=rows,
        refusal=refusal,
        pending=pending,
        change_refusal=change_refusal,
        one_admin=policy_actions.ONE_ADMIN if policy_actions.admin_count(db.session, tenant_id) < 2 else None,
        scopes=policy_rules.SCOPES,
        roles=ROLES,
        mode_words=policy_rules.MODE_WORDS,
        asked_for=policy_actions.asked_for,
        hint_words=mcp.hint_words,
        # who may not decide which change, and the changes no admin of the tenant may decide
        not_yours={c.id: four_eyes.why_not_decide(db.session, current_user, c.requested_by_id) for c in pending},
        operator_only={
            c.id: four_eyes.only_the_operator(c.requested_by)
            for c in pending
            if not four_eyes.deciders(db.session, tenant_id, c.requested_by_id)
        },
    )


def _tool(tool_name: str):
    tool = services().tools_for(db.session, _admin().tenant_id).get(tool_name)
    if tool is None:
        abort(404, description=f"There is no tool named {tool_name}.")
    return tool


def _people(raw: str, tenant_id: int) -> list[int]:
    """The ids of the people named by e-mail (commas, spaces or lines between them), all of the tenant."""
    emails = [email.strip().lower() for email in raw.replace(",", " ").split() if email.strip()]
    if len(emails) > access_rules.MAX_PEOPLE:
        raise access_rules.AccessError(f"Name at most {access_rules.MAX_PEOPLE} people; give the others a role.")
    found = (
        dict(
            db.session.execute(
                select(func.lower(User.email), User.id).where(
                    User.tenant_id == tenant_id, func.lower(User.email).in_(emails)
                )
            ).all()
        )
        if emails
        else {}
    )
    missing = [email for email in emails if email not in found]
    if missing:
        raise access_rules.AccessError(f"No one in your organisation has the e-mail {missing[0]}; check the spelling.")
    return [found[email] for email in emails]


def _emails(user_ids, tenant_id: int) -> list[str]:
    if not user_ids:
        return []
    return list(db.session.scalars(select(User.email).where(User.id.in_(user_ids), User.tenant_id == tenant_id)))


def _names(tenant_id: int, user_ids) -> dict[int, str]:
    if not user_ids:
        return {}
    users = db.session.scalars(select(User).where(User.id.in_(set(user_ids)), User.tenant_id == tenant_id))
    return {user.id: user.label for user in users}


def _limits(form) -> policy_rules.Limits | None:
    """The limits as typed (None when the form has none: the policy keeps its own)."""
    if not any(key.startswith("limit_") for key in form):
        return None
    values = {}
    for scope, words in policy_rules.SCOPES:
        raw = form.get(f"limit_{scope}_count", "").strip()
        if raw and not raw.isdigit():
            raise policy_rules.PolicyError(
                f"The most calls {words} must be a whole number, or empty.", f"limit_{scope}_count"
            )
        values[f"{scope}_count"] = int(raw) if raw else None
        values[f"{scope}_cents"] = _whole(
            form.get(f"limit_{scope}_cents"), f"The most money {words}", scale=100, field=f"limit_{scope}_cents"
        )
    return policy_rules.Limits(**values)


def _whole(raw: str | None, label: str, scale: int = 1, field: str | None = None) -> int | None:
    if raw is None or raw.strip() == "":
        return None
    return round(_number(raw, label, field) * scale)


def _number(raw: str, label: str, field: str | None = None) -> float:
    try:
        number = float(raw)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or abs(number) > 1e12:
        raise policy_rules.PolicyError(f"{label} must be a number.", field)
    return number


def _admin():
    return current_user._get_current_object()
