"""An integrator's program, written as one would write it: against a client that openapi-python-client
generates from GET /api/openapi.json, over HTTP to the desk on a live server with a real worker. It
learns of the waiting call and of the answer from signed webhooks (checked with the `standardwebhooks`
library), never by polling; approves the refund with an edit; reads the conversation back as typed
blocks; and finds it in the list."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.browser.conftest import LiveServer
from tests.conftest import ROOT, wait_until
from tests.model_server import Reply
from tests.notify.test_webhooks import Receiver
from tests.replies import reply, text, tool_use

ADMIN, AGENT, REVIEWER = "admin@acme.test", "agent@acme.test", "reviewer@acme.test"
GENERATOR = ROOT / ".venv" / "bin" / "openapi-python-client"


@pytest.fixture
def receiver():
    with Receiver() as made:
        yield made


def generate_client(document: dict, where: Path):
    """The package openapi-python-client makes of the document, imported (as `desk_api`)."""
    (where / "openapi.json").write_text(json.dumps(document))
    made = subprocess.run(
        [str(GENERATOR), "generate", "--path", "openapi.json", "--output-path", "desk_api", "--meta", "none"],
        cwd=where,
        env={**os.environ, "PATH": f"{GENERATOR.parent}{os.pathsep}{os.environ.get('PATH', '')}"},  # (its ruff)
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    assert "Warning" not in made.stdout + made.stderr, made.stdout + made.stderr  # every operation and model made
    sys.path.insert(0, str(where))
    try:
        return importlib.import_module("desk_api")
    finally:
        sys.path.remove(str(where))


@pytest.fixture
def desk_api(app, tmp_path):
    package = generate_client(app.test_client().get("/api/openapi.json").json, tmp_path)
    yield package
    for name in [name for name in sys.modules if name == "desk_api" or name.startswith("desk_api.")]:
        del sys.modules[name]


def test_a_program_on_a_generated_client_learns_by_events_and_approves_with_an_edit(
    api, env, model, receiver, workers, zygote, tmp_path, desk_api
):
    from desk_api import AuthenticatedClient
    from desk_api.api.approvals import decide_approval
    from desk_api.api.conversations import create_conversation, get_conversation, list_conversations
    from desk_api.api.webhooks import create_webhook
    from desk_api.models import (
        ConversationList,
        ConversationView,
        CreateWebhook,
        DecideApproval,
        DecideApprovalDecision,
        EventType,
        StartConversation,
        TextBlock,
        ToolArguments,
        ToolCallView,
        ToolResultBlock,
        ToolUseBlock,
        WebhookCreated,
    )

    allowed = {"OUTBOUND_ALLOW": f"127.0.0.1:{receiver.port}"}  # the receiver is the one private address
    server = LiveServer({**env, **allowed}, tmp_path / "live-server.log", zygote)
    try:
        server.wait_until_up()
        workers(**allowed)

        def as_(email: str) -> AuthenticatedClient:
            return AuthenticatedClient(base_url=server.url, token=api.token(email), raise_on_unexpected_status=True)

        events = [EventType.APPROVAL_REQUESTED, EventType.CONVERSATION_COMPLETED]
        hook = create_webhook.sync(client=as_(ADMIN), body=CreateWebhook(url=receiver.url, events=events))
        assert isinstance(hook, WebhookCreated) and hook.secret.startswith("whsec_")
        receiver.secret = hook.secret

        asked = {"invoice_id": 4471, "amount_cents": 12000, "reason": "late delivery"}
        model.enqueue(Reply.message(reply(tool_use("issue_refund", asked))), match="refund me")
        model.enqueue(Reply.message(reply(text("Refunded $80.00."))), match="refund")
        started = create_conversation.sync(client=as_(AGENT), body=StartConversation(message="refund me $120"))

        wait_until(lambda: receiver.types() == ["approval.requested"], 30, "the approval.requested event")
        waiting = receiver.received[0]
        assert waiting["verified"] and waiting["body"]["data"]["conversation_id"] == started.id
        edited = {**asked, "amount_cents": 8000}
        decided = decide_approval.sync(
            waiting["body"]["data"]["call_id"],
            client=as_(REVIEWER),
            body=DecideApproval(
                decision=DecideApprovalDecision.APPROVE,
                input_=ToolArguments.from_dict(edited),  # (the generator renames a builtin)
                arguments_hash=waiting["body"]["data"]["arguments_hash"],
            ),
        )
        assert isinstance(decided, ToolCallView) and decided.input_.to_dict() == edited

        wait_until(lambda: len(receiver.received) == 2, 30, "the conversation.completed event")
        assert receiver.types() == ["approval.requested", "conversation.completed"]
        assert all(request["verified"] for request in receiver.received)

        seen = get_conversation.sync(started.id, client=as_(AGENT))
        assert isinstance(seen, ConversationView) and seen.status.value == "completed"
        (call,) = seen.tool_calls
        assert call.input_.to_dict() == edited and call.status.value == "succeeded"
        assert call.output["amount_cents"] == 8000 and "$80.00" in call.summary
        kinds = [type(block) for message in seen.messages for block in message.content]
        assert kinds == [TextBlock, ToolUseBlock, ToolResultBlock, TextBlock]
        assert seen.messages[-1].content[0].text == "Refunded $80.00."

        listed = list_conversations.sync(client=as_(AGENT))
        assert isinstance(listed, ConversationList) and [row.id for row in listed.conversations] == [started.id]
    finally:
        server.stop()
        print(f"--- {server.log_path.name} ---\n{server.output()[-6000:]}")
