"""What people do with accounts that the pages, the API and the command line share. Each checks who
may do it, audits, and commits."""

from __future__ import annotations

from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.models import User
from webapp.web.security import unlock_account


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
