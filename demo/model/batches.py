"""The Message Batches API, offline: the endpoints both stand-ins of the Messages API answer.

A BatchStore keeps the batches of one stand-in (DemoTransport beneath the SDK, or the tests'
ModelServer over HTTP) and answers POST /v1/messages/batches, GET /v1/messages/batches/{id}, GET
/v1/messages/batches/{id}/results and POST /v1/messages/batches/{id}/cancel as the real API does, so
the SDK's batch calls run unchanged against it.

A batch stays "in_progress" until a retrieve comes at least `batch_seconds` after its creation, but
never ends on its first retrieve, so a poller always sees it in progress once. Only then are its
requests answered, each as /v1/messages would answer it (the `answer` function the stand-in gives).
A cancelled batch ends on the next retrieve with all its requests canceled; a held store ends no
batch unless it was cancelled. Two test hooks, anywhere in a request's messages, choose that
request's fate: EXPIRED_HOOK and ERRORED_HOOK.

A store given a `directory` keeps each batch in a file there too, so that every process of a machine
sees the same batches (the offline demo's workers are several processes: the one that sends a batch
is seldom the one that looks at it later); files older than LIFETIME are removed as new batches come.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

EXPIRED_HOOK = "[[batch expired]]"  # the request's result is {"type": "expired"}
ERRORED_HOOK = "[[batch errored]]"  # the request's result is an api_error, as when the service fails on it
MAX_REQUESTS = 100_000
LIFETIME = timedelta(hours=24)  # a batch expires this long after its creation
# where the offline demo's batches are kept for every process of the machine (DemoTransport's default)
SHARED_DIRECTORY = Path(tempfile.gettempdir()) / "approval-desk-demo-batches"
JSONL = (
    "application/binary"  # what the API sends results as (the SDK asks for it, and reads the lines whatever the type)
)
_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_PATH = re.compile(r"/v1/messages/batches(?:/(?P<id>[^/]+)(?P<action>/results|/cancel)?)?$")
_SERVICE_FAILED = {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}

# One request's params -> its result as the Message Batches API gives it: {"type": "succeeded",
# "message": ...}, or {"type": "errored", "error": ...} when /v1/messages would have refused it.
Answer = Callable[[dict], dict]


class Response(NamedTuple):
    """What a stand-in sends back: a status, a body and its content type."""

    status: int
    body: bytes
    content_type: str = "application/json"


@dataclass
class _Batch:
    id: str
    requests: list[dict]
    created_at: datetime
    retrieves: int = 0
    cancel_initiated_at: datetime | None = None
    ended_at: datetime | None = None
    results: list[dict] = field(default_factory=list)  # {"custom_id", "result"}, once ended

    def dump(self) -> str:
        times = ("created_at", "cancel_initiated_at", "ended_at")
        return json.dumps({k: (v.isoformat() if k in times and v else v) for k, v in asdict(self).items()})

    @classmethod
    def load(cls, text: str) -> _Batch:
        values = json.loads(text)
        for key in ("created_at", "cancel_initiated_at", "ended_at"):
            values[key] = datetime.fromisoformat(values[key]) if values[key] else None
        return cls(**values)


class BatchStore:
    """The batches of one stand-in, safe to use from several threads."""

    def __init__(self, answer: Answer, batch_seconds: float = 0.0, directory: Path | None = None) -> None:
        self.answer = answer
        self.batch_seconds = batch_seconds
        self.directory = directory
        self._batches: dict[str, _Batch] = {}
        self._bodies: list[dict] = []
        self._held = False
        self._lock = threading.Lock()

    def hold(self) -> None:
        """End no batch until release() (a cancelled one still ends)."""
        with self._lock:
            self._held = True

    def release(self) -> None:
        with self._lock:
            self._held = False

    def bodies(self) -> list[dict]:
        """The body of every batch created, oldest first."""
        with self._lock:
            return list(self._bodies)

    def respond(self, method: str, path: str, raw: bytes, origin: str) -> Response | None:
        """The answer to a Message Batches request, or None when the path is not one. `origin` is the
        stand-in's own scheme://host, from which a batch's results_url is formed."""
        matched = _PATH.search(path)
        if matched is None:
            return None
        base = origin + path[: matched.start()]
        batch_id, action = matched.group("id"), matched.group("action")
        with self._lock:
            if batch_id is None:
                return self._create(raw, base) if method == "POST" else _error(404, f"Not found: {path}")
            batch = self._batch(batch_id)
            if batch is None:
                return _error(404, f"No message batch with id {batch_id}.")
            if (method, action) == ("GET", None):
                answer = self._retrieve(batch, base)
            elif (method, action) == ("GET", "/results"):
                return _results(batch)
            elif (method, action) == ("POST", "/cancel"):
                answer = self._cancel(batch, base)
            else:
                return _error(404, f"Not found: {path}")
            self._keep(batch)
            return answer

    def _batch(self, batch_id: str) -> _Batch | None:
        """The batch as this store last kept it: in memory, or (with a directory) as any process left it."""
        if self.directory is None or not _CUSTOM_ID.match(batch_id):
            return self._batches.get(batch_id)
        try:
            return _Batch.load((self.directory / f"{batch_id}.json").read_text())
        except (OSError, ValueError):
            return None

    def _keep(self, batch: _Batch) -> None:
        self._batches[batch.id] = batch
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        partial = self.directory / f"{batch.id}.{os.getpid()}.part"
        partial.write_text(batch.dump())
        os.replace(partial, self.directory / f"{batch.id}.json")

    def _create(self, raw: bytes, base: str) -> Response:
        body, problem = _read_create(raw)
        if problem:
            return _error(400, problem)
        batch = _Batch("msgbatch_demo_" + secrets.token_hex(12), body["requests"], datetime.now(UTC))
        self._forget_old()
        self._keep(batch)
        self._bodies.append(body)
        return _json(200, _batch_json(batch, base))

    def _forget_old(self) -> None:
        if self.directory is None or not self.directory.is_dir():
            return
        past = (datetime.now(UTC) - LIFETIME).timestamp()
        for path in self.directory.glob("msgbatch_*.json"):
            try:
                if path.stat().st_mtime < past:
                    path.unlink()
            except OSError:
                pass

    def _retrieve(self, batch: _Batch, base: str) -> Response:
        batch.retrieves += 1
        if batch.ended_at is None and self._ends_now(batch):
            self._end(batch)
        return _json(200, _batch_json(batch, base))

    def _ends_now(self, batch: _Batch) -> bool:
        if batch.cancel_initiated_at is not None:
            return True
        waited = (datetime.now(UTC) - batch.created_at).total_seconds() >= self.batch_seconds
        return not self._held and batch.retrieves > 1 and waited

    def _end(self, batch: _Batch) -> None:
        batch.results = [
            {"custom_id": request["custom_id"], "result": self._result(request["params"], batch)}
            for request in batch.requests
        ]
        batch.ended_at = datetime.now(UTC)

    def _result(self, params: dict, batch: _Batch) -> dict:
        if batch.cancel_initiated_at is not None:
            return {"type": "canceled"}
        said = json.dumps(params.get("messages"), ensure_ascii=False).lower()
        if EXPIRED_HOOK in said:
            return {"type": "expired"}
        if ERRORED_HOOK in said:
            return {"type": "errored", "error": _SERVICE_FAILED}
        return self.answer(params)

    def _cancel(self, batch: _Batch, base: str) -> Response:
        if batch.ended_at is None and batch.cancel_initiated_at is None:
            batch.cancel_initiated_at = datetime.now(UTC)
        return _json(200, _batch_json(batch, base))


def _read_create(raw: bytes) -> tuple[dict, str | None]:
    """The create body and the first problem the API would refuse it for (None: none)."""
    try:
        body = json.loads(raw or b"null")
    except ValueError as exc:
        return {}, f"request body is not valid JSON: {exc}"
    if not isinstance(body, dict):
        return {}, "request body must be a JSON object"
    requests = body.get("requests")
    if not isinstance(requests, list):
        return body, "requests: Field required" if requests is None else "requests: Input should be a valid list"
    if not requests:
        return body, "requests: List should have at least 1 item after validation, not 0"
    if len(requests) > MAX_REQUESTS:
        return body, f"requests: List should have at most {MAX_REQUESTS} items after validation, not {len(requests)}"
    seen: set[str] = set()
    for i, request in enumerate(requests):
        if not isinstance(request, dict) or not isinstance(request.get("params"), dict):
            return body, f"requests.{i}: each request needs a custom_id and a params object"
        custom_id = request.get("custom_id")
        if not isinstance(custom_id, str) or not _CUSTOM_ID.match(custom_id):
            return body, f"requests.{i}.custom_id: String should match pattern '{_CUSTOM_ID.pattern}'"
        if custom_id in seen:
            return body, f"requests.{i}.custom_id: custom_id values must be unique, found {custom_id} twice"
        seen.add(custom_id)
    return body, None


def _results(batch: _Batch) -> Response:
    """The results as JSON Lines, in an order other than the requests' (as the API does not promise it)."""
    if batch.ended_at is None:
        return _error(400, f"Message batch {batch.id} has not ended yet; its results come once it has.")
    lines = [json.dumps(line, separators=(",", ":")) + "\n" for line in reversed(batch.results)]
    return Response(200, "".join(lines).encode(), JSONL)


def _batch_json(batch: _Batch, base: str) -> dict:
    """The MessageBatch object as the API returns it."""
    status = "ended" if batch.ended_at else ("canceling" if batch.cancel_initiated_at else "in_progress")
    return {
        "id": batch.id,
        "type": "message_batch",
        "processing_status": status,
        "request_counts": _counts(batch),
        "created_at": _rfc3339(batch.created_at),
        "expires_at": _rfc3339(batch.created_at + LIFETIME),
        "ended_at": _rfc3339(batch.ended_at),
        "cancel_initiated_at": _rfc3339(batch.cancel_initiated_at),
        "archived_at": None,
        "results_url": f"{base}/v1/messages/batches/{batch.id}/results" if batch.ended_at else None,
    }


def _counts(batch: _Batch) -> dict[str, int]:
    counts = dict.fromkeys(("processing", "succeeded", "errored", "canceled", "expired"), 0)
    if batch.ended_at is None:
        counts["processing"] = len(batch.requests)
    for line in batch.results:
        counts[line["result"]["type"]] += 1
    return counts


def _rfc3339(moment: datetime | None) -> str | None:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if moment else None


def _json(status: int, body: Any) -> Response:
    return Response(status, json.dumps(body).encode())


def _error(status: int, message: str) -> Response:
    """The API's error body: a 400 is an invalid request, a 404 names what is not there."""
    error_type = "not_found_error" if status == 404 else "invalid_request_error"
    return _json(status, {"type": "error", "error": {"type": error_type, "message": message}})
