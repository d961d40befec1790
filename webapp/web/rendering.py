"""Turning untrusted text into safe HTML: assistant Markdown through a real Markdown parser and an
allow-list sanitizer; everything else (tool arguments, tool results, people's text) is escaped.
Tool calls in words for people are webapp/conversations/cards.py's."""

from __future__ import annotations

import json

import nh3
from markdown_it import MarkdownIt
from markupsafe import Markup

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


def register(app) -> None:
    app.jinja_env.filters["markdown"] = markdown
    app.jinja_env.filters["pretty_json"] = pretty_json
