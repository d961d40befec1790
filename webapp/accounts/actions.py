"""What people do with accounts that the pages, the API and the command line share: API tokens
(issue, list, revoke), unlocking an account that failed sign-ins locked, disabling a person, making a
person, their roles and password with the admin role held for four eyes (role changes: asked,
approved or rejected by a second admin, withdrawn). Each checks who may do it, audits, and commits."""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from webapp import audit_chain, identity
from webapp.accounts import four_eyes
from webapp.conversations import actions as conversation_actions
from webapp.models import MAX_ROW_ID, ROLES, ApiToken, RoleChange, User
from webapp.refusals import Refusal


class AccountRefused(Refusal):
    """What the accounts refuse: a person, a role change or a token that cannot be made or decided."""


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
        raise AccountRefused("missing", "not_found", "There is no such user in your organisation.")
    return user


def find_token(session: Session, actor: User, token_id: int) -> ApiToken:
    row = session.get(ApiToken, token_id) if 1 <= token_id <= MAX_ROW_ID else None
    if row is None or not may_manage(actor, row.user):
        raise AccountRefused("missing", "not_found", NO_SUCH_TOKEN)
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


def record_unlock(session: Session, actor: User, user: User, was_locked: bool) -> None:
    """Put on record that an admin lifted the lock of failed sign-ins from a user's account (the page
    forgets the failures, in the sign-in limits' store); audited whether it was locked or not, so who
    lifted a lock, or tried to, is on record."""
    _audit_user(session, "user_unlocked", actor, user, was_locked=was_locked)
    session.commit()


def _audit_user(session: Session, action: str, admin: User, user: User, **said) -> None:
    """Put on the chain what an admin did to a person of their organisation."""
    data = {"user_id": user.id, "email": user.email, **said}
    audit_chain.record(session, action, tenant_id=admin.tenant_id, actor=admin, data=data)


def disable_user(session: Session, admin: User, user: User) -> int | None:
    """Disable the user: they cannot sign in, their sessions end, their API tokens are revoked, and
    every conversation of theirs that is moving or waiting stops (its waiting calls settle as
    cancelled, saying why). None when they were already disabled; else how many conversations stopped.
    AccountError when an admin would disable themself."""
    if not identity.set_active(session, user, False, actor=admin):
        return None
    stopped = conversation_actions.stop_all_of(session, admin, user, f"{user.email}'s account was disabled")
    _audit_user(
        session, "user_disabled", admin, user, conversations_stopped=[conversation.id for conversation, _ in stopped]
    )
    session.commit()
    conversation_actions.after_commit(stopped)
    return len(stopped)


# --- people, and the admin role held for four eyes ------------------------------------------------
#
# Giving a person the admin role loosens the gate like a looser policy does: an admin made by one
# admin could approve that admin's own changes. So an admin's grant of the admin role (on the users
# page: a person's roles, or a new account asked with it) waits as a RoleChange for a second admin of
# the tenant whose account the asker may not hold (four_eyes.why_not_decide), or an operator; and an
# admin who resets another admin's password (or issues them a token) takes the admin role away at
# once (a tightening) and asks for it back the same way. Taking the role away is immediate. The
# operator's command line and the demo seed give roles at once: operators hold the host.

ADMIN = four_eyes.ADMIN
PENDING = four_eyes.PENDING
# Why a role change was asked, in words after the asker's name.
ROLE_CHANGE_WHY = {
    "granted": "asked to give them the admin role",
    "created": "made their account and asked for the admin role",
    "password_reset": "reset their password, which took the admin role away until a second admin gives it back",
    "token_issued": "issued them an API token, which took the admin role away until a second admin gives it back",
}


class RolesSaved(NamedTuple):
    """What saving a person's roles did: the roles before; the admin role asked for them, waiting for a
    second admin (None when none was asked, or they hold it); `waited` when that change was already
    waiting before this save."""

    before: list[str]
    change: RoleChange | None
    waited: bool = False


class PasswordReset(NamedTuple):
    """What a password reset did: the API tokens revoked, and the admin role taken away and asked back."""

    tokens_revoked: int
    change: RoleChange | None


def create_user(
    session: Session, admin: User, email: str, password: str, roles: list[str], display_name: str = ""
) -> tuple[User, RoleChange | None]:
    """A person of the admin's tenant who can sign in now (user_created). Asked with the admin role,
    the account is made without it and a role change waits for a second admin. Committed. AccountError
    (nothing written) says what is not acceptable; an IntegrityError (the same e-mail added meanwhile)
    is the caller's to roll back."""
    held = ADMIN if ADMIN in roles else None
    user = identity.create_user(session, email, password, roles, admin.tenant, display_name, withheld=held)
    four_eyes.keyed(session, user, admin, "created")
    data = {"user_id": user.id, "email": user.email, "roles": list(user.roles)}
    audit_chain.record(
        session, "user_created", tenant_id=admin.tenant_id, actor=admin, data=data | ({"held": [ADMIN]} if held else {})
    )
    change = _ask_for_admin(session, admin, user, "created") if held else None
    session.commit()
    return user, change


def set_roles(session: Session, admin: User, user: User, roles: list[str]) -> RolesSaved:
    """Give the person exactly these roles: in force at once, but the admin role for someone who does
    not hold it, which waits for a second admin (a change already waiting is kept, not asked twice).
    Audited (user_roles_changed with before and after, role_change_requested) and committed.
    AccountError (nothing written) for unknown or no roles, or an admin dropping their own admin role."""
    grant = ADMIN in (roles or []) and not user.has_role(ADMIN)
    before = identity.set_roles(session, user, roles, actor=admin, withheld=ADMIN if grant else None)
    if before != user.roles:
        _roles_changed(session, admin, user, before)
    change, waited = None, False
    if grant:
        change = pending_role_change(session, user)
        waited = change is not None
        change = change or _ask_for_admin(session, admin, user, "granted")
    session.commit()
    return RolesSaved(before, change, waited)


def reset_password(session: Session, admin: User, user: User, password: str) -> PasswordReset:
    """Set the password the admin typed, end the person's sessions and revoke their API tokens
    (user_password_reset). Another person's password is a re-keying: recorded, and an admin's admin
    role is taken away at once and asked back from a second admin. Committed. AccountError (nothing
    written) when the password is not acceptable."""
    revoked = identity.reset_password(session, user, password)
    _audit_user(session, "user_password_reset", admin, user, tokens_revoked=revoked)
    change = rekeyed(session, admin, user, "password_reset")
    session.commit()
    return PasswordReset(revoked, change)


def rekeyed(session: Session, actor: User | None, user: User, kind: str) -> RoleChange | None:
    """`actor` set `user`'s credentials (`kind`: password_reset, token_issued): recorded, and if the
    user is an admin, their admin role is taken away now and a role change asks for it back. Nothing
    for the person themself or the command line (actor None). The caller commits."""
    if actor is None or actor.id == user.id:
        return None
    four_eyes.keyed(session, user, actor, kind)
    if not user.has_role(ADMIN):
        return None
    before = identity.take_role(session, user, ADMIN)
    _roles_changed(session, actor, user, before, why=kind)
    return pending_role_change(session, user) or _ask_for_admin(session, actor, user, kind)


def pending_role_change(session: Session, user: User) -> RoleChange | None:
    """The admin role change waiting for a second admin for this person, if any."""
    return session.scalar(
        select(RoleChange).where(RoleChange.user_id == user.id, RoleChange.status == PENDING).limit(1)
    )


def role_changes(session: Session, tenant_id: int | None, status: str | None = PENDING, limit: int = 200):
    """The tenant's role changes (None: every tenant's), newest first."""
    return four_eyes.listed(session, RoleChange, tenant_id, status, limit)


def find_role_change(session: Session, person: User | None, change_id: int, *, lock: bool = False) -> RoleChange:
    """The role change, if `person` may see it (four_eyes.find)."""
    return four_eyes.find(session, RoleChange, person, change_id, AccountRefused, lock=lock)


def decide_role_change(
    session: Session,
    decider: User | None,
    change_id: int,
    decision: str,
    reason: str | None = None,
    *,
    actor_label: str | None = None,
) -> RoleChange:
    """A second admin's (or an operator's) decision on a waiting role change: "approve" gives the
    role (role_change_decided, then user_roles_changed naming who asked and who approved), "reject"
    (with a reason) leaves the person without it. `decider` None is the operator's command line
    (`actor_label` says so). AccountRefused: missing, another tenant's or no such change; forbidden, a
    decider the asker's account may hold or who may hold the asker's (four_eyes.why_not_decide);
    conflict, decided already; invalid, a bad decision or a rejection without a reason."""
    change = find_role_change(session, decider, change_id, lock=True)
    four_eyes.still_waiting(change, role_change_said, AccountRefused)
    if decider is not None:
        why = four_eyes.why_not_decide(session, decider, change.requested_by_id)
        if why is not None:
            if decider.has_role(ADMIN) and not four_eyes.deciders(session, change.tenant_id, change.requested_by_id):
                why += " " + four_eyes.only_the_operator(change.requested_by)
            raise AccountRefused("forbidden", "not_allowed", why)
    reason = four_eyes.checked_reason(decision, reason, AccountRefused)
    if decision == "reject":
        _close_role_change(session, change, "rejected", decider, actor_label, reason)
        session.commit()
        return change
    user = change.user
    if not user.active:  # disabled since it was asked: nothing to give, and nothing given
        raise AccountRefused(
            "conflict", "user_disabled", f"{user.email} was disabled since this was asked; enable them first."
        )
    before = identity.give_role(session, user, change.role)
    four_eyes.keyed(session, user, change.requested_by, "role_granted")
    _close_role_change(session, change, "approved", decider, actor_label, reason)
    if before != user.roles:
        _roles_changed(session, decider, user, before, change=change, actor_label=actor_label)
    session.commit()
    return change


def withdraw_role_change(session: Session, actor: User, change_id: int) -> RoleChange:
    """The admin who asked takes a waiting role change back; the person stays without the role."""
    change = find_role_change(session, actor, change_id, lock=True)
    four_eyes.withdrawable(change, actor, role_change_said, AccountRefused)
    _close_role_change(session, change, "withdrawn", actor, None, None)
    session.commit()
    return change


def role_change_why(change: RoleChange) -> str:
    """Who asked for a role change and why, in a sentence for people."""
    asker = change.requested_by.label if change.requested_by else "The command line"
    return f"{asker} {ROLE_CHANGE_WHY.get(change.why, 'asked for the ' + change.role + ' role')}."


def role_change_said(change: RoleChange) -> str:
    """Why a role change can no longer be decided, in words whose "{at}" is when (the refusal's `at`)."""
    at = " at {at}" if change.decided_at else ""
    if change.status == "withdrawn":
        return f"This role change was withdrawn by the admin who asked for it{at}."
    who = change.decided_by.label if change.decided_by else (change.decided_by_label or "the desk")
    return f"This role change was already {change.status} by {who}{at}."


def _ask_for_admin(session: Session, actor: User | None, user: User, why: str) -> RoleChange:
    """A role change giving `user` the admin role, waiting for a second admin (role_change_requested)."""
    return four_eyes.asked(
        session,
        RoleChange(tenant_id=user.tenant_id, user_id=user.id, role=ADMIN, why=why),
        actor,
        "role_change_requested",
        user_id=user.id,
        email=user.email,
        role=ADMIN,
        why=why,
        before=list(user.roles),
        after=sorted({*user.roles, ADMIN}, key=ROLES.index),
    )


def _close_role_change(
    session: Session, change: RoleChange, status: str, decider: User | None, actor_label: str | None, reason
) -> None:
    four_eyes.close(
        session,
        change,
        status,
        decider,
        actor_label,
        reason,
        "role_change_decided",
        user_id=change.user_id,
        email=change.user.email,
        role=change.role,
        why=change.why,
    )


def _roles_changed(
    session: Session,
    actor: User | None,
    user: User,
    before: list[str],
    *,
    why: str | None = None,
    change: RoleChange | None = None,
    actor_label: str | None = None,
) -> None:
    """user_roles_changed with before and after; a role given after four eyes names both people."""
    data = {"user_id": user.id, "email": user.email, "before": before, "after": list(user.roles)}
    if why is not None:
        data["why"] = why
    if change is not None:
        data |= {
            "change_id": change.id,
            "requested_by": change.requested_by.email if change.requested_by else None,
            "approved_by": actor.email if actor else (actor_label or "command line"),
        }
    audit_chain.record(
        session,
        "user_roles_changed",
        tenant_id=user.tenant_id,
        actor=actor,
        actor_label=None if actor else (actor_label or "command line"),
        data=data,
    )
