"""Cumulative limits on what runs with no person: small calls add up, and past a policy's limit a
call waits like any flagged one, its decision page saying which limit it hit."""

from __future__ import annotations

import re
from html import unescape

from sqlalchemy import select

from demo.billing.models import Invoice, Refund
from tests.approvals.test_decision_page import section, words
from tests.approvals.test_inbox import refund, waiting_calls
from tests.clients import second_admin_approves, session_as
from webapp.runtime.extensions import db


def test_ten_small_refunds_in_one_turn_run_only_up_to_the_conversations_limit(app, api, model):
    # The red team's case: ten $50 refunds, each at the $50 that runs without a person. By default at
    # most three calls and $100 run unapproved per conversation.
    calls = waiting_calls(api, model, *(refund(4471, 5000) for _ in range(10)))
    assert [call.status for call in calls] == ["succeeded"] * 2 + ["awaiting_approval"] * 8
    assert db.session.scalar(select(Refund.amount_cents).where(Refund.idempotency_key == f"toolcall-{calls[0].id}"))
    said = calls[2].policy["limit"]
    assert (
        said
        == "With this one, $150.00 of issue_refund would run without a person per conversation; the limit is $100.00."
    )
    page = words(
        section(
            unescape(session_as(app, "reviewer@acme.test").get(f"/approvals/{calls[2].id}").get_data(as_text=True)),
            "decision-panel",
        )
    )
    assert "It waits because it would pass a limit on what runs without a person: " + said in page


def invoices_of(customer_id: int) -> list[int]:
    ids = list(
        db.session.scalars(
            select(Invoice.id).where(Invoice.customer_id == customer_id, Invoice.status == "paid").order_by(Invoice.id)
        )
    )
    db.session.remove()
    return ids


def test_limits_per_customer_and_per_tenant_add_up_across_conversations_as_the_admin_set_them(app, api, model):
    admin = session_as(app, "admin@acme.test")
    page = admin.get("/admin/policies").get_data(as_text=True)
    assert (
        "Above $500.00 every call waits for a person (the desk's ceiling). Without a person, at most 3 calls and "
        "$100.00 per conversation; $200.00 per subject in 24 hours; $500.00 for the whole tenant in 24 hours; "
        "$300.00 per acting person in 24 hours." in unescape(page)
    )
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    limits = {
        f"limit_{scope}_{kind}": ""
        for scope in ("conversation", "subject_day", "tenant_day")
        for kind in ("count", "cents")
    }
    form = {
        "csrf_token": token,
        "mode": "above_amount",
        "amount_threshold": "50",
        "approvals_required": "1",
        "ttl_hours": "24",
    }
    refused = admin.post("/admin/policies/issue_refund", data=form | limits | {"limit_tenant_day_count": "2.5"})
    assert refused.status_code == 422 and "must be a whole number" in unescape(refused.get_data(as_text=True))
    saved = admin.post(
        "/admin/policies/issue_refund",
        data=form | limits | {"limit_subject_day_cents": "30", "limit_tenant_day_count": "2"},
    )
    assert saved.status_code == 303
    second_admin_approves(app, "issue_refund")  # limits cleared let more run without a person: four eyes
    shown = unescape(admin.get("/admin/policies").get_data(as_text=True))
    assert (
        "Without a person, at most $30.00 per subject in 24 hours; 2 calls for the whole tenant in 24 hours." in shown
    )
    assert 'name="limit_conversation_count" type="number" min="1" step="1" value=""' in shown  # cleared: no limit

    jordan, wei = invoices_of(4471), invoices_of(4472)
    (first,) = waiting_calls(api, model, refund(jordan[0], 2000), message="one")
    (same_customer,) = waiting_calls(api, model, refund(jordan[1], 2000), message="two")
    (other_customer,) = waiting_calls(api, model, refund(wei[0], 1000), message="three")
    (past_tenant,) = waiting_calls(api, model, refund(wei[1], 1000), message="four")
    assert (first.status, same_customer.status, other_customer.status, past_tenant.status) == (
        "succeeded",
        "awaiting_approval",
        "succeeded",
        "awaiting_approval",
    )
    assert same_customer.policy["limit"] == (
        "With this one, $40.00 of issue_refund would run without a person for customer 4471 in 24 hours; "
        "the limit is $30.00."
    )
    assert past_tenant.policy["limit"] == (
        "2 issue_refund calls already ran without a person for the whole tenant in 24 hours; the limit is 2."
    )
    assert same_customer.subject == "customer:4471" and other_customer.subject == "customer:4472"
