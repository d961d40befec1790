"""People of their own for the account tests (the demo logins stay as seeded), and what the API and
the audit log say."""

from __future__ import annotations

import uuid

from sqlalchemy import select

from tests.clients import PASSWORD
from webapp.models import AuditEvent, User
from webapp.runtime.extensions import db


def new_user(roles=("agent",), tenant: str = "acme") -> User:
    """A person of their own: password PASSWORD."""
    from webapp.identity import create_user, get_or_create_tenant

    user = create_user(
        db.session,
        f"person-{uuid.uuid4().hex[:8]}@{tenant}.test",
        PASSWORD,
        list(roles),
        get_or_create_tenant(db.session, tenant),
    )
    db.session.commit()
    db.session.remove()
    return db.session.scalar(select(User).where(User.email == user.email))


def works(client, token: str) -> bool:
    """Whether the API takes the token (404 for a conversation that does not exist; 401 if refused)."""
    status = client.get("/api/conversations/999999", headers={"Authorization": f"Bearer {token}"}).status_code
    db.session.remove()
    assert status in (401, 404), status
    return status == 404


def actions_logged() -> list[str]:
    db.session.remove()
    return db.session.scalars(select(AuditEvent.action).order_by(AuditEvent.id)).all()


def last_event(action: str) -> AuditEvent:
    db.session.remove()
    return db.session.scalar(
        select(AuditEvent).where(AuditEvent.action == action).order_by(AuditEvent.id.desc()).limit(1)
    )
