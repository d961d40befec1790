"""An outside agent's call in the reviewer's pages: in the inbox with its source, on the decision page
with the agent's own words and facts set apart as the agent's, decided with the same form, and kept
out of the chat pages; its declared tool on the Policies page."""

from __future__ import annotations

import re
from html import unescape

from tests.api.test_outside_calls import ADMIN, AGENT, REVIEWER, ask, declare
from tests.approvals.test_decision_page import edit, page_text, section, words
from tests.clients import session_as
from webapp.models import ToolCall
from webapp.runtime.extensions import db


def test_the_inbox_and_the_decision_page_show_the_agent_and_its_words_as_its_own(app, api):
    declare(api)
    call = ask(api).json
    reviewer = session_as(app, REVIEWER)

    inbox = page_text(reviewer, "/approvals")
    row = words(section(inbox, f"approval-{call['id']}"))
    assert "treasury-bot" in row and AGENT in row and "transfer" in row

    html = page_text(reviewer, f"/approvals/{call['id']}")
    said = words(section(html, "outside-context"))
    assert "Asked by treasury-bot, an agent that runs elsewhere" in said
    assert "Supplier invoice 88 is due today." in said and "did not check it" in said
    assert "Supplied by treasury-bot, not checked by the desk" in html and "$12,000.00" in html
    assert "The conversation so far" not in html and "open conversation" not in html

    # the same edit form as any call: the reviewer sends $200 instead of $300
    page = reviewer.get(f"/approvals/{call['id']}").get_data(as_text=True)
    decided = edit(
        reviewer,
        db.session.get(ToolCall, call["id"]),
        page,
        {"amount_cents": "200.00", "account": "ACME-17", "memo": "invoice 88"},
        "half now",
    )
    assert decided.status_code in (200, 204), decided.get_data(as_text=True)
    db.session.remove()
    shown = api.as_(AGENT).get(f"/api/calls/{call['id']}").json
    assert shown["status"] == "approved" and shown["input"]["amount_cents"] == 20_000 and shown["edited"]

    api.as_(AGENT).post(f"/api/calls/{call['id']}/outcome", json={"ok": True, "summary": "Sent $200.00 to ACME-17."})
    after = page_text(reviewer, f"/approvals/{call['id']}")
    assert "treasury-bot reported at" in words(section(after, "outside-outcome"))
    assert "Sent $200.00 to ACME-17." in after


def test_an_outside_call_is_no_chat_and_its_tool_is_on_the_policies_page_without_the_assistants_access(app, api):
    declare(api)
    call = ask(api).json
    conversation_id = api.as_(REVIEWER).get(f"/api/approvals/{call['id']}").json["conversation_id"]
    agent = session_as(app, AGENT)
    assert "treasury-bot" not in agent.get("/conversations").get_data(as_text=True)
    assert api.as_(AGENT).get("/api/conversations").json["conversations"] == []
    opened = api.as_(AGENT).get(f"/api/conversations/{conversation_id}")
    assert opened.status_code == 404 and "treasury-bot" in opened.json["message"]
    written = api.as_(AGENT).post(f"/api/conversations/{conversation_id}/messages", json={"message": "hi"})
    assert written.status_code == 404

    policies = page_text(session_as(app, ADMIN), "/admin/policies")
    row = section(policies, "policy-transfer")
    assert "Asked about by agents that run elsewhere" in words(row) and "Send money from the treasury" in row
    assert "Who may use it" not in row and "Who may use it" in policies  # the assistant's tools keep theirs


def test_an_admin_declares_a_tool_on_the_policies_page_and_a_refused_one_keeps_what_was_typed(app, api):
    admin = session_as(app, ADMIN)
    page = admin.get("/admin/policies").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    typed = {
        "csrf_token": token,
        "name": "wire",
        "description": "Wire money abroad.",
        "input_schema": '{"type": "object", "properties": {"usd": {"type": "number"}}',  # a brace short
        "amount": "usd",
        "amount_unit": "dollars",
        "subject": "",
    }
    refused = admin.post("/admin/policies/external-tools", data=typed)
    assert refused.status_code == 422
    html = refused.get_data(as_text=True)
    assert "is not JSON" in words(section(html, "declare-error"))
    assert "Wire money abroad." in html and '{"type": "object", "properties": {"usd": {"type": "number"}}' in unescape(
        html
    )
    assert api.as_(ADMIN).get("/api/external-tools").json["tools"] == []

    declared = admin.post("/admin/policies/external-tools", data={**typed, "input_schema": typed["input_schema"] + "}"})
    assert declared.status_code == 303
    (tool,) = api.as_(ADMIN).get("/api/external-tools").json["tools"]
    assert tool["name"] == "wire" and tool["amount"] == "usd" and tool["amount_unit"] == "dollars"
    assert tool["policy"]["mode"] == "always"
    asked = api.as_(AGENT).post(
        "/api/calls",
        json={
            "source": "fx-bot",
            "tool": "wire",
            "input": {"usd": 12.5},
            "context": "Pay the Lyon office.",
            "idempotency_key": "w1",
        },
    )
    assert asked.status_code == 201 and asked.json["status"] == "waiting"

    removed = admin.post("/admin/policies/external-tools/wire/remove", data={"csrf_token": token})
    assert removed.status_code == 303 and api.as_(ADMIN).get("/api/external-tools").json["tools"] == []


def test_the_audit_log_says_what_an_edited_approval_changed(app, api):
    declare(api)
    call = ask(api).json
    edited = {"amount_cents": 20_000, "account": "ACME-17", "memo": "invoice 88"}
    api.as_(REVIEWER).post(f"/api/approvals/{call['id']}", json={"decision": "approve", "input": edited})
    html = page_text(session_as(app, "auditor@acme.test"), "/audit?action=approval_decided")
    assert "approve (edited: amount $300.00 → $200.00)" in words(html)
