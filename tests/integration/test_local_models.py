"""A local model without native tool use behind an Anthropic-compatible server (MODEL_PROTOCOL=react),
through the API and a real worker: the tool runs from the model's JSON action, and people read the
final answer, never the JSON."""

from __future__ import annotations

import json

import pytest

from tests.clients import session_as
from tests.integration.test_workers import AGENT, start, wait_status
from tests.model_server import Reply
from tests.replies import reply, text

pytestmark = pytest.mark.slow


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
