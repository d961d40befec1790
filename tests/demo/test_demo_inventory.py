"""What bin/demo shows with its inventory MCP server: with no model server given, the offline demo
model answers (in the worker, beneath the real SDK), uses the inventory's tools when a person asks in
words or with [[call ...]], and the desk's gate holds: the read-only lookup runs at once, the restock
waits for a reviewer and, once approved, runs once, and the demo model's reply tells its result."""

from __future__ import annotations

import json
import sys

import pytest

from tests.integration.test_workers import AGENT, REVIEWER, assert_valid_transcript, start, wait_status
from webapp.models import ToolCall

pytestmark = pytest.mark.slow

LOOKUP, RESTOCK = "mcp_inventory__lookup", "mcp_inventory__restock"


@pytest.fixture
def env(env) -> dict[str, str]:
    """No model endpoint: the workers fall back on the offline demo model, as bin/demo's do."""
    return {key: value for key, value in env.items() if key not in ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY")}


def last_words(conversation: dict) -> str:
    return " ".join(b["text"] for b in conversation["messages"][-1]["content"] if b["type"] == "text")


def test_the_demo_model_uses_the_demo_inventory_behind_the_approval_gate(app, cli, api, workers, model, read, tmp_path):
    state = tmp_path / "inventory.json"
    command = f"{sys.executable} -m demo.inventory_server --state {state}"
    added = cli("mcp", "add", "inventory", "--command", command, "--tenant", "acme")
    assert added.exit_code == 0, added.output
    workers()

    conversation_id = start(api, "Look up A-1 in the inventory and restock A-1 with 5 units.")
    waiting = wait_status(api, conversation_id, "awaiting_approval", "failed", "completed")
    assert waiting["status"] == "awaiting_approval", waiting
    lookup, restock = waiting["tool_calls"]
    assert (lookup["name"], lookup["input"], lookup["status"]) == (LOOKUP, {"sku": "A-1"}, "succeeded")  # at once
    assert (restock["name"], restock["input"], restock["status"]) == (
        RESTOCK,
        {"sku": "A-1", "quantity": 5},
        "awaiting_approval",
    )
    assert not state.exists()  # nothing written before a person decides

    approved = api.as_(REVIEWER).post(f"/api/approvals/{restock['id']}", json={"decision": "approve"})
    assert approved.status_code == 200, approved.json
    done = wait_status(api, conversation_id, "completed", "failed")
    assert done["status"] == "completed", done
    assert_valid_transcript(done)
    assert json.loads(state.read_text())["A-1"]["in_stock"] == 17  # restocked once: 12 + 5
    assert read(lambda s: s.get(ToolCall, restock["id"]).attempts) == 1
    assert last_words(done) == (
        "Here's what happened:\n"
        "- mcp_inventory__lookup answered: sku A-1, name Blue mug, in stock 12.\n"
        "- mcp_inventory__restock answered: sku A-1, name Blue mug, added 5, in stock 17."
    )
    again = api.as_(REVIEWER).post(f"/api/approvals/{restock['id']}", json={"decision": "approve"})
    assert again.status_code == 409  # decided once, run once

    asked = api.as_(AGENT).post(
        f"/api/conversations/{conversation_id}/messages",
        json={"message": '[[call mcp_inventory__lookup {"sku": "A-1"}]]'},
    )
    assert asked.status_code == 202, asked.json
    later = wait_status(api, conversation_id, "completed", "failed")
    assert later["status"] == "completed" and len(later["tool_calls"]) == 3
    assert last_words(later) == "mcp_inventory__lookup answered: sku A-1, name Blue mug, in stock 17."
    assert model.requests == []  # no model server was asked: the demo model answered every move
