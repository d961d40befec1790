"""Turning persisted message rows into a Messages API transcript.

Rows are append-only. Consecutive rows of one role form one API message (a new question after a
cancelled round joins the round's tool results; a pause_turn continuation joins its assistant
turn), so the transcript always alternates roles.
"""

from __future__ import annotations

from collections.abc import Iterable

from webapp.models import Message


def api_messages(rows: Iterable[Message]) -> list[dict]:
    """The conversation as the Messages API wants it: alternating roles, tool results first."""
    merged: list[dict] = []
    for row in rows:
        blocks = [dict(block) for block in row.content]
        if merged and merged[-1]["role"] == row.role:
            merged[-1]["content"].extend(blocks)
        else:
            merged.append({"role": row.role, "content": blocks})
    for message in merged:
        if message["role"] == "user":
            # tool_result blocks must lead their user message
            message["content"].sort(key=lambda block: block.get("type") != "tool_result")
    return merged


def tool_uses(content: list[dict]) -> list[dict]:
    return [block for block in content if block.get("type") == "tool_use"]
