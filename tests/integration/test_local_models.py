"""A local model without native tool use behind an Anthropic-compatible server (MODEL_PROTOCOL=react),
through the API and a real worker: the tool runs from the model's JSON action, and people read the
final answer, never the JSON."""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from sqlalchemy import func, select

from tests.clients import session_as
from tests.conftest import wait_until
from tests.integration.test_workers import AGENT, start, wait_status
from tests.model_server import ModelServer, Reply
from tests.replies import reply, text
from webapp.models import ModelCall, ModelEndpoint

pytestmark = pytest.mark.slow


@pytest.fixture
def local() -> Iterator[ModelServer]:
    """A second local model server, started before the app so that OUTBOUND_ALLOW can name it."""
    with ModelServer() as server:
        yield server


@pytest.fixture
def env(env, model, local) -> dict[str, str]:
    """The two local servers are the only private addresses the desk may call as registered endpoints."""
    return {**env, "OUTBOUND_ALLOW": f"{urlsplit(model.url).netloc},{urlsplit(local.url).netloc}"}


def test_a_model_that_answers_only_in_text_uses_the_tools_through_the_worker(app, api, workers, model):
    lookup = {"thought": "I need the invoices.", "action": "lookup_invoices", "action_input": {"customer_id": 4471}}
    model.enqueue(Reply.message(reply(text("Let me look.\n```json\n" + json.dumps(lookup) + "\n```"))))
    final = {"thought": "Both are listed.", "final_answer": "Customer 4471 has two invoices, both paid."}
    model.enqueue(Reply.message(reply(text(json.dumps(final)))))
    workers(MODEL_PROTOCOL="react")

    conversation_id = start(api, "Show invoices for customer 4471")
    state = wait_status(api, conversation_id, "completed", "failed")

    assert state["status"] == "completed", state
    assert all("tools" not in body for body in model.requests)
    assert [call["name"] for call in state["tool_calls"]] == ["lookup_invoices"]
    assert state["tool_calls"][0]["status"] == "succeeded"
    page = session_as(app, AGENT).get(f"/conversations/{conversation_id}").get_data(as_text=True)
    assert "Customer 4471 has two invoices, both paid." in page
    assert "final_answer" not in page and "action_input" not in page


def test_an_endpoint_registered_for_one_tenant_serves_its_conversations_and_no_one_else(
    app, api, workers, model, local, cli, read
):
    lookup = {"thought": "I need the invoices.", "action": "lookup_invoices", "action_input": {"customer_id": 4471}}
    local.enqueue(Reply.message(reply(text(json.dumps(lookup)))))
    local.enqueue(Reply.message(reply(text(json.dumps({"final_answer": "Two invoices, both paid."})))))
    added = cli(
        "endpoint", "add", "local-qwen", "--base-url", local.url, "--model", "qwen3:8b",
        "--api-key", "sk-local-secret", "--protocol", "react", "--context-window", "32000",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    assert cli("tenant", "set-model", "acme", "--endpoint", "local-qwen").exit_code == 0
    listing = cli("endpoint", "list").output
    assert "local-qwen: qwen3:8b at http://127.0.0.1" in listing and "serves acme" in listing
    assert "sk-local-secret" not in listing and "key stored encrypted" in listing
    stored = read(lambda s: s.scalar(select(ModelEndpoint.api_key_encrypted)))
    assert stored and "sk-local-secret" not in stored
    workers()

    ours = start(api, "Show invoices for customer 4471")
    assert wait_status(api, ours, "completed", "failed")["status"] == "completed"
    theirs = api.as_("agent@globex.test").post("/api/conversations", json={"message": "Look up ada@example.com"})
    assert wait_status_of(api, "agent@globex.test", theirs.json["id"]) == "completed"

    assert len(local.requests) == 2 and all(body["model"] == "qwen3:8b" for body in local.requests)
    assert all(body["model"] != "qwen3:8b" for body in model.requests) and model.requests  # globex: default
    served = read(lambda s: list(s.execute(select(ModelCall.conversation_id, ModelCall.endpoint))))
    assert {endpoint for cid, endpoint in served if cid == ours} == {"local-qwen"}
    assert {endpoint for cid, endpoint in served if cid == theirs.json["id"]} == {None}


def wait_status_of(api, email: str, conversation_id: int) -> str:
    return wait_until(
        lambda: (
            (s := api.as_(email).get(f"/api/conversations/{conversation_id}").json["status"]) in ("completed", "failed")
            and s
        ),
        30,
        f"conversation {conversation_id} to end",
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["Local Qwen!", "--base-url", "http://h:1", "--model", "m"], "is not an endpoint name"),
        (["q", "--base-url", "ftp://h", "--model", "m"], "is not a base URL"),
        (["q", "--base-url", "http://h:1", "--model", " "], "Name the model"),
        (["q", "--base-url", "http://h:1", "--model", "m", "--api-key", "k", "--api-key-env", "K"], "not both"),
        (["q", "--base-url", "http://h:1", "--model", "m", "--api-key-env", "1BAD"], "cannot hold an endpoint's key"),
        (["q", "--base-url", "http://h:1", "--model", "m", "--context-window", "1000"], "leaves no room"),
        (["q", "--base-url", "http://h:1", "--model", "m", "--protocol", "json"], "'json' is not one of"),
    ],
)
def test_a_bad_endpoint_is_refused_with_what_to_fix_and_nothing_is_kept(cli, read, args, says):
    result = cli("endpoint", "add", *args)
    assert result.exit_code == 2 and says in result.output
    assert read(lambda s: s.scalar(select(func.count()).select_from(ModelEndpoint))) == 0


def test_a_tenant_can_only_be_set_to_an_endpoint_that_exists(cli):
    refused = cli("tenant", "set-model", "acme", "--endpoint", "nope")
    assert refused.exit_code == 2 and "There is no endpoint 'nope' (registered: none yet)" in refused.output
    assert "There is no tenant 'nowhere'" in cli("tenant", "set-model", "nowhere", "--endpoint", "default").output
    back = cli("tenant", "set-model", "acme", "--endpoint", "default")
    assert back.exit_code == 0 and "Tenant acme is now served by default" in back.output


def test_a_tenant_with_a_small_endpoint_routes_each_question_through_a_worker(
    app, api, workers, model, local, cli, read
):
    """The large endpoint is the `model` server, the small one a second local server: a short look-up
    runs on the small one, a question with a change in it on the large one, every move of each."""
    for name, url in (("large", model.url), ("small", local.url)):
        added = cli("endpoint", "add", name, "--base-url", url, "--model", f"{name}-model")
        assert added.exit_code == 0, added.output
    routed = cli("tenant", "set-model", "acme", "--endpoint", "large", "--small-endpoint", "small")
    assert routed.exit_code == 0, routed.output
    workers()

    simple = start(api, "Look up ada@example.com")
    assert wait_status(api, simple, "completed", "failed")["status"] == "completed"
    complex_ = start(api, "Show invoices for customer 4471 and explain why the second differs")
    assert wait_status(api, complex_, "completed", "failed")["status"] == "completed"

    asked = [body["model"] for body in local.requests]
    assert asked.count("small-model") == 4  # two classifications, then the simple run's lookup and answer
    assert model.requests and {body["model"] for body in model.requests} == {"large-model"}
    calls = select(ModelCall.conversation_id, ModelCall.purpose, ModelCall.endpoint, ModelCall.route)
    served = read(lambda s: list(s.execute(calls)))
    assert {row[1:] for row in served if row[0] == simple} == {
        ("route", "small", "small: classifies the question"),
        ("answer", "small", "small: classified simple"),
    }
    assert {row[1:] for row in served if row[0] == complex_} == {
        ("route", "small", "small: classifies the question"),
        ("answer", "large", "large: classified complex"),
    }
