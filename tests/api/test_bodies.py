"""Request and response bodies of the JSON API (webapp/api/, each resource's module): strict, closed requests refused
with every bad field named, and responses in the shape clients rely on."""

from __future__ import annotations

import copy
import json
import re
import typing

import pytest
from sqlalchemy import func, select

from demo.billing.models import Refund
from tests.api.test_outside_calls import TRANSFER
from tests.clients import ADMIN, ADMIN2, AGENT, REVIEWER
from tests.model_server import Reply
from tests.replies import reply, text, tool_use
from webapp.agent.decisions import arguments_hash
from webapp.api import approvals, bodies, conversations, reading, tool_calls
from webapp.api.openapi import api_rules
from webapp.models import Conversation, Decision, ToolCall
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.tools.tasks import STATUSES

REFUND = {"invoice_id": 4471, "amount_cents": 9000, "reason": "late delivery"}

CONVERSATION_KEYS = {
    "id",
    "title",
    "status",
    "stop_reason",
    "error",
    "cancel_requested",
    "cancel_reason",
    "moves_used",
    "move_budget",
    "messages",
    "tool_calls",
    "tasks",
    "usage",
    "created_at",
    "updated_at",
}
CALL_KEYS = {
    "claimed_by",
    "claimed_until",
    "id",
    "conversation_id",
    "tool_use_id",
    "name",
    "source",  # added: the outside agent that asked (null: the assistant)
    "input",
    "arguments_hash",
    "status",
    "requires_approval",
    "output",  # added: the tool's own output, and the call in a sentence for people
    "summary",
    "result",
    "is_error",
    "decided_by",
    "decided_at",
    "decision_reason",
    "task",
    "created_at",
}
TASK_KEYS = {
    "tool_call_id",
    "tool",
    "status",
    "message",
    "progress",
    "input_required",
    "last_progress_at",
    "next_check_at",
}
USAGE_KEYS = {"input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "model_calls"}


def conversation_count(read) -> int:
    return read(lambda s: s.scalar(select(func.count(Conversation.id))))


def assert_refused(response, *fields: str) -> None:
    """A 422 naming exactly these fields, in words of our own."""
    assert response.status_code == 422, response.json
    assert response.json["error"] == "invalid_field"
    assert [item["field"] for item in response.json["fields"]] == list(fields)
    for field in fields:
        assert f'"{field}"' in response.json["message"]
    raw = json.dumps(response.json)
    assert "pydantic" not in raw and "Input should" not in raw and "Extra inputs" not in raw, raw


def waiting_refund(api, model) -> dict:
    """A conversation of the agent whose refund call waits for approval; the call as the API lists it."""
    model.enqueue(Reply.message(reply(tool_use("issue_refund", REFUND))), match="refund please")
    created = api.as_(AGENT).post("/api/conversations", json={"message": "refund please"}).json
    assert services().loop(db.session, db.session.get(Conversation, created["id"])).complete() == "awaiting_approval"
    db.session.remove()
    (listed,) = api.as_(REVIEWER).get("/api/approvals").json["approvals"]
    return listed


# --- refusals -----------------------------------------------------------------------------------


def test_an_unknown_field_is_refused_and_named_not_ignored(api, read):
    response = api.as_(AGENT).post("/api/conversations", json={"message": "hi", "colour": "red"})
    assert_refused(response, "colour")
    assert response.json["fields"] == [{"field": "colour", "problem": "is not a field of this request"}]
    assert response.json["message"] == '"colour" is not a field of this request.'
    assert conversation_count(read) == 0


def test_every_bad_field_is_named_in_one_answer(api, read):
    response = api.as_(AGENT).post("/api/conversations", json={"message": 42, "colour": "red"})
    assert_refused(response, "message", "colour")
    assert response.json["message"] == (
        '"message" must be a non-empty string of at most 20,000 characters; "colour" is not a field of this request.'
    )
    assert conversation_count(read) == 0


@pytest.mark.parametrize(
    ("url", "sent", "field"),
    [
        ("/api/conversations", {"message": ["hi"]}, "message"),
        ("/api/conversations", {"message": None}, "message"),
        ("/api/conversations/1/messages", {"message": 1.5}, "message"),
        ("/api/conversations/1/budget", {"moves": "5"}, "moves"),
        ("/api/conversations/1/budget", {"moves": True}, "moves"),
        ("/api/approvals/1", {"decision": True}, "decision"),
        ("/api/approvals/1", {"decision": "reject", "reason": 5}, "reason"),
        ("/api/approvals/1", {"decision": "approve", "arguments_hash": 123}, "arguments_hash"),
        ("/api/tool-calls/1/input", {"input": 123456}, "input"),
    ],
)
def test_a_wrong_type_is_refused_with_the_fields_name(api, url, sent, field):
    email = AGENT if "/messages" in url or "/input" in url or url == "/api/conversations" else REVIEWER
    assert_refused(api.as_(email).post(url, json=sent), field)


def test_an_empty_or_blank_or_missing_message_is_refused(api, read):
    agent = api.as_(AGENT)
    for sent in ({"message": ""}, {"message": " \n\t"}, {}):
        response = agent.post("/api/conversations", json=sent)
        assert_refused(response, "message")
        assert "non-empty string" in response.json["message"] and "Write a message first." in response.json["message"]
    assert "is required" in agent.post("/api/conversations", json={}).json["fields"][0]["problem"]
    assert conversation_count(read) == 0


def test_an_over_long_message_is_refused_with_the_limit(api, read):
    from webapp.conversations.actions import MAX_MESSAGE_CHARS

    agent = api.as_(AGENT)
    response = agent.post("/api/conversations", json={"message": "x" * (MAX_MESSAGE_CHARS + 1)})
    assert_refused(response, "message")
    assert f"at most {MAX_MESSAGE_CHARS:,} characters" in response.json["message"]
    assert conversation_count(read) == 0
    assert agent.post("/api/conversations", json={"message": "x" * MAX_MESSAGE_CHARS}).status_code == 201


def test_the_reason_has_its_limit_too(api, model):
    from webapp.approvals.actions import MAX_REASON_CHARS

    call = waiting_refund(api, model)
    response = api.as_(REVIEWER).post(
        f"/api/approvals/{call['id']}", json={"decision": "reject", "reason": "x" * (MAX_REASON_CHARS + 1)}
    )
    assert_refused(response, "reason")
    assert f"at most {MAX_REASON_CHARS:,} characters" in response.json["message"]


@pytest.mark.parametrize("edited", [[1, 2], "{}", 5, True])
def test_edited_input_that_is_not_an_object_is_refused(api, model, edited):
    call = waiting_refund(api, model)
    response = api.as_(REVIEWER).post(
        f"/api/approvals/{call['id']}", json={"decision": "approve", "edited_input": edited}
    )
    assert_refused(response, "edited_input")
    assert "JSON object" in response.json["message"]
    assert db.session.scalar(select(func.count(Decision.id))) == 0
    assert db.session.get(ToolCall, call["id"]).status == "awaiting_approval"


@pytest.mark.parametrize(
    "url",
    ["/api/conversations", "/api/conversations/1/messages", "/api/approvals/1", "/api/tool-calls/1/input"],
)
@pytest.mark.parametrize(
    ("data", "content_type"),
    [
        (b"{not json", "application/json"),
        (b"null", "application/json"),
        (b'"message"', "application/json"),
        (b'[{"message": "hi"}]', "application/json"),
        (b"message=hi", "application/x-www-form-urlencoded"),
        (b"", None),
    ],
)
def test_a_body_that_is_not_a_json_object_is_400(api, url, data, content_type):
    email = REVIEWER if "approvals" in url else AGENT
    response = api.as_(email).post(url, data=data, content_type=content_type)
    assert response.status_code == 400
    assert response.json == {
        "error": "invalid_json",
        "message": "Send a JSON object with Content-Type: application/json.",
    }


def test_the_budget_defaults_to_ten_moves_and_refuses_unknown_fields(api):
    created = api.as_(AGENT).post("/api/conversations", json={"message": "hi"}).json
    db.session.execute(Conversation.__table__.update().values(status="budget_exhausted", moves_used=25, move_budget=25))
    db.session.commit()
    url = f"/api/conversations/{created['id']}/budget"
    assert_refused(api.as_(REVIEWER).post(url, json={"move": 5}), "move")
    response = api.as_(REVIEWER).post(url, json={})
    assert response.status_code == 202
    assert response.json == {"id": created["id"], "status": "queued", "move_budget": 35}


def test_input_for_a_task_is_validated_before_anything_is_looked_up(api):
    agent = api.as_(AGENT)
    assert_refused(agent.post("/api/tool-calls/999999/input", json={"input": "1", "code": "2"}), "code")
    response = agent.post("/api/tool-calls/999999/input", json={"input": ""})
    assert_refused(response, "input")
    assert "Type the input first." in response.json["message"]
    assert agent.post("/api/tool-calls/999999/input", json={"input": "1"}).status_code == 404


def test_a_flood_of_unknown_fields_gets_a_short_answer(api):
    sent = {"message": "hi", **{f"field{i}": i for i in range(500)}}
    response = api.as_(AGENT).post("/api/conversations", json=sent)
    assert response.status_code == 422
    assert len(response.json["fields"]) == reading.MAX_PROBLEMS
    assert response.json["message"].endswith(f"and {500 - reading.MAX_PROBLEMS} more fields are wrong.")


# --- edit and approve ---------------------------------------------------------------------------


def test_approving_with_edits_through_the_api_runs_the_tool_with_the_edited_arguments(api, model):
    call = waiting_refund(api, model)
    edited = {**REFUND, "amount_cents": 5000}
    decided = api.as_(REVIEWER).post(
        f"/api/approvals/{call['id']}",
        json={
            "decision": "approve",
            "reason": "half is fair",
            "arguments_hash": call["arguments_hash"],
            "edited_input": edited,
        },
    )
    assert decided.status_code == 200, decided.json
    assert set(decided.json) == CALL_KEYS
    assert decided.json["status"] == "approved" and decided.json["decided_by"] == REVIEWER
    assert decided.json["input"] == edited and decided.json["arguments_hash"] == arguments_hash(edited)

    model.enqueue(Reply.message(reply(text("Refunded $50.00."))))
    conversation = db.session.get(Conversation, call["conversation_id"])
    assert services().loop(db.session, conversation).complete() == "completed"
    refund = db.session.scalar(select(Refund))
    assert (refund.invoice_id, refund.amount_cents) == (4471, 5000)
    settled = db.session.get(ToolCall, call["id"])
    assert settled.status == "succeeded" and settled.original_input == REFUND and settled.input == edited
    told = model.requests[-1]["messages"][-1]["content"][0]["content"]
    assert "changed the arguments before approving" in told and '"amount_cents": 5000' in told
    decision = db.session.scalar(select(Decision).where(Decision.tool_call_id == call["id"]))
    assert decision.edited_input == edited


def test_an_edit_sent_as_input_runs_the_tool_with_the_edited_amount(api, model):
    call = waiting_refund(api, model)
    edited = {**REFUND, "amount_cents": 4000}
    decided = api.as_(REVIEWER).post(
        f"/api/approvals/{call['id']}", json={"decision": "approve", "input": edited, "reason": "partial"}
    )
    assert decided.status_code == 200, decided.json
    assert decided.json["input"] == edited

    model.enqueue(Reply.message(reply(text("Done."))))
    conversation = db.session.get(Conversation, call["conversation_id"])
    assert services().loop(db.session, conversation).complete() == "completed"
    db.session.remove()
    assert [r.amount_cents for r in db.session.scalars(select(Refund))] == [4000]
    (shown,) = api.as_(AGENT).get(f"/api/conversations/{call['conversation_id']}").json["tool_calls"]
    assert shown["status"] == "succeeded" and shown["input"]["amount_cents"] == 4000
    assert '"amount_cents": 4000' in shown["result"]


def test_a_decision_with_a_field_it_does_not_know_is_refused_not_ignored(api, model):
    call = waiting_refund(api, model)
    url = f"/api/approvals/{call['id']}"
    reviewer = api.as_(REVIEWER)
    assert_refused(reviewer.post(url, json={"decision": "approve", "edits": {**REFUND, "amount_cents": 4000}}), "edits")
    both = reviewer.post(url, json={"decision": "approve", "input": REFUND, "edited_input": REFUND})
    assert_refused(both, "edited_input")
    assert 'send only "input"' in both.json["message"]
    assert db.session.scalar(select(func.count(Decision.id))) == 0
    assert db.session.get(ToolCall, call["id"]).status == "awaiting_approval"


def test_an_edit_the_tool_would_refuse_is_a_422_naming_the_argument_and_why(api, model):
    call = waiting_refund(api, model)
    refused = api.as_(REVIEWER).post(
        f"/api/approvals/{call['id']}", json={"decision": "approve", "input": {**REFUND, "amount_cents": 999_999}}
    )
    assert refused.status_code == 422 and refused.json["error"] == "invalid_input"
    problem = "A refund of $9,999.99 is more than the $129.00 left to refund on invoice 4471 (total $129.00)."
    assert refused.json["fields"] == [{"field": "input.amount_cents", "problem": problem}]
    assert refused.json["message"] == problem + " Nothing was approved."
    assert db.session.scalar(select(func.count(Decision.id))) == 0


def test_one_approval_shows_the_facts_beside_the_call_while_it_waits(api, model):
    call = waiting_refund(api, model)
    reviewer = api.as_(REVIEWER)
    shown = reviewer.get(f"/api/approvals/{call['id']}").json
    assert set(shown) == CALL_KEYS | {"review", "held"} and shown["input"] == REFUND
    invoice, customer = shown["review"]["records"]
    assert (invoice["kind"], invoice["id"], customer["kind"], customer["id"]) == ("invoice", 4471, "customer", 4471)
    facts = {fact["label"]: fact["value"] for fact in invoice["facts"]}
    assert facts["Total"] == "$129.00" and facts["Status"] == "paid" and facts["Left to refund"] == "$129.00"
    assert shown["review"]["concerns"] == [] and shown["review"]["letter"] is None

    reviewer.post(f"/api/approvals/{call['id']}", json={"decision": "reject", "reason": "no"})
    assert reviewer.get(f"/api/approvals/{call['id']}").json["review"] is None
    assert reviewer.get("/api/approvals/999999").status_code == 404


def test_edits_are_checked_against_the_tools_schema_and_go_only_with_an_approval(api, model):
    call = waiting_refund(api, model)
    reviewer = api.as_(REVIEWER)
    url = f"/api/approvals/{call['id']}"
    # Strict types: a number in a string, or a boolean, is not taken for the integer asked (true
    # would refund one cent, and the log would keep the string).
    for amount in ("lots", "6000", True, 60.5):
        wrong = reviewer.post(url, json={"decision": "approve", "edited_input": {**REFUND, "amount_cents": amount}})
        assert wrong.status_code == 422 and wrong.json["error"] == "invalid_input", amount
        assert "amount_cents" in wrong.json["message"], amount
    rejecting = reviewer.post(url, json={"decision": "reject", "reason": "no", "edited_input": REFUND})
    assert rejecting.status_code == 422 and rejecting.json["error"] == "invalid_input"
    stale = reviewer.post(url, json={"decision": "approve", "arguments_hash": "0" * 64})
    assert stale.status_code == 409 and stale.json["error"] == "arguments_changed"
    assert db.session.scalar(select(func.count(Decision.id))) == 0


# --- responses ----------------------------------------------------------------------------------


def test_every_response_carries_the_keys_clients_rely_on(api, model):
    agent, reviewer = api.as_(AGENT), api.as_(REVIEWER)
    created = agent.post("/api/conversations", json={"message": "hi"})
    assert created.status_code == 201 and created.json == {"id": created.json["id"], "status": "queued"}
    conversation_id = created.json["id"]

    shown = agent.get(f"/api/conversations/{conversation_id}").json
    assert set(shown) == CONVERSATION_KEYS and set(shown["usage"]) == USAGE_KEYS
    assert shown["error"] is None and shown["cancel_requested"] is False and shown["tasks"] == []
    row = db.session.get(Conversation, conversation_id)
    assert shown["created_at"] == row.created_at.isoformat() and shown["updated_at"] == row.updated_at.isoformat()
    db.session.remove()

    cancelled = agent.post(f"/api/conversations/{conversation_id}/cancel")
    assert cancelled.status_code == 202
    assert cancelled.json == {"id": conversation_id, "status": cancelled.json["status"], "cancel_requested": True}

    db.session.execute(
        Conversation.__table__.update().values(status="failed", error_code="model_error", error_message="Model down.")
    )
    db.session.commit()
    failed = agent.get(f"/api/conversations/{conversation_id}").json
    assert failed["error"] == {"code": "model_error", "message": "Model down."} and failed["status"] == "failed"
    retried = agent.post(f"/api/conversations/{conversation_id}/retry")
    assert retried.status_code == 202 and retried.json == {"id": conversation_id, "status": "queued"}

    db.session.execute(Conversation.__table__.update().values(status="completed"))
    db.session.commit()
    posted = agent.post(f"/api/conversations/{conversation_id}/messages", json={"message": "again"})
    assert posted.status_code == 202 and posted.json == {"id": conversation_id, "status": "queued"}

    listed = reviewer.get("/api/approvals").json
    assert listed == {"approvals": [], "next_cursor": None}
    call = waiting_refund(api, model)
    assert set(call) == CALL_KEYS


def test_a_tool_call_is_shown_exactly_as_before(api, model):
    """The JSON of a call, value by value, as the hand-built serializer wrote it."""
    listed = waiting_refund(api, model)
    decided = api.as_(REVIEWER).post(f"/api/approvals/{listed['id']}", json={"decision": "reject", "reason": "no"})
    call = db.session.get(ToolCall, listed["id"])
    assert decided.json == {
        "id": call.id,
        "conversation_id": call.conversation_id,
        "tool_use_id": call.tool_use_id,
        "name": "issue_refund",
        "source": None,  # added: the assistant's call, not an outside agent's
        "input": REFUND,
        "arguments_hash": arguments_hash(REFUND),
        "status": "rejected",
        "requires_approval": True,
        "output": None,  # (added since: nothing ran)
        "summary": "Rejected by Acme Corp reviewer: no. Nothing was done.",
        "result": call.result,
        "is_error": True,
        "decided_by": REVIEWER,
        "decided_at": call.decided_at.isoformat(),
        "decision_reason": "no",
        "claimed_by": None,  # a decided call is nobody's to review
        "claimed_until": None,
        "task": None,
        "created_at": call.created_at.isoformat(),
    }
    assert decided.json["created_at"].endswith("+00:00")  # isoformat, as before: not pydantic's "Z"


def test_a_task_waiting_for_input_is_shown_with_where_to_send_it(api, model):
    model.enqueue(Reply.message(reply(tool_use("verify_identity", {"customer_id": 4471}))), match="verify")
    created = api.as_(AGENT).post("/api/conversations", json={"message": "verify 4471"}).json
    assert services().loop(db.session, db.session.get(Conversation, created["id"])).complete() == "awaiting_task"
    db.session.remove()
    shown = api.as_(AGENT).get(f"/api/conversations/{created['id']}").json
    (task,) = shown["tasks"]
    assert set(task) == TASK_KEYS and shown["tool_calls"][0]["task"] == task
    assert task["status"] == "input_required" and task["progress"] is None
    assert task["input_required"] == {
        "prompt": "The 6-digit code the customer received by email",
        "pending": False,
        "url": f"/api/tool-calls/{task['tool_call_id']}/input",
    }
    assert task["last_progress_at"].endswith("+00:00")

    given = api.as_(AGENT).post(task["input_required"]["url"], json={"input": "000000"})
    assert given.status_code == 202 and set(given.json) == CALL_KEYS
    assert given.json["task"]["input_required"]["pending"] is True


def test_a_tasks_progress_keeps_the_number_the_tool_gave():
    """1 stays 1 and 0.5 stays 0.5: the response models do not turn numbers into other numbers."""
    call = ToolCall(id=1, conversation_id=1, name="countdown", status="awaiting_task", task_input=None)
    call.task_progress_at = call.task_due_at = None
    for progress in (1, 0.5, 0, None):
        call.task = {"status": "working", "message": "Counting", "progress": progress}
        shown = tool_calls.TaskView.of(call).model_dump(mode="json")
        assert shown["progress"] == progress and type(shown["progress"]) is type(progress)


# --- the models themselves ----------------------------------------------------------------------

REQUESTS = [
    conversations.StartConversation,
    conversations.PostMessage,
    conversations.ExtendBudget,
    approvals.DecideApproval,
    tool_calls.GiveInput,
]


@pytest.mark.parametrize("model", REQUESTS)
def test_every_request_field_says_in_words_what_it_must_be(model):
    for name, field in model.model_fields.items():
        assert any(isinstance(item, bodies.Rule) for item in field.metadata), f"{model.__name__}.{name}"
        assert field.description, f"{model.__name__}.{name} has no description"
    document = model.model_json_schema()
    assert document["additionalProperties"] is False and document["description"]


def test_the_json_schemas_document_limits_and_choices():
    from webapp.approvals.actions import MAX_REASON_CHARS
    from webapp.conversations.actions import MAX_MESSAGE_CHARS
    from webapp.tools.tasks import MAX_INPUT_CHARS

    assert (
        conversations.StartConversation.model_json_schema()["properties"]["message"]["maxLength"] == MAX_MESSAGE_CHARS
    )
    assert tool_calls.GiveInput.model_json_schema()["properties"]["input"]["maxLength"] == MAX_INPUT_CHARS
    decide = approvals.DecideApproval.model_json_schema()
    assert decide["required"] == ["decision"]
    assert decide["properties"]["decision"]["enum"] == ["approve", "reject"]
    reason = {"maxLength": MAX_REASON_CHARS, "pattern": bodies.NO_NUL, "type": "string"}
    assert reason in decide["properties"]["reason"]["anyOf"]
    budget = conversations.ExtendBudget.model_json_schema()["properties"]["moves"]
    assert (budget["minimum"], budget["maximum"], budget["default"]) == (1, 1000, 10)
    conversation = conversations.ConversationView.model_json_schema(mode="serialization")
    assert set(conversation["properties"]) == CONVERSATION_KEYS
    assert conversation["properties"]["created_at"]["format"] == "date-time"
    assert typing.get_args(tool_calls.TaskStatus) == STATUSES


# --- every route, fed what nobody means to send -----------------------------------------------------
#
# Each route that takes a body gets a body it would take, then the same body with one value at a time
# made odd, and an unknown field: none may answer 500. What no field can keep (a lone surrogate, 1e400:
# infinity to Python's json) is a 422 naming the field (or the field that holds it); an unknown field is
# a 422 naming it. A 30-digit integer and 1e308 are numbers: the route takes them or says why not.

ODD = {  # how each is written in the JSON
    "a lone surrogate": '"x\\ud800"',
    "a 30-digit integer": "1" * 30,
    "1e308": "1e308",
    "1e400": "1e400",
    "NaN": "NaN",
}
KEPT_BY_NO_FIELD = {"a lone surrogate", "1e400", "NaN"}
AMOUNTS = {  # the money a call moves: its checks are the gate's (tests at the end of this file)
    ("api.ask_call", "input.amount_cents"),
    ("api.decide_approval", "input.amount_cents"),
}
TRANSFER_TOOL = copy.deepcopy(TRANSFER)  # as the outside calls' tests declare it, with accounts as ACME-17
TRANSFER_TOOL["input_schema"]["properties"]["account"]["pattern"] = "^[A-Z]+-[0-9]+$"


def asked(key: str) -> dict:
    return {
        "source": "treasury-bot",
        "tool": "transfer",
        "input": {"amount_cents": 30_000, "account": "ACME-17", "memo": "invoice 88"},
        "context": "Supplier invoice 88 is due today.",
        "facts": [{"label": "Balance", "value": "$12,000.00"}],
        "idempotency_key": key,
    }


# endpoint: (who, its path's ids by name (from the seeded desk), a body it takes)
ROUTES = {
    "api.create_conversation": (AGENT, {}, lambda d: {"message": "hi"}),
    "api.post_message": (AGENT, {"conversation_id": "completed"}, lambda d: {"message": "more"}),
    "api.cancel_conversation": (AGENT, {"conversation_id": "waiting"}, lambda d: {}),
    "api.create_run": (
        AGENT,
        {},
        lambda d: {"items": [{"message": "one"}, {"message": "two"}], "batch": False, "title": "Q3"},
    ),
    "api.cancel_run": (AGENT, {"run_id": "run"}, lambda d: {}),
    "api.retry_conversation": (AGENT, {"conversation_id": "failed"}, lambda d: {}),
    "api.extend_budget": (REVIEWER, {"conversation_id": "exhausted"}, lambda d: {"moves": 5}),
    "api.decide_approval": (
        REVIEWER,
        {"tool_call_id": "refund_call"},
        lambda d: {
            "decision": "approve",
            "reason": "half is fair",
            "arguments_hash": d["refund_hash"],
            "input": {**REFUND, "amount_cents": 4500},
        },
    ),
    "api.claim_approval": (REVIEWER, {"tool_call_id": "refund_call"}, lambda d: {"take_over": True}),
    "api.release_approval": (REVIEWER, {"tool_call_id": "refund_call"}, lambda d: {}),
    "api.give_input": (AGENT, {"tool_call_id": "task_call"}, lambda d: {"input": "000000"}),
    "api.set_policy": (
        ADMIN,
        {"tool": "issue_refund"},
        lambda d: {
            "mode": "above_amount",
            "threshold_cents": 5000,
            "approvals": 2,
            "limits": {"tenant_day_cents": 100_000, "person_day_count": 10},
            "ttl_seconds": 3600,
            "remind_after_seconds": 600,
        },
    ),
    "api.decide_policy_change": (ADMIN2, {"change_id": "change"}, lambda d: {"decision": "reject", "reason": "no"}),
    "api.declare_external_tool": (
        ADMIN,
        {"name": "transfer"},
        lambda d: {**TRANSFER_TOOL, "policy": {"mode": "always", "approvals": 1}},
    ),
    "api.remove_external_tool": (ADMIN, {"name": "transfer"}, lambda d: {}),
    "api.ask_call": (AGENT, {}, lambda d: asked("walk")),
    "api.report_call": (
        AGENT,
        {"call_id": "approved_call"},
        lambda d: {"ok": True, "summary": "Sent $300.00.", "output": {"reference": "T-1", "fee": 0.5}},
    ),
    "api.cancel_call": (AGENT, {"call_id": "outside_call"}, lambda d: {"reason": "Paid by cheque."}),
    "api.revoke_token": (AGENT, {"token_id": "spare_token"}, lambda d: {}),
    "api.create_webhook": (ADMIN, {}, lambda d: {"url": d["hook_url"], "events": ["approval.requested"]}),
    "api.delete_webhook": (ADMIN, {"webhook_id": "webhook"}, lambda d: {}),
    "api.redeliver_webhook": (ADMIN, {"webhook_id": "webhook", "delivery_id": "delivery"}, lambda d: {}),
}
BODILESS = {"api.cancel_run", "api.retry_conversation", "api.remove_external_tool", "api.redeliver_webhook"}


@pytest.fixture
def desk(env, engine, base_env, seeded, clean, model):
    """The app (webhooks may go to a local address), and its seeded rows worth sending bodies to:
    `seed()` lays them again after a request that changed them."""
    from tests.conftest import desk_app, empty_runtime_tables, pushed

    with pushed(desk_app({**env, "OUTBOUND_ALLOW": "127.0.0.1:9"})) as app:
        yield Desk(app, model, lambda: empty_runtime_tables(engine, base_env["REDIS_URL"], seeded))


class Desk:
    def __init__(self, app, model, empty) -> None:
        from tests.conftest import ApiClient

        self.app, self.model, self.api, self.empty = app, model, ApiClient(app), empty
        self.ids: dict = {}

    def seed(self) -> dict:
        from sqlalchemy import update

        from webapp import webhooks
        from webapp.identity import issue_token
        from webapp.models import User, WebhookDelivery, WebhookSubscription

        db.session.remove()
        self.empty()
        self.api.tokens.clear()
        api, ids = self.api, {"hook_url": "http://127.0.0.1:9/hooks/desk"}
        ids["webhook"] = (
            api.as_(ADMIN)
            .post("/api/webhooks", json={"url": ids["hook_url"], "events": ["approval.requested"]})
            .json["id"]
        )
        ids["refund_call"] = waiting_refund(api, self.model)["id"]
        ids["refund_hash"] = arguments_hash(REFUND)
        ids["waiting"] = db.session.get(ToolCall, ids["refund_call"]).conversation_id
        self.model.enqueue(Reply.message(reply(tool_use("verify_identity", {"customer_id": 4471}))), match="verify")
        verifying = api.as_(AGENT).post("/api/conversations", json={"message": "verify 4471"}).json["id"]
        services().loop(db.session, db.session.get(Conversation, verifying)).complete()
        ids["task_call"] = db.session.scalar(select(ToolCall.id).where(ToolCall.conversation_id == verifying))
        for name in ("completed", "failed", "exhausted"):
            ids[name] = api.as_(AGENT).post("/api/conversations", json={"message": f"this one is {name}"}).json["id"]
        for name, status in (("completed", "completed"), ("failed", "failed"), ("exhausted", "budget_exhausted")):
            db.session.execute(update(Conversation).where(Conversation.id == ids[name]).values(status=status))
        ids["run"] = api.as_(AGENT).post("/api/runs", json={"items": [{"message": "a run"}]}).json["id"]
        loosened = api.as_(ADMIN).put(
            "/api/policies/issue_refund", json={"mode": "above_amount", "threshold_cents": 40_000}
        )
        ids["change"] = loosened.json["change"]["id"]
        assert api.as_(ADMIN).put("/api/external-tools/transfer", json=TRANSFER_TOOL).status_code == 200
        ids["approved_call"] = api.as_(AGENT).post("/api/calls", json=asked("approved")).json["id"]
        approved = api.as_(REVIEWER).post(f"/api/approvals/{ids['approved_call']}", json={"decision": "approve"})
        assert approved.status_code == 200, approved.json
        ids["outside_call"] = api.as_(AGENT).post("/api/calls", json=asked("waits")).json["id"]
        owner = db.session.scalar(select(User).where(User.email == AGENT))
        ids["spare_token"] = issue_token(db.session, owner, "spare")[0].id
        webhooks.collect(db.session, db.session.get(WebhookSubscription, ids["webhook"]))
        db.session.commit()
        ids["delivery"] = db.session.scalar(select(func.min(WebhookDelivery.id)))
        db.session.remove()
        self.ids = ids
        return ids

    def send(self, endpoint: str, raw: str, who: str | None = None):
        """The route's request with this body, as its person (or `who`)."""
        person, names, _ = ROUTES.get(endpoint, (ADMIN, {}, None))
        return self.send_to(self.url(endpoint, names), self.method(endpoint), raw, who or person)

    def send_to(self, url: str, method: str, raw: str, who: str):
        client = self.api.as_(who)
        return getattr(client, method.lower())(url, data=raw, content_type="application/json")

    def rule(self, endpoint: str):
        return next(rule for rule in api_rules(self.app) if rule.endpoint == endpoint)

    def method(self, endpoint: str) -> str:
        return sorted(self.rule(endpoint).methods & WRITES)[0]

    def url(self, endpoint: str, names: dict) -> str:
        rule = self.rule(endpoint)
        values = {name: self.ids.get(names[name], names[name]) if name in names else 1 for name in rule.arguments}
        return re.sub(r"<(?:[^<>:]+:)?([^<>]+)>", lambda m: str(values[m.group(1)]), rule.rule)


WRITES = {"POST", "PUT", "PATCH", "DELETE"}


def odd_bodies(good: dict):
    """(the leaf made odd as a dotted path, which odd value, the raw JSON): each leaf of the body in
    turn, then an unknown field holding each."""
    for path in leaves(good):
        for label, written in ODD.items():
            yield ".".join(map(str, path)), label, raw_with(good, path, written)
    for label, written in ODD.items():
        yield "colour", label, raw_with(good, ("colour",), written)


def leaves(value, path=()):
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from leaves(inner, (*path, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from leaves(inner, (*path, index))
    else:
        yield path


def raw_with(body: dict, path: tuple, written: str) -> str:
    """The body as JSON with the value at `path` written as given (a top-level field it lacks is added)."""
    marked = json.loads(json.dumps({**body, path[0]: None} if len(path) == 1 and path[0] not in body else body))
    inside = marked
    for part in path[:-1]:
        inside = inside[part]
    inside[path[-1]] = "__odd__"
    return json.dumps(marked).replace('"__odd__"', written)


def api_name(path: str) -> str:
    """A dotted path as the API names a field: "items.0.message" is "items[0].message"."""
    return re.sub(r"\.(\d+)", r"[\1]", path)


def named(response, path: str) -> bool:
    """Whether the 422 names the field, or a field that holds it."""
    name = api_name(path)
    fields = [problem["field"] for problem in response.json.get("fields", [])]
    return any(name == field or name.startswith((f"{field}.", f"{field}[")) for field in fields)


def walk(desk: Desk, endpoint: str) -> list[str]:
    """Every odd body of the route sent; what went wrong, in words."""
    from webapp.api.openapi import document

    person, names, good_body = ROUTES.get(endpoint, (ADMIN, {}, lambda d: {}))
    operations = document(desk.app)["paths"][re.sub(r"<(?:[^<>:]+:)?([^<>]+)>", r"{\1}", desk.rule(endpoint).rule)]
    takes_body = "requestBody" in operations[desk.method(endpoint).lower()]
    wrong = []
    ids = desk.seed()
    good = good_body(ids)
    for path, label, raw in [("colour", "an unknown field", json.dumps({**good, "colour": "red"}))] + list(
        odd_bodies(good)
    ):
        if (endpoint, api_name(path)) in AMOUNTS and label not in KEPT_BY_NO_FIELD:
            continue  # the gate's
        response = desk.send(endpoint, raw)
        said = f"{endpoint} {path} = {label}: {response.status_code} {response.get_data(as_text=True)[:300]}"
        if response.status_code >= 500:
            wrong.append(said)
        elif takes_body and (label in KEPT_BY_NO_FIELD or label == "an unknown field"):
            if response.status_code != 422 or not named(response, path):
                wrong.append(said)
        if 200 <= response.status_code < 300:
            ids = desk.seed()  # what it changed is laid again for the next body
    return wrong


@pytest.mark.parametrize("endpoint", sorted(ROUTES))
def test_every_route_answers_odd_values_and_unknown_fields_with_what_to_fix_never_a_500(desk, endpoint):
    wrong = walk(desk, endpoint)
    assert not wrong, "\n".join(wrong)


def test_a_route_added_since_is_walked_too(desk):
    """Routes the table above does not know are sent the odd values in an unknown field, as an admin."""
    added = sorted(
        rule.endpoint for rule in api_rules(desk.app) if rule.methods & WRITES and rule.endpoint not in ROUTES
    )
    wrong = [said for endpoint in added for said in walk(desk, endpoint)]
    assert not wrong, "\n".join(wrong)


def test_the_routes_that_take_no_fields_refuse_one_by_name(desk):
    """Stopping a conversation, giving a claim up and removing a webhook take no body, or {}: a field is
    refused by name, as on every route that reads a body, and nothing is done."""
    ids = desk.seed()
    for endpoint in ("api.cancel_conversation", "api.release_approval", "api.delete_webhook"):
        refused = desk.send(endpoint, json.dumps({"reason": "done"}))
        assert_refused(refused, "reason")
    assert desk.api.as_(AGENT).get(f"/api/conversations/{ids['waiting']}").json["cancel_requested"] is False
    assert api_webhooks(desk) == [ids["webhook"]]
    claimed = desk.api.as_(REVIEWER).post(f"/api/approvals/{ids['refund_call']}/claim")
    assert claimed.json["claimed_by"] == REVIEWER
    assert_refused(desk.send("api.release_approval", '{"force": true}'), "force")
    assert desk.api.as_(REVIEWER).get(f"/api/approvals/{ids['refund_call']}").json["claimed_by"] == REVIEWER
    for endpoint in ("api.cancel_conversation", "api.release_approval", "api.delete_webhook"):
        assert desk.send(endpoint, "").status_code in (200, 202), endpoint  # no body at all
    assert api_webhooks(desk) == []


def api_webhooks(desk: Desk) -> list[int]:
    return [hook["id"] for hook in desk.api.as_(ADMIN).get("/api/webhooks").json["webhooks"]]


def test_a_removed_webhooks_delivery_log_stays_readable(desk):
    ids = desk.seed()
    url = f"/api/webhooks/{ids['webhook']}/deliveries"
    before = desk.api.as_(ADMIN).get(url)
    assert before.status_code == 200 and ids["delivery"] in [row["id"] for row in before.json["deliveries"]]
    assert desk.api.as_(ADMIN).delete(f"/api/webhooks/{ids['webhook']}").status_code == 200
    after = desk.api.as_(ADMIN).get(url)
    assert after.status_code == 200, after.json
    assert after.json["deliveries"] == before.json["deliveries"]
    redeliver = desk.api.as_(ADMIN).post(f"{url}/{ids['delivery']}/redeliver")
    assert redeliver.status_code == 404  # a removed webhook is sent nothing more


# Amounts past what money can be, at the doors where a call's amount comes in: a call asked, and an
# edit of the assistant's call or of an outside agent's. Refused, never a 500.
HUGE_AMOUNTS = {"29 digits": "1" * 29, "30 digits": "1" * 30, "2^63": str(2**63), "1e308": "1e308"}
AMOUNT_DOORS = ("asked", "edit of the assistant's call", "edit of an outside agent's call")


@pytest.mark.parametrize("door", AMOUNT_DOORS)
@pytest.mark.parametrize("amount", sorted(HUGE_AMOUNTS))
def test_an_amount_past_what_money_can_be_is_refused_at_every_door(desk, door, amount):
    ids = desk.seed()
    if door == "asked":
        url, who, body = "/api/calls", AGENT, asked("huge")
    elif door == "edit of the assistant's call":
        url, who = f"/api/approvals/{ids['refund_call']}", REVIEWER
        body = {"decision": "approve", "arguments_hash": ids["refund_hash"], "input": dict(REFUND)}
    else:
        url, who = f"/api/approvals/{ids['outside_call']}", REVIEWER
        body = {"decision": "approve", "input": asked("waits")["input"]}
    answer = desk.send_to(url, "POST", raw_with(body, ("input", "amount_cents"), HUGE_AMOUNTS[amount]), who)
    assert 400 <= answer.status_code < 500, answer.get_data(as_text=True)
