"""The offline demo model's context window: token counting, the prompt cache, and summaries.

- count(): a request's input tokens, about four characters of its JSON per token (the same rule the
  desk's own estimate uses, so the demo's count_tokens and its estimate agree);
- PromptCache: what the API's prompt cache would read and write for a request, from its cache
  breakpoints (a prefix up to a breakpoint seen in the last five minutes is read, the rest written);
- summarise(): the answer to a summary request (the older turns as plain text between
  <conversation_to_summarise> tags): every line a person wrote kept whole, the assistant's and the
  tools' lines cut short, so that names, amounts and codes a person stated survive as they were.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time

CACHE_SECONDS = 300  # the API's ephemeral cache lives five minutes from its last use
LOOKBACK = 20  # blocks before a breakpoint where the API also looks for a cached prefix
SUMMARY_TAG = "<conversation_to_summarise>"
_KEPT = {"Support agent": 400, "Assistant": 160, "Tool result": 160, "Tool result (error)": 160}


def count(body: dict) -> int:
    """The request's input tokens: its system prompt, tools and messages."""
    sent = {key: body[key] for key in ("system", "tools", "messages") if body.get(key) is not None}
    return len(json.dumps(sent, ensure_ascii=False)) // 4


def too_long(body: dict, window: int) -> str | None:
    """The API's words when the request and its reply's room exceed the window; None when it fits."""
    tokens = count(body) + int(body.get("max_tokens") or 0)
    if tokens <= window:
        return None
    return f"prompt is too long: {tokens} tokens > {window} maximum"


def is_summary_request(body: dict) -> bool:
    messages = body.get("messages") or []
    first = messages[0].get("content") if messages and isinstance(messages[0], dict) else None
    text = first[0].get("text", "") if isinstance(first, list) and first and isinstance(first[0], dict) else first
    return isinstance(text, str) and text.startswith(SUMMARY_TAG)


def summarise(body: dict) -> str:
    """A summary of the conversation in a summary request, previous summary first."""
    text = body["messages"][0]["content"]
    text = text if isinstance(text, str) else text[0]["text"]
    text = text.removeprefix(SUMMARY_TAG).rsplit("</conversation_to_summarise>", 1)[0]
    kept = []
    if "<previous_summary>" in text:
        previous, text = text.split("</previous_summary>", 1)
        kept.append(previous.split("<previous_summary>", 1)[1].strip())
    for line in text.splitlines():
        who, _, said = line.partition(": ")
        limit = _KEPT.get(who)
        if limit is None or not said.strip():
            continue
        said = " ".join(said.split())
        kept.append(f"{who}: {said if len(said) <= limit else said[:limit].rstrip() + '...'}")
    return "\n".join(kept) or "Nothing of note was said."


class PromptCache:
    """The prompt cache of one demo endpoint (shared by its threads)."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def usage(self, body: dict, output_tokens: int) -> dict:
        """The usage block of a reply to `body`: input tokens split into read from the cache, written
        to it, and neither, the way the API splits them."""
        total = count(body)
        boundaries = _boundaries(body)
        breakpoints = [i for i, (_, _, marked) in enumerate(boundaries) if marked]
        # A hit may end at any block up to LOOKBACK blocks before a breakpoint, as the API looks back.
        candidates = {j for i in breakpoints for j in range(max(0, i - LOOKBACK), i + 1)}
        now = time.monotonic()
        with self._lock:
            self._seen = {key: seen for key, seen in self._seen.items() if now - seen < CACHE_SECONDS}
            read = max((boundaries[j][1] for j in candidates if boundaries[j][0] in self._seen), default=0)
            written = max((boundaries[i][1] for i in breakpoints), default=0)
            for i in breakpoints:
                self._seen[boundaries[i][0]] = now
        read, written = min(read, total), min(max(read, written), total)
        return {
            "input_tokens": max(1, total - written),
            "output_tokens": max(1, output_tokens),
            "cache_read_input_tokens": read,
            "cache_creation_input_tokens": written - read,
        }


def _boundaries(body: dict) -> list[tuple[str, int, bool]]:
    """For each block of the request, in the API's order (the tools, the system prompt, then the
    messages' blocks): the digest of the prefix ending with it, that prefix's tokens, and whether
    the block is a cache breakpoint. Where the breakpoints sit does not change a prefix."""
    blocks: list[dict] = [tool for tool in body.get("tools") or [] if isinstance(tool, dict)]
    system = body.get("system")
    blocks += system if isinstance(system, list) else []
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            blocks += [{"role": message["role"], **block} for block in content if isinstance(block, dict)]
    digest, chars, boundaries = hashlib.sha256(), 0, []
    for block in blocks:
        text = json.dumps({k: v for k, v in block.items() if k != "cache_control"}, sort_keys=True, ensure_ascii=False)
        digest.update(text.encode())
        chars += len(text)
        boundaries.append((digest.hexdigest(), chars // 4, bool(block.get("cache_control"))))
    return boundaries
