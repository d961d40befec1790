"""Answering htmx and plain requests from one rendering path.

One rule for every page: a page template includes its fragments, and a request htmx made gets the
fragment alone (`render`). htmx restoring its history asks with HX-Request too and needs the whole
page. A refused change answers htmx with its fragment re-rendered and the refusal's status: the
base template's htmx config swaps 409 and 422 (what a person can fix right there) and leaves the
page as it was for other errors; a plain form post gets the message flashed and a 303 back."""

from __future__ import annotations

from flask import Response, flash, redirect, render_template
from htmx_flask import make_response, request

from webapp.web.errors import Refused, status_of
from webapp.web.rendering import page_words


def is_htmx() -> bool:
    """Whether htmx asked for a fragment (not a history restore, which needs the page)."""
    return bool(request.htmx) and not request.htmx.history_restore_request


def render(page: str, fragment: str, status: int = 200, **context) -> Response:
    """The page, or for htmx only its fragment; caches keep the two apart (Vary: HX-Request)."""
    response = Response(render_template(fragment if is_htmx() else page, **context), status)
    response.vary.add("HX-Request")
    return response


def refused(exc: Refused, fragment, back_to: str) -> Response:
    """A refused change: for htmx, `fragment(status)` with the message flashed into it; else the
    message flashed and a redirect to `back_to`."""
    flash(page_words(exc), "error")
    if is_htmx():
        return fragment(status_of(exc))
    return redirect(back_to, code=303)


def go_to(url: str) -> Response:
    """Move on to another page after a change: htmx loads it as a whole page (HX-Redirect), so every
    panel on it is fresh; a plain form post gets a 303."""
    if is_htmx():
        return make_response("", 200, redirect=url)
    return redirect(url, code=303)
