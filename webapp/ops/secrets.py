"""The secrets page for operators (/ops/secrets): which of the desk's environment variables each
tenant's admins may name in an MCP server's header, granting one to a tenant and revoking it, and the
headers admins set that name a secret not granted (not sent). Names only, never a value. The same
actions as `flask secret grant|revoke|list` (webapp/secrets/secret_grants.py), audited on the tenant's chain;
a refused form says why in words and keeps what was typed."""

from __future__ import annotations

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_login import current_user
from sqlalchemy import select

from webapp import identity
from webapp.models import OPERATIONS_SLUG, OPERATOR, Tenant
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.secrets import secret_grants
from webapp.web.forms import unknown_fields
from webapp.web.security import roles_required

bp = Blueprint("ops_secrets", __name__, url_prefix="/ops/secrets")
GRANT_FIELDS = frozenset({"csrf_token", "tenant", "name"})


@bp.get("")
@roles_required(OPERATOR)
def index():
    return _page()


@bp.post("")
@roles_required(OPERATOR)
def grant():
    form = request.form
    unknown = unknown_fields(form, GRANT_FIELDS)
    tenant = identity.tenant_of(db.session, form.get("tenant", ""))
    name = form.get("name", "").strip()
    if unknown:
        return _page(error=unknown, typed=form), 422
    if tenant is None:
        return _page(error="Choose the tenant whose admins may name the secret.", typed=form), 422
    try:
        added = secret_grants.grant(
            db.session,
            tenant,
            name,
            prefix=services().config.mcp_secret_prefix,
            actor=current_user._get_current_object(),
        )
    except secret_grants.SecretGrantError as exc:
        db.session.rollback()
        return _page(error=str(exc), typed=form), 422
    db.session.commit()
    if added:
        flash(f"Granted {name} to {tenant.slug}: its admins may now name it in an MCP server's header.", "info")
    else:
        flash(f"{name} is granted to {tenant.slug} already.", "info")
    if warning := secret_grants.unset_here(name):
        flash(f"Note: {warning}", "info")
    return redirect(url_for(".index"), code=303)


@bp.post("/<tenant>/<name>/revoke")
@roles_required(OPERATOR)
def revoke(tenant: str, name: str):
    owner = identity.tenant_of(db.session, tenant)
    if owner is None:
        return _page(error=f"There is no tenant {tenant!r}."), 422
    try:
        naming = secret_grants.revoke(db.session, owner, name, actor=current_user._get_current_object())
    except secret_grants.SecretGrantError as exc:
        db.session.rollback()
        return _page(error=str(exc)), 422
    db.session.commit()
    flash(f"Revoked {name} from {owner.slug}.", "info")
    if naming:
        flash(
            f"{', '.join(naming)} of {owner.slug} name it in a header: it is not sent any more, so their sync and "
            "calls fail until it is granted again or an admin adds them again with another value.",
            "info",
        )
    return redirect(url_for(".index"), code=303)


def _page(error: str | None = None, typed=None) -> str:
    tenants = db.session.scalars(select(Tenant.slug).where(Tenant.slug != OPERATIONS_SLUG).order_by(Tenant.slug))
    grants = secret_grants.grants(db.session)
    return render_template(
        "ops/secrets.html",
        grants=grants,
        unset={grant.name for grant in grants if secret_grants.unset_here(grant.name)},
        not_granted=secret_grants.not_granted(db.session),
        tenants=list(tenants),
        prefix=services().config.mcp_secret_prefix,
        error=error,
        typed=typed or {},
    )
