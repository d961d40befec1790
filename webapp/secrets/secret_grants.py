"""Secrets belong to a tenant: the environment variables of the desk that the operator grants to one
tenant, so that its admins may name them in an MCP server's header (`X-Key: $MCP_SECRET_ACME_KEY`).

A tenant's admin names only the secrets granted to their tenant; the MCP code checks it when a header
is saved and again at every use (webapp/tools/mcp/), so a grant revoked since, or a header stored
before grants existed, is never sent. An operator grants only names starting with MCP_SECRET_PREFIX:
none of the desk's own settings starts with it (the desk refuses to boot otherwise), so none can ever
be handed to a tenant. Headers and variables an operator set are the operator's and need no grant.

Shared by the command line (`flask secret grant|revoke|list`), the operators' page (/ops/secrets) and
the MCP code. Each grant and revoke is audited on the tenant's chain (`secret_granted`,
`secret_revoked`: the name, never a value) and moves the tenant's tools version, so every process
builds the tenant's MCP tools again with the grants as they are now. The caller commits."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.models import McpServer, SecretGrant, Tenant, User, utcnow

NAME_LIMIT = 128  # secret_grants.name
_VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SecretGrantError(ValueError):
    """A grant or revoke that cannot be done; the message says what to fix."""


@dataclass(frozen=True)
class Grant:
    """One secret granted to a tenant, as people read it."""

    name: str
    tenant_id: int
    tenant: str  # the tenant's slug
    granted_by: str | None  # the operator's e-mail; None: the command line
    granted_at: datetime


def checked_name(name: str, prefix: str) -> str:
    """The variable's name, stripped; SecretGrantError when it is not one an operator may grant."""
    name = (name or "").strip()
    if not _VARIABLE_NAME.match(name) or len(name) > NAME_LIMIT:
        raise SecretGrantError(
            f"{name!r} is not the name of an environment variable: use letters, digits and _, not starting with "
            f"a digit, at most {NAME_LIMIT} characters, e.g. {prefix}ACME_KEY."
        )
    if not name.startswith(prefix):
        raise SecretGrantError(
            f"{name} does not start with MCP_SECRET_PREFIX ({prefix}): only variables named {prefix}... can be "
            f"granted to a tenant, so none of the desk's own settings ever is. Set the value as e.g. "
            f"{prefix}{name.upper()} and grant that."
        )
    return name


def unset_here(name: str) -> str | None:
    """A warning when the variable is not set in this process's environment (a grant of it is kept
    all the same: the desk's web and worker processes may have it where this one does not)."""
    if name in os.environ:
        return None
    return (
        f"{name} is not set in this process's environment: set it for the desk's web and worker processes, or "
        "a header naming it fails in words."
    )


def granted(session: Session, tenant_id: int) -> set[str]:
    """The names of the secrets granted to the tenant (what its admins may name as $NAME)."""
    return set(session.scalars(select(SecretGrant.name).where(SecretGrant.tenant_id == tenant_id)))


def grants(session: Session, tenant_id: int | None = None) -> list[Grant]:
    """Every grant (or one tenant's), by tenant slug then name."""
    query = (
        select(SecretGrant, Tenant.slug, User.email)
        .join(Tenant, Tenant.id == SecretGrant.tenant_id)
        .outerjoin(User, User.id == SecretGrant.granted_by_id)
        .order_by(Tenant.slug, SecretGrant.name)
    )
    if tenant_id is not None:
        query = query.where(SecretGrant.tenant_id == tenant_id)
    return [Grant(row.name, row.tenant_id, slug, email, row.granted_at) for row, slug, email in session.execute(query)]


def grant(
    session: Session,
    tenant: Tenant,
    name: str,
    *,
    prefix: str,
    actor: User | None = None,
    actor_label: str | None = None,
) -> bool:
    """Grant the secret `name` to the tenant (audited); False when it was granted already (nothing
    written). SecretGrantError when the name cannot be granted. The caller commits."""
    name = checked_name(name, prefix)
    if name in granted(session, tenant.id):
        return False
    row = SecretGrant(name=name, tenant_id=tenant.id, granted_by_id=actor.id if actor else None, granted_at=utcnow())
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:  # granted by another request meanwhile
        return False
    _changed(session, tenant.id)
    _audit(session, "secret_granted", tenant.id, name, actor, actor_label)
    return True


def revoke(
    session: Session, tenant: Tenant, name: str, *, actor: User | None = None, actor_label: str | None = None
) -> list[str]:
    """Take the secret `name` back from the tenant (audited); the names of its MCP servers whose
    headers name it (from now on they are not sent: a sync or a call of those servers fails in words).
    SecretGrantError when it is not granted to the tenant. The caller commits."""
    name = (name or "").strip()
    removed = session.execute(
        delete(SecretGrant).where(SecretGrant.tenant_id == tenant.id, SecretGrant.name == name)
    ).rowcount
    if not removed:
        have = sorted(granted(session, tenant.id))
        raise SecretGrantError(
            f"{name!r} is not granted to {tenant.slug}; "
            + (f"its secrets are {', '.join(have)}." if have else "no secret is granted to it.")
        )
    _changed(session, tenant.id)
    naming = servers_naming(session, tenant.id, name)
    _audit(session, "secret_revoked", tenant.id, name, actor, actor_label, servers=naming)
    return naming


def servers_naming(session: Session, tenant_id: int, name: str) -> list[str]:
    """The tenant's MCP servers with a header an admin set that reads the variable `name`."""
    servers = session.scalars(select(McpServer).where(McpServer.tenant_id == tenant_id).order_by(McpServer.name))
    return [server.name for server in servers if name in admins_variables(server)]


def not_granted(session: Session, tenant_id: int | None = None) -> list[str]:
    """Headers a tenant's admin set that name a secret not granted to the tenant (stored before grants
    existed, or revoked since: they are not sent), one sentence each, by tenant and server."""
    query = select(McpServer, Tenant.slug).join(Tenant, Tenant.id == McpServer.tenant_id)
    if tenant_id is not None:
        query = query.where(McpServer.tenant_id == tenant_id)
    have: dict[int, set[str]] = {}
    said = []
    for server, slug in session.execute(query.order_by(Tenant.slug, McpServer.name)):
        for header in server.headers or ():
            if "env" not in header or header.get("operator") is True:
                continue
            mine = have.setdefault(server.tenant_id, granted(session, server.tenant_id))
            if header["env"] not in mine:
                said.append(
                    f"{slug} {server.name}: its {header['name']} header names ${header['env']}, which is not granted "
                    f"to {slug}: not sent"
                )
    return said


def admins_variables(server: McpServer) -> list[str]:
    """The variables the server's headers read that a tenant's admin (not an operator) named."""
    return [h["env"] for h in server.headers or () if "env" in h and h.get("operator") is not True]


def _changed(session: Session, tenant_id: int) -> None:
    """Move the tenant's tools version: each process builds its MCP tools again (their headers are
    checked against the grants as they are when built)."""
    session.execute(update(Tenant).where(Tenant.id == tenant_id).values(tools_version=Tenant.tools_version + 1))


def _audit(
    session: Session,
    action: str,
    tenant_id: int,
    name: str,
    actor: User | None,
    actor_label: str | None,
    **more,
) -> None:
    audit_chain.record(
        session,
        action,
        tenant_id=tenant_id,
        actor=actor,
        actor_label=actor_label if actor_label or actor else "command line",
        data={"name": name, **more},
    )
