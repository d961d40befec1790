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

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.models import MAX_ROW_ID, PolicyChange, RoleChange, User, UserKeying, utcnow
from webapp.refusals import Refusal

Change = TypeVar("Change", PolicyChange, RoleChange)
KINDS = ("created", "password_reset", "token_issued", "role_granted")
ADMIN = "admin"
ASKED_IT = "You asked for this change, so another admin of your organisation decides it (four eyes)."
NOT_AN_ADMIN = "Only an active admin of the organisation, or the desk's operator, decides this change."
PENDING = "pending"
MAX_REASON_CHARS = 2000
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


def asked(
    session: Session, change: Change, actor: User | None, action: str, tool_name: str | None = None, **said
) -> Change:
    """Keep `change` waiting for a second pair of eyes, asked by `actor` (None: the command line) now,
    audited as `action` with `said`."""
    change.status, change.requested_at = PENDING, utcnow()
    change.requested_by_id = actor.id if actor else None
    session.add(change)
    session.flush()
    audit_chain.record(
        session,
        action,
        tenant_id=change.tenant_id,
        actor=actor,
        actor_label=None if actor else "command line",
        tool_name=tool_name,
        data={"change_id": change.id, **said},
    )
    return change


def find(
    session: Session,
    kind: type[Change],
    person: User | None,
    change_id: int,
    refused: type[Refusal],
    *,
    lock: bool = False,
) -> Change:
    """The change, if `person` may see it (an admin: their tenant's; an operator or the command line,
    None: any); refused as missing otherwise, so other tenants' ids reveal nothing."""
    query = select(kind).where(kind.id == change_id)
    if lock:
        query = query.with_for_update()
    change = session.scalar(query) if 1 <= change_id <= MAX_ROW_ID else None
    if change is None or (person is not None and not person.is_operator and change.tenant_id != person.tenant_id):
        noun = "role change" if kind is RoleChange else "policy change"
        raise refused("missing", "not_found", f"There is no such {noun} in your organisation.")
    return change


def listed(session: Session, kind: type[Change], tenant_id: int | None, status: str | None, limit: int) -> list:
    """The tenant's changes (None: every tenant's) in `status` (None: any), newest first."""
    query = select(kind).order_by(kind.id.desc()).limit(limit)
    if tenant_id is not None:
        query = query.where(kind.tenant_id == tenant_id)
    if status is not None:
        query = query.where(kind.status == status)
    return list(session.scalars(query))


def checked_reason(decision: str, reason: str | None, refused: type[Refusal]) -> str | None:
    """The reason typed, trimmed (None when empty), once the decision and it are ones a change takes."""
    reason = (reason or "").strip() or None
    if reason is not None and len(reason) > MAX_REASON_CHARS:
        raise refused("invalid", "invalid_reason", f"The reason must be at most {MAX_REASON_CHARS:,} characters.")
    if decision not in ("approve", "reject"):
        raise refused("invalid", "invalid_decision", 'The decision must be "approve" or "reject".')
    if decision == "reject" and reason is None:
        raise refused("invalid", "reason_required", "Say why you reject the change; the admin who asked reads it.")
    return reason


def still_waiting(change: Change, said: Callable[[Change], str], refused: type[Refusal]) -> None:
    """Refuse a change that was decided already (`said(change)`: why, with "{at}" for when)."""
    if change.status != PENDING:
        raise refused("conflict", "already_decided", said(change), at=change.decided_at)


def withdrawable(change: Change, actor: User, said: Callable[[Change], str], refused: type[Refusal]) -> None:
    """Refuse the withdrawal of a change that no longer waits, or by anyone but the admin who asked."""
    still_waiting(change, said, refused)
    if change.requested_by_id != actor.id:
        noun = "a role change" if isinstance(change, RoleChange) else "a change"
        raise refused(
            "forbidden", "not_allowed", f"Only the admin who asked for {noun} can withdraw it; you can reject it."
        )


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
