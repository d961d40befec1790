"""Turning untrusted text into safe HTML: assistant Markdown through a real Markdown parser and an
allow-list sanitizer; everything else (tool arguments, tool results, people's text) is escaped.
Tool calls in words for people are webapp/conversations/cards.py's."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import nh3
from markdown_it import MarkdownIt
from markupsafe import Markup, escape

from webapp.refusals import Refusal
from webapp.tools.presenting import plural, shorten

_markdown = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False}).enable("table")

ALLOWED_TAGS = {
    "p", "br", "strong", "em", "code", "pre", "blockquote", "ul", "ol", "li", "a", "h1", "h2", "h3", "h4",
    "table", "thead", "tbody", "tr", "th", "td", "hr",
}  # fmt: skip
ALLOWED_ATTRIBUTES = {"a": {"href", "title"}, "th": {"align"}, "td": {"align"}}


def markdown(text: str) -> Markup:
    """Assistant Markdown as sanitized HTML: no raw HTML, no scripts, only http(s) and mailto links."""
    html = _markdown.render(text or "")
    return Markup(
        nh3.clean(
            html,
            tags=ALLOWED_TAGS,
            attributes=ALLOWED_ATTRIBUTES,
            url_schemes={"http", "https", "mailto"},
            link_rel="noopener noreferrer nofollow",
        )
    )


def pretty_json(value: object) -> str:
    """Tool arguments for people: indented JSON (escaped by the template like any text)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def when(moment: datetime | None, seconds: bool = False, relative: bool = True) -> Markup:
    """A moment for people: the exact UTC time in a <time> element, which static/js/times.js turns
    into "3 min ago" with the exact time in the viewer's time zone on hover (relative=False: into the
    exact time in the viewer's time zone, for sentences like "decided at ...", with seconds only when
    `seconds`). Every time a page shows goes through here, so one card never mixes "2:19 PM" with
    "14:19 UTC". Naive values are UTC."""
    if moment is None:
        return Markup('<span class="muted">never</span>')
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    exact = moment.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")
    iso = moment.isoformat(timespec="seconds").replace("+00:00", "Z")
    kind = Markup("data-relative" if relative else "data-local" + (" data-seconds" if seconds else ""))
    return Markup('<time datetime="{}" {} title="{} UTC">{} UTC</time>').format(escape(iso), kind, exact, exact)


def page_words(refusal: Refusal) -> str | Markup:
    """A refusal's message for a page, its moment shown like every other time on the page."""
    if refusal.at is None:
        return refusal.message
    before, _, after = refusal.words.partition("{at}")
    return escape(before) + when(refusal.at, seconds=True, relative=False) + escape(after)


def register(app) -> None:
    app.jinja_env.filters["markdown"] = markdown
    app.jinja_env.filters["pretty_json"] = pretty_json
    app.jinja_env.filters["when"] = when
    app.jinja_env.filters["shorten"] = shorten
    app.jinja_env.filters["page_words"] = page_words
    app.jinja_env.globals["plural"] = plural
