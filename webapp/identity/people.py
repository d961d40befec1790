"""Tenants and people: creating them, the operations tenant, passwords, roles, disabling and resetting."""

from __future__ import annotations

import re
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session
from werkzeug.security import check_password_hash, generate_password_hash

from webapp.identity.base import AccountError
from webapp.identity.sessions import end_sessions
from webapp.identity.tokens import revoke_tokens
from webapp.models import OPERATIONS_SLUG, OPERATOR, ROLES, Tenant, User

EMAIL_RE = re.compile(r"^[^@\s]{1,64}@[^@\s]{1,189}\.[^@\s]{2,}$")
SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


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
