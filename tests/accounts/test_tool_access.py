"""The Policies page's "who may use it" and its policy form, and what disabling a person stops:
saves are audited, refusals keep what was typed beside the field, and a disabled person's waiting
calls settle as cancelled with the reason."""

from __future__ import annotations

import re
from html import unescape

from sqlalchemy import func, select

from tests.approvals.test_inbox import refund, waiting_calls
from tests.clients import sign_in
from webapp.models import AuditEvent, Conversation, ToolCall, User
from webapp.runtime.extensions import db
from webapp.runtime.services import services

ADMIN = "admin@acme.test"


def row(html: str, tool: str) -> str:
    return re.search(rf'<tr id="policy-{tool}">.*?</tr>', html, re.S).group(0)


def last_event_id(read) -> int:
    return read(lambda s: s.scalar(select(func.coalesce(func.max(AuditEvent.id), 0))))


def events(read, action: str, after: int) -> list[AuditEvent]:
    """The events of this action since `after` (the audit log is never emptied between tests)."""
    return read(lambda s: s.scalars(select(AuditEvent).where(AuditEvent.action == action, AuditEvent.id > after)).all())


def test_an_admin_chooses_who_may_use_a_tool_and_the_page_and_audit_log_say_so(app, read):
    before = last_event_id(read)
    admin = sign_in(app, ADMIN)
    saved = admin.post(
        "/admin/policies/issue_refund/access",
        {"who": "chosen", "roles": ["reviewer"], "people": "Agent@acme.test, "},
    )
    assert saved.status_code == 303 and saved.headers["Location"].endswith("#policy-issue_refund")
    html = unescape(admin.get("/admin/policies").text)
    assert "Only the assistant of people with the role reviewer; and Acme Corp agent" in row(html, "issue_refund")
    assert "agent@acme.test" in row(html, "issue_refund")  # the people field shows who is named
    (event,) = events(read, "tool_access_changed", before)
    assert event.tool_name == "issue_refund"
    assert event.data["before"]["who"] == "everyone" and event.data["after"]["roles"] == ["reviewer"]

    admin.post("/admin/policies/send_email/access", {"who": "nobody"})
    assert "Disabled: no one's assistant may use it." in row(unescape(admin.get("/admin/policies").text), "send_email")


def test_a_refused_access_setting_says_why_and_keeps_what_was_typed(app, read):
    before = last_event_id(read)
    admin = sign_in(app, ADMIN)
    refused = admin.post(
        "/admin/policies/issue_refund/access", {"who": "chosen", "roles": ["admin"], "people": "nobody@acme.test"}
    )
    assert refused.status_code == 422
    html = row(unescape(refused.text), "issue_refund")
    assert "No one in your organisation has the e-mail nobody@acme.test" in html
    assert ">nobody@acme.test</textarea>" in html
    assert re.search(r'value="admin" checked', html) and re.search(r'value="chosen" checked', html)
    assert '<details class="access-form" open' in html
    # another tenant's person is no one here either
    assert (
        admin.post("/admin/policies/issue_refund/access", {"who": "chosen", "people": "agent@globex.test"}).status_code
        == 422
    )
    assert admin.post("/admin/policies/issue_refund/access", {"who": "everyone", "extra": "1"}).status_code == 422
    assert admin.post("/admin/policies/no_such_tool/access", {"who": "everyone"}).status_code == 404
    assert events(read, "tool_access_changed", before) == []


def test_the_policy_form_offers_only_what_the_tool_supports_and_keeps_typed_values_beside_the_error(app):
    admin = sign_in(app, ADMIN)
    html = admin.get("/admin/policies").text
    email_row, refund_row = row(html, "send_email"), row(html, "issue_refund")
    assert 'value="above_amount"' not in email_row and 'name="amount_threshold"' not in email_row
    assert 'value="never"' not in email_row  # it changes things for customers
    assert 'value="above_amount"' in refund_row
    assert 'action="/admin/policies/issue_refund#policy-issue_refund"' in refund_row

    refused = admin.post(
        "/admin/policies/issue_refund",
        {"mode": "always", "amount_threshold": "50", "approvals_required": "9", "ttl_hours": "36"},
    )
    assert refused.status_code == 422
    form = row(unescape(refused.text), "issue_refund")
    assert re.search(r'name="approvals_required"[^>]*value="9"></label><span class="error field-error"', form)
    assert "Approvals needed must be from 1 to 5." in form
    assert 'name="ttl_hours" type="number" min="0.1" step="0.1" value="36"' in form
    assert re.search(r'<option value="always" selected', form)


def test_disabling_a_person_stops_their_conversations_and_their_waiting_calls_say_why(app, api, model, read):
    before = last_event_id(read)
    (call,) = waiting_calls(api, model, refund(4471, 9000))
    agent_id = read(lambda s: s.scalar(select(User.id).where(User.email == "agent@acme.test")))
    admin = sign_in(app, ADMIN)
    done = admin.post(f"/admin/users/{agent_id}/disable")
    assert done.status_code == 303
    assert "1 conversation of theirs stopped" in unescape(admin.get("/admin/users").text)

    conversation = db.session.get(Conversation, call.conversation_id)
    assert conversation.cancel_reason == "agent@acme.test's account was disabled"
    services().loop(db.session, conversation).complete()  # the move the disable queued
    settled = db.session.get(ToolCall, call.id)
    assert (settled.status, settled.is_error) == ("cancelled", True)
    assert "(agent@acme.test's account was disabled). Nothing was done." in settled.result
    assert db.session.get(Conversation, call.conversation_id).status == "cancelled"
    db.session.remove()

    (stopped,) = events(read, "cancel_requested", before)
    assert stopped.conversation_id == call.conversation_id and "disabled" in stopped.data["reason"]
    (disabled,) = events(read, "user_disabled", before)
    assert disabled.data["conversations_stopped"] == [call.conversation_id]
    page = unescape(sign_in(app, "reviewer@acme.test").get(f"/conversations/{call.conversation_id}").text)
    assert "because agent@acme.test's account was disabled" in page
    assert "Cancelled: the conversation was stopped because agent@acme.test's account was disabled." in page
