"""JSON errors with a stable code and a human message."""

from __future__ import annotations

from datetime import datetime

from flask import jsonify, render_template, request
from flask_wtf.csrf import CSRFError
from werkzeug.exceptions import HTTPException

from webapp.refusals import Refusal
from webapp.runtime.extensions import db

STATUS: dict[str, int] = {
    "missing": 404,
    "forbidden": 403,
    "invalid": 422,
    "conflict": 409,
    "too_many": 429,
    "unavailable": 503,
    "bad_request": 400,
    "unauthenticated": 401,
}
KIND_OF_STATUS = {status: kind for kind, status in STATUS.items()}


class Refused(Refusal):
    """A refusal the web layer raises itself (the pages, the API's doors, the sign-in), named by its HTTP
    status; the features raise their own `Refusal` subclasses, by kind."""

    def __init__(self, status: int, code: str, words: str, at: datetime | None = None) -> None:
        super().__init__(KIND_OF_STATUS[status], code, words, at)


def status_of(refusal: Refusal) -> int:
    """The HTTP status that answers a refusal."""
    return STATUS[refusal.kind]


def json_error(status: int, code: str, message: str):
    response = jsonify(error=code, message=message)
    response.status_code = status
    return response


def register(app) -> None:
    """Unmatched /api URLs and unexpected errors answer in JSON or a plain page, never a traceback."""

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException):
        if request.path.startswith("/api/"):
            return json_error(exc.code or 500, exc.name.lower().replace(" ", "_"), exc.description or exc.name)
        message = exc.description
        if isinstance(exc, CSRFError):
            message = "This form expired or came from another site. Reload the page and try again."
        return render_template("error.html", title=exc.name, message=message), exc.code

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        db.session.rollback()
        app.logger.exception("unexpected error")
        if request.path.startswith("/api/"):
            return json_error(500, "internal_error", "Something went wrong on our side; nothing was changed.")
        message = "Something went wrong on our side; nothing was changed. Try again, or tell an admin."
        return render_template("error.html", title="Something went wrong", message=message), 500
