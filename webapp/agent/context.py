"""Keeping a conversation inside the model's context window.

Before every model call the loop weighs the request against the window (CONTEXT_WINDOW_TOKENS, less
the reply's MAX_TOKENS): a local estimate, and the API's own count (`messages.count_tokens`) once the
estimate comes near the line. Past COMPACT_AT of that room, the move summarises the older turns
instead of answering: the model writes a summary of everything before a turn boundary (so a
tool_use is never parted from its tool_result), the summary becomes a row of its own, and from then
on the model is sent the summary, then the turns after it verbatim. Summarising works with any
Anthropic-compatible endpoint: the older turns go to the model as plain text in one user message.

When nothing older is left to summarise (one long turn), the oldest tool results of the request are
cleared to a short stub, the way the API's clear_tool_uses does, and only when even that does not fit
does the move fail, with a sentence that says what to do.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from webapp.agent import wording
from webapp.agent.transcript import api_messages

CHARS_PER_TOKEN = 4  # the local estimate: about four characters of the request's JSON per token
COUNT_ABOVE = 0.6  # share of the compaction threshold past which the API counts the tokens itself
CLEARED = "[This tool result was cleared to save room in the context window: {chars:,} characters.]"
SHORT_RESULT = 600  # characters of a tool result that the summary request keeps


@dataclass(frozen=True)
class Window:
    """The model's context window and when to summarise."""

    tokens: int  # CONTEXT_WINDOW_TOKENS
    max_tokens: int  # the reply's room (MAX_TOKENS)
    compact_at: float = 0.7  # COMPACT_AT: share of the room past which older turns are summarised
    keep: float = 0.3  # share of the room that the newest turns, kept verbatim, may take

    @property
    def room(self) -> int:
        """What the request may take: the window less the reply's room."""
        return self.tokens - self.max_tokens

    @property
    def threshold(self) -> int:
        return int(self.room * self.compact_at)


def estimate(request: dict) -> int:
    """The request's size in tokens, estimated from its JSON (no network)."""
    return len(json.dumps(request, ensure_ascii=False)) // CHARS_PER_TOKEN


def measure(request: dict, window: Window, count: Callable[[dict], int | None]) -> int:
    """The request's size: the estimate, or the API's count once the estimate nears the threshold
    (`count` returns None when the endpoint cannot count; the estimate stands then)."""
    guess = estimate(request)
    if guess < window.threshold * COUNT_ABOVE:
        return guess
    counted = count(request)
    return guess if counted is None else counted


def turn_starts(rows: Sequence) -> list[int]:
    """Indices of the rows that start a turn: a person's words, not tool results. Cutting there never
    parts a tool_use from its tool_result."""
    return [
        i
        for i, row in enumerate(rows)
        if row.role == "user" and not any(block.get("type") == "tool_result" for block in row.content)
    ]


def cut_point(rows: Sequence, window: Window) -> int | None:
    """Where to cut: the index of the first row kept verbatim. The newest turns are kept while they fit
    in `window.keep` of the room (always at least the newest turn); None when there is no older turn
    to summarise."""
    starts = [i for i in turn_starts(rows) if i > 0]
    if not starts:
        return None
    budget = window.room * window.keep
    cut = starts[-1]
    for i in reversed(starts[:-1]):
        if estimate({"messages": api_messages(rows[i:])}) > budget:
            break
        cut = i
    return cut


def summary_request(summary: str | None, rows: Sequence, window: Window) -> tuple[dict, int]:
    """The request that asks the model to summarise `rows` (after the previous summary, if any), as
    plain text in one user message, and how many of the rows it covers: as many of the oldest as fit
    the room (a long history is summarised over several moves)."""
    parts = [f"<previous_summary>\n{summary}\n</previous_summary>"] if summary else []
    covered = 0
    for row in rows:
        text = _as_text(row)
        draft = _summary_body(parts + [text])
        if covered and estimate(draft) > window.room:
            break
        parts.append(text)
        covered += 1
    return _summary_body(parts), covered


def clear_old_results(request: dict, window: Window, count: Callable[[dict], int]) -> dict | None:
    """The request with its oldest tool results cleared to a stub, oldest first, until it fits the
    room; None if it does not fit even with all but the newest round's results cleared."""
    messages = json.loads(json.dumps(request["messages"]))
    results = [
        block
        for message in messages[:-1]  # the newest message holds the round the model must answer
        if message["role"] == "user"
        for block in message["content"]
        if block.get("type") == "tool_result" and len(str(block.get("content", ""))) > len(CLEARED) + 40
    ]
    for block in results:
        block["content"] = CLEARED.format(chars=len(str(block["content"])))
        trimmed = {**request, "messages": messages}
        if count(trimmed) <= window.room:
            return trimmed
    return None


def with_summary(summary: str | None, rows: Sequence) -> list[dict]:
    """The transcript the model is sent: the summary of the older turns as the first user words, then
    the rows after it."""
    messages = api_messages(rows)
    if summary is None:
        return messages
    block = {"type": "text", "text": wording.SUMMARY_INTRO.format(summary=summary)}
    if messages and messages[0]["role"] == "user":
        messages[0]["content"].insert(0, block)  # (tool results would lead: rows start at a turn)
        return messages
    return [{"role": "user", "content": [block]}, *messages]


def _summary_body(parts: list[str]) -> dict:
    text = "<conversation_to_summarise>\n" + "\n\n".join(parts) + "\n</conversation_to_summarise>"
    return {
        "system": [{"type": "text", "text": wording.SUMMARY_PROMPT}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
    }


def _as_text(row) -> str:
    """One row as the summary request shows it: who said what, the tool calls and their results."""
    lines = []
    for block in row.content:
        kind = block.get("type")
        if kind == "text" and block.get("text", "").strip():
            who = "Support agent" if row.role == "user" else "Assistant"
            lines.append(f"{who}: {block['text'].strip()}")
        elif kind == "tool_use":
            lines.append(f"Assistant called {block['name']}({json.dumps(block.get('input') or {})})")
        elif kind == "tool_result":
            content = block.get("content")
            text = content if isinstance(content, str) else json.dumps(content)
            if len(text) > SHORT_RESULT:
                text = text[:SHORT_RESULT] + f" [... {len(text) - SHORT_RESULT:,} more characters]"
            lines.append(f"Tool result{' (error)' if block.get('is_error') else ''}: {text}")
    return "\n".join(lines)
