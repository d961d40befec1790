"""The model client: one anthropic SDK client per process, streaming one reply at a time, or sending
many requests as one message batch and reading their results when it has ended.

With an API key it talks to the Anthropic API (ANTHROPIC_BASE_URL honoured as the SDK does).
Without one, the offline demo model answers beneath the SDK through an httpx2 transport, so the
SDK's request building and stream parsing run either way.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx2

from webapp import outbound


class ModelError(Exception):
    """A model call that failed. `transient` errors are worth retrying; `message` is for people."""

    def __init__(self, code: str, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.transient = transient


@dataclass
class ModelReply:
    """One finished (or stopped) model call."""

    content: list[dict]
    stop_reason: str | None
    model: str
    usage: dict = field(default_factory=dict)
    request_id: str | None = None
    latency_ms: float = 0.0


@dataclass(frozen=True)
class BatchState:
    """Where a message batch stands: its processing status ("in_progress", "canceling" or "ended", as
    the API says) and how many of its requests are processing, succeeded, errored, canceled, expired."""

    status: str
    counts: dict[str, int]


@dataclass(frozen=True)
class BatchItemResult:
    """One request of an ended batch, matched by its custom_id: a reply as generate() would give it
    when it succeeded, else a sentence for people saying why there is none. `transient`: it errored
    in a way worth sending again."""

    custom_id: str
    outcome: str  # "succeeded" | "errored" | "expired" | "canceled"
    reply: ModelReply | None
    error: str | None
    transient: bool = False


# Checked this often while a reply streams: cancellation and lease renewal (seconds).
CHECK_EVERY = 0.25
STOP_REASON_CHARS = 32  # as the rows hold it (model_calls, conversations, an audit event's outcome)
log = logging.getLogger(__name__)


class ModelClient:
    takes_batches = True  # the endpoint is asked through the Messages API, so a batch can carry its requests

    def __init__(self, client: anthropic.Anthropic, model: str, max_tokens: int, endpoint: str | None = None) -> None:
        self.client = client
        self.model = model
        self.max_tokens = max_tokens
        self.endpoint = endpoint  # the registered endpoint's name; None: the configured default

    def count_tokens(self, request: dict) -> int | None:
        """The request's input tokens as the endpoint counts them (`messages.count_tokens`); None when
        the endpoint cannot count (not every Anthropic-compatible one can), so the caller estimates."""
        try:
            counted = self.client.messages.count_tokens(model=self.model, **_without_empty_tools(request))
        except (anthropic.APIError, httpx2.HTTPError, ValueError) as exc:
            log.info("could not count the request's tokens (%s); estimating instead", exc)
            return None
        return counted.input_tokens

    def generate(
        self,
        *,
        system: list[dict],
        messages: list[dict],
        tools: list[dict] | None = None,
        tool_choice: dict | None = None,
        on_text: Callable[[str], None] | None = None,
        on_tool_start: Callable[[str], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> ModelReply:
        """Stream one reply. should_stop() is asked every CHECK_EVERY seconds on another thread, so a
        stop is honoured between chunks even while the model stalls: the partial reply then comes back
        with stop_reason "cancelled" and only its text (an unfinished tool call is never kept)."""
        started = time.perf_counter()
        stopped = threading.Event()
        try:
            with self.client.messages.stream(
                model=self.model,
                max_tokens=self.max_tokens,
                **_without_empty_tools(
                    {"system": system, "tools": tools, "tool_choice": tool_choice, "messages": messages}
                ),
            ) as stream:
                watcher = _Watcher(stream, should_stop, stopped) if should_stop else None
                try:
                    for event in stream:
                        if stopped.is_set():
                            break
                        if event.type == "text" and on_text:
                            on_text(event.text)
                        elif event.type == "content_block_start" and event.content_block.type == "tool_use":
                            if on_tool_start:
                                on_tool_start(event.content_block.name)
                except (anthropic.APIConnectionError, httpx2.TransportError) as exc:  # (the SDK wraps it from 2.17)
                    if stopped.is_set():
                        pass
                    elif isinstance(exc, (anthropic.APITimeoutError, httpx2.TimeoutException)):
                        raise
                    else:  # the reply had begun: what broke is the reply, not the way to the service
                        raise _cut() from exc
                except Exception:
                    if not stopped.is_set():
                        raise
                finally:
                    if watcher:
                        watcher.finish()
                if stopped.is_set():
                    return _cancelled(stream, started)
                final = stream.get_final_message()
                request_id = _request_id(stream)
            if final.stop_reason is None:  # the stream ended without saying why: a cut, not an answer
                raise _cut()
        except _SDK_ERRORS as exc:
            raise model_error(exc) from exc
        return ModelReply(
            _blocks(final.content),
            final.stop_reason[:STOP_REASON_CHARS],  # a newer, longer reason than the rows hold is cut to fit
            final.model,
            _usage(final.usage),
            request_id,
            _ms(started),
        )

    def ask(self, system: str, text: str, max_tokens: int) -> ModelReply:
        """A short request in plain words, no tools and no stream (classifying a question): whatever
        the endpoint's protocol, the reply is read as text."""
        started = time.perf_counter()
        try:
            final = self.client.messages.create(
                model=self.model,
                max_tokens=max_tokens,
                system=system,
                messages=[{"role": "user", "content": [{"type": "text", "text": text}]}],
            )
        except _SDK_ERRORS as exc:
            raise model_error(exc) from exc
        return ModelReply(
            _blocks(final.content),
            (final.stop_reason or "end_turn")[:STOP_REASON_CHARS],
            final.model,
            _usage(final.usage),
            getattr(final, "_request_id", None),
            _ms(started),
        )

    def batch_params(self, request: dict) -> dict:
        """The Messages params of one batch request, from a request as generate() takes it (system,
        messages, tools, tool_choice); not streamed, as a batch never is."""
        return {"model": self.model, "max_tokens": self.max_tokens, **_without_empty_tools(request)}

    def send_batch(self, items: list[tuple[str, dict]]) -> str:
        """Send (custom_id, params) pairs as one message batch; its id."""
        requests = [{"custom_id": custom_id, "params": params} for custom_id, params in items]
        try:
            return self.client.messages.batches.create(requests=requests).id
        except _SDK_ERRORS as exc:
            raise _batch_error(exc, None) from exc

    def batch_state(self, batch_id: str) -> BatchState:
        """Where the batch stands now: a poller asks until its status is "ended"."""
        try:
            batch = self.client.messages.batches.retrieve(batch_id)
        except _SDK_ERRORS as exc:
            raise _batch_error(exc, batch_id) from exc
        return BatchState(batch.processing_status, batch.request_counts.model_dump())

    def batch_results(self, batch_id: str) -> list[BatchItemResult]:
        """The results of an ended batch, one per request, in no particular order."""
        try:
            lines = self.client.messages.batches.results(batch_id)
            try:
                return [_item_result(line) for line in lines]
            finally:
                lines.close()
        except _SDK_ERRORS as exc:
            raise _batch_error(exc, batch_id) from exc
        except anthropic.AnthropicError as exc:  # the SDK's own refusal: the batch has no results_url yet
            raise ModelError(
                "batch_not_ended", "The batch has not ended yet, so it has no results.", transient=True
            ) from exc

    def cancel_batch(self, batch_id: str) -> None:
        """Ask the service to stop the batch: the requests it has not answered end as canceled."""
        try:
            self.client.messages.batches.cancel(batch_id)
        except _SDK_ERRORS as exc:
            raise _batch_error(exc, batch_id) from exc


def _cut() -> ModelError:
    return ModelError("bad_response", "The model service's reply ended half-way.", transient=True)


_SDK_ERRORS = (anthropic.APIError, json.JSONDecodeError, httpx2.HTTPError, ValueError, KeyError)


def model_error(exc: Exception) -> ModelError:
    """An SDK (or reading) error as a ModelError a person understands."""
    if isinstance(exc, anthropic.APIStatusError):
        return _status_error(exc)
    if isinstance(exc, anthropic.APITimeoutError):
        return ModelError("timeout", "The model service did not answer in time.", transient=True)
    if refusal := outbound.refusal_behind(exc):  # a registered endpoint at an address the guard refuses
        return ModelError("address_refused", f"{refusal} Ask the desk's operator.", transient=False)
    if isinstance(exc, anthropic.APIConnectionError):
        return ModelError("unreachable", "The model service could not be reached.", transient=True)
    return ModelError("bad_response", "The model service sent a reply that could not be read.", transient=True)


def _without_empty_tools(request: dict) -> dict:
    """The request's system, tools, tool choice and messages, leaving tools (and the choice among them)
    out when there are none: a summary, or a model without tool use."""
    if not request.get("tools"):
        return {key: value for key, value in request.items() if key not in ("tools", "tool_choice")}
    return {key: value for key, value in request.items() if key != "tool_choice" or value}


TRANSIENT_ERROR_TYPES = {"overloaded_error", "api_error", "rate_limit_error", "timeout_error"}


def _batch_error(exc: Exception, batch_id: str | None) -> ModelError:
    """As model_error, but a 404 from the batch endpoints is about the batch, not the model: the
    service knows no batch of that id, or (on creating one) offers no message batches at all."""
    if not isinstance(exc, anthropic.NotFoundError):
        return model_error(exc)
    if batch_id is None:
        return ModelError("batches_unsupported", "The model service does not offer message batches.", transient=False)
    return ModelError("batch_not_found", f"The model service knows no batch {batch_id}.", transient=False)


def _item_result(line: Any) -> BatchItemResult:
    """One line of a batch's results as a BatchItemResult."""
    result = line.result
    if result.type == "succeeded":
        message = result.message
        stop_reason = (message.stop_reason or "end_turn")[:STOP_REASON_CHARS]
        reply = ModelReply(_blocks(message.content), stop_reason, message.model, _usage(message.usage))
        return BatchItemResult(line.custom_id, "succeeded", reply, None)
    if result.type == "errored":
        error = getattr(result.error, "error", None)
        error_type = getattr(error, "type", None)
        sentence = _item_error(error_type, str(getattr(error, "message", None) or "no reason given")[:500])
        return BatchItemResult(line.custom_id, "errored", None, sentence, error_type in TRANSIENT_ERROR_TYPES)
    return BatchItemResult(line.custom_id, result.type, None, _UNANSWERED[result.type])


_UNANSWERED = {
    "expired": "The batch expired before the model service answered this request (a batch has 24 hours).",
    "canceled": "The batch was cancelled before this request was answered.",
}


def _item_error(error_type: str | None, detail: str) -> str:
    """The sentence for an errored batch request, worded as _status_error words the same error."""
    if error_type in TRANSIENT_ERROR_TYPES:
        return "The model service failed while answering."
    if error_type == "not_found_error":
        return "The model service does not know this model; check ANTHROPIC_MODEL."
    if "too long" in detail.lower():
        return f"The request is too long for the model: {detail}"
    return f"The model service rejected the request: {detail}"


class _Watcher:
    """Asks should_stop() on its own thread; on a yes it closes the stream, which ends a blocked read."""

    def __init__(self, stream, should_stop: Callable[[], bool], stopped: threading.Event) -> None:
        self.stream = stream
        self.should_stop = should_stop
        self.stopped = stopped
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="model-stream-watcher", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.done.wait(CHECK_EVERY):
            try:
                stop = self.should_stop()
            except Exception:  # a failed check is not a stop; the next one may work
                log.warning("could not check for a stop request", exc_info=True)
                continue
            if stop:
                self.stopped.set()
                self.stream.close()
                return

    def finish(self) -> None:
        self.done.set()
        self.thread.join(5)


def _cancelled(stream, started: float) -> ModelReply:
    snapshot = stream._current_snapshot_or_none()  # None when the stop came before the first event
    if snapshot is None:
        return ModelReply([], "cancelled", "", {}, _request_id(stream), _ms(started))
    text = [b for b in _blocks(snapshot.content) if b["type"] == "text" and b["text"].strip()]
    if text:  # the API refuses an assistant turn that ends in whitespace, and a stop can fall between words
        text[-1] = {**text[-1], "text": text[-1]["text"].rstrip()}
    return ModelReply(text, "cancelled", snapshot.model, _usage(snapshot.usage), _request_id(stream), _ms(started))


def _status_error(exc: anthropic.APIStatusError) -> ModelError:
    status = exc.status_code
    if 300 <= status < 400:  # the desk's clients follow no redirect (webapp/outbound/)
        return ModelError(
            "request_rejected",
            f"The model service answered HTTP {status}, a redirect, which the desk does not follow; give the "
            "endpoint's own base URL.",
            transient=False,
        )
    if status < 400:  # an `event: error` inside a 200 stream
        error_type = getattr(exc, "type", None) or _error_body(exc).get("type")
        if error_type in TRANSIENT_ERROR_TYPES:
            return ModelError(
                "overloaded" if error_type == "overloaded_error" else "service_error",
                "The model service failed while answering.",
                transient=True,
            )
        return ModelError(
            "request_rejected", f"The model service stopped answering: {_error_detail(exc)}", transient=False
        )
    if status == 429:
        return ModelError("rate_limited", "The model service is rate limiting us.", transient=True)
    if status == 529 or isinstance(exc, anthropic.OverloadedError):
        return ModelError("overloaded", "The model service is overloaded.", transient=True)
    if status >= 500 or status in (408, 409):
        return ModelError("service_error", f"The model service failed (HTTP {status}).", transient=True)
    if status == 401:
        return ModelError(
            "key_invalid", "The model service rejected the API key; check ANTHROPIC_API_KEY.", transient=False
        )
    if status == 403:
        return ModelError("forbidden", "The API key may not use this model or feature.", transient=False)
    if status == 404:
        return ModelError(
            "model_not_found",
            "The model service does not know this model; check ANTHROPIC_MODEL.",
            transient=False,
        )
    detail = _error_detail(exc)
    if status in (400, 413) and "too long" in detail.lower():
        return ModelError("too_long", f"The request is too long for the model: {detail}", transient=False)
    return ModelError("request_rejected", f"The model service rejected the request: {detail}", transient=False)


def _error_body(exc: anthropic.APIStatusError) -> dict:
    body = exc.body if isinstance(exc.body, dict) else {}
    return body.get("error") if isinstance(body.get("error"), dict) else {}


def _error_detail(exc: anthropic.APIStatusError) -> str:
    """The API's own error message; of any other body nothing (a server that is not the API is
    named by its status only, never by what it sent)."""
    message = _error_body(exc).get("message")
    return str(message)[:500] if message else f"HTTP {exc.status_code}"


def _blocks(content: list[Any]) -> list[dict]:
    return [block.model_dump(mode="json", exclude_none=True) for block in content]


def _usage(usage: Any) -> dict:
    return {
        "input_tokens": usage.input_tokens or 0,
        "output_tokens": usage.output_tokens or 0,
        "cache_read_input_tokens": getattr(usage, "cache_read_input_tokens", 0) or 0,
        "cache_creation_input_tokens": getattr(usage, "cache_creation_input_tokens", 0) or 0,
    }


def _request_id(stream: Any) -> str | None:
    response = getattr(stream, "response", None)
    return response.headers.get("request-id") if response is not None else None


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000
