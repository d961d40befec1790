"""What operators do with the fleet's model endpoints, shared by the endpoints page and the command
line (`flask endpoint add|update|allow|disallow`): register one, change one, choose which tenants
may use it. The checks and their messages are webapp/llm/endpoints.py's; each change is audited on
the global chain (endpoints are no tenant's), a tenant's model changed by a withdrawal also on that
tenant's chain, and committed, or rolled back whole with the EndpointError that says what to fix."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy.orm import Session

from webapp import audit_chain, outbound
from webapp.agent import policies
from webapp.config import Config
from webapp.llm import endpoints, grants
from webapp.models import ModelEndpoint, User
from webapp.tools.registry import Tool


def add_endpoint(
    session: Session,
    config: Config,
    name: str,
    *,
    tenants: Iterable[str] = (),
    actor: User | None = None,
    actor_label: str | None = None,
    **fields,
) -> ModelEndpoint:
    """Register an endpoint, allowed for the tenants named by slug (none: no tenant may use it yet)."""
    try:
        may_use = [endpoints.tenant_named(session, slug) for slug in tenants]
        endpoint = endpoints.add_endpoint(session, config, name, **fields)
        allowed = grants.allow_tenants(session, endpoint, may_use)
    except endpoints.EndpointError as exc:
        session.rollback()
        _audit_refused_address(session, exc, actor, actor_label)
        raise
    audit_chain.record(
        session,
        "endpoint_added",
        tenant_id=None,
        actor=actor,
        actor_label=actor_label,
        data={**endpoints.snapshot(endpoint), "may_use": sorted(allowed)},
    )
    session.commit()
    return endpoint


def change_endpoint(
    session: Session,
    config: Config,
    endpoint: ModelEndpoint,
    *,
    actor: User | None = None,
    actor_label: str | None = None,
    **fields,
) -> ModelEndpoint:
    """Change a registered endpoint (see endpoints.update_endpoint for the key's fields)."""
    try:
        before = endpoints.update_endpoint(session, config, endpoint, **fields)
    except endpoints.EndpointError as exc:
        session.rollback()
        _audit_refused_address(session, exc, actor, None)
        raise
    after = endpoints.snapshot(endpoint)
    data = {"before": before, "after": after, "key_replaced": bool(fields.get("api_key"))}
    audit_chain.record(session, "endpoint_changed", tenant_id=None, actor=actor, actor_label=actor_label, data=data)
    session.commit()
    return endpoint


def set_ceiling(
    session: Session,
    tool: Tool | None,
    name: str,
    cents: int | None | object,
    *,
    actor: User | None = None,
    actor_label: str | None = None,
) -> int | None:
    """Set a tool's ceiling for every tenant, audited on the global chain; the ceiling now. PolicyError
    (rolled back) for a tool that does not exist or moves no amount."""
    if tool is None:
        raise policies.PolicyError(f"There is no built-in tool named {name!r}; `flask ceiling list` names them.")
    before = policies.ceiling_for(session, tool)
    try:
        after = policies.set_ceiling(session, tool, cents, actor.id if actor else None)
    except policies.PolicyError:
        session.rollback()
        raise
    audit_chain.record(
        session,
        "tool_ceiling_set",
        tenant_id=None,
        actor=actor,
        actor_label=actor_label,
        tool_name=tool.name,
        data={"before_cents": before, "after_cents": after, "tool_default": cents is policies.DEFAULT_CEILING},
    )
    session.commit()
    return after


def change_access(
    session: Session,
    endpoint: ModelEndpoint,
    *,
    allow: Iterable[str] = (),
    disallow: Iterable[str] = (),
    actor: User | None = None,
    actor_label: str | None = None,
) -> grants.AccessChange:
    """Allow the endpoint for the tenants in `allow` and withdraw it from those in `disallow` (slugs).
    A tenant served by it goes back to the default model, one routing through it stops routing; the
    returned change says so (`sentences`). Nothing asked that is so already is audited."""
    try:
        change = grants.change_access(
            session,
            endpoint,
            [endpoints.tenant_named(session, slug) for slug in allow],
            [endpoints.tenant_named(session, slug) for slug in disallow],
        )
    except endpoints.EndpointError:
        session.rollback()
        raise
    if change.changed:
        grants.record_access_change(session, change, actor=actor, actor_label=actor_label)
    session.commit()
    return change


def set_access(
    session: Session,
    endpoint: ModelEndpoint,
    *,
    ticked: Iterable[str],
    listed: Iterable[str],
    actor: User | None = None,
) -> grants.AccessChange:
    """The endpoint page's checkboxes: of the tenants the form listed, the ticked ones may use the
    endpoint and the others may not. A tenant the form did not list (made after the page was drawn,
    or allowed meanwhile from the command line) is left as it is."""
    listed_slugs = {slug.strip().lower() for slug in listed}
    ticked_slugs = {slug.strip().lower() for slug in ticked}
    try:
        if ticked_slugs - listed_slugs:
            raise endpoints.EndpointError(
                f"This form has no tenant {', '.join(sorted(ticked_slugs - listed_slugs))[:200]}; reload the page.",
                "tenant",
            )
        for slug in sorted(listed_slugs):
            endpoints.tenant_named(session, slug)  # an unknown (or forged) slug is refused in words
    except endpoints.EndpointError:
        session.rollback()
        raise
    now = set(grants.allowed_tenants(session).get(endpoint.id, []))
    return change_access(
        session,
        endpoint,
        allow=sorted(ticked_slugs - now),
        disallow=sorted((listed_slugs - ticked_slugs) & now),
        actor=actor,
    )


def _audit_refused_address(session: Session, error: Exception, actor: User | None, actor_label: str | None) -> None:
    """A base URL the outbound guard refused (webapp/outbound/) is audited on the global chain."""
    refusal = outbound.refusal_behind(error)
    if refusal is not None:
        data = {"for": "model endpoint", **refusal.audit_data()}
        audit_chain.record(
            session,
            "outbound_refused",
            tenant_id=None,
            actor=actor,
            actor_label=actor_label,
            outcome="refused",
            data=data,
        )
        session.commit()
