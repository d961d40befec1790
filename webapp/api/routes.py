"""The JSON API's doors, one module a resource, each holding its routes and the bodies they take and
answer (what they share is in base.py and bodies.py). Importing this module puts every route on the
api blueprint, `bp`, which create_app registers; and it serves the API's own description."""

from __future__ import annotations

from typing import Any

from flask import current_app, jsonify
from pydantic import BaseModel, ConfigDict

from webapp.api import (  # noqa: F401 - each resource's module puts its routes on bp
    approvals,
    audit,
    calls,
    conversations,
    external_tools,
    policies,
    runs,
    secrets,
    tokens,
    tool_calls,
    webhooks,
)
from webapp.api.base import bp, documented
from webapp.api.openapi import document
from webapp.web.security import public

__all__ = ["bp"]


class OpenApiDocument(BaseModel):
    """This API's OpenAPI 3.1 document."""

    model_config = ConfigDict(extra="allow")

    openapi: str
    info: dict[str, Any]
    paths: dict[str, Any]


@bp.get("/openapi.json")
@documented("This document", responses={200: OpenApiDocument})
@public
def openapi_document():
    """The OpenAPI 3.1 document of this API, built from the routes and their models."""
    return jsonify(document(current_app))
