"""JSON errors with a stable code and a human message."""

from __future__ import annotations

from datetime import datetime

from flask import jsonify, render_template, request
from flask_wtf.csrf import CSRFError
from markupsafe import Markup, escape
from werkzeug.exceptions import HTTPException

from webapp.runtime.extensions import db
from webapp.tools.presenting import at_moment
from webapp.web.rendering import when


class Refused(Exception):
    """A request that cannot be honoured: an HTTP status, a stable `code` for the API, and a
    `message` that tells a person what happened and what to do. A `words` with "{at}" names the
    moment `at`: the exact UTC time in `message` (the API's), the viewer's own time in `page_words`."""

    def __init__(self, status: int, code: str, words: str, at: datetime | None = None) -> None:
        self.status, self.code, self.words, self.at = status, code, words, at
        self.message = at_moment(words, at)
        super().__init__(self.message)

    def page_words(self) -> str | Markup:
        """The message for a page, its moment shown like every other time on the page."""
        if self.at is None:
            return self.message
        before, _, after = self.words.partition("{at}")
        return escape(before) + when(self.at, seconds=True, relative=False) + escape(after)


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
