"""/api/secrets: the names of the secrets the desk's operator granted to the tenant, which its admins
may name in an MCP server's header; never a value."""

from __future__ import annotations

from flask import g
from pydantic import BaseModel, Field

from webapp.api.base import answer, bp, documented
from webapp.runtime.extensions import db
from webapp.secrets import secret_grants
from webapp.web.security import api_roles


class SecretList(BaseModel):
    """The secrets the desk's operator granted to the caller's tenant: the environment variables its
    admins may name in an MCP server's header (`X-Key: $NAME`). Names only, never a value."""

    secrets: list[str] = Field(description="Their names, sorted; any other variable is refused.")


@bp.get("/secrets")
@documented("List the secrets an MCP server's header may name", responses={200: SecretList})
@api_roles("admin")
def list_secrets():
    """The names of the secrets the desk's operator granted to the tenant (never a value): the only
    environment variables its admins may name in an MCP server's header."""
    return answer(SecretList(secrets=sorted(secret_grants.granted(db.session, g.user.tenant_id))))
