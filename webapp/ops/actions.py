"""What operators do with the fleet's model endpoints, shared by the endpoints page and the command
line (`flask endpoint add`): register one, change one. The checks and their messages are
webapp/llm/endpoints.py's; each change is audited on the global chain (endpoints are no tenant's)
and committed, or rolled back whole with the EndpointError that says what to fix."""

from __future__ import annotations

from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.agent import policies
from webapp.config import Config
from webapp.llm import endpoints
from webapp.models import ModelEndpoint, User
from webapp.tools.registry import Tool


def add_endpoint(
    session: Session, config: Config, name: str, *, actor: User | None = None, actor_label: str | None = None, **fields
) -> ModelEndpoint:
    try:
        endpoint = endpoints.add_endpoint(session, config, name, **fields)
    except endpoints.EndpointError:
        session.rollback()
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
    except endpoints.EndpointError:
        session.rollback()
        raise
    after = endpoints.snapshot(endpoint)
    data = {"before": before, "after": after, "key_replaced": bool(fields.get("api_key"))}
    audit_chain.record(session, "endpoint_changed", tenant_id=None, actor=actor, data=data)
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
