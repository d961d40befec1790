"""The JSON API's OpenAPI 3.1 document, built from what each route declares next to itself and from the
pydantic models of its resource's module (webapp/api/conversations.py, ...): nothing in it is written
by hand.

A route says what it takes and answers with `@documented(...)` (webapp/api/base.py): its request body model, its query
parameters' model, its answers by status and the errors of its own (409 conversation_busy, say). The
rest is read from the route itself: its path parameters from the URL rule (an int is an id, 1 to MAX_ID),
401 and 403 from the roles it declares (`@api_roles`), 404 when its path names something, 400, 413 and
422 when it reads a body, 422 when it reads query parameters. Every error has the one `Error` schema.
`document(app)` assembles it once per process; GET /api/openapi.json serves it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from flask import Flask
from pydantic import BaseModel
from werkzeug.routing import IntegerConverter, Rule

from webapp.api.base import Declared
from webapp.api.bodies import MAX_ID, QueryParameters
from webapp.api.events import EVENT_MODELS
from webapp.api.reading import ErrorBody
from webapp.models import ROLES
from webapp.webhooks import EVENT_TYPES

TITLE = "Approval desk API"
VERSION = "1"
REF = "#/components/schemas/{model}"


def document(app: Flask) -> dict[str, Any]:
    """The app's API document, built on first use and kept for the life of the process."""
    if "openapi" not in app.extensions:
        app.extensions["openapi"] = build(app)
    return app.extensions["openapi"]


def api_rules(app: Flask) -> list[Rule]:
    """The URL rules of the api blueprint, in the order the app matches them."""
    return [rule for rule in app.url_map.iter_rules() if rule.endpoint.startswith("api.")]


# --- assembling ---------------------------------------------------------------------------------------


class _Components:
    """The schemas the operations refer to, each under its model's name."""

    def __init__(self) -> None:
        self.schemas: dict[str, dict[str, Any]] = {}

    def ref(self, model: type[BaseModel], mode: str) -> dict[str, str]:
        schema = model.model_json_schema(ref_template=REF, mode=mode)
        for name, nested in schema.pop("$defs", {}).items():
            self._add(name, nested)
        name = model.model_config.get("title") or model.__name__
        self._add(name, schema)
        return {"$ref": REF.format(model=name)}

    def inline(self, model: type[BaseModel], mode: str) -> dict[str, Any]:
        """The model's schema itself (its nested models as components)."""
        schema = model.model_json_schema(ref_template=REF, mode=mode)
        for name, nested in schema.pop("$defs", {}).items():
            self._add(name, nested)
        return schema

    def _add(self, name: str, schema: dict[str, Any]) -> None:
        if self.schemas.setdefault(name, schema) != schema:
            raise ValueError(f"two different schemas are both named {name}; rename one of the models")


def build(app: Flask) -> dict[str, Any]:
    components = _Components()
    error = components.ref(ErrorBody, "serialization")
    paths: dict[str, dict[str, Any]] = {}
    for rule in api_rules(app):
        view = app.view_functions[rule.endpoint]
        declared: Declared | None = getattr(view, "openapi", None)
        if declared is None:
            continue  # tests/api/test_openapi.py fails on a route missing from the document
        path = _openapi_path(rule)
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            paths.setdefault(path, {})[method.lower()] = _operation(rule, view, declared, components, error)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": TITLE,
            "version": VERSION,
            "description": (
                "The approval desk's JSON API. Send a token as `Authorization: Bearer <token>` (people make "
                "them on the API tokens page). Request bodies and query parameters are strict and closed: a "
                "field the endpoint does not take, or a value of the wrong type, is a 422 naming it. Every "
                "error is `{error, message}` with a 4xx status."
            ),
        },
        # where the desk is (PUBLIC_URL): generated clients and schema tools take their base address from it
        "servers": [{"url": app.extensions["desk"].config.public_url, "description": "This desk."}],
        "paths": paths,
        "webhooks": {
            event_type: {
                "post": {
                    "operationId": event_type.replace(".", "_"),
                    "summary": EVENT_TYPES[event_type],
                    "description": (
                        "Sent to each webhook subscribed to it (POST /api/webhooks), signed as the Standard "
                        "Webhooks specification says: headers webhook-id (the same at every attempt), "
                        "webhook-timestamp and webhook-signature (v1,<base64>); verify with the "
                        "`standardwebhooks` library and the webhook's whsec_ secret. Retried until a 2xx, "
                        "for about a day; a conversation's events arrive in order."
                    ),
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": components.ref(model, "serialization")}},
                    },
                    "responses": {"2XX": {"description": "Received."}},
                    "security": [],
                }
            }
            for event_type, model in EVENT_MODELS.items()
        },
        "components": {
            "schemas": dict(sorted(components.schemas.items())),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API token of a person; what it may do follows the person's roles.",
                }
            },
        },
        "security": [{"bearer": []}],
    }


def _openapi_path(rule: Rule) -> str:
    return re.sub(r"<(?:[^<>:]+:)?([^<>]+)>", r"{\1}", rule.rule)


def _operation(rule: Rule, view: Callable, declared: Declared, components: _Components, error: dict) -> dict[str, Any]:
    roles = getattr(view, "allowed_roles", None)
    operation: dict[str, Any] = {
        "operationId": rule.endpoint.removeprefix("api."),
        "summary": declared.summary,
        "tags": [rule.rule.removeprefix("/api/").split("/")[0]],
    }
    description = " ".join((view.__doc__ or "").split())
    if roles == "public":
        operation["security"] = []
        description = (description + " No token needed.").strip()
    elif roles:
        who = "anyone with a token" if set(roles) == set(ROLES) else f"people with the {' or '.join(roles)} role"
        description = (description + f" For {who}.").strip()
    if description:
        operation["description"] = description

    parameters = [_path_parameter(rule, name) for name in _path_arguments(rule)]
    if declared.query is not None:
        parameters += _query_parameters(declared.query, components)
    if parameters:
        operation["parameters"] = parameters
    if declared.body is not None:
        operation["requestBody"] = {
            "required": declared.body_required,
            "content": {"application/json": {"schema": components.ref(declared.body, "validation")}},
        }

    responses: dict[str, Any] = {}
    for status, model in declared.responses.items():
        schema = components.ref(model, "serialization") if model is not None else {"type": "object"}
        responses[str(status)] = {
            "description": (model.__doc__ or "").strip().split("\n")[0] if model is not None else "A JSON object.",
            "content": {"application/json": {"schema": schema}},
        }
    if declared.stream is not None:
        responses["200"] = {
            "description": declared.stream,
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        }
    for status, text in sorted(_errors(rule, roles, declared).items()):
        responses[str(status)] = {"description": text, "content": {"application/json": {"schema": error}}}
    operation["responses"] = responses
    return operation


def _errors(rule: Rule, roles: Any, declared: Declared) -> dict[int, str]:
    """The refusals a route may answer, by status: those that follow from its shape, then its own."""
    errors: dict[int, str] = {}
    if roles and roles != "public":
        errors[401] = "unauthorized: no token, or one that is unknown, expired or revoked."
        if set(roles) != set(ROLES):
            errors[403] = "forbidden: the token's person does not hold a role this call needs."
    if rule.arguments:
        errors[404] = "not_found: nothing of your organisation has that number."
    if declared.body is not None:
        errors[400] = "invalid_json: the body is not a JSON object."
        errors[413] = "too_large: the body is larger than the desk accepts."
    if declared.body is not None or declared.query is not None:
        errors[422] = (
            "invalid_field: a field the call does not take, or a value of the wrong type; `fields` names each."
        )
    for status, text in declared.errors.items():
        errors[status] = f"{errors[status]} {text}" if status in errors else text
    return errors


def _path_arguments(rule: Rule) -> list[str]:
    return re.findall(r"<(?:[^<>:]+:)?([^<>]+)>", rule.rule)


def _path_parameter(rule: Rule, name: str) -> dict[str, Any]:
    converter = rule._converters[name]  # werkzeug keeps no public map of a rule's converters
    schema: dict[str, Any] = {"type": "string"}
    if isinstance(converter, IntegerConverter):  # an id: the app answers 404 outside this range
        schema = {"type": "integer", "minimum": 1, "maximum": MAX_ID}
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _query_parameters(model: type[QueryParameters], components: _Components) -> list[dict[str, Any]]:
    schema = components.inline(model, "validation")
    required = set(schema.get("required", []))
    parameters = []
    for name, prop in schema["properties"].items():
        prop = dict(prop)
        description = prop.pop("description", None)
        prop.pop("title", None)
        prop.pop("default", None)
        if "anyOf" in prop:  # an optional parameter is left out, never sent as null
            kept = [branch for branch in prop.pop("anyOf") if branch.get("type") != "null"]
            prop.update(kept[0] if len(kept) == 1 else {"anyOf": kept})
        parameter = {"name": name, "in": "query", "required": name in required, "schema": prop}
        if description:
            parameter["description"] = description
        parameters.append(parameter)
    return parameters
