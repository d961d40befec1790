"""What a feature refuses a person, in plain Python: no request, no HTTP.

Each feature raises its own subclass of `Refusal` (`ConversationRefused`, `ApprovalRefused`,
`AccountRefused`, `SettingsRefused`, `RunRefused`, ...) with a `kind` (what sort of refusal it is), a
stable `code` for programs and `words` for people. The pages, the API and the command line translate
it: the web answers `webapp.web.errors.STATUS[kind]`, the command line prints the message.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

Kind = Literal[
    "missing", "forbidden", "invalid", "conflict", "too_many", "unavailable", "bad_request", "unauthenticated"
]
KINDS: frozenset[str] = frozenset(Kind.__args__)


def at_moment(words: str, at: datetime | None) -> str:
    """A sentence whose "{at}" is a moment, for the API and the command line: the exact UTC time. Pages
    show the same sentence with the moment in the viewer's own time (web.rendering.page_words)."""
    return words.replace("{at}", at.strftime("%Y-%m-%d %H:%M:%S UTC")) if at is not None else words


class Refusal(Exception):
    """A change or a read that cannot be honoured: its `kind` (missing, forbidden, invalid, conflict,
    too_many, unavailable, bad_request, unauthenticated), a stable `code` for the API, and a `message` that
    tells a person what happened and what to do. A `words` with "{at}" names the moment `at`: the exact
    UTC time in `message`, the viewer's own time on pages."""

    def __init__(self, kind: Kind, code: str, words: str, at: datetime | None = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"A refusal's kind is one of {', '.join(sorted(KINDS))}, not {kind!r}.")
        self.kind, self.code, self.words, self.at = kind, code, words, at
        self.message = at_moment(words, at)
        super().__init__(self.message)
