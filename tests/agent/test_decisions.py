"""The decision ledger without Flask: policies, approvals, edits, expiry, and what the model hears."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select

from demo.billing.models import Customer, Refund
from demo.billing.tools import demo_registry
from tests.model_server import Reply
from tests.replies import reply, tool_use
from webapp.agent.decisions import DecisionError, arguments_hash, decide, expire_due
from webapp.agent.policies import PolicyError, policy_for, save_policy
from webapp.agent.transcript import api_messages
from webapp.models import Decision, ToolCall, User, utcnow


def person(session, email: str) -> User:
    return session.scalar(select(User).where(User.email == email))


def calls_of(session, loop) -> list[ToolCall]:
    return list(
        session.scalars(
            select(ToolCall).where(ToolCall.conversation_id == loop.conversation.id).order_by(ToolCall.position)
        )
    )


def asked(model, new_loop, *blocks):
    model.enqueue(Reply.message(reply(*blocks)))
    loop = new_loop()
    loop.ask_later("please")
    loop.complete()
    return loop


def reviewer_decides(session, call, approve: bool, **given):
    """The reviewer's decision on the call, about the arguments it holds now (`given`: an edit, a reason...)."""
    reviewer = person(session, "reviewer@acme.test")
    return decide(session, call, reviewer, approve=approve, arguments_seen=arguments_hash(call.input), **given)


def results_sent(loop) -> list[dict]:
    return [m for m in api_messages(loop.rows()) if m["role"] == "user"][-1]["content"]


def resume(loop) -> str:
    loop.conversation.status = "queued"
    return loop.complete()


def test_small_refunds_run_at_once_and_large_ones_wait_for_a_reviewer(session, new_loop, model):
    loop = asked(
        model,
        new_loop,
        tool_use("issue_refund", {"invoice_id": 4471, "amount_cents": 5000, "reason": "small"}),
        tool_use("issue_refund", {"invoice_id": 4471, "amount_cents": 5001, "reason": "large"}),
    )
    small, large = calls_of(session, loop)
    assert (small.status, large.status) == ("succeeded", "awaiting_approval")
    assert large.policy["mode"] == "above_amount" and "above $50.00" in large.policy["rule"]
    assert large.expires_at > utcnow() + timedelta(hours=23)
    assert session.scalar(select(func.count(Refund.id))) == 1


def test_a_round_of_three_answers_once_in_order_after_the_decisions(session, new_loop, model):
    loop = asked(
        model,
        new_loop,
        tool_use("lookup_invoices", {"customer_id": 4471}),
        tool_use("issue_refund", {"invoice_id": 4471, "amount_cents": 9000, "reason": "late"}),
        tool_use("send_email", {"customer_id": 4471, "subject": "Refund", "body": "On its way."}),
    )
    lookup, refund, email = calls_of(session, loop)
    assert lookup.status == "succeeded" and loop.conversation.status == "awaiting_approval"
    reviewer = person(session, "reviewer@acme.test")
    decide(session, refund, reviewer, approve=True, arguments_seen=arguments_hash(refund.input))
    assert loop.open_round()  # still open: the email waits
    decide(session, email, reviewer, approve=True, arguments_seen=arguments_hash(email.input))
    assert resume(loop) == "completed"
    results = results_sent(loop)
    assert [b["tool_use_id"] for b in results] == [lookup.tool_use_id, refund.tool_use_id, email.tool_use_id]
    assert not any(b.get("is_error") for b in results)


def test_an_edited_approval_runs_with_the_new_arguments_and_the_model_is_told(session, new_loop, model):
    loop = asked(model, new_loop, tool_use("issue_refund", {"invoice_id": 4471, "amount_cents": 12900, "reason": "x"}))
    (call,) = calls_of(session, loop)
    edited = {"invoice_id": 4471, "amount_cents": 6500, "reason": "half, as agreed"}
    reviewer_decides(session, call, approve=True, edited_input=edited, tools=demo_registry())
    assert call.input == edited and call.original_input["amount_cents"] == 12900
    resume(loop)
    assert session.scalar(select(Refund.amount_cents)) == 6500
    result = results_sent(loop)[0]["content"]
    assert result.startswith("Note from the approval desk: a person (Acme Corp reviewer (reviewer@acme.test))")
    assert "changed the arguments before approving" in result
    assert '"amount_cents": 12900' in result and '"amount_cents": 6500' in result


def test_an_edit_that_breaks_the_tools_schema_is_refused(session, new_loop, model):
    loop = asked(model, new_loop, tool_use("issue_refund", {"invoice_id": 4471, "amount_cents": 12900, "reason": "x"}))
    (call,) = calls_of(session, loop)
    with pytest.raises(DecisionError) as refused:
        reviewer_decides(
            session, call, approve=True, edited_input={"invoice_id": 4471, "amount_cents": -5}, tools=demo_registry()
        )
    assert refused.value.code == "invalid_input" and "amount_cents" in refused.value.message
    assert call.status == "awaiting_approval" and call.input["amount_cents"] == 12900


def test_a_rejection_reaches_the_model_as_a_declined_error_with_the_reason(session, new_loop, model):
    loop = asked(model, new_loop, tool_use("send_email", {"customer_id": 4471, "subject": "s", "body": "b"}))
    (call,) = calls_of(session, loop)
    reviewer_decides(session, call, approve=False, reason="We call customers instead")
    resume(loop)
    result = results_sent(loop)[0]
    assert result["is_error"] is True
    assert (
        "Declined by a person (Acme Corp reviewer (reviewer@acme.test)): We call customers instead" in result["content"]
    )
    assert "Do not retry" in result["content"]


def test_an_expired_call_says_nothing_was_done_not_denied_and_the_loop_resumes(session, new_loop, model):
    loop = asked(model, new_loop, tool_use("send_email", {"customer_id": 4471, "subject": "s", "body": "b"}))
    (call,) = calls_of(session, loop)
    call.expires_at = utcnow() - timedelta(seconds=1)
    session.commit()
    wakeups = expire_due(session)
    session.commit()
    assert wakeups == [(loop.conversation.id, loop.conversation.version, loop.conversation.tenant_id)]
    assert call.status == "expired"
    assert loop.conversation.status == "queued"
    loop.complete()
    result = results_sent(loop)[0]["content"]
    assert "No decision was made in time" in result and "nothing was done" in result
    assert "denied" not in result.lower() and "declined" not in result.lower()
    assert expire_due(session) == []  # settled once


def test_closing_an_account_needs_two_different_reviewers(session, new_loop, model):
    loop = asked(model, new_loop, tool_use("delete_account", {"customer_id": 4470, "reason": "asked to leave"}))
    (call,) = calls_of(session, loop)
    assert call.approvals_required == 2
    first, second = person(session, "reviewer@acme.test"), person(session, "reviewer2@acme.test")
    assert decide(session, call, first, approve=True, arguments_seen=arguments_hash(call.input)) is None
    assert call.status == "awaiting_approval"
    with pytest.raises(DecisionError, match="You already approved this call"):
        decide(session, call, first, approve=True, arguments_seen=arguments_hash(call.input))
    assert decide(session, call, second, approve=True, arguments_seen=arguments_hash(call.input)) is not None
    assert call.status == "approved"
    resume(loop)
    assert session.get(Customer, 4470).status == "closed"
    versions = session.scalars(select(Decision.policy_version).where(Decision.tool_call_id == call.id)).all()
    assert versions == [0, 0]  # the built-in default policy, recorded with each decision


def test_a_changed_policy_applies_to_new_calls_and_its_version_is_recorded(session, new_loop, model, agent):
    tools = demo_registry()
    admin = person(session, "admin@acme.test")
    before, after = save_policy(
        session,
        agent.tenant_id,
        tools.get("issue_refund"),
        mode="always",
        amount_threshold_cents=None,
        approvals_required=1,
        ttl_seconds=3600,
        by_user_id=admin.id,
    )
    assert (before.version, after.version, after.mode) == (0, 1, "always")
    loop = asked(model, new_loop, tool_use("issue_refund", {"invoice_id": 4471, "amount_cents": 100, "reason": "x"}))
    (call,) = calls_of(session, loop)
    assert call.status == "awaiting_approval" and call.policy["version"] == 1
    assert "within 1 hours" in call.policy["rule"]
    reviewer_decides(session, call, approve=True)
    assert session.scalar(select(Decision.policy_version)) == 1
    assert policy_for(session, agent.tenant_id, tools.get("issue_refund")).version == 1


@pytest.mark.parametrize(
    ("tool", "values", "says"),
    [
        ("issue_refund", {"mode": "sometimes"}, "must be one of"),
        ("send_email", {"mode": "never"}, "must wait for at least one person"),
        ("send_email", {"mode": "above_amount", "amount_threshold_cents": 100}, "has no amount"),
        ("issue_refund", {"mode": "above_amount", "amount_threshold_cents": -1}, "The amount limit must be from"),
        (
            "issue_refund",
            {"mode": "above_amount", "amount_threshold_cents": 10_000_000},
            r"operator caps issue_refund at \$500\.00",
        ),
        ("issue_refund", {"mode": "always", "approvals_required": 9}, "from 1 to 5"),
        ("issue_refund", {"mode": "always", "ttl_seconds": 10}, "from 5 minutes to 30 days"),
    ],
)
def test_bad_policies_are_refused_in_words(session, agent, tool, values, says):
    settings = {
        "mode": "always",
        "amount_threshold_cents": None,
        "approvals_required": 1,
        "ttl_seconds": 3600,
        **values,
    }
    with pytest.raises(PolicyError, match=says):
        save_policy(session, agent.tenant_id, demo_registry().get(tool), by_user_id=agent.id, **settings)
