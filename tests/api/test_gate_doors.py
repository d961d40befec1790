"""The one gate at every door (webapp/agent/gate.py): amounts are money, a re-declared tool loosens
nothing alone, a widening edit needs another reviewer. Each test first reproduced a way past the people
a call needs (issue 42)."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from tests.clients import ADMIN, ADMIN2, AGENT, REVIEWER, REVIEWER2
from webapp.agent import decisions
from webapp.models import ToolCall

# As an attacker would declare it: no minimum on the amount.
WIRE = {
    "description": "Wire money to a supplier's account.",
    "input_schema": {
        "type": "object",
        "properties": {
            "amount_cents": {"type": "integer"},
            "fee_cents": {"type": "integer"},
            "account": {"type": "string"},
        },
        "required": ["amount_cents", "account"],
    },
    "amount": "amount_cents",
    "subject": "account",
}


def declare(api, as_=ADMIN, policy=None, **more):
    body = {**WIRE, **more}
    if policy is not None:
        body["policy"] = policy
    return api.as_(as_).put("/api/external-tools/wire", json=body)


def in_force(api, policy):
    """Declare the wire with `policy`, approved by the second admin when it waits for one."""
    declared = declare(api, policy=policy)
    assert declared.status_code == 200, declared.json
    if declared.json["change"]:
        decided = api.as_(ADMIN2).post(
            f"/api/policy-changes/{declared.json['change']['id']}", json={"decision": "approve"}
        )
        assert decided.status_code == 200, decided.json
    return declared


def ask(api, key, as_=AGENT, **input_):
    return api.as_(as_).post(
        "/api/calls",
        json={
            "source": "treasury-bot",
            "tool": "wire",
            "input": {"account": "ACME-17", **input_},
            "context": "A supplier's invoice.",
            "idempotency_key": key,
        },
    )


@pytest.mark.parametrize(
    "amount",
    [-10_000_000, -1, 10**12 + 1, 2**63, 10**29, 1e308, 12.5, "500", True],
    ids=["negative", "minus-one", "past-the-ceiling", "2^63", "29-digits", "1e308", "a-fraction", "text", "true"],
)
def test_an_amount_that_is_not_money_is_refused_naming_the_argument_and_nothing_is_kept(api, read, amount):
    in_force(api, {"mode": "above_amount", "threshold_cents": 200_000})
    before = read(lambda s: s.scalar(select(func.count(ToolCall.id))))
    asked = ask(api, "k", amount_cents=amount)
    assert asked.status_code == 422, asked.json
    assert "input.amount_cents" in [field["field"] for field in asked.json["fields"]]
    assert read(lambda s: s.scalar(select(func.count(ToolCall.id)))) == before


def test_a_negative_amount_buys_no_headroom_under_the_daily_limit(api):
    in_force(
        api,
        {"mode": "above_amount", "threshold_cents": 200_000, "limits": {"tenant_day_cents": 150_000}},
    )
    assert ask(api, "minus", amount_cents=-10_000_000).status_code == 422
    first = ask(api, "one", amount_cents=100_000).json
    second = ask(api, "two", amount_cents=100_000).json
    assert first["status"] == "approved"
    assert second["status"] == "waiting" and "at most $1,500.00 for the whole tenant" in second["rule"]


def test_zero_and_the_most_one_call_may_move_are_money(api):
    in_force(api, {"mode": "above_amount", "threshold_cents": 200_000})
    assert ask(api, "zero", amount_cents=0).json["status"] == "approved"
    most = ask(api, "most", amount_cents=10**12)
    assert most.status_code == 201 and most.json["status"] == "waiting"


def test_a_reviewers_edit_to_an_amount_that_is_not_money_is_refused(api, read):
    in_force(api, {"mode": "always"})
    call = ask(api, "edit-me", amount_cents=5_000).json
    for amount in (-5_000, 10**30):
        edited = api.as_(REVIEWER).post(
            f"/api/approvals/{call['id']}",
            json={
                "decision": "approve",
                "arguments_hash": decisions.arguments_hash(call["input"]),
                "input": {**call["input"], "amount_cents": amount},
            },
        )
        assert edited.status_code == 422, edited.json
        assert "amount_cents" in edited.json["message"]
    assert read(lambda s: s.get(ToolCall, call["id"]).status) == "awaiting_approval"


@pytest.mark.parametrize(
    "change", [{"amount": "fee_cents"}, {"amount_unit": "dollars"}], ids=["another-argument", "another-unit"]
)
def test_declaring_a_tool_again_cannot_change_what_its_amount_rule_reads(api, read, change):
    in_force(api, {"mode": "above_amount", "threshold_cents": 100_000})
    again = declare(api, **change)
    assert again.status_code == 409 and again.json["error"] == "loosens_alone", again.json
    assert "second admin" in again.json["message"]
    big = ask(api, "big", amount_cents=5_000_000, fee_cents=1)  # $50,000
    assert big.json["status"] == "waiting" and big.json["approvals_required"] == 1
    tool = api.as_(ADMIN).get("/api/external-tools").json["tools"][0]
    assert tool["amount"] == "amount_cents" and tool["amount_unit"] == "cents"  # nothing of it was kept


def test_a_reading_changes_with_a_rule_that_makes_every_call_wait_and_the_looser_rule_then_waits(api):
    in_force(api, {"mode": "above_amount", "threshold_cents": 100_000})
    again = declare(api, amount="fee_cents", policy={"mode": "always"})
    assert again.status_code == 200 and again.json["change"] is None, again.json
    assert again.json["amount"] == "fee_cents"
    looser = api.as_(ADMIN).put("/api/policies/wire", json={"mode": "above_amount", "threshold_cents": 100_000})
    assert looser.json["change"]["status"] == "pending"
    assert ask(api, "after", amount_cents=5_000_000, fee_cents=1).json["status"] == "waiting"


def test_a_tool_removed_and_declared_again_does_not_bring_its_amount_rule_back_on_other_numbers(api):
    in_force(api, {"mode": "above_amount", "threshold_cents": 100_000})
    assert api.as_(ADMIN).delete("/api/external-tools/wire").status_code == 200
    back = declare(api, amount="fee_cents")
    assert back.status_code == 409 and back.json["error"] == "loosens_alone", back.json
    assert declare(api, amount="fee_cents", policy={"mode": "always"}).status_code == 200


def decide(api, reviewer, call, **more):
    return api.as_(reviewer).post(
        f"/api/approvals/{call['id']}",
        json={"decision": "approve", "arguments_hash": decisions.arguments_hash(call["input"]), **more},
    )


def test_an_edit_that_raises_the_amount_and_changes_the_account_needs_another_reviewer(api, read):
    in_force(api, {"mode": "always"})
    call = ask(api, "wire-2000", amount_cents=200_000).json
    widened = {"amount_cents": 100_000_000, "account": "ELSEWHERE-1"}
    edited = decide(api, REVIEWER, call, input=widened)
    assert edited.status_code == 200, edited.json
    assert read(lambda s: s.get(ToolCall, call["id"]).status) == "awaiting_approval"  # nobody else saw it yet
    assert api.as_(AGENT).get(f"/api/calls/{call['id']}").json["status"] == "waiting"
    again = decide(api, REVIEWER, {**call, "input": widened})
    assert again.status_code == 409  # the editor counts as the one who asked
    second = decide(api, REVIEWER2, {**call, "input": widened})
    assert second.status_code == 200, second.json
    seen = api.as_(AGENT).get(f"/api/calls/{call['id']}").json
    assert seen["status"] == "approved" and seen["input"] == widened


@pytest.mark.parametrize(
    "edit",
    [{"account": "ACME-17", "fee_cents": 5}, {"account": "OTHER-2"}],
    ids=["adds-an-argument", "another-subject"],
)
def test_an_edit_that_adds_an_argument_or_names_another_subject_needs_another_reviewer(api, read, edit):
    in_force(api, {"mode": "always"})
    call = ask(api, "wire", amount_cents=200_000).json
    assert decide(api, REVIEWER, call, input={"amount_cents": 200_000, **edit}).status_code == 200
    assert read(lambda s: s.get(ToolCall, call["id"]).status) == "awaiting_approval"


def test_an_edit_that_lowers_the_amount_stays_one_step(api, read):
    in_force(api, {"mode": "always"})
    call = ask(api, "wire-lower", amount_cents=200_000).json
    assert decide(api, REVIEWER, call, input={"amount_cents": 150_000, "account": "ACME-17"}).status_code == 200
    assert api.as_(AGENT).get(f"/api/calls/{call['id']}").json["status"] == "approved"


def test_an_approval_without_the_arguments_it_approves_is_refused_once_a_reviewer_edited_the_call(api, read):
    in_force(api, {"mode": "always"})
    call = ask(api, "edited-then-bare", amount_cents=200_000).json
    widened = {"amount_cents": 900_000, "account": "ACME-17"}
    assert decide(api, REVIEWER, call, input=widened).status_code == 200
    bare = api.as_(REVIEWER2).post(f"/api/approvals/{call['id']}", json={"decision": "approve"})
    assert bare.status_code == 409 and bare.json["error"] == "arguments_changed", bare.json
    assert read(lambda s: s.get(ToolCall, call["id"]).status) == "awaiting_approval"


def test_an_agents_report_that_a_call_failed_frees_no_room_under_the_limits(api):
    in_force(api, {"mode": "above_amount", "threshold_cents": 200_000, "limits": {"tenant_day_count": 1}})
    first = ask(api, "first", amount_cents=100_000).json
    assert first["status"] == "approved"
    reported = api.as_(AGENT).post(f"/api/calls/{first['id']}/outcome", json={"ok": False, "summary": "Bounced."})
    assert reported.status_code == 200, reported.json
    assert ask(api, "second", amount_cents=100_000).json["status"] == "waiting"  # the limit still counts it


def test_an_edit_after_the_tool_reads_its_calls_otherwise_needs_another_reviewer(api, read):
    in_force(api, {"mode": "always"})
    call = ask(api, "before-redeclared", amount_cents=200_000, fee_cents=100).json
    assert declare(api, amount="fee_cents", policy={"mode": "always"}).status_code == 200  # reads the fee now
    raised = {"amount_cents": 900_000, "fee_cents": 100, "account": "ACME-17"}  # what was the amount, raised
    assert decide(api, REVIEWER, call, input=raised).status_code == 200
    assert read(lambda s: s.get(ToolCall, call["id"]).status) == "awaiting_approval"


def test_a_tool_removed_and_declared_again_without_its_subject_does_not_escape_its_limit_per_subject(api):
    in_force(api, {"mode": "never", "limits": {"subject_day_count": 1}})  # runs at once, once per account a day
    assert ask(api, "one", amount_cents=100).json["status"] == "approved"
    assert ask(api, "two", amount_cents=100).json["status"] == "waiting"
    assert api.as_(ADMIN).delete("/api/external-tools/wire").status_code == 200
    back = declare(api, subject=None)  # with no subject, the limit per account would never count
    assert back.status_code == 409 and back.json["error"] == "loosens_alone", back.json


@pytest.mark.parametrize(
    ("asked", "redeclared", "edit"),
    [
        ({"amount_cents": 200_000, "fee_cents": 200_000}, {"amount": "fee_cents"}, {"amount_cents": 100_000_000}),
        ({"amount_cents": 200_000, "account": ""}, {"subject": None}, {"account": "ACME-99"}),
    ],
    ids=["reads-another-argument-of-the-same-value", "drops-a-subject-that-was-empty"],
)
def test_an_edit_is_weighed_under_what_the_tool_read_when_the_call_was_asked(api, read, asked, redeclared, edit):
    in_force(api, {"mode": "always"})
    call = ask(api, "asked", **asked).json
    assert declare(api, policy={"mode": "always"}, **redeclared).status_code == 200
    assert decide(api, REVIEWER, call, input={**call["input"], **edit}).status_code == 200
    assert read(lambda s: s.get(ToolCall, call["id"]).status) == "awaiting_approval"  # another reviewer decides


def test_a_call_that_names_no_subject_waits_under_a_limit_per_subject(api, read):
    in_force(api, {"mode": "never", "limits": {"subject_day_count": 1}})
    asked = ask(api, "no-subject", amount_cents=100, account="").json  # nothing to count it against
    assert asked["status"] == "waiting"
    limit = read(lambda s: s.get(ToolCall, asked["id"]).policy["limit"])
    assert limit == "It names nothing it acts on, so the limit per subject cannot be counted for it."


def test_after_an_edit_names_another_account_a_second_reviewer_who_only_lowers_the_amount_approves_it(api):
    in_force(api, {"mode": "always"})
    call = ask(api, "two-edits", amount_cents=200_000).json
    moved = {"amount_cents": 200_000, "account": "ACME-99"}
    assert decide(api, REVIEWER, call, input=moved).status_code == 200  # wider: waits for another reviewer
    lowered = {"amount_cents": 150_000, "account": "ACME-99"}
    assert decide(api, REVIEWER2, {**call, "input": moved}, input=lowered).status_code == 200
    assert api.as_(AGENT).get(f"/api/calls/{call['id']}").json["status"] == "approved"
