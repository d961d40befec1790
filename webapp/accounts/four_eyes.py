"""Who may be the second pair of eyes on a change someone asked for: shared by policy changes
(policy_actions) and the admin role held for four eyes (actions: role changes).

Four eyes means two people. An admin who set another person's credentials (made their account, reset
their password, issued them a token) or gave them the admin role may know how to sign in as them, so
the desk keeps who keyed whom (`UserKeying`, at any time, never forgotten) and refuses a decider
whose account may be held by the one who asked: the decider was keyed by the requester, the
requester by the decider, or both by a third person, directly or along a chain of keyings (A made B,
B made C: whoever holds A's password may hold C's). Operators hold the host and may always decide;
the command line is theirs. Keyings done from the command line or the demo seed are the operator's
and name no person, so they are not recorded."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.models import PolicyChange, RoleChange, User, UserKeying, utcnow

KINDS = ("created", "password_reset", "token_issued", "role_granted")
ADMIN = "admin"
ASKED_IT = "You asked for this change, so another admin of your organisation decides it (four eyes)."
NOT_AN_ADMIN = "Only an active admin of the organisation, or the desk's operator, decides this change."
ONLY_THE_OPERATOR = (
    "Only the desk's operator can decide this: your organisation has no other admin who was not made or "
    "re-keyed by {requester}, or by whoever made or re-keyed them."
)


def keyed(session: Session, user: User, by: User | None, kind: str) -> UserKeying | None:
    """Record that `by` set `user`'s credentials or gave them a role (`kind`, one of KINDS). Nothing
    when `by` is nobody (the command line, the seed: the operator's) or the person themself."""
    if kind not in KINDS:
        raise ValueError(f"unknown keying {kind!r}; one of {', '.join(KINDS)}")
    if by is None or by.id == user.id:
        return None
    row = UserKeying(tenant_id=user.tenant_id, user_id=user.id, by_user_id=by.id, kind=kind)
    session.add(row)
    session.flush()
    return row


def close(
    session: Session,
    change: PolicyChange | RoleChange,
    status: str,
    decider: User | None,
    actor_label: str | None,
    reason: str | None,
    action: str,
    tool_name: str | None = None,
    **said,
) -> None:
    """End a change that waited for a second pair of eyes (approved, rejected, withdrawn, superseded),
    by `decider` (None: the command line, or `actor_label`), audited as `action` with `said`."""
    change.status, change.decided_at, change.reason = status, utcnow(), reason
    change.decided_by_id = decider.id if decider else None
    change.decided_by_label = None if decider else (actor_label or "command line")
    session.flush()
    audit_chain.record(
        session,
        action,
        tenant_id=change.tenant_id,
        actor=decider,
        actor_label=None if decider else change.decided_by_label,
        tool_name=tool_name,
        data={
            "change_id": change.id,
            "decision": status,
            "reason": reason,
            "requested_by": change.requested_by.email if change.requested_by else None,
            **said,
        },
    )


def why_not_decide(session: Session, decider: User, requester_id: int | None) -> str | None:
    """None when `decider` may decide a change `requester_id` asked for (None: the command line asked);
    otherwise a sentence for people saying why not. Refused: the requester themself, anyone who is not
    an active admin of the requester's organisation, and anyone whose account the requester may hold
    or who may hold the requester's (keyed by them, or they by the decider, or both by a third person,
    at any time). Operators may always decide."""
    if decider.is_operator:
        return None
    if requester_id is not None and decider.id == requester_id:
        return ASKED_IT
    if not decider.active or not decider.has_role(ADMIN):
        return NOT_AN_ADMIN
    if requester_id is None:
        return None
    requester = session.get(User, requester_id)
    if requester is None or requester.tenant_id != decider.tenant_id:
        return NOT_AN_ADMIN
    keyings = _keyings(session, decider.tenant_id)
    return _shared_holder(session, keyings, decider, requester)


def deciders(session: Session, tenant_id: int, requester_id: int | None) -> list[User]:
    """The tenant's admins who could decide a change `requester_id` asked for, by e-mail (operators
    aside: they always can). Empty: only the desk's operator can."""
    admins = [
        person
        for person in session.scalars(
            select(User).where(User.tenant_id == tenant_id, User.active.is_(True)).order_by(User.email)
        )
        if person.has_role(ADMIN) and person.id != requester_id
    ]
    requester = session.get(User, requester_id) if requester_id is not None else None
    if requester is None:
        return admins
    keyings = _keyings(session, tenant_id)
    return [person for person in admins if _shared_holder(session, keyings, person, requester) is None]


def only_the_operator(requester: User | None) -> str:
    """What a page says when no admin of the tenant may decide a change `requester` asked for."""
    return ONLY_THE_OPERATOR.format(requester=requester.label if requester else "the command line")


def _keyings(session: Session, tenant_id: int) -> dict[int, set[int]]:
    """Who keyed whom in the tenant: user id -> the ids of the people who keyed them."""
    by: dict[int, set[int]] = {}
    rows = session.execute(select(UserKeying.user_id, UserKeying.by_user_id).where(UserKeying.tenant_id == tenant_id))
    for user_id, by_user_id in rows:
        by.setdefault(user_id, set()).add(by_user_id)
    return by


def _holders(keyings: dict[int, set[int]], user_id: int) -> set[int]:
    """The person and everyone who may hold their credentials: who keyed them, who keyed those, ..."""
    found, todo = {user_id}, [user_id]
    while todo:
        for by_id in keyings.get(todo.pop(), ()):
            if by_id not in found:
                found.add(by_id)
                todo.append(by_id)
    return found


def _shared_holder(session: Session, keyings: dict[int, set[int]], decider: User, requester: User) -> str | None:
    """Why one person may hold both accounts (a sentence ending in what to do), or None."""
    theirs, mine = _holders(keyings, requester.id), _holders(keyings, decider.id)
    if requester.id in mine:
        said = f"{requester.label} made or re-keyed your account"
        said += "" if requester.id in keyings.get(decider.id, ()) else ", through another account"
    elif decider.id in theirs:
        said = f"You made or re-keyed {requester.label}'s account"
        said += "" if decider.id in keyings.get(requester.id, ()) else ", through another account"
    elif common := mine & theirs:
        third = session.get(User, min(common))
        said = f"{third.label} made or re-keyed both your account and {requester.label}'s"
    else:
        return None
    return (
        f"{said}, so one person may hold both and you may not decide {requester.label}'s changes (four eyes). "
        "Another admin of your organisation, or the desk's operator, decides it."
    )
