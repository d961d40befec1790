"""The wire layer: request validation, SSE encoding, DemoTransport and ModelServer as the SDK sees them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import anthropic
import httpx2
import pytest

from demo.model.engine import respond
from demo.model.wire import DemoTransport, sse_events, validate_request
from tests.model_server import Fault, ModelServer, Reply, model_server_fixture  # noqa: F401 - the model_server fixture

MODEL = "claude-sonnet-4-6"
TOOLS = [
    {
        "name": "lookup_customer",
        "description": "Find customers.",
        "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
    }
]
HELLO = {"model": MODEL, "max_tokens": 200, "messages": [{"role": "user", "content": "hello"}]}


def body(*messages: dict, **extra) -> dict:
    return {"model": MODEL, "max_tokens": 100, "messages": list(messages), **extra}


def user(*content) -> dict:
    return {
        "role": "user",
        "content": list(content) if len(content) != 1 or not isinstance(content[0], str) else content[0],
    }


def assistant(*content) -> dict:
    return {"role": "assistant", "content": list(content)}


def text(words: str) -> dict:
    return {"type": "text", "text": words}


def use(tool_id: str) -> dict:
    return {"type": "tool_use", "id": tool_id, "name": "lookup_customer", "input": {"query": "bob"}}


def result(tool_id: str) -> dict:
    return {"type": "tool_result", "tool_use_id": tool_id, "content": "[]"}


def only_problem(request: dict) -> str:
    problems = validate_request(request)
    assert len(problems) == 1, problems
    return problems[0]


# --- validate_request -----------------------------------------------------------------------------


def test_a_well_formed_tool_conversation_is_valid():
    request = body(
        user("look up bob"),
        assistant(text("Looking."), use("toolu_1"), use("toolu_2")),
        user(result("toolu_2"), result("toolu_1"), text("and be quick")),
        assistant(text("Found nobody.")),
        user("thanks"),
        assistant(text("You're")),  # a prefill may end the list
        tools=[{**TOOLS[0], "cache_control": {"type": "ephemeral"}}],
        system=[{"type": "text", "text": "Be careful.", "cache_control": {"type": "ephemeral"}}],
    )
    assert validate_request(request) == []


@pytest.mark.parametrize(
    ("request_body", "expected"),
    [
        ({"max_tokens": 5, "messages": [user("hi")]}, "model: Field required"),
        ({"model": MODEL, "messages": [user("hi")]}, "max_tokens"),
        (body(), "messages: Field required"),
        (body(assistant(text("hi"))), 'first message must use the "user" role'),
        (body(user("hi"), {"role": "system", "content": "x"}), "messages.1.role"),
        (body(user(text(""))), "text content blocks must be non-empty"),
        (body(user({"type": "video", "url": "x"})), "unknown content block type 'video'"),
        (body(user("hi"), assistant(), user("again")), "must have non-empty content"),
        (body(user("hi"), assistant(text("Sure "))), "cannot end with trailing whitespace"),
        (body(user(use("toolu_1"))), "tool_use blocks may only appear in assistant messages"),
        (body(user("hi"), tools=[{"name": "x"}]), "tools.0.custom.input_schema: Field required"),
        (body(user("hi"), tools=[TOOLS[0], TOOLS[0]]), "Tool names must be unique"),
    ],
)
def test_malformed_requests_are_named(request_body, expected):
    assert expected in only_problem(request_body)


def test_roles_must_alternate():
    problem = only_problem(body(user("hi"), user("hello again")))
    assert "roles must alternate" in problem and "messages.1" in problem


def test_a_tool_use_without_its_result_is_caught():
    problem = only_problem(body(user("look"), assistant(use("toolu_1"), use("toolu_2")), user(result("toolu_1"))))
    assert "without `tool_result` blocks immediately after: toolu_2" in problem


def test_results_in_a_later_message_are_both_missing_and_orphaned():
    request = body(
        user("look"), assistant(use("toolu_1")), user("wait"), assistant(text("ok")), user(result("toolu_1"))
    )
    problems = validate_request(request)
    assert len(problems) == 2
    assert "messages.1: `tool_use` ids were found without `tool_result`" in problems[0]
    assert "messages.4.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_1" in problems[1]


def test_an_orphan_tool_result_is_caught():
    problem = only_problem(body(user("look"), assistant(text("ok")), user(result("toolu_9"))))
    assert "unexpected `tool_use_id`" in problem and "toolu_9" in problem


def test_results_must_come_before_text():
    problem = only_problem(body(user("look"), assistant(use("toolu_1")), user(text("here:"), result("toolu_1"))))
    assert "tool_result blocks must come before any other content" in problem


def test_tool_use_ids_must_be_unique_across_the_request():
    request = body(
        user("a"),
        assistant(use("toolu_1")),
        user(result("toolu_1")),
        assistant(use("toolu_1")),
        user(result("toolu_1")),
    )
    assert "ids must be unique" in only_problem(request)


def test_the_last_message_may_not_be_an_unanswered_tool_use():
    assert "final assistant message may not contain tool_use" in only_problem(body(user("a"), assistant(use("t1"))))


def test_at_most_four_cache_breakpoints():
    marked = {"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}
    assert "maximum of 4 blocks with cache_control" in only_problem(body(user(marked, marked, marked, marked, marked)))


# --- sse_events -----------------------------------------------------------------------------------


def parse_sse(chunks: list[bytes]) -> list[tuple[str, dict]]:
    events = []
    for chunk in chunks:
        name_line, data_line, *rest = chunk.decode().split("\n")
        assert rest == ["", ""], "each item must be exactly one event ending in a blank line"
        events.append((name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))))
    return events


def test_sse_events_follow_the_api_event_order_and_rebuild_the_message():
    message = respond(
        body(
            user("refund $5 on invoice 1 and email customer 2"),
            tools=[{**TOOLS[0], "name": n} for n in ("issue_refund", "send_email")],
        )
    )
    events = parse_sse(list(sse_events(message, text_chunk_words=2)))
    names = [name for name, _ in events]

    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop") == 3
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == message["usage"]["output_tokens"]

    rebuilt: dict[int, str] = {}
    for name, data in events:
        if name == "content_block_delta":
            piece = data["delta"].get("text", data["delta"].get("partial_json"))
            rebuilt[data["index"]] = rebuilt.get(data["index"], "") + piece
    assert rebuilt[0] == message["content"][0]["text"]
    assert json.loads(rebuilt[1]) == message["content"][1]["input"]
    deltas_per_block = [sum(1 for n, d in events if n == "content_block_delta" and d["index"] == i) for i in range(3)]
    assert all(count > 2 for count in deltas_per_block)


# --- DemoTransport through the SDK ----------------------------------------------------------------


def demo_client(transport: DemoTransport | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key="demo", max_retries=0, http_client=httpx2.Client(transport=transport or DemoTransport())
    )


def test_create_and_stream_give_the_same_message():
    client = demo_client()
    created = client.messages.create(**HELLO)
    with client.messages.stream(**HELLO) as live:
        chunks = list(live.text_stream)
        streamed = live.get_final_message()

    assert len(chunks) > 3 and "".join(chunks) == created.content[0].text
    assert streamed.model_dump(exclude={"content"}) | {"usage": None} == created.model_dump(exclude={"content"}) | {
        "usage": None
    }
    assert streamed.usage.output_tokens == created.usage.output_tokens
    assert streamed.content[0].text == created.content[0].text


def test_an_invalid_request_gets_the_api_400():
    with pytest.raises(anthropic.BadRequestError) as caught:
        demo_client().messages.create(
            model=MODEL,
            max_tokens=10,
            messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
        )
    assert caught.value.type == "invalid_request_error"
    assert "roles must alternate" in caught.value.api_message


def test_other_paths_are_404_in_the_api_shape():
    with pytest.raises(anthropic.NotFoundError) as caught:
        demo_client().models.retrieve("claude-sonnet-4-6")
    assert caught.value.type == "not_found_error"


def test_a_custom_responder_and_chunk_delay():
    canned = {**respond(HELLO), "content": [{"type": "text", "text": "one two three four five six seven"}]}
    client = demo_client(DemoTransport(responder=lambda _body: canned, chunk_delay=0.02))
    started = time.monotonic()
    with client.messages.stream(**HELLO) as live:
        assert live.get_final_text() == "one two three four five six seven"
    assert time.monotonic() - started >= 0.02 * 6


def test_a_reply_pace_spreads_a_stream_over_the_reply_and_delays_a_plain_answer():
    client = demo_client(DemoTransport(reply_seconds=0.4))
    started = time.monotonic()
    with client.messages.stream(**HELLO) as live:
        first_words = next(iter(live.text_stream))
        first_at = time.monotonic() - started
        rest = "".join(live.text_stream)
    assert first_words and rest and first_at < 0.4  # the words arrive along the way, not all at the end
    assert time.monotonic() - started >= 0.4
    started = time.monotonic()
    assert client.messages.create(**HELLO).content[0].text == first_words + rest
    assert time.monotonic() - started >= 0.4


# --- ModelServer over HTTP ------------------------------------------------------------------------


def http_client(server: ModelServer, **options) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="test-key", **{"max_retries": 0, **options})


def stream_text(client: anthropic.Anthropic, seen: list[str]) -> str:
    with client.messages.stream(**HELLO) as live:
        for piece in live.text_stream:
            seen.append(piece)
        return live.get_final_text()


def test_server_answers_and_records_requests(model_server):
    client = http_client(model_server)
    created = client.messages.create(**HELLO, tools=TOOLS)
    seen: list[str] = []
    streamed = stream_text(client, seen)

    assert created.stop_reason == "end_turn" and streamed.startswith("I'm the offline demo")
    assert [r.get("stream", False) for r in model_server.requests] == [False, True]
    assert model_server.requests[0]["tools"] == TOOLS
    assert model_server.env()["ANTHROPIC_BASE_URL"] == model_server.url


def test_server_rejects_and_records_invalid_requests(model_server):
    with pytest.raises(anthropic.BadRequestError):
        http_client(model_server).messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "assistant", "content": "x"}]
        )
    [rejected] = model_server.invalid_requests
    assert rejected.problems == ['messages.0: first message must use the "user" role']
    assert rejected.body["max_tokens"] == 5


def test_a_client_killed_mid_send_is_not_a_request(model_server):
    """A drill SIGKILLs a worker while it writes: half a body reached nobody's API."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(model_server.url)
    body = json.dumps(HELLO).encode()
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body[: len(body) // 2]
        )
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(100) == b""  # hung up, no answer
    assert model_server.invalid_requests == [] and model_server.requests == []
    assert http_client(model_server).messages.create(**HELLO).stop_reason == "end_turn"


@pytest.mark.parametrize(
    ("fault", "error_class", "error_type"),
    [
        (Fault.status(429, headers={"retry-after": "0"}), anthropic.RateLimitError, "rate_limit_error"),
        (Fault.status(529), anthropic.OverloadedError, "overloaded_error"),
        (Fault.status(500), anthropic.InternalServerError, "api_error"),
        (Fault.status(400), anthropic.BadRequestError, "invalid_request_error"),
        (Fault.status(401), anthropic.AuthenticationError, "authentication_error"),
    ],
)
def test_status_faults_raise_the_sdk_error_classes(model_server, fault, error_class, error_type):
    model_server.enqueue(fault)
    with pytest.raises(anthropic.APIStatusError) as caught:
        http_client(model_server).messages.create(**HELLO)
    assert type(caught.value) is error_class
    assert caught.value.type == error_type
    assert caught.value.status_code == fault.status
    assert http_client(model_server).messages.create(**HELLO).stop_reason == "end_turn"  # one-shot


def test_overloaded_is_an_internal_server_error_and_carries_headers(model_server):
    model_server.enqueue(Fault.status(529, headers={"retry-after": "7"}))
    with pytest.raises(anthropic.InternalServerError) as caught:
        http_client(model_server).messages.create(**HELLO)
    assert isinstance(caught.value, anthropic.OverloadedError)
    assert caught.value.response.headers["retry-after"] == "7"


def test_sdk_retries_through_scripted_faults(model_server):
    fast = {"retry-after-ms": "1"}  # retry-after: 0 makes the SDK fall back to its own backoff
    model_server.enqueue(Fault.status(429, headers=fast))
    model_server.enqueue(Fault.status(529, headers=fast))
    message = http_client(model_server, max_retries=2).messages.create(**HELLO)
    assert message.stop_reason == "end_turn" and len(model_server.requests) == 3


def test_a_hang_times_out(model_server):
    model_server.enqueue(Fault.hang(5))
    started = time.monotonic()
    with pytest.raises(anthropic.APITimeoutError):
        http_client(model_server, timeout=0.3).messages.create(**HELLO)
    assert time.monotonic() - started < 2


def test_a_cut_stream_raises_from_the_stream_after_some_text(model_server):
    model_server.enqueue(Fault.cut_after(4))
    seen: list[str] = []
    # (the SDK raises it as it is, or from 2.17 on as an APIConnectionError caused by it)
    with pytest.raises((httpx2.RemoteProtocolError, anthropic.APIConnectionError)) as raised:
        stream_text(http_client(model_server), seen)
    cause = raised.value if isinstance(raised.value, httpx2.RemoteProtocolError) else raised.value.__cause__
    assert isinstance(cause, httpx2.RemoteProtocolError)
    assert seen == ["I'm the offline "]


def test_a_cut_plain_response_is_a_connection_error(model_server):
    model_server.enqueue(Fault.cut_after(0))
    with pytest.raises(anthropic.APIConnectionError):
        http_client(model_server).messages.create(**HELLO)


def test_malformed_bodies_fail_to_decode(model_server):
    model_server.enqueue(Fault.malformed())
    model_server.enqueue(Fault.malformed())
    with pytest.raises(json.JSONDecodeError):
        http_client(model_server).messages.create(**HELLO)
    with pytest.raises(json.JSONDecodeError):
        stream_text(http_client(model_server), [])


def test_an_error_event_mid_stream_is_a_plain_status_error_with_status_200(model_server):
    model_server.enqueue(Fault.stream_error(after=4))
    seen: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        stream_text(http_client(model_server), seen)
    assert not isinstance(caught.value, anthropic.OverloadedError)
    assert (caught.value.status_code, caught.value.type) == (200, "overloaded_error")
    assert seen == ["I'm the offline "]


def test_scripted_steps_wait_for_a_matching_request(model_server):
    client = http_client(model_server)
    model_server.enqueue(Fault.status(529), match="[[refusal]]")
    model_server.enqueue(Fault.status(429))
    with pytest.raises(anthropic.RateLimitError):
        client.messages.create(**HELLO)
    assert client.messages.create(**HELLO).stop_reason == "end_turn"
    with pytest.raises(anthropic.OverloadedError):
        client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "[[refusal]]"}])


def test_an_explicit_reply_is_served_plain_or_streamed(model_server):
    canned = {**respond(HELLO), "content": [{"type": "text", "text": "Scripted words."}]}
    model_server.enqueue(Reply.message(canned))
    model_server.enqueue(Reply.message(canned))
    client = http_client(model_server)
    assert client.messages.create(**HELLO).content[0].text == "Scripted words."
    assert stream_text(client, []) == "Scripted words."


def test_a_held_stream_shows_text_before_the_call_ends(model_server):
    gate = threading.Event()
    model_server.enqueue(Reply.held(gate))
    seen: list[str] = []
    worker = threading.Thread(target=stream_text, args=(http_client(model_server), seen))
    worker.start()
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert seen == ["I'm the offline "] and worker.is_alive()
    gate.set()
    worker.join(5)
    assert not worker.is_alive() and "".join(seen).startswith("I'm the offline demo assistant.")


def test_stopping_the_server_releases_a_held_stream():
    server = ModelServer().start()
    server.enqueue(Reply.held(threading.Event()))
    errors: list[Exception] = []

    def call() -> None:
        try:
            stream_text(http_client(server), [])
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    worker = threading.Thread(target=call)
    worker.start()
    server.wait_for_requests(1)
    time.sleep(0.05)
    server.stop()
    worker.join(5)
    assert not worker.is_alive() and errors


def test_a_subprocess_reaches_the_server_through_the_environment(model_server):
    code = (
        "import anthropic; m = anthropic.Anthropic(max_retries=0).messages.create("
        f"model={MODEL!r}, max_tokens=50, messages=[{{'role': 'user', 'content': 'hello'}}]); print(m.id)"
    )
    env = {**os.environ, **model_server.env()}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("msg_demo_") and len(model_server.requests) == 1
