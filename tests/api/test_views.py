"""What a program reads of a conversation: typed content blocks, and each tool call's structured `output`
and its `summary` for people, with the text written for the model (fences, the desk's notes) out of
both the messages and the summaries."""

from __future__ import annotations

from tests.approvals.test_inbox import refund, waiting_calls
from tests.model_server import Reply
from tests.replies import reply, text, tool_use
from webapp.api.conversations import ConversationView
from webapp.models import Conversation
from webapp.runtime.extensions import db
from webapp.runtime.services import services

AGENT, REVIEWER = "agent@acme.test", "reviewer@acme.test"


def test_a_conversation_reads_as_typed_blocks_with_each_calls_output_and_summary(api, model):
    lookup = tool_use("lookup_invoices", {"customer_id": 4471})
    (looked, call) = waiting_calls(api, model, lookup, refund(4471, 9000))
    model.enqueue(Reply.message(reply(text("Refunded $50 after the edit."))), match="refund")
    edited = {"invoice_id": 4471, "amount_cents": 5000, "reason": "late delivery"}
    decided = api.as_(REVIEWER).post(f"/api/approvals/{call.id}", json={"decision": "approve", "input": edited})
    assert decided.status_code == 200, decided.json
    services().loop(db.session, db.session.get(Conversation, call.conversation_id)).complete()
    db.session.remove()

    seen = api.as_(AGENT).get(f"/api/conversations/{call.conversation_id}").json
    ConversationView.model_validate(seen)  # the document's schema, discriminated by `type`
    blocks = [block for message in seen["messages"] for block in message["content"]]
    assert [block["type"] for block in blocks] == ["text", "tool_use", "tool_use", "tool_result", "tool_result", "text"]
    uses = {block["id"]: block for block in blocks if block["type"] == "tool_use"}
    results = [block for block in blocks if block["type"] == "tool_result"]
    assert [block["tool_call_id"] for block in results] == [looked.id, call.id]
    assert uses[call.tool_use_id]["input"]["amount_cents"] == 9000  # what the model asked for; the call ran the edit
    calls = {row["id"]: row for row in seen["tool_calls"]}

    ran = calls[looked.id]
    assert isinstance(ran["output"], (dict, list)) and "4471" in str(ran["output"])  # the tool's JSON, parsed
    refunded = calls[call.id]
    assert refunded["input"] == edited and refunded["output"]["amount_cents"] == 5000
    assert "$50.00" in refunded["summary"] and results[1]["summary"] == refunded["summary"]
    for words in [block["summary"] for block in results] + [row["summary"] for row in seen["tool_calls"]]:
        assert "<tool_output" not in words and "Note from the approval desk" not in words
    assert "<tool_output" not in str(seen["messages"])


def test_a_rejected_and_a_waiting_call_say_so_in_their_summary(api, model):
    first, second = waiting_calls(api, model, refund(4471, 9000), refund(4401, 20000))
    rejected = api.as_(REVIEWER).post(f"/api/approvals/{first.id}", json={"decision": "reject", "reason": "Too much"})
    assert rejected.json["summary"] == "Rejected by Acme Corp reviewer: Too much. Nothing was done."
    assert rejected.json["output"] is None
    waiting = api.as_(REVIEWER).get(f"/api/approvals/{second.id}").json
    assert waiting["summary"].startswith("Waiting for approval: ") and waiting["output"] is None


def test_the_document_names_its_server_and_types_the_content_blocks(app):
    document = app.test_client().get("/api/openapi.json").json
    assert document["servers"] == [{"url": services().config.public_url, "description": "This desk."}]
    schemas = document["components"]["schemas"]
    content = schemas["MessageView"]["properties"]["content"]["items"]
    assert content["discriminator"]["propertyName"] == "type"
    assert set(content["discriminator"]["mapping"]) == {"text", "tool_use", "tool_result", "other"}
    assert schemas["ToolCallView"]["properties"]["result"]["deprecated"] is True
