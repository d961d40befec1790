"""What every door of the JSON API shares: the one blueprint (/api), what a route declares of itself
for the OpenAPI document (`@documented`), the answer envelope, the errors as {"error", "message"}
(with "fields" when a request's fields are wrong), and the caller's tools. Beside it: bodies.py (what
request and answer bodies are made of), reading.py (reading a request, refusing it), paging.py.

Each resource's module (conversations.py, approvals.py, ...) holds its routes and its bodies; routes.py
lists them, so registering `bp` registers every route."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from flask import Blueprint, current_app, g, jsonify
from pydantic import BaseModel
from werkzeug.exceptions import HTTPException

from webapp.api.bodies import QueryParameters, RequestBody
from webapp.api.reading import InvalidFields
from webapp.approvals import actions as approvals
from webapp.approvals import outside as outside_actions
from webapp.refusals import Refusal
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.tools.registry import ToolRegistry
from webapp.web.errors import Refused, json_error, status_of

bp = Blueprint("api", __name__, url_prefix="/api")
OTHER_AGENTS = "forbidden: the conversation is another agent's."


@dataclass(frozen=True)
class Declared:
    """What a route of the API takes and answers, as its `@documented` says."""

    summary: str
    responses: Mapping[int, type[BaseModel] | None]
    body: type[RequestBody] | None = None
    body_required: bool = True
    query: type[QueryParameters] | None = None
    errors: Mapping[int, str] = field(default_factory=dict)
    stream: str | None = None  # a 200 that is a stream of server-sent events: what it sends


def documented(
    summary: str,
    *,
    responses: Mapping[int, type[BaseModel] | None],
    body: type[RequestBody] | None = None,
    body_required: bool = True,
    query: type[QueryParameters] | None = None,
    errors: Mapping[int, str] | None = None,
    stream: str | None = None,
) -> Callable:
    """Record a route's request and response models on the view, which is returned unchanged. A response
    model of None is any JSON object. `errors` are the route's own refusals, by status, in words."""

    def decorate(view: Callable) -> Callable:
        view.openapi = Declared(summary, dict(responses), body, body_required, query, dict(errors or {}), stream)
        return view

    return decorate


def answer(view: BaseModel, status: int = 200):
    """A response body model as JSON."""
    return jsonify(view.model_dump(mode="json")), status


def refused_with_fields(status: int, code: str, message: str, fields: list[dict[str, str]]):
    """An error that names the request fields to change, for programs."""
    return jsonify(error=code, message=message, fields=fields), status


@bp.errorhandler(InvalidFields)
def _invalid_fields(exc: InvalidFields):
    db.session.rollback()
    return answer(exc.view(), status_of(exc))


@bp.errorhandler(Refusal)
def _api_error(exc: Refused):
    db.session.rollback()
    if isinstance(exc, approvals.EditRefused | outside_actions.OutsideRefused):  # what to change, for programs
        fields = [{"field": f"input.{name}" if name else "input", "problem": p} for name, p in exc.problems.items()]
        if not fields and getattr(exc, "field", None):
            fields = [{"field": exc.field, "problem": exc.message}]
        if fields:
            return refused_with_fields(status_of(exc), exc.code, exc.message, fields)
    return json_error(status_of(exc), exc.code, exc.message)


@bp.errorhandler(HTTPException)
def _http_error(exc: HTTPException):
    db.session.rollback()
    messages = {
        400: ("bad_request", "The request could not be read; send a JSON object."),
        404: ("not_found", "There is no such resource."),
        405: ("method_not_allowed", "This URL does not accept that method."),
        413: ("too_large", "The request body is too large."),
    }
    code, message = messages.get(exc.code, ("http_error", exc.description or "Request failed."))
    return json_error(exc.code or 500, code, message)


@bp.errorhandler(Exception)
def _unexpected(exc: Exception):
    db.session.rollback()
    current_app.logger.exception("unexpected API error")
    return json_error(500, "internal_error", "Something went wrong on our side; nothing was changed.")


def tenant_tools() -> ToolRegistry:
    """The tools of the caller's tenant (built-in and MCP): what a call's sentence is read from."""
    return services().tools_for(db.session, g.user.tenant_id)
