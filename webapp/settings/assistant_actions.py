"""What tenant admins (and operators, `flask tenant set-model`) do with the assistant's settings,
shared by the Assistant page and the command line: which model serves the tenant (an endpoint an
operator allowed for it, or the desk's default) and the small endpoint that routes simple questions to
itself; how the assistant writes and its extra rules. Each change is audited and committed."""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.agent import assistant_settings
from webapp.llm import endpoints, errors, grants
from webapp.models import AssistantSettings, Tenant, User


def save_settings(session: Session, admin: User, **typed) -> AssistantSettings:
    """Save how the tenant's assistant writes (assistant_settings.save's keyword arguments) as a new
    version, audited with the version before and committed; the settings now. SettingsError (rolled
    back) says which field to fix."""
    try:
        before, after = assistant_settings.save(session, admin.tenant_id, **typed, by_user_id=admin.id)
    except assistant_settings.SettingsError:
        session.rollback()
        raise
    audit_chain.record(
        session,
        "assistant_settings_changed",
        tenant_id=admin.tenant_id,
        actor=admin,
        data={"before": assistant_settings.snapshot(before), "after": assistant_settings.snapshot(after)},
    )
    session.commit()
    return after


def set_tenant_models(
    session: Session,
    tenant_slug: str,
    endpoint_name: str | None,
    small_endpoint_name: str | None | object = grants.KEEP,
    *,
    allow: bool = False,
    actor: User | None = None,
    actor_label: str | None = None,
) -> TenantModels:
    """Serve the tenant from an endpoint (None: the desk's default model), with a small endpoint that
    routes simple questions to itself (None: no routing; grants.KEEP: as it is). A tenant's admin
    may name only endpoints their tenant may use: any other is refused (EndpointNotAllowed) and the
    refused attempt audited on the tenant's chain in a transaction of its own. `allow` is for
    operators: an endpoint named is allowed for the tenant if it was not (audited as such). Audited
    and committed; an EndpointError (nothing changed) says what to fix."""
    try:
        tenant, allowed = grants.set_tenant_endpoint(
            session, tenant_slug, endpoint_name, small_endpoint_name, allow=allow
        )
    except errors.EndpointNotAllowed as refused:
        session.rollback()  # nothing of the attempt stays; only its record
        audit_chain.record(
            session,
            "tenant_model_refused",
            tenant_id=refused.tenant_id,
            actor=actor,
            actor_label=actor_label,
            outcome="refused",
            data={
                "endpoint": _as_typed(endpoint_name) or "default",
                "small_endpoint": None if small_endpoint_name is grants.KEEP else _as_typed(small_endpoint_name),
                "refused": str(refused),
            },
        )
        session.commit()
        raise
    except endpoints.EndpointError:
        session.rollback()
        raise
    for endpoint in allowed:
        change = grants.AccessChange(endpoint, allowed=[tenant.slug])
        grants.record_access_change(session, change, actor=actor, actor_label=actor_label)
    name, small_name = endpoints.endpoint_names(session, tenant)
    audit_chain.record(
        session,
        "tenant_model_set",
        tenant_id=tenant.id,
        actor=actor,
        actor_label=actor_label,
        data={"endpoint": name, "small_endpoint": small_name},
    )
    session.commit()
    return TenantModels(tenant, name, small_name, [endpoint.name for endpoint in allowed])


class TenantModels(NamedTuple):
    """A tenant's models after a change: its endpoint's name ("default": the configured model), its
    small endpoint's (None: no routing), and the endpoints the change allowed for it."""

    tenant: Tenant
    endpoint: str
    small_endpoint: str | None
    allowed: list[str]


def _as_typed(name: object) -> str | None:
    """A name as a person gave it, cut to what the audit log keeps of it."""
    return None if name is None else str(name)[:120]
