"""The Messages API wire format, offline: request checks, SSE encoding and a demo httpx2 transport.

DemoTransport sits beneath the real `anthropic` SDK, so the SDK builds every request and parses every
response and stream exactly as it would against api.anthropic.com. validate_request applies the rules
the real API enforces on a request body, so a malformed conversation fails here as it would there.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx2

from demo.model import batches, context, engine, react, routing

Responder = Callable[[dict], dict]

KNOWN_BLOCK_TYPES = frozenset(
    {
        "text",
        "image",
        "document",
        "search_result",
        "thinking",
        "redacted_thinking",
        "tool_use",
        "tool_result",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "container_upload",
    }
)
MAX_CACHE_BREAKPOINTS = 4
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_ID_PATTERN = re.compile(r"^[a-zA-Z0-9_-]+$")
_TOOL_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")


# --- request validation ---------------------------------------------------------------------------


def validate_request(body: dict) -> list[str]:
    """Problems that would make the real Messages API reject this body with a 400; empty when valid."""
    if not isinstance(body, dict):
        return ["request body must be a JSON object"]
    problems: list[str] = []
    if not isinstance(body.get("model"), str) or not body["model"]:
        problems.append("model: Field required")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        problems.append("max_tokens: Field required (an integer of at least 1)")
    problems += _system_problems(body.get("system"))
    problems += _tools_problems(body.get("tools"))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        problems.append("messages: Field required (a non-empty list)")
    else:
        problems += _messages_problems(messages)
    breakpoints = _count_cache_breakpoints(body)
    if breakpoints > MAX_CACHE_BREAKPOINTS:
        problems.append(
            f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. Found {breakpoints}."
        )
    return problems


def _system_problems(system: Any) -> list[str]:
    if system is None or isinstance(system, str):
        return []
    if not isinstance(system, list):
        return ["system: Input should be a string or a list of text blocks"]
    return [
        f"system.{i}: system blocks must be non-empty text blocks"
        for i, block in enumerate(system)
        if not isinstance(block, dict) or block.get("type") != "text" or not block.get("text")
    ]


def _tools_problems(tools: Any) -> list[str]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        return ["tools: Input should be a list"]
    problems, seen = [], set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            problems.append(f"tools.{i}: Input should be an object")
            continue
        name = tool.get("name")
        if not isinstance(name, str) or not _TOOL_NAME_PATTERN.match(name):
            problems.append(f"tools.{i}.name: String should match pattern '{_TOOL_NAME_PATTERN.pattern}'")
        elif name in seen:
            problems.append(f"tools: Tool names must be unique. Found duplicate: {name}")
        seen.add(name)
        is_custom = tool.get("type") in (None, "custom")
        if is_custom and not isinstance(tool.get("input_schema"), dict):
            problems.append(f"tools.{i}.custom.input_schema: Field required")
    return problems


def _messages_problems(messages: list) -> list[str]:
    problems: list[str] = []
    tool_use_ids: set[str] = set()
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            problems.append(f"{where}.role: Input should be 'user' or 'assistant'")
            continue
        role, content = message["role"], message.get("content")
        is_final = i == len(messages) - 1
        if i == 0 and role != "user":
            problems.append(f'{where}: first message must use the "user" role')
        if i > 0 and isinstance(messages[i - 1], dict) and messages[i - 1].get("role") == role:
            problems.append(
                f'messages: roles must alternate between "user" and "assistant", but found '
                f'multiple "{role}" roles in a row at {where}'
            )
        problems += _content_problems(where, role, content, is_prefill=is_final and role == "assistant")
        for block in _blocks(content):
            if block.get("type") == "tool_use":
                block_id = block.get("id")
                if not isinstance(block_id, str) or not _ID_PATTERN.match(block_id):
                    problems.append(f"{where}: tool_use id {block_id!r} must match ^[a-zA-Z0-9_-]+$")
                elif block_id in tool_use_ids:
                    problems.append(f"{where}: `tool_use` ids must be unique, found {block_id} twice")
                tool_use_ids.add(block_id)
    problems += _pairing_problems(messages)
    return problems


def _content_problems(where: str, role: str, content: Any, is_prefill: bool) -> list[str]:
    if not isinstance(content, str | list):
        return [f"{where}.content: Input should be a string or a list of content blocks"]
    if not content and not is_prefill:
        return [f"{where}: all messages must have non-empty content except for the optional final assistant message"]
    texts = (
        [content] if isinstance(content, str) else [b.get("text") for b in _blocks(content) if b.get("type") == "text"]
    )
    problems = []
    if is_prefill and texts and isinstance(texts[-1], str) and texts[-1] != texts[-1].rstrip():
        problems.append(f"{where}: final assistant content cannot end with trailing whitespace")
    if isinstance(content, str):
        return problems
    for j, block in enumerate(content):
        at = f"{where}.content.{j}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in KNOWN_BLOCK_TYPES:
            problems.append(f"{at}: unknown content block type {kind!r}")
        elif kind == "text" and (not isinstance(block.get("text"), str) or not block["text"]):
            problems.append(f"{at}: text content blocks must be non-empty")
        elif kind == "tool_use" and role != "assistant":
            problems.append(f"{at}: tool_use blocks may only appear in assistant messages")
        elif kind == "tool_use" and (not isinstance(block.get("input"), dict) or not block.get("name")):
            problems.append(f"{at}: tool_use blocks need a name and an object input")
        elif kind == "tool_result" and role != "user":
            problems.append(f"{at}: tool_result blocks may only appear in user messages")
    return problems


def _pairing_problems(messages: list) -> list[str]:
    """Every tool_use answered in the very next user message, results first, and no orphan results."""
    problems = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        blocks = _blocks(message.get("content"))
        if message.get("role") == "assistant":
            asked = [b.get("id") for b in blocks if b.get("type") == "tool_use"]
            if not asked:
                continue
            if i == len(messages) - 1:
                problems.append(
                    f"messages.{i}: the final assistant message may not contain tool_use blocks; "
                    f"send their tool_result blocks in a user message"
                )
                continue
            following = messages[i + 1] if isinstance(messages[i + 1], dict) else {}
            answered = {
                b.get("tool_use_id") for b in _blocks(following.get("content")) if b.get("type") == "tool_result"
            }
            missing = [tool_id for tool_id in asked if tool_id not in answered]
            if missing:
                problems.append(
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately "
                    f"after: {', '.join(map(str, missing))}. Each `tool_use` block must have a corresponding "
                    f"`tool_result` block in the next message."
                )
        elif message.get("role") == "user":
            previous = messages[i - 1] if i > 0 and isinstance(messages[i - 1], dict) else {}
            offered = {
                b.get("id")
                for b in _blocks(previous.get("content"))
                if previous.get("role") == "assistant" and b.get("type") == "tool_use"
            }
            seen_other = False
            for j, block in enumerate(blocks):
                if block.get("type") != "tool_result":
                    seen_other = True
                    continue
                if block.get("tool_use_id") not in offered:
                    problems.append(
                        f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{block.get('tool_use_id')}. Each `tool_result` block must have a corresponding "
                        f"`tool_use` block in the previous message."
                    )
                if seen_other:
                    problems.append(
                        f"messages.{i}.content.{j}: tool_result blocks must come before any "
                        f"other content in the user message"
                    )
    return problems


def _blocks(content: Any) -> list[dict]:
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _count_cache_breakpoints(body: dict) -> int:
    places: list[Any] = []
    for key in ("system", "tools"):
        if isinstance(body.get(key), list):
            places += body[key]
    for message in body.get("messages") or []:
        if isinstance(message, dict):
            places += _blocks(message.get("content"))
    return sum(1 for item in places if isinstance(item, dict) and item.get("cache_control"))


# --- responses ------------------------------------------------------------------------------------


def api_error(status: int, message: str, error_type: str | None = None) -> dict:
    """The API's error body for an HTTP status: {"type": "error", "error": {"type", "message"}}."""
    kind = error_type or ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def read_request(raw: bytes, counting: bool = False) -> tuple[dict | None, list[str]]:
    """Decode a request body and list its problems; the body is None when it is not a JSON object.
    `counting`: a count_tokens body, which has no max_tokens."""
    try:
        body = json.loads(raw or b"null")
    except ValueError as exc:
        return None, [f"request body is not valid JSON: {exc}"]
    if not isinstance(body, dict):
        return None, ["request body must be a JSON object"]
    return body, validate_request({"max_tokens": 1, **body} if counting else body)


def request_id(raw: bytes) -> str:
    """A deterministic request-id header value for a request body."""
    return "req_demo_" + hashlib.sha256(raw).hexdigest()[:24]


def sse_event(name: str, data: dict) -> bytes:
    """One complete server-sent event."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def sse_events(message: dict, text_chunk_words: int = 3) -> Iterator[bytes]:
    """Encode a complete Messages API response as the SSE stream the API sends for it, event by event."""
    usage = dict(message.get("usage") or {})
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 1},
    }
    yield sse_event("message_start", {"type": "message_start", "message": start})
    yield sse_event("ping", {"type": "ping"})
    for index, block in enumerate(message.get("content") or []):
        yield from _block_events(index, block, text_chunk_words)
    final_usage = {
        key: usage[key]
        for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")
        if key in usage
    }
    yield sse_event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {
                "stop_reason": message.get("stop_reason"),
                "stop_sequence": message.get("stop_sequence"),
            },
            "usage": final_usage,
        },
    )
    yield sse_event("message_stop", {"type": "message_stop"})


def _block_events(index: int, block: dict, text_chunk_words: int) -> Iterator[bytes]:
    kind = block.get("type")
    if kind == "text":
        yield _block_start(index, {**block, "text": ""})
        for piece in _text_pieces(block.get("text", ""), text_chunk_words):
            yield _block_delta(index, {"type": "text_delta", "text": piece})
    elif kind == "tool_use":
        yield _block_start(index, {**block, "input": {}})
        for piece in _json_pieces(json.dumps(block.get("input") or {})):
            yield _block_delta(index, {"type": "input_json_delta", "partial_json": piece})
    elif kind == "thinking":
        yield _block_start(index, {**block, "thinking": "", "signature": ""})
        for piece in _text_pieces(block.get("thinking", ""), text_chunk_words):
            yield _block_delta(index, {"type": "thinking_delta", "thinking": piece})
        yield _block_delta(index, {"type": "signature_delta", "signature": block.get("signature", "")})
    else:
        yield _block_start(index, block)
    yield sse_event("content_block_stop", {"type": "content_block_stop", "index": index})


def _block_start(index: int, block: dict) -> bytes:
    return sse_event("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})


def _block_delta(index: int, delta: dict) -> bytes:
    return sse_event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def _text_pieces(text: str, words: int) -> list[str]:
    tokens = re.findall(r"\s*\S+\s*|\s+", text)
    size = max(1, words)
    return ["".join(tokens[i : i + size]) for i in range(0, len(tokens), size)] or [""]


def _json_pieces(text: str, pieces: int = 4) -> list[str]:
    """The API opens with an empty partial_json, then sends the input in a few arbitrary cuts."""
    size = max(1, -(-len(text) // pieces))
    return [""] + [text[i : i + size] for i in range(0, len(text), size)]


# --- the transport --------------------------------------------------------------------------------


class DemoTransport(httpx2.BaseTransport):
    """An httpx2 transport that answers POST /v1/messages (and /v1/messages/count_tokens) offline, as
    the real API would, with a context window and a prompt cache of its own; and the Message Batches
    endpoints, with batches of its own (demo/model/batches.py)."""

    def __init__(
        self,
        responder: Responder = engine.respond,
        chunk_delay: float = 0.0,
        reply_seconds: float = 0.0,
        context_tokens: int = 200_000,
        batch_seconds: float = 2.0,
        batch_dir: Path | None = batches.SHARED_DIRECTORY,
    ) -> None:
        """`chunk_delay` pauses between streamed events; `reply_seconds` makes each reply take that
        long in all (a JSON reply waits it out, a stream spreads it over its events), as a real
        model's pace; `context_tokens` is the window past which a request is refused as too long;
        `batch_seconds` is how long a message batch takes at the least, and its batches are kept in
        `batch_dir` too, which every process of the machine shares (None: in this process only)."""
        self.responder = responder
        self.chunk_delay = chunk_delay
        self.reply_seconds = reply_seconds
        self.context_tokens = context_tokens
        self.cache = context.PromptCache()
        self.batch_store = batches.BatchStore(self._batch_result, batch_seconds, batch_dir)

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        raw = request.read()
        headers = {"request-id": request_id(raw)}
        path = request.url.path
        origin = f"{request.url.scheme}://{request.url.netloc.decode()}"
        answered = self.batch_store.respond(request.method, path, raw, origin)
        if answered is not None:  # one of the Message Batches endpoints
            return httpx2.Response(
                answered.status, content=answered.body, headers={**headers, "content-type": answered.content_type}
            )
        if request.method == "POST" and path.endswith("/v1/messages/count_tokens"):
            body, problems = read_request(raw, counting=True)
            if problems:
                return httpx2.Response(400, json=api_error(400, "; ".join(problems)), headers=headers)
            return httpx2.Response(200, json={"input_tokens": context.count(body)}, headers=headers)
        if request.method != "POST" or not path.endswith("/v1/messages"):
            return httpx2.Response(404, json=api_error(404, f"Not found: {path}"), headers=headers)
        body, problems = read_request(raw)
        if problems:
            return httpx2.Response(400, json=api_error(400, "; ".join(problems)), headers=headers)
        refusal = context.too_long(body, self.context_tokens)
        if refusal:
            return httpx2.Response(400, json=api_error(400, refusal), headers=headers)
        message = demo_reply(body, self.responder, self.cache)
        if not body.get("stream"):
            time.sleep(self.reply_seconds)
            return httpx2.Response(200, json=message, headers=headers)
        events = list(sse_events(message))
        delay = self.chunk_delay or (self.reply_seconds / max(1, len(events) - 1))
        return httpx2.Response(
            200,
            headers={
                **headers,
                "content-type": "text/event-stream; charset=utf-8",
                "cache-control": "no-cache",
            },
            stream=_EventStream(events, delay),
        )

    def _batch_result(self, params: dict) -> dict:
        return batch_result(params, self.responder, self.cache, self.context_tokens)


def batch_result(params: dict, responder: Responder, cache: context.PromptCache, context_tokens: int) -> dict:
    """One message batch request's result: the reply /v1/messages would give these params, or, where
    it would refuse them with a 400, that error, as the Message Batches API reports each request."""
    problems = validate_request(params)
    refusal = None if problems else context.too_long(params, context_tokens)
    if problems or refusal:
        return {"type": "errored", "error": api_error(400, refusal or "; ".join(problems))}
    return {"type": "succeeded", "message": demo_reply(params, responder, cache)}


def demo_reply(body: dict, responder: Responder, cache: context.PromptCache) -> dict:
    """The demo endpoint's reply to a valid request: a summary for a summary request, a label for a
    routing request (demo/model/routing.py), else the responder's answer; its usage as the prompt
    cache splits it."""
    if react.is_react_request(body):
        message = react.respond(body, responder)
        output = len(message["content"][0]["text"]) // 4
    elif context.is_summary_request(body) or routing.is_route_request(body):
        said = context.summarise(body) if context.is_summary_request(body) else routing.demo_label(body)
        content = [{"type": "text", "text": said}]
        message = {
            "id": "msg_demo_" + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:24],
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "demo"),
            "content": content,
            "stop_reason": "end_turn",
            "stop_sequence": None,
        }
        output = len(content[0]["text"]) // 4
    else:
        message = responder(body)
        if (body.get("tool_choice") or {}).get("disable_parallel_tool_use"):  # one tool call per reply
            first = next((i for i, b in enumerate(message["content"]) if b["type"] == "tool_use"), None)
            if first is not None:
                message = {**message, "content": message["content"][: first + 1]}
        output = (message.get("usage") or {}).get("output_tokens") or len(json.dumps(message["content"])) // 4
    return {**message, "usage": cache.usage(body, output)}


class _EventStream(httpx2.SyncByteStream):
    """SSE events as a response body, one event per chunk, paced by a delay."""

    def __init__(self, events: Iterable[bytes], delay: float) -> None:
        self._events = events
        self._delay = delay

    def __iter__(self) -> Iterator[bytes]:
        for i, event in enumerate(self._events):
            if i and self._delay:
                time.sleep(self._delay)
            yield event
