"""JSON errors with a stable code and a human message."""

from __future__ import annotations

from flask import jsonify, render_template, request
from flask_wtf.csrf import CSRFError
from werkzeug.exceptions import HTTPException

from webapp.runtime.extensions import db


class Refused(Exception):
    """A request that cannot be honoured: an HTTP status, a stable `code` for the API, and a
    `message` that tells a person what happened and what to do."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


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
