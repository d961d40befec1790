"""What operators do with the fleet's model endpoints, shared by the endpoints page and the command
line (`flask endpoint add`): register one, change one. The checks and their messages are
webapp/llm/endpoints.py's; each change is audited on the global chain (endpoints are no tenant's)
and committed, or rolled back whole with the EndpointError that says what to fix."""

from __future__ import annotations

from sqlalchemy.orm import Session

from webapp import audit_chain, outbound
from webapp.config import Config
from webapp.llm import endpoints
from webapp.models import ModelEndpoint, User


def add_endpoint(
    session: Session, config: Config, name: str, *, actor: User | None = None, actor_label: str | None = None, **fields
) -> ModelEndpoint:
    try:
        endpoint = endpoints.add_endpoint(session, config, name, **fields)
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
        data=endpoints.snapshot(endpoint),
    )
    session.commit()
    return endpoint


def change_endpoint(
    session: Session, config: Config, endpoint: ModelEndpoint, *, actor: User | None = None, **fields
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
    audit_chain.record(session, "endpoint_changed", tenant_id=None, actor=actor, data=data)
    session.commit()
    return endpoint


def _audit_refused_address(session: Session, error: Exception, actor: User | None, actor_label: str | None) -> None:
    """A base URL the outbound guard refused (webapp/outbound.py) is audited on the global chain."""
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
