"""People, their browser sessions and API tokens: creating users, checking passwords, opening and
ending sessions, issuing, listing and revoking tokens, and resolving a bearer token to a user."""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session
from werkzeug.security import check_password_hash, generate_password_hash

from webapp.models import OPERATIONS_SLUG, OPERATOR, ROLES, ApiToken, Tenant, User, UserSession, utcnow

EMAIL_RE = re.compile(r"^[^@\s]{1,64}@[^@\s]{1,189}\.[^@\s]{2,}$")
SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class AccountError(ValueError):
    """A request about accounts that cannot be honoured; the message says what to fix."""


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def get_or_create_tenant(session: Session, slug: str, name: str | None = None) -> Tenant:
    if not SLUG_RE.match(slug or ""):
        raise AccountError(f"tenant slug {slug!r} must be lowercase letters, digits and dashes, e.g. acme")
    tenant = session.scalar(select(Tenant).where(Tenant.slug == slug))
    if tenant is None:
        tenant = Tenant(slug=slug, name=name or slug.capitalize())
        session.add(tenant)
        session.flush()
    return tenant


# What an admin is told when the e-mail belongs to a person of another tenant (or an operator): the
# same words whoever has it, so the users page never tells that an e-mail has an account elsewhere.
EMAIL_UNAVAILABLE = "that e-mail cannot be used for a new account; choose another"


def create_user(
    session: Session,
    email: str,
    password: str,
    roles: list[str],
    tenant: Tenant,
    display_name: str = "",
    *,
    withheld: str | None = None,
) -> User:
    """A new active user of the tenant; AccountError when the email, password or roles are not
    acceptable. An e-mail already in use says so only when its person is of this same tenant.
    `withheld`: a role among those asked that the account does not get yet (the admin role, held for
    a second admin); it may then hold no role until it is given."""
    if tenant.slug == OPERATIONS_SLUG:
        raise AccountError("the operations tenant holds only operators; make one with flask create-operator")
    email = _check_new_login(email, password)
    unknown = sorted(set(roles) - set(ROLES))
    if unknown or not roles:
        raise AccountError(f"roles must be among {', '.join(ROLES)}; got {', '.join(unknown) or 'none'}")
    holder = session.scalar(select(User.tenant_id).where(User.email == email))
    if holder is not None:
        raise AccountError(f"a user with email {email} already exists" if holder == tenant.id else EMAIL_UNAVAILABLE)
    given = sorted(set(roles) - {withheld}, key=ROLES.index)
    return _add_user(session, email, password, given, tenant, display_name)


def tenant_of(session: Session, slug: str) -> Tenant | None:
    """A tenant that owns data (never the operators' own), by its slug."""
    return session.scalar(select(Tenant).where(Tenant.slug == slug.strip(), Tenant.slug != OPERATIONS_SLUG))


def operations_tenant(session: Session) -> Tenant:
    """The tenant operators belong to: it owns no data (no conversation, customer or policy is ever
    made in it, since its people hold no tenant role) and no tenant role can be given in it."""
    tenant = session.scalar(select(Tenant).where(Tenant.slug == OPERATIONS_SLUG))
    if tenant is None:
        tenant = Tenant(slug=OPERATIONS_SLUG, name="Desk operations")
        session.add(tenant)
        session.flush()
    return tenant


def create_operator(session: Session, email: str, password: str, display_name: str = "") -> User:
    """A new operator: the desk's fleet-wide operations (/ops, /metrics) and nothing of any tenant.
    Only the command line calls this. AccountError when the e-mail or password is not acceptable or
    the e-mail is taken (the command line may say by which tenant: whoever runs it sees the database)."""
    email = _check_new_login(email, password)
    holder = session.scalar(select(User).where(User.email == email))
    if holder is not None:
        where = "an operator" if holder.is_operator else f"a person of tenant {holder.tenant.slug}"
        raise AccountError(f"{email} is already {where}; an operator needs an e-mail with no account")
    return _add_user(session, email, password, [OPERATOR], operations_tenant(session), display_name)


def _check_new_login(email: str, password: str) -> str:
    """The e-mail, trimmed and lowercased; AccountError when it or the password is not acceptable."""
    email = (email or "").strip().lower()
    if not EMAIL_RE.match(email):
        raise AccountError(f"{email!r} is not an email address")
    if len(password or "") < 8:
        raise AccountError("the password must be at least 8 characters")
    return email


def _add_user(session: Session, email: str, password: str, roles: list[str], tenant: Tenant, display_name: str) -> User:
    user = User(
        email=email,
        password_hash=generate_password_hash(password),  # scrypt: memory-hard
        roles=roles,
        tenant_id=tenant.id,
        display_name=display_name,
    )
    session.add(user)
    session.flush()
    return user


# The scrypt hash of a random password nobody knows, made with werkzeug's defaults (what
# generate_password_hash gives every user): checking a password for an e-mail that has no account does
# the same work as for one that has, so the time a sign-in takes does not tell which e-mails exist.
# (tests/web/test_security.py checks that it still uses the method real hashes use.)
DUMMY_PASSWORD_HASH = (
    "scrypt:32768:8:1$b47pLwBER9EXIHOj$"
    "ca9b6c30021ef992f8901d63dd07974913d6276d4ed4111c73f8304cf3edd460"
    "ca3a2dfb9c767d853123eb7b932b93b8ccb5590ac81e9fbdfdb2009b5de5c314"
)


def check_password(user: User | None, password: str) -> bool:
    """Whether the password is the user's. Always one scrypt check, also when there is no user (or no
    password set): then against DUMMY_PASSWORD_HASH, and False."""
    if user is None or not user.password_hash:
        check_password_hash(DUMMY_PASSWORD_HASH, password or "")
        return False
    return check_password_hash(user.password_hash, password)


# --- browser sessions -----------------------------------------------------------------------------


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


# --- API tokens -----------------------------------------------------------------------------------

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


def _clean_roles(roles) -> list[str]:
    roles = list(roles or [])
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise AccountError(f"roles must be among {', '.join(ROLES)}; {', '.join(unknown)} is not one of them")
    if not roles:
        raise AccountError("choose at least one role")
    return sorted(set(roles), key=ROLES.index)


def set_roles(
    session: Session, user: User, roles, *, actor: User | None = None, withheld: str | None = None
) -> list[str]:
    """Give the user exactly these roles and return the roles they had before. AccountError for
    unknown or no roles, or when an admin (actor) would remove their own admin role. `withheld`: a
    role among those asked that is not given yet (the admin role, held for a second admin); the user
    may then hold no role until it is given."""
    if user.is_operator:
        raise AccountError("an operator holds the operator role only, and no tenant role can be given to one")
    new_roles = _clean_roles(roles)
    if actor is not None and actor.id == user.id and user.has_role("admin") and "admin" not in new_roles:
        raise AccountError("you cannot remove your own admin role; ask another admin to do it")
    before = list(user.roles or [])
    user.roles = [role for role in new_roles if role != withheld]  # a new list, so the JSON column sees it
    session.flush()
    return before


def give_role(session: Session, user: User, role: str) -> list[str]:
    """Add one role to the user's (a role held for four eyes, now approved); the roles before."""
    if user.is_operator or role not in ROLES:
        raise AccountError(f"the {role} role cannot be given to {user.email}")
    before = list(user.roles or [])
    user.roles = sorted({*before, role}, key=ROLES.index)
    session.flush()
    return before


def take_role(session: Session, user: User, role: str) -> list[str]:
    """Take one role from the user (they may then hold none); the roles before."""
    before = list(user.roles or [])
    user.roles = [each for each in before if each != role]
    session.flush()
    return before


def set_active(session: Session, user: User, active: bool, *, actor: User | None = None) -> bool:
    """Enable or disable the user; True when that changed anything. Disabling ends every browser
    session of theirs at once and revokes their API tokens for good (enabling them again brings
    neither back). AccountError when an admin (actor) would disable themself."""
    if not active and actor is not None and actor.id == user.id:
        raise AccountError("you cannot disable your own account; ask another admin to do it")
    if user.active == active:
        return False
    user.active = active
    if not active:
        user.session_token = secrets.token_hex(16)
        end_sessions(session, user)
        revoke_tokens(session, user)
    session.flush()
    return True


def reset_password(session: Session, user: User, new_password: str) -> int:
    """Set a new password, end every browser session of the user's and revoke their API tokens; how
    many tokens were revoked. AccountError when the password is shorter than 8 or longer than 200
    characters."""
    if len(new_password or "") < 8:
        raise AccountError("the new password must be at least 8 characters")
    if len(new_password) > 200:
        raise AccountError("the new password must be at most 200 characters")
    user.password_hash = generate_password_hash(new_password)
    user.session_token = secrets.token_hex(16)
    end_sessions(session, user)
    revoked = revoke_tokens(session, user)
    session.flush()
    return revoked
