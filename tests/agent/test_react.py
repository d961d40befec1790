"""A model without native tool use (MODEL_PROTOCOL=react): the same loop, the tools described in the
system prompt, the model's JSON actions and final answers read from its text, against a local
stand-in of such a server over HTTP (ModelServer with scripted text replies)."""

from __future__ import annotations

import json

import anthropic
import httpx2
import pytest
from sqlalchemy import select

import demo.billing.phrases  # noqa: F401 - the demo model speaks the billing tools' words (the last test)
from tests.model_server import Reply
from tests.replies import reply, text
from webapp.agent.decisions import arguments_hash, decide
from webapp.agent.loop import Loop, LoopSettings
from webapp.llm.react import ReactClient, read_action
from webapp.models import Conversation, Refund, ToolCall, User
from webapp.tools.billing import demo_registry


@pytest.fixture
def react_loop(session, agent, model):
    sdk = anthropic.Anthropic(
        api_key="local", base_url=model.url, max_retries=0, timeout=5, http_client=httpx2.Client()
    )
    client = ReactClient(sdk, "qwen-local", 1024)

    def make() -> Loop:
        conversation = Conversation(tenant_id=agent.tenant_id, user_id=agent.id, status="queued", move_budget=25)
        session.add(conversation)
        session.flush()
        return Loop(session, conversation, model=client, tools=demo_registry(), settings=LoopSettings())

    return make


def says(value: str):
    return Reply.message(reply(text(value)))


def action(name: str, arguments: dict, thought: str = "I need to look that up.") -> str:
    return json.dumps({"thought": thought, "action": name, "action_input": arguments})


def answer(words: str) -> str:
    return json.dumps({"thought": "I have what I need.", "final_answer": words})


def test_an_action_in_prose_and_a_code_fence_runs_the_tool_and_the_final_answer_ends_the_turn(react_loop, model):
    model.enqueue(
        says("Sure, let me check.\n```json\n" + action("lookup_invoices", {"customer_id": 4471}) + "\n```\nOne moment.")
    )
    model.enqueue(says(answer("Customer 4471 has invoices 4471 and 4472; both are paid.")))
    loop = react_loop()
    loop.ask_later("Show invoices for customer 4471")
    assert loop.complete() == "completed"

    first, second = model.requests
    assert "tools" not in first  # no native tool use: the tools are described in the system prompt
    assert '"name": "lookup_invoices"' in first["system"][-1]["text"]
    sent = second["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"][0]["text"].endswith(
        json.dumps({"action": "lookup_invoices", "action_input": {"customer_id": 4471}})
    )
    assert sent[2]["content"][0]["text"].startswith("Observation from lookup_invoices: <tool_output")
    assert all(block["type"] == "text" for m in sent for block in m["content"])
    last = loop.last_row()
    assert last.content == [{"type": "text", "text": "Customer 4471 has invoices 4471 and 4472; both are paid."}]


def test_a_reply_without_a_readable_action_goes_back_once_as_an_observation(react_loop, model):
    model.enqueue(says("I think the customer is fine {not json"))
    model.enqueue(says(answer("Customer 4471 is in good standing.")))
    loop = react_loop()
    loop.ask_later("Is customer 4471 fine?")
    assert loop.complete() == "completed"
    correction = model.requests[1]["messages"][-1]["content"][0]["text"]
    assert correction.startswith("Observation: your last reply could not be read (it holds no JSON object)")
    assert loop.last_row().content[0]["text"] == "Customer 4471 is in good standing."
    assert loop.conversation.moves_used == 1 and loop.conversation.run_tokens > 0


def test_an_unknown_tool_goes_back_as_an_observation_within_the_move_budget(react_loop, model, session):
    model.enqueue(says(action("teleport_customer", {"customer_id": 1})))
    model.enqueue(says(answer("I can't do that.")))
    loop = react_loop()
    loop.ask_later("Teleport customer 1")
    assert loop.complete() == "completed"
    [call] = session.scalars(select(ToolCall).where(ToolCall.conversation_id == loop.conversation.id))
    assert call.status == "failed"
    observation = model.requests[1]["messages"][-1]["content"][0]["text"]
    assert observation.startswith("Observation from teleport_customer (failed): Unknown tool 'teleport_customer'")


def test_a_sensitive_action_waits_for_a_person_and_runs_once_approved(react_loop, model, session):
    model.enqueue(says(action("issue_refund", {"invoice_id": 4471, "amount_cents": 6000, "reason": "late"})))
    model.enqueue(says(answer("The $60.00 refund on invoice 4471 was issued.")))
    loop = react_loop()
    loop.ask_later("Refund $60 on invoice 4471")
    assert loop.complete() == "awaiting_approval"
    [call] = session.scalars(select(ToolCall).where(ToolCall.conversation_id == loop.conversation.id))
    reviewer = session.scalar(select(User).where(User.email == "reviewer@acme.test"))
    decide(session, call, reviewer, approve=True, arguments_seen=arguments_hash(call.input))
    loop.conversation.status = "queued"  # (the wake-up the decision's action would enqueue)
    assert loop.complete() == "completed"
    assert session.scalar(select(Refund).where(Refund.invoice_id == 4471)).amount_cents == 6000
    assert loop.last_row().content[0]["text"] == "The $60.00 refund on invoice 4471 was issued."


@pytest.mark.parametrize(
    ("reply_text", "expected"),
    [
        ('{"thought": "t", "final_answer": "Done."}', {"final_answer": "Done."}),
        (
            'Here:\n```\n{"action": "lookup_customer", "action_input": "{\\"query\\": \\"4471\\"}"}\n```',
            {"action_input": {"query": "4471"}},
        ),
        (
            '{"note": 1} then {"action": "lookup_customer", "action_input": {"query": "a"}} trailing',
            {"action": "lookup_customer"},
        ),
    ],
)
def test_reading_an_action_is_tolerant(reply_text, expected):
    found, problem = read_action(reply_text)
    assert problem == "" and expected.items() <= found.items()


@pytest.mark.parametrize(
    ("reply_text", "problem"),
    [
        ("No JSON here.", "it holds no JSON object"),
        ('{"thought": "only thinking"}', 'its JSON has neither an "action" nor a "final_answer"'),
        ('{"action": "lookup_customer", "action_input": [1]}', "its action_input is not a JSON object"),
    ],
)
def test_an_unreadable_reply_says_what_was_wrong(reply_text, problem):
    assert read_action(reply_text) == (None, problem)


def test_the_offline_demo_model_speaks_the_text_protocol_too(react_loop, model, session):
    """MODEL_PROTOCOL=react works without a local server: the demo model reads the text back."""
    loop = react_loop()
    loop.ask_later("Show invoices for customer 4471")
    assert loop.complete() == "completed"
    assert all("tools" not in body for body in model.requests)
    [call] = session.scalars(select(ToolCall).where(ToolCall.conversation_id == loop.conversation.id))
    assert (call.name, call.status) == ("lookup_invoices", "succeeded")
    answer = loop.last_row().content[0]["text"]
    assert "4471" in answer and "final_answer" not in answer and "{" not in answer
