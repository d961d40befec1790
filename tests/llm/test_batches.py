"""Message batches through the real anthropic SDK and the desk's ModelClient, against both stand-ins
of the Messages API: ModelServer over HTTP and DemoTransport beneath the SDK (demo/model/batches.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import anthropic
import httpx2
import pytest

from demo.model.batches import ERRORED_HOOK, EXPIRED_HOOK
from demo.model.wire import DemoTransport
from tests.llm.test_demo_model import BILLING_TOOLS, SYSTEM
from tests.model_server import ModelServer
from webapp.llm.choice import UnusableEndpointClient
from webapp.llm.client import BatchItemResult, ModelClient, ModelError
from webapp.llm.react import ReactClient
from webapp.models import ModelEndpoint

EXPIRED = "The batch expired before the model service answered this request (a batch has 24 hours)."
CANCELED = "The batch was cancelled before this request was answered."


@dataclass
class StandIn:
    """A ModelClient over one stand-in, with the stand-in's hold switch and what reached POST /v1/messages."""

    client: ModelClient
    sdk: anthropic.Anthropic
    base_url: str
    hold: Callable[[], None]
    posted_messages: Callable[[], list]


@pytest.fixture(params=["model_server", "demo_transport"])
def stand_in(request) -> Iterator[StandIn]:
    if request.param == "model_server":
        with ModelServer() as server:
            sdk = anthropic.Anthropic(api_key="test-key", base_url=server.url, max_retries=0, timeout=5)
            yield StandIn(
                ModelClient(sdk, "claude-test", 1024),
                sdk,
                server.url,
                server.hold_batches,
                lambda: list(server.requests),
            )
        return
    transport = DemoTransport(batch_seconds=0)
    posted: list[str] = []

    def record(sent: httpx2.Request) -> None:
        if sent.method == "POST" and sent.url.path.endswith("/v1/messages"):
            posted.append(sent.url.path)

    http = httpx2.Client(transport=transport, event_hooks={"request": [record]})
    sdk = anthropic.Anthropic(api_key="offline", base_url="http://demo-model.invalid", http_client=http, max_retries=0)
    yield StandIn(
        ModelClient(sdk, "claude-test", 1024),
        sdk,
        "http://demo-model.invalid",
        transport.batch_store.hold,
        lambda: list(posted),
    )


def request(words: str, tools: list[dict] | None = None) -> dict:
    """A request as the loop hands generate() one."""
    return {
        "system": SYSTEM,
        "messages": [{"role": "user", "content": [{"type": "text", "text": words}]}],
        "tools": tools or [],
        "tool_choice": None,
    }


def by_id(results: list[BatchItemResult]) -> dict[str, BatchItemResult]:
    return {result.custom_id: result for result in results}


QUESTIONS = {
    "greeting": request("hello there"),
    "lookup": request("look up bob", BILLING_TOOLS),
    "long": request("[[max tokens]] tell me everything"),
}


def test_a_batch_is_in_progress_at_first_then_ends_with_the_answers_messages_would_give(stand_in):
    client = stand_in.client
    batch_id = client.send_batch([(name, client.batch_params(asked)) for name, asked in QUESTIONS.items()])

    first, later = client.batch_state(batch_id), client.batch_state(batch_id)
    results = by_id(client.batch_results(batch_id))

    assert (first.status, first.counts["processing"]) == ("in_progress", 3)
    assert later.status == "ended"
    assert later.counts == {"processing": 0, "succeeded": 3, "errored": 0, "canceled": 0, "expired": 0}
    assert stand_in.posted_messages() == []  # everything went by batch
    assert set(results) == set(QUESTIONS)
    for name, asked in QUESTIONS.items():
        direct = client.generate(**asked)
        batched = results[name]
        assert (batched.outcome, batched.error) == ("succeeded", None)
        assert (batched.reply.content, batched.reply.stop_reason) == (direct.content, direct.stop_reason)
        assert batched.reply.model == "claude-test"
        assert batched.reply.usage["input_tokens"] > 0 and batched.reply.request_id is None
    assert [b["type"] for b in results["lookup"].reply.content][-1] == "tool_use"
    assert results["long"].reply.stop_reason == "max_tokens"


def test_results_come_in_another_order_than_the_requests_and_the_url_is_the_stand_ins_own(stand_in):
    names = ["first", "second", "third"]
    batch_id = stand_in.client.send_batch([(name, stand_in.client.batch_params(request(name))) for name in names])
    stand_in.client.batch_state(batch_id)

    results = stand_in.client.batch_results(batch_id)

    assert sorted(result.custom_id for result in results) == sorted(names)
    assert [result.custom_id for result in results] != names  # so a reader must match by custom_id
    url = stand_in.sdk.messages.batches.retrieve(batch_id).results_url
    assert url == f"{stand_in.base_url}/v1/messages/batches/{batch_id}/results"


def test_an_expired_and_an_errored_request_come_back_in_words_while_the_others_succeed(stand_in):
    client = stand_in.client
    asked = {
        "fine": request("hello"),
        "late": request(f"hello {EXPIRED_HOOK}"),
        "failed": request(f"hello {ERRORED_HOOK}"),
        "malformed": {**request("hello"), "messages": [{"role": "assistant", "content": "Sure. "}]},
    }
    batch_id = client.send_batch([(name, client.batch_params(req)) for name, req in asked.items()])
    client.batch_state(batch_id)

    state = client.batch_state(batch_id)
    results = by_id(client.batch_results(batch_id))

    assert state.counts == {"processing": 0, "succeeded": 1, "errored": 2, "canceled": 0, "expired": 1}
    assert results["fine"].outcome == "succeeded" and results["fine"].reply.content
    assert (results["late"].outcome, results["late"].reply, results["late"].error) == ("expired", None, EXPIRED)
    failed = results["failed"]
    assert (failed.outcome, failed.error, failed.transient) == (
        "errored",
        "The model service failed while answering.",
        True,
    )
    malformed = results["malformed"]
    assert (malformed.outcome, malformed.transient) == ("errored", False)
    assert malformed.error.startswith("The model service rejected the request: ")
    assert "trailing whitespace" in malformed.error
    assert stand_in.posted_messages() == []


def test_a_held_batch_stays_in_progress_and_once_cancelled_ends_with_its_requests_canceled(stand_in):
    stand_in.hold()
    client = stand_in.client
    batch_id = client.send_batch([(name, client.batch_params(req)) for name, req in QUESTIONS.items()])

    looks = [client.batch_state(batch_id).status for _ in range(3)]
    with pytest.raises(ModelError) as not_yet:
        client.batch_results(batch_id)
    client.cancel_batch(batch_id)
    canceling = stand_in.sdk.messages.batches.cancel(batch_id)  # a second cancel changes nothing
    ended = client.batch_state(batch_id)
    results = client.batch_results(batch_id)

    assert looks == ["in_progress"] * 3
    assert canceling.processing_status == "canceling" and canceling.cancel_initiated_at is not None
    assert not_yet.value.message == "The batch has not ended yet, so it has no results." and not_yet.value.transient
    assert ended.status == "ended"
    assert ended.counts == {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 3, "expired": 0}
    assert {(r.custom_id, r.outcome, r.reply, r.error) for r in results} == {
        (name, "canceled", None, CANCELED) for name in QUESTIONS
    }
    assert stand_in.posted_messages() == []


def test_an_unknown_batch_is_a_model_error_that_names_it(stand_in):
    for call in (stand_in.client.batch_state, stand_in.client.batch_results, stand_in.client.cancel_batch):
        with pytest.raises(ModelError) as failed:
            call("msgbatch_nobody_knows")
        assert failed.value.message == "The model service knows no batch msgbatch_nobody_knows."
        assert not failed.value.transient


@pytest.mark.parametrize(
    "items, problem",
    [
        ([], "at least 1 item"),
        ([("twice", {}), ("twice", {})], "unique"),
        ([("no spaces allowed", {})], "custom_id"),
        ([("x" * 65, {})], "custom_id"),
    ],
)
def test_a_malformed_batch_is_refused_whole(items, problem):
    with ModelServer() as server:
        client = ModelClient(anthropic.Anthropic(api_key="test-key", base_url=server.url, max_retries=0), "m", 10)
        params = client.batch_params(request("hello"))
        with pytest.raises(ModelError) as refused:
            client.send_batch([(custom_id, params) for custom_id, _ in items])

        assert refused.value.message.startswith("The model service rejected the request: ")
        assert problem in refused.value.message and not refused.value.transient
        assert server.batches == [] and server.requests == []


def test_the_server_records_each_batch_as_sent_without_streaming_or_empty_tools():
    with ModelServer() as server:
        client = ModelClient(anthropic.Anthropic(api_key="test-key", base_url=server.url), "claude-test", 1024)
        client.send_batch(
            [("plain", client.batch_params(request("hi"))), ("tools", client.batch_params(QUESTIONS["lookup"]))]
        )

        [sent] = server.batches
    plain, tools = (item["params"] for item in sent["requests"])
    assert [item["custom_id"] for item in sent["requests"]] == ["plain", "tools"]
    assert plain == {
        "model": "claude-test",
        "max_tokens": 1024,
        "system": SYSTEM,
        "messages": request("hi")["messages"],
    }
    assert tools["tools"] == BILLING_TOOLS and "stream" not in tools and "tool_choice" not in tools


def test_a_batch_ends_no_sooner_than_batch_seconds():
    with ModelServer(batch_seconds=0.3) as server:
        client = ModelClient(anthropic.Anthropic(api_key="test-key", base_url=server.url), "claude-test", 1024)
        batch_id = client.send_batch([("one", client.batch_params(request("hi")))])
        early = [client.batch_state(batch_id).status for _ in range(3)]
        time.sleep(0.35)
        late = client.batch_state(batch_id).status

    assert (early, late) == (["in_progress"] * 3, "ended")


def test_an_endpoint_the_desk_cannot_call_fails_its_batches_in_words():
    unusable = UnusableEndpointClient(
        "Set this endpoint's key again.", ModelEndpoint(name="local", model="qwen3:8b"), 1024
    )
    calls = [
        lambda: unusable.send_batch([("one", unusable.batch_params(request("hi")))]),
        lambda: unusable.batch_state("msgbatch_1"),
        lambda: unusable.batch_results("msgbatch_1"),
        lambda: unusable.cancel_batch("msgbatch_1"),
    ]
    for call in calls:
        with pytest.raises(ModelError) as failed:
            call()
        assert (failed.value.message, failed.value.transient) == ("Set this endpoint's key again.", False)


def test_only_clients_of_the_native_protocol_take_batches():
    assert ModelClient.takes_batches and not ReactClient.takes_batches


def test_the_demo_models_batches_are_seen_by_every_process_of_the_machine(tmp_path):
    """The offline demo runs several worker processes: one sends a batch, another looks at it later."""

    def client() -> ModelClient:
        http = httpx2.Client(transport=DemoTransport(batch_seconds=0, batch_dir=tmp_path))
        sdk = anthropic.Anthropic(api_key="offline", base_url="http://demo-model.invalid", http_client=http)
        return ModelClient(sdk, "claude-test", 1024)

    sender, poller = client(), client()  # two processes' clients: nothing in memory is shared
    batch_id = sender.send_batch([("desk-1", sender.batch_params(QUESTIONS["greeting"]))])
    assert poller.batch_state(batch_id).status == "in_progress"
    assert sender.batch_state(batch_id).status == "ended"  # the second look, from either process
    (result,) = poller.batch_results(batch_id)
    assert result.custom_id == "desk-1" and result.outcome == "succeeded"
    with pytest.raises(ModelError):
        client().batch_state("msgbatch_demo_" + "0" * 24)  # a batch no process sent
