"""Approvals for agents that run elsewhere: declared tools, POST /api/calls, the same gate and inbox as
the assistant's calls, waiting for the decision, and the agent's report of what it did."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import func, select

from tests.clients import ADMIN, ADMIN2, AGENT, REVIEWER, REVIEWER2
from webapp import webhooks
from webapp.agent import decisions
from webapp.models import AuditEvent, Conversation, ExternalCall, ToolCall, utcnow
from webapp.runtime.services import services

TRANSFER = {
    "description": "Send money from the treasury account to a supplier's account.",
    "input_schema": {
        "type": "object",
        "properties": {
            "amount_cents": {"type": "integer", "minimum": 1},
            "account": {"type": "string"},
            "memo": {"type": "string"},
        },
        "required": ["amount_cents", "account"],
    },
    "amount": "amount_cents",
    "subject": "account",
}


def declare(api, policy=None, name="transfer", **more):
    body = {**TRANSFER, **more}
    if policy is not None:
        body["policy"] = policy
    return api.as_(ADMIN).put(f"/api/external-tools/{name}", json=body)


def ask(api, amount=30_000, key="k1", **more):
    body = {
        "source": "treasury-bot",
        "tool": "transfer",
        "input": {"amount_cents": amount, "account": "ACME-17", "memo": "invoice 88"},
        "context": "Supplier invoice 88 is due today.",
        "facts": [{"label": "Balance", "value": "$12,000.00"}],
        "idempotency_key": key,
        **more,
    }
    return api.as_(AGENT).post("/api/calls", json=body)


def last_event(read) -> int:
    """The newest audit event's id: the audit log outlives each test (it is append-only) while ids of
    calls start again, so a test reads the events after it."""
    return read(lambda s: s.scalar(select(func.coalesce(func.max(AuditEvent.id), 0))))


def actions_on(read, call_id: int, after: int, *also) -> list[str]:
    """The audit log's actions on the call after event `after`, oldest first (`also`: more conditions)."""
    where = (AuditEvent.tool_call_id == call_id, AuditEvent.id > after, *also)
    return read(lambda s: s.scalars(select(AuditEvent.action).where(*where).order_by(AuditEvent.id)).all())


# What the audit log says of a call two people approved and its agent then reported on.
APPROVED_TWICE_AND_REPORTED = [
    "tool_call_requested",
    "approval_requested",
    "approval_decided",
    "approval_decided",
    "call_outcome_reported",
]


def test_a_declared_tool_waits_by_default_and_an_edited_call_needs_two_people(api, read):
    before = last_event(read)
    declared = declare(api, policy={"mode": "always", "approvals": 2})
    assert declared.status_code == 200, declared.json
    assert declared.json["policy"]["mode"] == "always" and declared.json["policy"]["approvals"] == 2
    assert declared.json["change"] is None  # stricter than the default (one approval): in force at once
    assert [tool["name"] for tool in api.as_(ADMIN).get("/api/external-tools").json["tools"]] == ["transfer"]

    asked = ask(api)
    assert asked.status_code == 201, asked.json
    call = asked.json
    assert call["status"] == "waiting" and call["source"] == "treasury-bot" and call["approvals_required"] == 2
    assert call["input"] == {"amount_cents": 30_000, "account": "ACME-17", "memo": "invoice 88"}
    assert call["facts"] == [{"label": "Balance", "value": "$12,000.00"}] and call["expires_at"]

    # the same inbox and the same id as the assistant's calls
    waiting = api.as_(REVIEWER).get("/api/approvals").json["approvals"]
    assert [(row["id"], row["source"], row["name"]) for row in waiting] == [(call["id"], "treasury-bot", "transfer")]
    approval = api.as_(REVIEWER).get(f"/api/approvals/{call['id']}").json
    assert approval["review"]["records"][0]["facts"] == [{"label": "Balance", "value": "$12,000.00"}]
    assert "Supplied by treasury-bot" in approval["review"]["records"][0]["title"]

    edited = api.as_(REVIEWER).post(
        f"/api/approvals/{call['id']}",
        json={"decision": "approve", "input": {"amount_cents": 20_000, "account": "ACME-17", "memo": "invoice 88"}},
    )
    assert edited.status_code == 200, edited.json
    still = api.as_(AGENT).get(f"/api/calls/{call['id']}").json
    assert still["status"] == "waiting" and still["approvals"] == 1 and still["input"]["amount_cents"] == 20_000

    bare = api.as_(REVIEWER2).post(f"/api/approvals/{call['id']}", json={"decision": "approve"})
    assert bare.status_code == 409 and bare.json["error"] == "arguments_changed"  # edited: say what you approve
    second = api.as_(REVIEWER2).post(
        f"/api/approvals/{call['id']}",
        json={"decision": "approve", "arguments_hash": decisions.arguments_hash(still["input"])},
    )
    assert second.status_code == 200, second.json
    decided = api.as_(AGENT).get(f"/api/calls/{call['id']}").json
    assert decided["status"] == "approved" and decided["edited"] is True
    assert decided["input"]["amount_cents"] == 20_000 and decided["asked_input"]["amount_cents"] == 30_000
    assert decided["decided_by"] == REVIEWER2 and decided["approvals"] == 2 and decided["outcome"] is None
    # no move follows: the call's conversation is done, and nothing was enqueued for it
    assert read(lambda s: s.get(Conversation, call_conversation(s, call["id"])).status) == "completed"
    assert services().dispatcher.people_queue.count == 0 and services().dispatcher.queue.count == 0

    reported = api.as_(AGENT).post(
        f"/api/calls/{call['id']}/outcome",
        json={"ok": True, "summary": "Sent $200.00 to ACME-17.", "output": {"ref": 9}},
    )
    assert reported.status_code == 200, reported.json
    assert reported.json["outcome"]["summary"] == "Sent $200.00 to ACME-17." and reported.json["outcome"]["ok"]
    assert read(lambda s: s.get(ToolCall, call["id"]).status) == "succeeded"
    again = api.as_(AGENT).post(f"/api/calls/{call['id']}/outcome", json={"ok": False, "summary": "Other."})
    assert again.status_code == 409 and again.json["error"] == "already_reported"

    assert actions_on(read, call["id"], before) == APPROVED_TWICE_AND_REPORTED


def call_conversation(session, call_id: int) -> int:
    return session.get(ToolCall, call_id).conversation_id


def test_a_policy_that_lets_calls_run_waits_for_a_second_admin_then_small_calls_run_at_once(api):
    declared = declare(api, policy={"mode": "above_amount", "threshold_cents": 10_000})
    assert declared.status_code == 200
    change = declared.json["change"]
    assert change is not None and change["status"] == "pending"
    assert declared.json["policy"]["mode"] == "always"  # not in force yet
    assert ask(api, amount=5_000, key="small-1").json["status"] == "waiting"

    assert api.as_(ADMIN2).post(f"/api/policy-changes/{change['id']}", json={"decision": "approve"}).status_code == 200
    small = ask(api, amount=5_000, key="small-2").json
    assert small["status"] == "approved" and small["approvals_required"] == 0 and small["rule"] is None
    big = ask(api, amount=50_000, key="big").json
    assert big["status"] == "waiting" and "above $100.00" in big["rule"]


def test_the_same_key_returns_the_same_call_and_another_request_under_it_is_refused(api, read):
    declare(api)
    first = ask(api, key="same")
    repeated = ask(api, key="same")
    assert first.status_code == 201 and repeated.status_code == 200
    assert repeated.json["id"] == first.json["id"]
    other = ask(api, amount=999, key="same")
    assert other.status_code == 409 and other.json["error"] == "idempotency_conflict"
    assert f"call {first.json['id']}" in other.json["message"]
    assert read(lambda s: s.scalar(select(func.count(ExternalCall.tool_call_id)))) == 1


def test_another_agent_sending_the_same_key_gets_a_call_of_its_own_and_learns_nothing_of_the_first(api, app, read):
    from tests.accounts.people import new_user

    declare(api)
    first = ask(api, key="shared-key")
    assert first.status_code == 201
    with app.app_context():
        other = new_user(("agent",))
    second = api.as_(other.email).post(
        "/api/calls",
        json={
            "source": "other-bot",
            "tool": "transfer",
            "input": {"amount_cents": 100, "account": "ACME-99"},
            "context": "A small payment.",
            "idempotency_key": "shared-key",
        },
    )
    assert second.status_code == 201, second.json  # a call of its own
    assert second.json["id"] != first.json["id"]
    assert second.json["source"] == "other-bot" and "Balance" not in str(second.json)
    assert read(lambda s: s.scalar(select(func.count(ExternalCall.tool_call_id)))) == 2
    assert ask(api, key="shared-key").json["id"] == first.json["id"]  # the first agent's key is still its own


def test_an_undeclared_tool_or_input_outside_its_schema_is_refused_in_words_and_nothing_is_kept(api, read):
    unknown = ask(api, tool="wire")
    assert unknown.status_code == 422 and unknown.json["error"] == "unknown_tool"
    assert "declared" in unknown.json["message"]
    declare(api)
    bad = ask(api, input={"amount_cents": "300", "account": "ACME-17", "colour": "red"})
    assert bad.status_code == 422 and bad.json["error"] == "invalid_input"
    fields = {problem["field"] for problem in bad.json["fields"]}
    assert "input.amount_cents" in fields
    missing = api.as_(AGENT).post("/api/calls", json={"source": "treasury-bot", "tool": "transfer"})
    assert missing.status_code == 422 and {"input", "context", "idempotency_key"} <= {
        problem["field"] for problem in missing.json["fields"]
    }
    assert read(lambda s: s.scalar(select(func.count(ToolCall.id)))) == 0
    assert read(lambda s: s.scalar(select(func.count(Conversation.id)))) == 0


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"name_in_url": "mcp_x"}, None, "MCP"),
        ({"name_in_url": "issue_refund"}, None, "desk's own"),
        ({"name_in_url": "bad name"}, None, "letters, digits"),
        ({"input_schema": {"type": "array"}}, "input_schema", "object"),
        ({"amount": "value"}, "amount", "amount_cents"),
        ({"description": "   "}, "description", "description"),
    ],
)
def test_a_declaration_the_desk_cannot_take_is_refused_in_words(api, read, body, field, says):
    name = body.pop("name_in_url", "transfer")
    response = declare(api, name=name, **body)
    assert response.status_code == 422, response.json
    assert says in response.json["message"] or says in str(response.json.get("fields"))
    if field is not None:
        assert field in {problem["field"] for problem in response.json["fields"]}
    assert api.as_(ADMIN).get("/api/external-tools").json["tools"] == []


def test_a_refused_policy_keeps_nothing_of_the_declaration(api):
    response = declare(api, policy={"mode": "above_amount", "threshold_cents": 10_000, "approvals": 9})
    assert response.status_code == 422 and response.json["fields"][0]["field"] == "policy.approvals"
    assert api.as_(ADMIN).get("/api/external-tools").json["tools"] == []


def test_waiting_answers_as_soon_as_the_call_is_decided(api, app):
    declare(api)
    call = ask(api).json
    assert api.as_(AGENT).get(f"/api/calls/{call['id']}?wait=0").json["status"] == "waiting"

    def reject_soon():
        time.sleep(0.5)
        with app.app_context():
            api.as_(REVIEWER).post(
                f"/api/approvals/{call['id']}", json={"decision": "reject", "reason": "Wrong account."}
            )

    thread = threading.Thread(target=reject_soon)
    thread.start()
    waited = api.as_(AGENT).get(f"/api/calls/{call['id']}?wait=60")
    thread.join()
    assert waited.status_code == 200
    assert waited.json["status"] == "rejected" and waited.json["reason"] == "Wrong account."
    assert waited.json["decided_by"] == REVIEWER
    refused = api.as_(AGENT).post(f"/api/calls/{call['id']}/outcome", json={"ok": True, "summary": "Sent."})
    assert refused.status_code == 409 and refused.json["error"] == "not_approved"
    bad_wait = api.as_(AGENT).get(f"/api/calls/{call['id']}?wait=61")
    assert bad_wait.status_code == 422 and bad_wait.json["fields"][0]["field"] == "wait"


def test_an_outside_call_expires_and_its_agent_is_told_without_a_move(api, app, read):
    from webapp.runtime.extensions import db

    declare(api)
    call = ask(api).json
    db.session.execute(ToolCall.__table__.update().values(expires_at=utcnow()))
    db.session.commit()
    assert decisions.expire_due(db.session) == []  # nothing to enqueue
    db.session.commit()
    shown = api.as_(AGENT).get(f"/api/calls/{call['id']}").json
    assert shown["status"] == "expired" and shown["reason"]
    assert read(lambda s: s.get(Conversation, call_conversation(s, call["id"])).status) == "completed"


def test_an_agent_gives_up_a_waiting_call_and_a_disabled_agents_calls_are_cancelled(api, read):
    declare(api)
    first = ask(api, key="a").json
    given_up = api.as_(AGENT).post(f"/api/calls/{first['id']}/cancel", json={"reason": "Paid by cheque instead."})
    assert given_up.status_code == 200 and given_up.json["status"] == "cancelled"
    assert api.as_(REVIEWER).get("/api/approvals").json["approvals"] == []

    second = ask(api, key="b").json
    agent_id = read(lambda s: s.get(ToolCall, second["id"]).acting_user_id)
    from webapp.accounts import actions as accounts
    from webapp.models import User
    from webapp.runtime.extensions import db

    admin = db.session.scalar(select(User).where(User.email == ADMIN))
    accounts.disable_user(db.session, admin, db.session.get(User, agent_id))
    db.session.commit()
    call = read(lambda s: s.get(ToolCall, second["id"]))
    assert call.status == "cancelled" and "disabled" in call.result


def test_only_supervisors_and_the_asking_agent_read_a_call_and_the_model_is_never_offered_a_declared_tool(api, app):
    declare(api)
    call = ask(api).json
    assert api.as_(REVIEWER).get(f"/api/calls/{call['id']}").status_code == 200
    assert api.as_("agent@globex.test").get(f"/api/calls/{call['id']}").status_code == 404
    from webapp.runtime.extensions import db

    registry = services().tools_for(db.session, 1)
    assert "transfer" in registry.names()
    assert "transfer" not in {definition["name"] for definition in registry.definitions()}


def test_the_decided_event_names_the_outside_agent(api, read):
    before = last_event(read)
    declare(api)
    call = ask(api).json
    api.as_(REVIEWER).post(f"/api/approvals/{call['id']}", json={"decision": "approve"})
    events = read(
        lambda s: s.scalars(
            select(AuditEvent)
            .where(
                AuditEvent.tool_call_id == call["id"], AuditEvent.action.in_(webhooks.ACTIONS), AuditEvent.id > before
            )
            .order_by(AuditEvent.id)
        ).all()
    )
    made = [webhooks.event_of(event) for event in events]
    assert [kind for kind, _ in made] == ["approval.requested", "approval.decided"]
    assert all(data["source"] == "treasury-bot" for _, data in made)
    assert made[1][1]["decision"] == "approve" and made[1][1]["input"]["amount_cents"] == 30_000


def test_a_reminder_of_an_outside_call_names_the_agent_that_asked(api, app):
    from webapp import notify
    from webapp.runtime.extensions import db

    declare(api)
    call = db.session.get(ToolCall, ask(api).json["id"])
    tools = services().tools_for(db.session, call.tenant_id)
    notice = notify.notice_for(db.session, services().config, tools, call, "reminder")
    assert notice.lines[0] == "Transfer, asked by the outside agent treasury-bot for Acme Corp agent."
    assert notice.url.endswith(f"/approvals/{call.id}")


# --- schemas the desk did not write -------------------------------------------------------------

EVIL = "^(a|aa)+$"  # Python's re takes exponential time on "aaa...ab": 38 letters take seconds


def with_account_pattern(pattern: str) -> dict:
    schema = TRANSFER["input_schema"]
    return {**schema, "properties": {**schema["properties"], "account": {"type": "string", "pattern": pattern}}}


def test_a_pattern_that_takes_exponential_time_cannot_hold_a_web_thread(api, read):
    assert declare(api, input_schema=with_account_pattern(EVIL)).status_code == 200
    # The time limit itself is the proof that no thread is held: the refusal says the pattern ran out of
    # time. A loaded machine may also run the call's whole budget out on another field, so the account's
    # problem is looked up by name rather than expected alone.
    refused = ask(api, input={"amount_cents": 500, "account": "a" * 38 + "b"})
    assert refused.status_code == 422 and refused.json["error"] == "invalid_input"
    problems = {field["field"]: field["problem"] for field in refused.json["fields"]}
    assert f"could not be checked against the pattern '{EVIL}' in time" in problems["input.account"]
    assert read(lambda s: s.scalar(select(func.count(ToolCall.id)))) == 0
    assert ask(api, input={"amount_cents": 500, "account": "aaaa"}, key="k2").status_code == 201  # it matches
    wrong = ask(api, input={"amount_cents": 500, "account": "ACME-17"}, key="k3")
    assert wrong.status_code == 422 and "does not match" in wrong.json["fields"][0]["problem"]


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        ("(unclosed", "is not a regular expression"),
        ("((a{100}){100}){100}", "too large to run"),
        ("(?x) a b # spaced", "verbose"),
    ],
)
def test_a_pattern_the_desk_cannot_run_is_refused_when_declared(api, pattern, says):
    refused = declare(api, input_schema=with_account_pattern(pattern))
    assert refused.status_code == 422 and refused.json["error"] == "invalid_tool"
    assert refused.json["fields"][0]["field"] == "input_schema" and says in refused.json["message"]
    assert api.as_(ADMIN).get("/api/external-tools").json["tools"] == []


def test_a_schema_of_more_patterns_than_the_desk_runs_is_refused_when_declared(api):
    from webapp.tools.described import MAX_PATTERNS

    properties = {f"code{n}": {"type": "string", "pattern": "^[A-Z]{3}$"} for n in range(MAX_PATTERNS + 1)}
    refused = declare(api, input_schema={"type": "object", "properties": {**properties, "amount_cents": {}}})
    assert refused.status_code == 422 and refused.json["fields"][0]["field"] == "input_schema"
    assert f"the desk runs at most {MAX_PATTERNS}" in refused.json["message"]


def raw_declaration(schema_text: str) -> str:
    import json

    body = json.dumps({**TRANSFER, "input_schema": "__schema__"})
    return body.replace('"__schema__"', schema_text)


def test_a_number_that_is_not_finite_is_refused_by_name_in_a_schema_and_in_an_input(api, read):
    import json

    schema = json.dumps(TRANSFER["input_schema"]).replace('"minimum": 1', '"minimum": 1, "maximum": 1e400')
    refused = api.as_(ADMIN).put(
        "/api/external-tools/transfer", data=raw_declaration(schema), content_type="application/json"
    )
    assert refused.status_code == 422, refused.json
    assert refused.json["fields"][0]["field"] == "input_schema"
    assert "not finite" in refused.json["message"] and "properties.amount_cents.maximum" in refused.json["message"]
    assert api.as_(ADMIN).get("/api/external-tools").json["tools"] == []

    assert declare(api).status_code == 200
    for written in ("1e400", "-1e400", "NaN", "Infinity"):
        body = json.dumps({"source": "bot", "tool": "transfer", "input": {"amount_cents": 1, "account": "A-1"}})
        raw = body.replace('"amount_cents": 1', f'"amount_cents": {written}')
        more = ', "context": "Due.", "idempotency_key": "k"}'
        answer = api.as_(AGENT).post("/api/calls", data=raw[:-1] + more, content_type="application/json")
        assert answer.status_code == 422, (written, answer.json)
        assert answer.json["fields"][0]["field"] == "input.amount_cents" and "not finite" in answer.json["message"]
    assert read(lambda s: s.scalar(select(func.count(ToolCall.id)))) == 0


def test_a_lone_surrogate_anywhere_in_a_request_is_refused_by_name_and_nothing_is_kept(api, read):
    import json

    assert declare(api).status_code == 200
    raw = json.dumps(
        {
            "source": "treasury-bot",
            "tool": "transfer",
            "input": {"amount_cents": 500, "account": "ACME-17", "memo": "__memo__"},
            "context": "Due today.",
            "idempotency_key": "k1",
        }
    ).replace('"__memo__"', '"invoice \\ud800 88"')
    refused = api.as_(AGENT).post("/api/calls", data=raw, content_type="application/json")
    assert refused.status_code == 422, refused.json
    assert refused.json["fields"] == [
        {
            "field": "input.memo",
            "problem": "cannot be read: the JSON holds text that is not valid Unicode (a lone surrogate); "
            "send whole characters",
        }
    ]
    assert "the JSON holds text that is not valid Unicode (a lone surrogate)" in refused.json["message"]
    assert read(lambda s: s.scalar(select(func.count(ToolCall.id)))) == 0
    schema = json.dumps(TRANSFER["input_schema"]).replace('"type": "string"}', '"type": "string", "title": "\\udfff"}')
    declared = api.as_(ADMIN).put(
        "/api/external-tools/transfer2", data=raw_declaration(schema), content_type="application/json"
    )
    assert declared.status_code == 422 and declared.json["fields"][0]["field"] == "input_schema"


def test_two_declared_tools_cannot_share_a_name_in_another_case(api):
    assert declare(api, name="Transfer").status_code == 200
    refused = declare(api, name="transfer")
    assert refused.status_code == 422 and refused.json["error"] == "invalid_tool"
    assert "The name transfer is taken by the declared tool Transfer" in refused.json["message"]
    assert [tool["name"] for tool in api.as_(ADMIN).get("/api/external-tools").json["tools"]] == ["Transfer"]
    assert declare(api, name="Transfer", description="Send money to a supplier.").status_code == 200  # itself
    own = declare(api, name="Issue_Refund")  # the desk's own tool, in another case
    assert own.status_code == 422 and "desk's own" in own.json["message"]
