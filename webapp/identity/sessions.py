"""Browser sessions: opened at sign-in, found live, ended one by one or all of a person's."""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from webapp.identity.base import hash_token
from webapp.models import User, UserSession, utcnow


def open_session(session: Session, user: User) -> str:
    """A new browser session for the user; the key goes in the (signed) cookie, its hash in the table."""
    key = secrets.token_urlsafe(24)
    session.add(UserSession(user_id=user.id, key_hash=hash_token(key)))
    session.flush()
    return key


def live_session(
    session: Session, user: User, key: str | None, idle: timedelta, longest: timedelta, now: datetime | None = None
) -> UserSession | None:
    """The user's session with this key if it is neither ended, nor idle longer than `idle`, nor older
    than `longest`; None otherwise (a session found too old or idle is ended on the way)."""
    if not key or len(key) > 100:
        return None
    row = session.scalar(
        select(UserSession).where(UserSession.key_hash == hash_token(key), UserSession.user_id == user.id)
    )
    if row is None or row.ended_at is not None:
        return None
    now = now or utcnow()
    if row.last_seen_at + idle < now or row.created_at + longest < now:
        row.ended_at = now
        session.flush()
        return None
    return row


def end_session(session: Session, key: str | None) -> bool:
    """End one browser session for good (signing out); True if it was open."""
    if not key:
        return False
    ended = session.execute(
        update(UserSession)
        .where(UserSession.key_hash == hash_token(key), UserSession.ended_at.is_(None))
        .values(ended_at=utcnow())
    )
    return bool(ended.rowcount)


def end_sessions(session: Session, user: User) -> int:
    """End every open browser session of the user; how many there were."""
    ended = session.execute(
        update(UserSession)
        .where(UserSession.user_id == user.id, UserSession.ended_at.is_(None))
        .values(ended_at=utcnow())
    )
    return ended.rowcount or 0
