"""A team's own tools, with names the desk has never heard of (tests/packs/orders.py: money in
`value_usd`, an order as the subject), get what the billing demo gets with no change to the desk: their
default policy, an above-amount rule and limits on their own arguments, the operator's ceiling, their
facts and concerns on the decision page, their sentence in the inbox and on the card."""

from __future__ import annotations

from html import unescape

import pytest

from tests.approvals.test_decision_page import section, words
from tests.approvals.test_inbox import waiting_calls
from tests.clients import session_as
from tests.conftest import BILLING
from tests.replies import tool_use
from webapp.models import Conversation, ToolCall
from webapp.runtime.extensions import db
from webapp.runtime.services import services

PACK = "tests.packs.orders:FindOrder,tests.packs.orders:GiveBack,tests.packs.orders:CancelOrder"
REVIEWER = "reviewer@acme.test"


@pytest.fixture
def env(env, tmp_path, monkeypatch) -> dict[str, str]:
    monkeypatch.setenv("ORDERS_FILE", str(tmp_path / "given-back.json"))
    return {**env, "EXTRA_TOOLS": f"{BILLING},{PACK}"}


def give_back(order: int, dollars: str, note: str = "late") -> dict:
    return tool_use("give_back", {"order": order, "value_usd": dollars, "note": note})


def converse(api, model, message: str, *calls: dict) -> list[ToolCall]:
    """The agent says `message`, the model asks for `calls`: each as it stands once the loop has run."""
    return waiting_calls(api, model, *calls, message=message)


def test_its_default_policy_amount_rule_and_subject_come_from_its_own_arguments(app, api, model):
    small, large, cancel = converse(
        api,
        model,
        "three",
        give_back(9001, "20.00"),
        give_back(9002, "30.00"),
        tool_use("cancel_order", {"order": 9002}),
    )
    assert (small.status, large.status, cancel.status) == ("succeeded", "awaiting_approval", "awaiting_approval")
    assert (small.money_cents, small.subject) == (2_000, "order:9001")
    assert large.policy["rule"].startswith("give_back calls above $25.00 need one approval")
    assert cancel.approvals_required == 2 and cancel.money_cents is None
    policies = {p["tool"]: p for p in api.as_("admin@acme.test").get("/api/policies").json["policies"]}
    assert (policies["give_back"]["mode"], policies["give_back"]["threshold_cents"]) == ("above_amount", 2_500)
    assert policies["give_back"]["ceiling_cents"] == 20_000 and policies["find_order"]["mode"] == "never"
    refused = api.as_("admin@acme.test").put(
        "/api/policies/cancel_order", json={"mode": "above_amount", "threshold_cents": 100}
    )
    assert refused.status_code == 422 and "cancel_order has no amount" in refused.json["message"]


def test_its_limits_add_up_per_order_and_the_limit_names_the_order(app, api, model):
    first, second = converse(api, model, "one", give_back(9001, "20.00"), give_back(9001, "20.00"))
    (third,) = converse(api, model, "two", give_back(9001, "20.00"))
    (other,) = converse(api, model, "three", give_back(9002, "20.00"))
    assert [c.status for c in (first, second, third, other)] == ["succeeded"] * 2 + ["awaiting_approval", "succeeded"]
    assert third.policy["limit"] == (
        "With this one, $60.00 of give_back would run without a person for order 9001 in 24 hours; the limit is $50.00."
    )


def test_the_operators_ceiling_holds_for_it(app, api, model, cli):
    refused = api.as_("admin@acme.test").put(
        "/api/policies/give_back", json={"mode": "above_amount", "threshold_cents": 25_000}
    )
    assert refused.status_code == 422 and "caps give_back at $200.00" in refused.json["message"]
    assert cli("ceiling", "set", "give_back", "10").exit_code == 0
    (capped,) = converse(api, model, "capped", give_back(9001, "15.00"))
    assert capped.status == "awaiting_approval"  # under its $25 rule, over the $10 ceiling


def test_reviewers_see_its_facts_concerns_and_sentence_and_the_agent_its_card(app, api, model):
    (call,) = converse(api, model, "big one", give_back(9002, "60.00"))
    reviewer = session_as(app, REVIEWER)
    inbox = unescape(reviewer.get("/approvals").get_data(as_text=True))
    assert "Give $60.00 back on order 9002." in inbox
    assert f"approval-{call.id}" in reviewer.get("/approvals?min_amount=50").get_data(as_text=True)
    assert f"approval-{call.id}" not in reviewer.get("/approvals?max_amount=50").get_data(as_text=True)
    panel = words(section(unescape(reviewer.get(f"/approvals/{call.id}").get_data(as_text=True)), "decision-panel"))
    assert "Order 9002 Buyer Charles Babbage Total $45.00 Left to give back $45.00" in panel
    assert "This call cannot succeed as asked: Only $45.00 is left to give back on order 9002." in panel
    edited = api.as_(REVIEWER).post(
        f"/api/approvals/{call.id}",
        json={"decision": "approve", "input": {"order": 9002, "value_usd": "45.00", "note": "late"}},
    )
    assert edited.status_code == 200, edited.json
    services().loop(db.session, db.session.get(Conversation, call.conversation_id)).complete()
    db.session.remove()
    page = unescape(
        session_as(app, "agent@acme.test").get(f"/conversations/{call.conversation_id}").get_data(as_text=True)
    )
    assert '<p class="call-asks">Give $45.00 back on order 9002.</p>' in page  # its sentence, as edited
    assert "Gave $45.00 back on order 9002." in page
    assert "value usd “60.00” → “45.00”" in page
