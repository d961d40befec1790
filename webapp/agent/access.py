"""Who may have the assistant use which tool, per tenant.

A tenant's admins choose, per tool (built-in or from an MCP server), whether everyone may have the
assistant use it, only people holding some roles or named people, or no one (the tool is disabled).
A conversation acts for its owner, so the model is offered only the tools the owner may use, and a
call of any other tool (named anyway, or allowed when the model asked and taken away since) is
settled as an error result without running. No setting: everyone may.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from webapp.models import ROLES, ToolAccess, User, utcnow

EVERYONE, CHOSEN, NOBODY = "everyone", "chosen", "nobody"
WHO = (EVERYONE, CHOSEN, NOBODY)
MAX_PEOPLE = 200  # named people per tool; more than that is what roles are for


class AccessError(ValueError):
    """A setting that cannot be saved; the message says what to fix."""


@dataclass(frozen=True)
class Access:
    tool_name: str
    who: str = EVERYONE
    roles: tuple[str, ...] = ()
    user_ids: tuple[int, ...] = ()
    version: int = 0  # 0: never set (everyone)

    def allows(self, user: User) -> bool:
        """Whether the assistant may use the tool in a conversation `user` owns."""
        if not user.active:
            return False
        if self.who == EVERYONE:
            return True
        if self.who == NOBODY:
            return False
        return user.id in self.user_ids or any(role in self.roles for role in user.roles or ())

    def describe(self, names: dict[int, str] | None = None) -> str:
        """The setting in words; `names` labels the people it names (id -> label)."""
        if self.who == EVERYONE:
            return "Everyone's assistant may use it."
        if self.who == NOBODY:
            return "Disabled: no one's assistant may use it."
        parts = []
        if self.roles:
            parts.append("people with the role " + " or ".join(self.roles))
        if self.user_ids:
            labels = sorted((names or {}).get(user_id, f"person {user_id}") for user_id in self.user_ids)
            parts.append(", ".join(labels))
        return f"Only the assistant of {'; and '.join(parts)} may use it."

    def snapshot(self) -> dict:
        return {
            "who": self.who,
            "roles": list(self.roles),
            "user_ids": list(self.user_ids),
            "version": self.version,
            "rule": self.describe(),
        }


def _access(row: ToolAccess | None, tool_name: str) -> Access:
    if row is None:
        return Access(tool_name)
    return Access(row.tool_name, row.who, tuple(row.roles or ()), tuple(row.user_ids or ()), row.version)


def access_for(session: Session, tenant_id: int, tool_name: str) -> Access:
    row = session.scalar(select(ToolAccess).where(ToolAccess.tenant_id == tenant_id, ToolAccess.tool_name == tool_name))
    return _access(row, tool_name)


def accesses(session: Session, tenant_id: int) -> dict[str, Access]:
    """Every tool's setting in the tenant that has one (a tool missing here: everyone)."""
    rows = session.scalars(_ACCESSES, {"tenant_id": tenant_id})
    return {row.tool_name: _access(row, row.tool_name) for row in rows}


_ACCESSES = select(ToolAccess).where(ToolAccess.tenant_id == bindparam("tenant_id"))  # every move: built once


def usable(
    session: Session, user: User, names: Iterable[str], settings: dict[str, Access] | None = None
) -> frozenset[str]:
    """Of these tools, the ones the assistant may use in a conversation the user owns (`settings`: the
    tenant's, as accesses() reads them, when the caller has them already)."""
    if settings is None:
        settings = accesses(session, user.tenant_id)
    return frozenset(name for name in names if settings.get(name, Access(name)).allows(user))


def save_access(
    session: Session,
    tenant_id: int,
    tool_name: str,
    *,
    who: str,
    roles: Iterable[str] = (),
    user_ids: Iterable[int] = (),
    by_user_id: int,
) -> tuple[Access, Access]:
    """Store who may use the tool; returns (before, after). AccessError on bad values (people of
    another tenant, unknown roles, nobody chosen)."""
    if who not in WHO:
        raise AccessError(f"Who may use it must be one of: {', '.join(WHO)}.")
    roles, user_ids = sorted(set(roles)), sorted(set(user_ids))
    if who == CHOSEN:
        unknown = [role for role in roles if role not in ROLES]
        if unknown:
            raise AccessError(f"Unknown role {unknown[0]!r}; the roles are {', '.join(ROLES)}.")
        if len(user_ids) > MAX_PEOPLE:
            raise AccessError(f"Name at most {MAX_PEOPLE} people; give the others a role instead.")
        found = set(
            session.scalars(select(User.id).where(User.id.in_(user_ids), User.tenant_id == tenant_id))
            if user_ids
            else ()
        )
        if len(found) != len(user_ids):
            raise AccessError("Choose people of your own organisation only.")
        if not roles and not user_ids:
            raise AccessError("Choose at least one role or person, or choose “no one” to disable the tool.")
    else:
        roles, user_ids = [], []
    before = access_for(session, tenant_id, tool_name)
    row = session.scalar(select(ToolAccess).where(ToolAccess.tenant_id == tenant_id, ToolAccess.tool_name == tool_name))
    if row is None:
        row = ToolAccess(tenant_id=tenant_id, tool_name=tool_name, version=0)
        session.add(row)
    row.who, row.roles, row.user_ids = who, roles, user_ids
    row.version = max(row.version, before.version) + 1
    row.updated_by_id = by_user_id
    row.updated_at = utcnow()
    session.flush()
    return before, _access(row, tool_name)
