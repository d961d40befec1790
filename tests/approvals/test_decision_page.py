"""The decision page and the agent's card in words for people: the facts beside the call, the
arguments in dollars, the edit form checked with the tool's own rules, and who decided what."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

from sqlalchemy import func, select, update

from demo.billing.models import Invoice, Refund
from tests.approvals.test_inbox import form_token, refund, waiting_calls
from tests.clients import session_as
from tests.replies import tool_use
from webapp.models import AuditEvent, Conversation, Decision, ToolCall, utcnow
from webapp.runtime.extensions import db
from webapp.runtime.services import services

MODEL_WORDS = ("<tool_output", "tool_output>", "Do not retry", "Note from the approval desk", "external data")


def page_text(client, url: str) -> str:
    return unescape(client.get(url).get_data(as_text=True))


def words(html: str) -> str:
    """The text a person reads: tags removed, spaces collapsed."""
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def section(html: str, element_id: str) -> str:
    return re.search(rf'<(\w+)[^>]*id="{element_id}".*?</\1>', html, re.S).group(0)


def carry_on(call: ToolCall) -> str:
    """Let the conversation move after a decision (the demo model answers); its status."""
    db.session.remove()
    conversation = db.session.get(Conversation, call.conversation_id)
    status = services().loop(db.session, conversation).complete()
    db.session.remove()
    return status


def edit(client, call: ToolCall, page: str, arguments: dict[str, str], why: str = ""):
    """Post the edit form with these arguments as typed, htmx-style."""
    data = {"decision": "edit", "reason": why, **form_token(page, "edit-form")}
    data.update({f"arg_{name}": value for name, value in arguments.items()})
    return client.post(f"/approvals/{call.id}/decide", data=data, headers={"HX-Request": "true"})


def test_the_decision_page_shows_the_invoice_as_it_stands_beside_the_refund(app, api, model):
    (call,) = waiting_calls(api, model, refund(4471, 9000))
    html = page_text(session_as(app, "reviewer@acme.test"), f"/approvals/{call.id}")
    arguments = words(section(html, "call-arguments-shown"))
    assert "Amount $90.00" in arguments and "Reason late delivery" in arguments
    assert re.search(r'href="#record-invoice-4471"[^>]*>4471</a>', html)  # the id links to its facts
    invoice = words(section(html, "record-invoice-4471"))
    assert "Total $129.00" in invoice and "Status paid" in invoice
    assert "Refunded so far $0.00 (0 refunds)" in invoice and "Left to refund $129.00" in invoice
    assert "Email jordan.ellis@example.com" in words(section(html, "record-customer-4471"))
    assert 'id="call-concerns"' not in html
    assert re.search(r'<details class="raw">.*"amount_cents": 9000', html, re.S)  # the raw JSON, a click away


def test_a_refund_that_cannot_succeed_is_flagged_before_anyone_approves_it(app, api, model):
    unpaid = db.session.scalar(select(Invoice.id).where(Invoice.customer_id == 4471, Invoice.status == "open"))
    db.session.remove()
    too_much, not_paid = waiting_calls(api, model, refund(4471, 999_999), refund(unpaid, 9000))
    reviewer = session_as(app, "reviewer@acme.test")
    first = words(section(page_text(reviewer, f"/approvals/{too_much.id}"), "call-concerns"))
    assert first == (
        "This call cannot succeed as asked: A refund of $9,999.99 is more than the $129.00 left to refund "
        "on invoice 4471 (total $129.00)."
    )
    second = words(section(page_text(reviewer, f"/approvals/{not_paid.id}"), "call-concerns"))
    assert f"Invoice {unpaid} is open (unpaid); there is nothing to refund." in second


def test_an_email_is_shown_as_the_customer_would_get_it(app, api, model):
    body = "Hello Jordan,\n\nYour refund is on its way."
    (call,) = waiting_calls(
        api, model, tool_use("send_email", {"customer_id": 4471, "subject": "Refund", "body": body})
    )
    html = page_text(session_as(app, "reviewer@acme.test"), f"/approvals/{call.id}")
    letter = section(html, "call-letter")
    assert (
        "Jordan Ellis &lt;jordan.ellis@example.com&gt;" in letter or "Jordan Ellis <jordan.ellis@example.com>" in letter
    )
    assert f'<div class="letter-body">{body}</div>' in letter


def test_closing_an_account_shows_what_is_still_open(app, api, model):
    (call,) = waiting_calls(api, model, tool_use("delete_account", {"customer_id": 4471, "reason": "asked to"}))
    customer = words(
        section(page_text(session_as(app, "reviewer@acme.test"), f"/approvals/{call.id}"), "record-customer-4471")
    )
    assert "Active subscriptions (cancelled by closing) standard, $" in customer
    assert "Unpaid invoices (stay open) invoice " in customer


def test_an_edit_is_a_form_per_argument_checked_with_the_tools_own_rules(app, api, model):
    (call,) = waiting_calls(api, model, refund(4471, 9000))
    reviewer = session_as(app, "reviewer@acme.test")
    page = page_text(reviewer, f"/approvals/{call.id}")
    assert 'name="arg_amount_cents" value="90.00"' in page and 'name="arg_invoice_id" value="4471"' in page
    assert "<textarea" not in section(page, "edit-form") or 'name="edited_input"' not in page

    unreadable = edit(reviewer, call, page, {"invoice_id": "4471", "amount_cents": "lots", "reason": "late delivery"})
    html = unescape(unreadable.get_data(as_text=True))
    assert unreadable.status_code == 422
    assert "Amount: type an amount in dollars with at most two decimals" in section(html, "field-amount_cents")
    assert 'value="lots"' in section(html, "field-amount_cents")  # what was typed stays
    # the field in error takes the focus (the page shows it), and names its error for screen readers
    assert re.search(r'id="arg-amount_cents"[^>]*aria-describedby="help-amount_cents error-amount_cents"', html)
    assert re.search(r'id="arg-amount_cents"[^>]*autofocus', html)
    assert not re.search(r'id="arg-invoice_id"[^>]*autofocus', html)

    too_much = edit(reviewer, call, page, {"invoice_id": "4471", "amount_cents": "9999.99", "reason": "goodwill"})
    html = unescape(too_much.get_data(as_text=True))
    assert too_much.status_code == 422
    field = section(html, "field-amount_cents")
    assert "A refund of $9,999.99 is more than the $129.00 left to refund on invoice 4471" in field
    assert 'value="9999.99"' in field
    assert "Fix the marked fields; nothing was approved." in html
    assert db.session.scalar(select(func.count(Decision.id))) == 0

    too_long = "x" * 2001  # a rejection refused: the reason typed stays in its box
    data = {"decision": "reject", "reason": too_long, **form_token(page, "reject-form")}
    refused = reviewer.post(f"/approvals/{call.id}/decide", data=data, headers={"HX-Request": "true"})
    assert refused.status_code == 422
    assert f'value="{too_long}"' in section(refused.get_data(as_text=True), "reject-form")
    assert db.session.scalar(select(func.count(Decision.id))) == 0

    plain = reviewer.post(  # without JavaScript: the page again, not a redirect that would lose what was typed
        f"/approvals/{call.id}/decide",
        data={
            "decision": "edit",
            "arg_invoice_id": "4471",
            "arg_amount_cents": "",
            "arg_reason": "x",
            **form_token(page, "edit-form"),
        },
    )
    assert plain.status_code == 422 and "Amount is required." in unescape(plain.get_data(as_text=True))


def test_after_an_edit_the_card_says_what_changed_and_what_was_really_done(app, api, model):
    (call,) = waiting_calls(api, model, refund(4471, 7500))
    reviewer = session_as(app, "reviewer@acme.test")
    page = page_text(reviewer, f"/approvals/{call.id}")
    arguments = {"invoice_id": "4471", "amount_cents": "40", "reason": "late delivery"}
    approved = edit(reviewer, call, page, arguments, why="partial refund")
    assert approved.status_code == 200, approved.get_data(as_text=True)
    assert carry_on(call) == "completed"
    assert [r.amount_cents for r in db.session.scalars(select(Refund))] == [4000]

    chat = page_text(session_as(app, "agent@acme.test"), f"/conversations/{call.conversation_id}")
    card = words(section(chat, f"tool-call-{call.id}"))
    assert "Approved with changes by Acme Corp reviewer: amount $75.00 → $40.00 (partial refund)." in card
    assert "Refunded $40.00 on invoice 4471; $89.00 is left to refund." in card
    for model_words in MODEL_WORDS:
        assert model_words not in chat
    answer = words(re.findall(r'<li class="turn assistant">.*?</li>', chat, re.S)[-1])
    # the assistant tells what was really done, and that a person changed it
    assert "of $40.00 issued on invoice 4471" in answer and "changed the amount from $75.00 to $40.00" in answer


def test_a_card_names_every_approver_and_a_rejection_in_words(app, api, model):
    admin = session_as(app, "admin@acme.test")
    token = re.search(r'name="csrf_token" value="([^"]+)"', admin.get("/admin/policies").get_data(as_text=True))
    admin.post(
        "/admin/policies/issue_refund",
        data={
            "csrf_token": token.group(1),
            "mode": "above_amount",
            "amount_threshold": "50",
            "approvals_required": "2",
            "ttl_hours": "2",
        },
    )
    two, rejected = waiting_calls(api, model, refund(4471, 9000), refund(4401, 9000))
    first, second = session_as(app, "reviewer@acme.test"), session_as(app, "reviewer2@acme.test")
    for reviewer in (first, second):
        page = page_text(reviewer, f"/approvals/{two.id}")
        if reviewer is first:
            assert "1 more approval(s)" not in page
        reviewer.post(f"/approvals/{two.id}/decide", data={"decision": "approve", **form_token(page, "approve-form")})
        if reviewer is first:
            waiting = page_text(first, f"/approvals/{two.id}")
            assert "it needs 1 more approval from another reviewer" in words(waiting)
    page = page_text(first, f"/approvals/{rejected.id}")
    first.post(
        f"/approvals/{rejected.id}/decide",
        data={"decision": "reject", "reason": "already credited", **form_token(page, "reject-form")},
    )
    carry_on(two)
    chat = page_text(session_as(app, "agent@acme.test"), f"/conversations/{two.conversation_id}")
    assert "Approved by Acme Corp reviewer and Acme Corp reviewer2." in words(section(chat, f"tool-call-{two.id}"))
    refused = words(section(chat, f"tool-call-{rejected.id}"))
    assert "Rejected by Acme Corp reviewer: already credited. Nothing was done." in refused
    for model_words in MODEL_WORDS:
        assert model_words not in chat
    decided = words(section(page_text(second, f"/approvals/{rejected.id}"), "decision-panel"))
    assert "Acme Corp reviewer rejected at" in decided and "rejectd" not in decided


def test_after_a_decision_the_page_moves_to_the_next_call_the_reviewer_can_decide(app, api, model):
    first, second = waiting_calls(api, model, refund(4471, 9000), refund(4401, 9000))
    reviewer = session_as(app, "reviewer@acme.test")
    page = page_text(reviewer, f"/approvals/{first.id}")
    assert "Press a again to approve" in section(page, "approve-form")  # $90.00 is above the $50.00 rule
    moved = reviewer.post(
        f"/approvals/{first.id}/decide",
        data={"decision": "approve", **form_token(page, "approve-form")},
        headers={"HX-Request": "true"},
    )
    assert moved.status_code == 200 and moved.headers["HX-Redirect"] == f"/approvals/{second.id}"
    reviewer.get(f"/approvals/{first.id}/panel", headers={"HX-Request": "true"})  # a live refresh, racing the move
    landed = page_text(reviewer, moved.headers["HX-Redirect"])
    assert "You approved Issue a refund" in landed and "Here is the oldest call still waiting for you." in landed

    page = page_text(reviewer, f"/approvals/{second.id}")
    last = reviewer.post(
        f"/approvals/{second.id}/decide",
        data={"decision": "reject", "reason": "duplicate", **form_token(page, "reject-form")},
        headers={"HX-Request": "true"},
    )
    assert last.headers["HX-Redirect"] == "/approvals"
    inbox = page_text(reviewer, "/approvals")
    assert "You rejected Issue a refund" in inbox and "Nothing else waits for your decision." in inbox
    assert "Nothing waits for a decision" in inbox


def test_an_email_needs_no_confirming_key_and_the_next_call_skips_what_i_already_approved(app, api, model):
    email = tool_use("send_email", {"customer_id": 4471, "subject": "Hi", "body": "Hello"})
    refund_call, email_call = waiting_calls(api, model, refund(4471, 9000), email)
    html = page_text(session_as(app, "reviewer@acme.test"), f"/approvals/{email_call.id}")
    assert "data-confirm-key" not in html
    db.session.execute(ToolCall.__table__.update().where(ToolCall.id == refund_call.id).values(approvals_required=2))
    db.session.commit()
    reviewer = session_as(app, "reviewer@acme.test")
    page = page_text(reviewer, f"/approvals/{refund_call.id}")
    recorded = reviewer.post(
        f"/approvals/{refund_call.id}/decide",
        data={"decision": "approve", **form_token(page, "approve-form")},
        headers={"HX-Request": "true"},
    )
    assert recorded.headers["HX-Redirect"] == f"/approvals/{email_call.id}"  # not back to the refund
    landed = words(page_text(reviewer, recorded.headers["HX-Redirect"]))
    assert "Your approval of Issue a refund" in landed and "it needs 1 more approval from another reviewer." in landed


def test_a_call_that_failed_after_approval_says_why_in_words(app, api, model):
    (call,) = waiting_calls(api, model, refund(4471, 999_999))
    assert (
        api.as_("reviewer@acme.test").post(f"/api/approvals/{call.id}", json={"decision": "approve"}).status_code == 200
    )
    carry_on(call)
    why = "Failed: A refund of $9,999.99 is more than the $129.00 left to refund on invoice 4471 (total $129.00)."
    decided = words(
        section(page_text(session_as(app, "reviewer@acme.test"), f"/approvals/{call.id}"), "decision-panel")
    )
    assert "Decided by Acme Corp reviewer (reviewer@acme.test) at" in decided and why in decided
    assert "the call has since" not in decided
    chat = page_text(session_as(app, "agent@acme.test"), f"/conversations/{call.conversation_id}")
    assert why in words(section(chat, f"tool-call-{call.id}"))


def test_a_call_past_its_time_to_decide_is_not_run_even_before_the_sweeper_comes(app, api, model):
    (call,) = waiting_calls(api, model, refund(4471, 9000))
    db.session.execute(
        update(ToolCall).where(ToolCall.id == call.id).values(expires_at=utcnow() - timedelta(seconds=1))
    )
    db.session.commit()
    before = db.session.scalar(select(func.max(AuditEvent.id)))
    db.session.remove()
    late = api.as_("reviewer@acme.test").post(f"/api/approvals/{call.id}", json={"decision": "approve"})
    assert late.status_code == 409 and late.json["error"] == "expired"
    assert (
        "The time to decide this call ran out at" in late.json["message"] and "nothing was done" in late.json["message"]
    )
    assert db.session.get(ToolCall, call.id).status == "expired"  # settled at once, not left waiting
    expired = db.session.scalar(
        select(func.count(AuditEvent.id)).where(AuditEvent.action == "approval_expired", AuditEvent.id > before)
    )
    assert expired == 1
    assert carry_on(call) == "completed"  # the conversation was woken and the assistant answered
    assert (
        db.session.scalar(select(func.count(Refund.id)).where(Refund.idempotency_key == f"toolcall-{call.id}")) == 0
    )  # the refund never ran
    again = api.as_("reviewer@acme.test").post(f"/api/approvals/{call.id}", json={"decision": "approve"})
    assert again.status_code == 409 and "it is expired" in again.json["message"]
