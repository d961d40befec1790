"""An address the outbound guard (webapp/outbound/) refused, put on record: whatever a tenant's admin
or an operator asked the desk to call (a webhook, an MCP server, a model endpoint), a refused address
leaves an `outbound_refused` event on the chain, in a transaction of its own."""

from __future__ import annotations

from sqlalchemy.orm import Session

from webapp import audit_chain, outbound
from webapp.models import User


def audit_refused_address(
    session: Session, error: Exception, purpose: str, tenant_id: int | None, actor: User | None, actor_label=None
) -> None:
    """An address refused by the outbound guard (behind `error`) is audited and committed, the rest
    of the attempt rolled back; an error of any other kind is left alone. `purpose`: what the
    address was for ("webhook", "mcp server", "model endpoint")."""
    refusal = outbound.refusal_behind(error)
    if refusal is None:
        return
    session.rollback()
    audit_chain.record(
        session,
        "outbound_refused",
        tenant_id=tenant_id,
        actor=actor,
        actor_label=actor_label,
        outcome="refused",
        data={"for": purpose, **refusal.audit_data()},
    )
    session.commit()
