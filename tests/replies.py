"""Scripted model replies for tests: Messages API response dicts, built readably."""

from __future__ import annotations

import itertools

_ids = itertools.count(1)


def text(value: str) -> dict:
    return {"type": "text", "text": value}


def tool_use(name: str, tool_input: dict, tool_use_id: str | None = None) -> dict:
    return {
        "type": "tool_use",
        "id": tool_use_id or f"toolu_test_{next(_ids)}",
        "name": name,
        "input": tool_input,
    }


def reply(*blocks: dict, stop_reason: str | None = None) -> dict:
    """An assistant reply; stop_reason defaults to tool_use when it asks for tools, else end_turn."""
    if stop_reason is None:
        stop_reason = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    return {
        "id": f"msg_test_{next(_ids)}",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": list(blocks),
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 100,
            "output_tokens": 20,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 80,
        },
    }
