"""API tokens: issued (only their hash kept), listed with their state, found, revoked, and a bearer
token resolved to its person."""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from webapp.identity.base import AccountError, hash_token
from webapp.models import ApiToken, User, utcnow

TOKEN_PREFIX_CHARS = 12  # "adk_" and 8 random characters: enough to tell tokens apart, never to use one
MAX_TOKEN_NAME_CHARS = 100
MAX_TOKEN_DAYS = 3650


def issue_token(
    session: Session, user: User, name: str = "", expires_in_days: int | None = None
) -> tuple[ApiToken, str]:
    """A new API token for the user: its row and the token itself, which is seen only this once (only its
    hash is stored). AccountError when the name or the expiry is not acceptable."""
    name = (name or "").strip()
    if len(name) > MAX_TOKEN_NAME_CHARS:
        raise AccountError(f"the token's name must be at most {MAX_TOKEN_NAME_CHARS} characters")
    if expires_in_days is not None and not 1 <= expires_in_days <= MAX_TOKEN_DAYS:
        raise AccountError(f"a token expires after 1 to {MAX_TOKEN_DAYS} days, or never (leave it empty)")
    token = "adk_" + secrets.token_urlsafe(32)
    row = ApiToken(
        user_id=user.id,
        token_hash=hash_token(token),
        name=name,
        prefix=token[:TOKEN_PREFIX_CHARS],
        expires_at=utcnow() + timedelta(days=expires_in_days) if expires_in_days else None,
    )
    session.add(row)
    session.flush()
    return row, token


def create_token(session: Session, user: User, name: str = "", expires_in_days: int | None = None) -> str:
    """A new API token for the user; only its hash is stored, so this is the one time it is seen."""
    return issue_token(session, user, name, expires_in_days)[1]


def token_state(row: ApiToken, now: datetime | None = None) -> str:
    """ "revoked", "expired" or "active"."""
    if row.revoked_at is not None:
        return "revoked"
    if row.expires_at is not None and row.expires_at <= (now or utcnow()):
        return "expired"
    return "active"


def tokens_of(session: Session, user: User) -> list[ApiToken]:
    """The user's tokens, newest first (revoked and expired ones too: they say when)."""
    return list(session.scalars(select(ApiToken).where(ApiToken.user_id == user.id).order_by(ApiToken.id.desc())))


def find_token(session: Session, ref: str) -> ApiToken:
    """A token by its number or by its first characters (as the tokens page shows them); AccountError
    naming what to type when there is none, or when the characters fit several tokens."""
    ref = (ref or "").strip().removeprefix("#")
    if ref.isdigit() and len(ref) < 12:
        row = session.get(ApiToken, int(ref))
        if row is None:
            raise AccountError(f"there is no API token number {ref}; the tokens page lists them")
        return row
    if len(ref) < 6 or len(ref) > TOKEN_PREFIX_CHARS:
        raise AccountError(
            f"give a token's number or its first {TOKEN_PREFIX_CHARS} characters (like adk_Ab3dE6gH), "
            f"as the tokens page shows them; got {ref!r}"
        )
    rows = session.scalars(select(ApiToken).where(ApiToken.prefix.startswith(ref, autoescape=True)).limit(2)).all()
    if not rows:
        raise AccountError(f"no API token starts with {ref!r}; the tokens page lists them")
    if len(rows) > 1:
        raise AccountError(f"several API tokens start with {ref!r}; give its number instead")
    return rows[0]


def revoke_token(session: Session, row: ApiToken) -> bool:
    """Revoke the token for good; True if it was not revoked already."""
    if row.revoked_at is not None:
        return False
    row.revoked_at = utcnow()
    session.flush()
    return True


def revoke_tokens(session: Session, user: User) -> int:
    """Revoke every token of the user (password reset, disabling); how many were still unrevoked."""
    revoked = session.execute(
        update(ApiToken).where(ApiToken.user_id == user.id, ApiToken.revoked_at.is_(None)).values(revoked_at=utcnow())
    )
    return revoked.rowcount or 0


def user_for_token(session: Session, token: str) -> User | None:
    """The active user a bearer token belongs to, or None (unknown, revoked or expired token)."""
    if not token or len(token) > 200:
        return None
    row = session.scalar(
        select(ApiToken).where(ApiToken.token_hash == hash_token(token), ApiToken.revoked_at.is_(None))
    )
    if row is None or token_state(row) != "active" or not row.user.active:
        return None
    return row.user
