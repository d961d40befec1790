"""Who may use which endpoint: an operator allows an endpoint for a tenant (`endpoint_tenants`,
`flask endpoint allow`), its admins choose among those for the tenant's model and small model
(`flask tenant set-model`), and a choice of any other endpoint is never made (EndpointNotAllowed)
nor served (choice.py checks the grant again at use). Withdrawing an endpoint moves the tenants it
served back to the default model, audited on their own chains."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.llm.choice import forget_choice
from webapp.llm.endpoints import endpoint_named, endpoint_names, tenant_named
from webapp.llm.errors import EndpointError, EndpointNotAllowed
from webapp.models import EndpointGrant, ModelEndpoint, Tenant, User

KEEP = object()  # set_tenant_endpoint's small endpoint: leave it as it is


def set_tenant_endpoint(
    session: Session,
    tenant_slug: str,
    endpoint_name: str | None,
    small_endpoint_name: str | None | object = KEEP,
    *,
    allow: bool = False,
) -> tuple[Tenant, list[ModelEndpoint]]:
    """Serve the tenant's conversations from the named endpoint (None: the configured default model),
    and route each new question through the small endpoint's classification (None: no routing; KEEP:
    as it is). Each endpoint named must be one the tenant may use (EndpointNotAllowed otherwise);
    `allow` (the operator's own choice) allows it for the tenant instead. Returns the tenant and the
    endpoints this call allowed for it. Running processes follow within CHOICE_SECONDS. The
    caller commits."""
    tenant = tenant_named(session, tenant_slug)
    allowed_now: list[ModelEndpoint] = []

    def usable(name: object, field: str) -> ModelEndpoint:
        endpoint = session.scalar(select(ModelEndpoint).where(ModelEndpoint.name == str(name).strip().lower()))
        if allow:
            endpoint = endpoint or endpoint_named(session, name, field)  # (an operator sees every registered name)
            if allow_tenants(session, endpoint, [tenant]):
                allowed_now.append(endpoint)
        elif endpoint is None or not may_use(session, tenant.id, endpoint.id):
            raise EndpointNotAllowed(
                f"{tenant.name} may not use an endpoint named {str(name)[:64]!r}: choose one from the list, or ask "
                "an operator to allow another.",
                field,
                tenant.id,
            )
        return endpoint

    large = usable(endpoint_name, "endpoint") if endpoint_name is not None else None
    small_id = tenant.small_endpoint_id
    if small_endpoint_name is not KEEP:
        small = usable(small_endpoint_name, "small_endpoint") if small_endpoint_name is not None else None
        small_id = small.id if small else None
    if small_id is not None and small_id == (large.id if large else None):
        raise EndpointError(
            "The small endpoint is the endpoint itself: choose a smaller, cheaper one, or no small endpoint.",
            "small_endpoint",
        )
    forget_choice(tenant.id)
    tenant.endpoint_id = large.id if large else None
    tenant.small_endpoint_id = small_id
    return tenant, allowed_now


def may_use(session: Session, tenant_id: int, endpoint_id: int) -> bool:
    """Whether an operator allowed the endpoint for the tenant."""
    return session.get(EndpointGrant, (endpoint_id, tenant_id)) is not None


def usable_endpoints(session: Session, tenant_id: int) -> list[ModelEndpoint]:
    """The endpoints the tenant may use, by name: what its admins may choose among."""
    query = (
        select(ModelEndpoint)
        .join(EndpointGrant, EndpointGrant.endpoint_id == ModelEndpoint.id)
        .where(EndpointGrant.tenant_id == tenant_id)
        .order_by(ModelEndpoint.name)
    )
    return list(session.scalars(query))


def allowed_tenants(session: Session) -> dict[int, list[str]]:
    """The slugs of the tenants that may use each endpoint (by endpoint id), sorted."""
    rows = session.execute(
        select(EndpointGrant.endpoint_id, Tenant.slug)
        .join(Tenant, Tenant.id == EndpointGrant.tenant_id)
        .order_by(Tenant.slug)
    )
    allowed: dict[int, list[str]] = {}
    for endpoint_id, slug in rows:
        allowed.setdefault(endpoint_id, []).append(slug)
    return allowed


def who_may_use(session: Session, endpoint: ModelEndpoint) -> str:
    """A sentence naming the tenants that may use the endpoint, for the command line and the pages."""
    slugs = allowed_tenants(session).get(endpoint.id, [])
    if not slugs:
        return f"No tenant may use {endpoint.name} yet: allow it for one with `flask endpoint allow` or on its page."
    return f"{_and(slugs)} may use {endpoint.name}."


@dataclass
class AccessChange:
    """What a change of who may use an endpoint did, as slugs: newly allowed, no longer allowed,
    served by the endpoint until now (now by the default model), routing through it until now (now
    not routed), and asked for but so already. `tenants` are the tenants whose model changed."""

    endpoint: ModelEndpoint
    allowed: list[str] = field(default_factory=list)
    disallowed: list[str] = field(default_factory=list)
    moved_to_default: list[str] = field(default_factory=list)
    lost_routing: list[str] = field(default_factory=list)
    allowed_already: list[str] = field(default_factory=list)
    disallowed_already: list[str] = field(default_factory=list)
    tenants: list[Tenant] = field(default_factory=list, repr=False)

    @property
    def changed(self) -> bool:
        return bool(self.allowed or self.disallowed)

    def audit_data(self, session: Session) -> dict:
        return {
            "endpoint": self.endpoint.name,
            "allowed": self.allowed,
            "disallowed": self.disallowed,
            "moved_to_default": self.moved_to_default,
            "lost_routing": self.lost_routing,
            "may_use_now": allowed_tenants(session).get(self.endpoint.id, []),
        }

    def sentences(self, default_model: str) -> list[str]:
        """What happened, one sentence each, for the command line and the page's flash."""
        name = self.endpoint.name
        said = [] if self.changed else ["Nothing changed."]
        if self.allowed:
            said.append(f"{_and(self.allowed)} may now use {name}.")
        if self.disallowed:
            said.append(f"{_and(self.disallowed)} may no longer use {name}.")
        for slug in self.moved_to_default:
            said.append(f"{slug} was served by {name}: it is now served by the default model ({default_model}).")
        for slug in self.lost_routing:
            said.append(f"{slug} routed simple questions to {name}: it no longer routes by difficulty.")
        if self.allowed_already:
            said.append(f"{_and(self.allowed_already)} could use {name} already.")
        if self.disallowed_already:
            said.append(f"{_and(self.disallowed_already)} could not use {name} anyway.")
        return said


def _and(slugs: list[str]) -> str:
    return ", ".join(slugs[:-1]) + f" and {slugs[-1]}" if len(slugs) > 1 else "".join(slugs)


def allow_tenants(session: Session, endpoint: ModelEndpoint, tenants: list[Tenant]) -> list[str]:
    """Allow the endpoint for these tenants (the caller commits); the slugs of those newly allowed."""
    newly = []
    for tenant in tenants:
        if tenant.slug not in newly and not may_use(session, tenant.id, endpoint.id):
            session.add(EndpointGrant(endpoint_id=endpoint.id, tenant_id=tenant.id))
            newly.append(tenant.slug)
    session.flush()
    return newly


def change_access(
    session: Session, endpoint: ModelEndpoint, allow: list[Tenant], disallow: list[Tenant]
) -> AccessChange:
    """Allow the endpoint for some tenants and withdraw it from others (the caller commits). A tenant
    served by it goes back to the default model, one routing through it stops routing: the tenant
    keeps working, and its admins may choose again among what it may use."""
    if {t.id for t in allow} & {t.id for t in disallow}:
        raise EndpointError("A tenant is both allowed and disallowed here: say one or the other.", "tenant")
    change = AccessChange(endpoint)
    change.allowed = allow_tenants(session, endpoint, allow)
    change.allowed_already = sorted({t.slug for t in allow} - set(change.allowed))
    for tenant in sorted({t.id: t for t in disallow}.values(), key=lambda t: t.slug):
        grant = session.get(EndpointGrant, (endpoint.id, tenant.id))
        if grant is None:
            change.disallowed_already.append(tenant.slug)
            continue
        session.delete(grant)
        change.disallowed.append(tenant.slug)
        if tenant.endpoint_id == endpoint.id:
            tenant.endpoint_id = None
            change.moved_to_default.append(tenant.slug)
        if tenant.small_endpoint_id == endpoint.id:
            tenant.small_endpoint_id = None
            change.lost_routing.append(tenant.slug)
        if tenant.slug in change.moved_to_default + change.lost_routing:
            change.tenants.append(tenant)
            forget_choice(tenant.id)
    session.flush()
    return change


def record_access_change(
    session: Session, change: AccessChange, *, actor: User | None = None, actor_label: str | None = None
) -> None:
    """Audit a change of who may use an endpoint (the caller commits): on the global chain, and on the
    chain of each tenant whose model it changed, so the tenant's auditors see why."""
    audit_chain.record(
        session,
        "endpoint_access_changed",
        tenant_id=None,
        actor=actor,
        actor_label=actor_label,
        data=change.audit_data(session),
    )
    for tenant in change.tenants:
        name, small_name = endpoint_names(session, tenant)
        audit_chain.record(
            session,
            "tenant_model_set",
            tenant_id=tenant.id,
            actor=actor,
            actor_label=actor_label,
            data={
                "endpoint": name,
                "small_endpoint": small_name,
                "because": f"an operator withdrew endpoint {change.endpoint.name} from {tenant.slug}",
            },
        )
