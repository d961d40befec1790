"""A real HTTP stand-in for the Messages API, for tests whose workers run as subprocesses.

ModelServer listens on 127.0.0.1 and answers POST /v1/messages like demo.model.wire.DemoTransport:
invalid bodies get a 400, valid ones the demo model's answer as JSON or as an SSE stream. A worker
reaches it through ANTHROPIC_BASE_URL=server.url. Tests can script the next answers (FIFO, optionally
only for requests whose body contains some text) with faults and replies:

    with ModelServer() as server:
        server.enqueue(Fault.status(529))
        server.enqueue(Reply.held(gate), match="[[long answer]]")
        run_worker(env=server.env())

It also answers the Message Batches endpoints as DemoTransport does (demo/model/batches.py: a
batch ends on a later look, never the first; its requests get the demo model's answers, and the
hooks EXPIRED_HOOK and ERRORED_HOOK in a request's messages expire or fail it). Scripted steps apply
to POST /v1/messages only. `server.requests` records POST /v1/messages bodies and `server.batches`
the body of each batch created, so a test can tell how its model requests went;
`hold_batches()` keeps every batch in progress until `release_batches()` (a cancelled one still
ends).

Tests get a fresh one per test with the `model_server` fixture, after
`from tests.model_server import model_server_fixture  # noqa: F401`.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple

import pytest

from demo.model import context as demo_context
from demo.model import engine as demo_model
from demo.model.batches import BatchStore
from demo.model.wire import (
    ERROR_TYPES,
    Responder,
    api_error,
    batch_result,
    demo_reply,
    read_request,
    request_id,
    sse_event,
    sse_events,
)

Gate = threading.Event | float


@dataclass(frozen=True)
class Step:
    """One scripted answer. Build it with Fault.* or Reply.*."""

    status: int = 200
    error: dict | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    malformed: bool = False
    cut_after: int | None = None
    stream_error: dict | None = None
    message: dict | None = None
    hold: Gate | None = None
    hold_after: int | None = None


class Fault:
    """Scripted failures, as the SDK would meet them from the real API or the network."""

    @staticmethod
    def status(
        code: int,
        message: str | None = None,
        error_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Step:
        """An HTTP error with the API's error body, e.g. status(429, headers={"retry-after": "0"})."""
        return Step(
            status=code,
            error=api_error(code, message or f"Scripted error {code}", error_type),
            headers=dict(headers or {}),
        )

    @staticmethod
    def hang(seconds: float) -> Step:
        """Wait this long before answering normally (longer than the client's timeout to force one)."""
        return Step(delay=seconds)

    @staticmethod
    def malformed() -> Step:
        """A 200 whose body is not valid JSON (or, for a stream, not valid SSE data)."""
        return Step(malformed=True)

    @staticmethod
    def cut_after(events: int) -> Step:
        """Close the connection after this many SSE events (a non-streaming body is cut half-way)."""
        return Step(cut_after=events)

    @staticmethod
    def stream_error(after: int, error_type: str = "overloaded_error", message: str = "Overloaded") -> Step:
        """An `event: error` after this many SSE events of a 200 stream, as the API sends mid-stream.

        A non-streaming request gets the matching HTTP error (529 for overloaded_error) instead.
        """
        return Step(cut_after=after, stream_error={"type": "error", "error": {"type": error_type, "message": message}})


class Reply:
    """Scripted successful answers."""

    @staticmethod
    def message(message: dict) -> Step:
        """Serve this Messages API response dict, as JSON or as a stream, whatever the request was."""
        return Step(message=message)

    @staticmethod
    def held(gate: Gate, message: dict | None = None, after: int | None = None) -> Step:
        """Stream the demo (or given) answer, holding it open until `gate` is set.

        With an Event, the events up to the first text delta (or the first `after` events) go out,
        then the rest wait for the Event. With a number, every event waits that many seconds.
        """
        return Step(message=message, hold=gate, hold_after=after)


class Rejected(NamedTuple):
    body: dict | None
    problems: list[str]


class ModelServer:
    """The Messages API on a local port, in a daemon thread; records every request it gets."""

    def __init__(
        self,
        responder: Responder = demo_model.respond,
        chunk_delay: float = 0.0,
        context_tokens: int = 200_000,
        batch_seconds: float = 0.0,
    ) -> None:
        """`batch_seconds`: the least time a message batch takes; it ends on a look after that, never its first."""
        self.responder = responder
        self.chunk_delay = chunk_delay
        self.context_tokens = context_tokens  # longer requests are refused as the API does ("prompt is too long")
        self.cache = demo_context.PromptCache()
        self.counted: list[dict] = []  # the bodies of POST /v1/messages/count_tokens
        self.requests: list[dict | None] = []
        self.invalid_requests: list[Rejected] = []
        self._script: list[tuple[str | None, Step]] = []
        self._batch_store = BatchStore(self._batch_result, batch_seconds)
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.model_server = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="model-server", daemon=True
        )

    @property
    def url(self) -> str:
        """The base URL for ANTHROPIC_BASE_URL."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def env(self, api_key: str = "test-key") -> dict[str, str]:
        """Environment variables that point a worker subprocess at this server."""
        return {"ANTHROPIC_BASE_URL": self.url, "ANTHROPIC_API_KEY": api_key}

    def start(self) -> ModelServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def enqueue(self, step: Step, match: str | None = None) -> None:
        """Script the answer to the next request (whose body contains `match`, if given)."""
        with self._lock:
            self._script.append((match, step))

    @property
    def batches(self) -> list[dict]:
        """The body of every message batch created (POST /v1/messages/batches), oldest first."""
        return self._batch_store.bodies()

    def hold_batches(self) -> None:
        """Keep every batch in progress, however often it is looked at, until release_batches()."""
        self._batch_store.hold()

    def release_batches(self) -> None:
        self._batch_store.release()

    def set_chunk_delay(self, seconds: float) -> None:
        """Pause this long between the events of every stream."""
        self.chunk_delay = seconds

    def wait_for_requests(self, count: int, timeout: float = 10.0) -> list[dict | None]:
        """Block until at least `count` requests arrived; the recorded bodies."""
        deadline = time.monotonic() + timeout
        while len(self.requests) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.requests)} of {count} model requests arrived in {timeout}s")
            time.sleep(0.01)
        return list(self.requests)

    def _take(self, text: str) -> Step:
        with self._lock:
            for i, (match, _) in enumerate(self._script):
                if match is None or match in text:
                    return self._script.pop(i)[1]
        return Step()

    def _answer(self, http: _Handler, raw: bytes) -> None:
        body, problems = read_request(raw)
        with self._lock:
            self.requests.append(body)
            if problems:
                self.invalid_requests.append(Rejected(body, problems))
        step = self._take(raw.decode("utf-8", "replace"))
        stream = bool(body and body.get("stream"))
        headers = {"request-id": request_id(raw), **step.headers}
        if step.delay and self._closing.wait(step.delay):
            http.close_connection = True
            return
        if step.error is not None:
            http.send_json(step.status, step.error, headers)
        elif step.stream_error is not None and not stream:
            status = next(
                (code for code, kind in ERROR_TYPES.items() if kind == step.stream_error["error"]["type"]),
                500,
            )
            http.send_json(status, step.stream_error, headers)
        elif step.malformed:
            garbage = b"event: message_start\ndata: {not json\n\n" if stream else b'{"type": "message", "content": ['
            http.send_bytes(200, garbage, {**headers, "content-type": _content_type(stream)})
        elif body is None or (problems and step.message is None):
            http.send_json(400, api_error(400, "; ".join(problems)), headers)
        elif step.message is None and (refusal := demo_context.too_long(body, self.context_tokens)):
            http.send_json(400, api_error(400, refusal), headers)
        else:
            message = step.message or demo_reply(body, self.responder, self.cache)
            if stream:
                self._stream(http, message, step, headers)
            else:
                http.send_json(200, message, headers, cut=step.cut_after is not None)

    def _count(self, http: _Handler, raw: bytes) -> None:
        body, problems = read_request(raw, counting=True)
        if problems:
            http.send_json(400, api_error(400, "; ".join(problems)), {})
            return
        with self._lock:
            self.counted.append(body)
        http.send_json(200, {"input_tokens": demo_context.count(body)}, {"request-id": request_id(raw)})

    def _batch(self, http: _Handler, method: str, path: str, raw: bytes) -> bool:
        """Answer a Message Batches request; False when the path is not one."""
        answer = self._batch_store.respond(method, path, raw, self.url)
        if answer is None:
            return False
        http.send_bytes(
            answer.status, answer.body, {"content-type": answer.content_type, "request-id": request_id(raw)}
        )
        return True

    def _batch_result(self, params: dict) -> dict:
        return batch_result(params, self.responder, self.cache, self.context_tokens)

    def _stream(self, http: _Handler, message: dict, step: Step, headers: dict[str, str]) -> None:
        events = list(sse_events(message))
        hold_after = step.hold_after
        if isinstance(step.hold, threading.Event) and hold_after is None:
            hold_after = next((i + 1 for i, e in enumerate(events) if b"text_delta" in e), 1)
        http.start_chunked(200, {**headers, "content-type": _content_type(True), "cache-control": "no-cache"})
        for i, event in enumerate(events):
            if step.cut_after is not None and i >= step.cut_after:
                if step.stream_error is None:
                    http.close_connection = True
                    return
                http.write_chunk(sse_event("error", step.stream_error))
                break
            if i and not self._pause(step, i, hold_after):
                http.close_connection = True
                return
            http.write_chunk(event)
        http.write_chunk(b"")

    def _pause(self, step: Step, index: int, hold_after: int | None) -> bool:
        """Wait before event `index`; False when the server is closing instead."""
        if isinstance(step.hold, threading.Event) and index >= (hold_after or 0):
            while not step.hold.wait(0.02):
                if self._closing.is_set():
                    return False
        elif isinstance(step.hold, int | float) and self._closing.wait(step.hold):
            return False
        return not (self.chunk_delay and self._closing.wait(self.chunk_delay))


class _Server(ThreadingHTTPServer):
    block_on_close = False  # a hanging handler must not hold up stop()
    model_server: ModelServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        if len(raw) < length:
            # The client died mid-send (a drill SIGKILLs workers): the API
            # never received a request, so there is nothing to answer or judge.
            self.close_connection = True
            return
        path = self.path.split("?")[0]
        if self.server.model_server._batch(self, "POST", path, raw):
            return
        if path not in ("/v1/messages", "/v1/messages/count_tokens"):
            self.send_json(404, api_error(404, f"Not found: {self.path}"), {})
            return
        try:
            if path.endswith("count_tokens"):
                self.server.model_server._count(self, raw)
                return
            self.server.model_server._answer(self, raw)
        except ConnectionError:
            self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802
        if not self.server.model_server._batch(self, "GET", self.path.split("?")[0], b""):
            self.send_json(404, api_error(404, f"Not found: {self.path}"), {})

    def send_json(self, status: int, body: dict, headers: dict[str, str], cut: bool = False) -> None:
        data = json.dumps(body).encode()
        self.send_bytes(status, data, {"content-type": "application/json", **headers}, cut=cut)

    def send_bytes(self, status: int, data: bytes, headers: dict[str, str], cut: bool = False) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2] if cut else data)
        if cut:
            self.close_connection = True

    def start_chunked(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass


def _content_type(stream: bool) -> str:
    return "text/event-stream; charset=utf-8" if stream else "application/json"


@pytest.fixture(name="model_server")
def model_server_fixture() -> Iterator[ModelServer]:
    """A running ModelServer for one test."""
    with ModelServer() as server:
        yield server
