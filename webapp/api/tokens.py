"""/api/tokens: API tokens, listed (never the token itself) and revoked; with the bodies those routes
take and answer. People make tokens on the API tokens page."""

from __future__ import annotations

from typing import Literal

from flask import g
from pydantic import BaseModel, Field

from webapp.accounts import actions as accounts
from webapp.api.base import answer, bp, documented
from webapp.api.bodies import MAX_ID, QueryParameters, RequestBody, Timestamp, whole_number
from webapp.api.reading import optional_body, query
from webapp.identity import token_state
from webapp.models import ROLES, ApiToken
from webapp.runtime.extensions import db
from webapp.web.security import api_roles


class RevokeToken(RequestBody):
    """Revoking a token takes no fields; a body, if sent, must be an empty JSON object."""


class TokensQuery(QueryParameters):
    """Whose tokens to list."""

    user_id: whole_number(
        1,
        MAX_ID,
        "Admins: list this person's tokens (a person of their tenant).",
        "must be the number of a person of your organisation",
    ) = None


class TokenView(BaseModel):
    """An API token as its owner and their admins see it: never the token itself, which is shown once."""

    id: int
    name: str = Field(description="What its owner named it.")
    prefix: str = Field(description='Its first characters, e.g. "adk_Ab3dE6gH" (empty for tokens made before names).')
    user_id: int
    email: str = Field(description="Whose token it is.")
    state: Literal["active", "expired", "revoked"]
    created_at: Timestamp
    expires_at: Timestamp | None = Field(description="When it stops working by itself; null: never.")
    revoked_at: Timestamp | None

    @classmethod
    def of(cls, row: ApiToken, state: str) -> TokenView:
        return cls(
            id=row.id,
            name=row.name,
            prefix=row.prefix,
            user_id=row.user_id,
            email=row.user.email,
            state=state,
            created_at=row.created_at,
            expires_at=row.expires_at,
            revoked_at=row.revoked_at,
        )


class TokenList(BaseModel):
    tokens: list[TokenView]


@bp.get("/tokens")
@documented(
    "List API tokens",
    query=TokensQuery,
    responses={200: TokenList},
    errors={404: "not_found: `user_id` names nobody whose tokens you manage."},
)
@api_roles(*ROLES)
def list_tokens():
    """The caller's own tokens; an admin may ask for a person of their tenant's with ?user_id=."""
    user_id = query(TokensQuery).user_id
    owner = accounts.tenant_user(db.session, g.user, user_id) if user_id is not None else g.user
    return answer(TokenList(tokens=[TokenView.of(row, token_state(row)) for row in accounts.tokens(db.session, owner)]))


@bp.delete("/tokens/<int:token_id>")
@documented("Revoke an API token", body=RevokeToken, body_required=False, responses={200: TokenView})
@api_roles(*ROLES)
def revoke_token(token_id: int):
    """Revoke one of the caller's tokens (admins: of their tenant's people) for good; revoking one that is
    revoked already answers the same."""
    optional_body(RevokeToken)  # (it takes no field: only an empty body, or {})
    row, _ = accounts.revoke(db.session, g.user, token_id)
    return answer(TokenView.of(row, token_state(row)))
