"""What people do with accounts that the pages, the API and the command line share: API tokens
(issue, list, revoke), unlocking an account that failed sign-ins locked, and the model endpoints
that serve a tenant. Each checks who may do it, audits, and commits."""

from __future__ import annotations

from sqlalchemy.orm import Session

from webapp import audit_chain, identity
from webapp.llm import endpoints
from webapp.models import MAX_ROW_ID, ApiToken, Tenant, User
from webapp.web.errors import Refused
from webapp.web.security import unlock_account

NO_SUCH_TOKEN = "There is no such API token among yours (admins: among your organisation's)."


def token_data(row: ApiToken) -> dict:
    """What the audit log keeps of a token: never the token, only its number, name and first characters."""
    return {"token_id": row.id, "name": row.name, "prefix": row.prefix, "user_id": row.user_id, "email": row.user.email}


def may_manage(actor: User, owner: User) -> bool:
    """A person manages their own tokens; an admin also those of their tenant's people."""
    return actor.id == owner.id or (actor.has_role("admin") and owner.tenant_id == actor.tenant_id)


def tenant_user(session: Session, actor: User, user_id: int) -> User:
    """A user whose tokens the actor may manage; 404 otherwise, so other tenants' ids reveal nothing."""
    user = session.get(User, user_id) if 1 <= user_id <= MAX_ROW_ID else None
    if user is None or not may_manage(actor, user):
        raise Refused(404, "not_found", "There is no such user in your organisation.")
    return user


def find_token(session: Session, actor: User, token_id: int) -> ApiToken:
    row = session.get(ApiToken, token_id) if 1 <= token_id <= MAX_ROW_ID else None
    if row is None or not may_manage(actor, row.user):
        raise Refused(404, "not_found", NO_SUCH_TOKEN)
    return row


def tokens(session: Session, owner: User) -> list[ApiToken]:
    return identity.tokens_of(session, owner)


def issue(session: Session, actor: User, name: str, expires_in_days: int | None) -> tuple[ApiToken, str]:
    """A new token for the actor themself: its row and the token, seen only now. AccountError (a
    sentence's worth) when the name or expiry is not acceptable."""
    row, token = identity.issue_token(session, actor, name, expires_in_days)
    data = {**token_data(row), "expires_at": row.expires_at.isoformat() if row.expires_at else None}
    audit_chain.record(session, "api_token_created", tenant_id=actor.tenant_id, actor=actor, data=data)
    session.commit()
    return row, token


def revoke(session: Session, actor: User, token_id: int) -> tuple[ApiToken, bool]:
    """Revoke a token the actor may manage, for good; (the token, whether it was still unrevoked)."""
    row = find_token(session, actor, token_id)
    changed = identity.revoke_token(session, row)
    if changed:
        audit_chain.record(
            session, "api_token_revoked", tenant_id=row.user.tenant_id, actor=actor, data=token_data(row)
        )
        session.commit()
    return row, changed


def unlock(session: Session, actor: User, user: User) -> bool:
    """Forget the failed sign-ins that locked the user's account (admins); True if it was locked.
    Audited either way, so who lifted a lock, or tried to, is on record. AccountError when the
    limits' store cannot be reached."""
    was_locked = unlock_account(user.email)
    audit_chain.record(
        session,
        "user_unlocked",
        tenant_id=actor.tenant_id,
        actor=actor,
        data={"user_id": user.id, "email": user.email, "was_locked": was_locked},
    )
    session.commit()
    return was_locked


def set_tenant_models(
    session: Session,
    tenant_slug: str,
    endpoint_name: str | None,
    small_endpoint_name: str | None | object = endpoints.KEEP,
    *,
    actor: User | None = None,
    actor_label: str | None = None,
) -> tuple[Tenant, str, str | None]:
    """Serve the tenant from an endpoint (None: the desk's default model), with a small endpoint that
    routes simple questions to itself (None: no routing; endpoints.KEEP: as it is). Audited and
    committed; an EndpointError (nothing changed) says what to fix. Returns the tenant and the names
    of its endpoint and small endpoint."""
    try:
        tenant = endpoints.set_tenant_endpoint(session, tenant_slug, endpoint_name, small_endpoint_name)
    except endpoints.EndpointError:
        session.rollback()
        raise
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
    return tenant, name, small_name
