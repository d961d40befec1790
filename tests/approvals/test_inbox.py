"""The reviewers' inbox and decision page, over HTTP with real sign-ins, and decisions under load."""

from __future__ import annotations

import re
import threading
from html import unescape

import pytest
from sqlalchemy import func, insert, select

from demo.billing.models import Refund
from tests.clients import open_call, second_admin_approves, session_as
from tests.conftest import wait_until
from tests.model_server import Reply
from tests.replies import reply, tool_use
from webapp.models import AuditEvent, Conversation, Decision, ToolCall
from webapp.runtime.extensions import db
from webapp.runtime.services import services


def waiting_calls(api, model, *blocks, message="please") -> list[ToolCall]:
    """A conversation of agent@acme.test whose calls now wait for decisions."""
    model.enqueue(Reply.message(reply(*blocks)), match=message)
    created = api.as_("agent@acme.test").post("/api/conversations", json={"message": message}).json
    services().loop(db.session, db.session.get(Conversation, created["id"])).complete()
    calls = list(db.session.scalars(select(ToolCall).where(ToolCall.conversation_id == created["id"])))
    db.session.remove()
    return calls


def refund(invoice: int, cents: int) -> dict:
    return tool_use("issue_refund", {"invoice_id": invoice, "amount_cents": cents, "reason": "late delivery"})


def form_token(html: str, form_id: str) -> dict:
    form = re.search(rf'<form[^>]*id="{form_id}".*?</form>', html, re.S).group(0)
    return dict(re.findall(r'name="(csrf_token|arguments_hash)" value="([^"]+)"', form))


def test_the_inbox_lists_waiting_calls_oldest_first_with_what_a_reviewer_sorts_by(app, api, model):
    first, second = waiting_calls(api, model, refund(4471, 9000), refund(4401, 20000))
    html = session_as(app, "reviewer@acme.test").get("/approvals").get_data(as_text=True)
    assert html.index(f'id="approval-{first.id}"') < html.index(f'id="approval-{second.id}"')
    assert "Refund $90.00 on invoice 4471." in html and "Refund $200.00 on invoice 4401." in html
    assert "agent@acme.test" in html
    assert re.search(r'id="approvals-badge"[^>]*>2<', html)  # the navigation badge


def test_inbox_filters_narrow_the_list_and_bad_values_say_so(app, api, model):
    calls = waiting_calls(
        api,
        model,
        refund(4471, 9000),
        refund(4401, 20000),
        tool_use("send_email", {"customer_id": 4471, "subject": "Hello", "body": "b"}),
    )
    reviewer = session_as(app, "reviewer@acme.test")
    by_amount = reviewer.get("/approvals?min_amount=100").get_data(as_text=True)
    assert f"approval-{calls[1].id}" in by_amount and f"approval-{calls[0].id}" not in by_amount
    by_tool = reviewer.get("/approvals?tool=send_email").get_data(as_text=True)
    assert f"approval-{calls[2].id}" in by_tool and f"approval-{calls[0].id}" not in by_tool
    nobody = reviewer.get("/approvals?requester=someone@else.test").get_data(as_text=True)
    assert "Nothing waits for a decision with these filters" in nobody
    bad = reviewer.get("/approvals?min_amount=lots&min_age=-3")
    assert bad.status_code == 200
    assert "Amount from ($) must be a positive number" in bad.get_data(as_text=True)
    fragment = reviewer.get("/approvals?tool=send_email", headers={"HX-Request": "true"}).get_data(as_text=True)
    assert fragment.startswith('<div id="approval-list"')

    # the API's list takes the same filters, read the same way
    listed = api.as_("reviewer@acme.test")

    def ids(url: str) -> list[int]:
        answer = listed.get(url)
        assert answer.status_code == 200, answer.json
        return [item["id"] for item in answer.json["approvals"]]

    assert ids("/api/approvals?min_amount=100") == [calls[1].id]
    assert ids("/api/approvals?tool=send_email") == [calls[2].id]
    assert ids("/api/approvals?tool=issue_refund&max_amount=100") == [calls[0].id]
    assert ids("/api/approvals?requester=AGENT@acme.test&min_amount=") == [call.id for call in calls]  # empty: none
    assert ids("/api/approvals?requester=someone@else.test") == []
    refused = listed.get("/api/approvals?min_amount=lots")
    assert refused.status_code == 422 and refused.json["error"] == "invalid_filter"
    assert refused.json["message"] == "Amount from ($) must be a positive number up to 21,474,836; “lots” was ignored."
    # past what a call can carry, or a hundred years: said, never a 500
    for too_much in ("min_amount=21474837", "max_amount=1e12", "min_age=99999999999"):
        assert listed.get(f"/api/approvals?{too_much}").status_code == 422, too_much
        assert "must be a positive number up to" in reviewer.get(f"/approvals?{too_much}").get_data(as_text=True)
    unknown = listed.get("/api/approvals?amount=5")
    assert unknown.status_code == 422 and unknown.json["fields"][0]["field"] == "amount"


def test_the_decision_page_shows_the_arguments_the_rule_and_the_conversation(app, api, model):
    (call,) = waiting_calls(api, model, refund(4471, 9000), message="refund the late one")
    viewed_before = db.session.scalar(select(func.count(AuditEvent.id)).where(AuditEvent.action == "approval_viewed"))
    html = unescape(open_call(session_as(app, "reviewer@acme.test"), call.id))
    assert '"amount_cents": 9000' in html
    assert "Flagged by policy v0: issue_refund calls above $50.00 need one approval" in html
    assert "refund the late one" in html  # what the support agent asked
    assert 'id="approve-button"' in html and 'id="reject-reason"' in html
    viewed = db.session.scalar(select(func.count(AuditEvent.id)).where(AuditEvent.action == "approval_viewed"))
    assert viewed == viewed_before + 1  # the audit log outlives each test's data


def test_approving_on_the_page_moves_on_and_a_stale_tab_hears_who_decided(app, api, model):
    (call,) = waiting_calls(api, model, refund(4471, 9000))
    first_tab, second_tab = session_as(app, "reviewer@acme.test"), session_as(app, "reviewer2@acme.test")
    page_one = first_tab.get(f"/approvals/{call.id}").get_data(as_text=True)
    page_two = second_tab.get(f"/approvals/{call.id}").get_data(as_text=True)
    approved = first_tab.post(
        f"/approvals/{call.id}/decide", data={"decision": "approve", **form_token(page_one, "approve-form")}
    )
    assert approved.status_code == 303 and approved.location.endswith("/approvals")
    stale = second_tab.post(
        f"/approvals/{call.id}/decide",
        data={"decision": "reject", "reason": "no", **form_token(page_two, "reject-form")},
        headers={"HX-Request": "true"},
    )
    assert stale.status_code == 409
    body = stale.get_data(as_text=True)
    assert "Already decided by Acme Corp reviewer (reviewer@acme.test)" in body
    assert 'id="approve-button"' not in body  # the buttons are gone
    assert db.session.get(ToolCall, call.id).status == "approved"


def test_rejecting_needs_a_reason(app, api, model):
    (call,) = waiting_calls(api, model, refund(4471, 9000))
    reviewer = session_as(app, "reviewer@acme.test")
    page = reviewer.get(f"/approvals/{call.id}").get_data(as_text=True)
    no_reason = reviewer.post(
        f"/approvals/{call.id}/decide",
        headers={"HX-Request": "true"},
        data={"decision": "reject", "reason": " ", **form_token(page, "reject-form")},
    )
    assert no_reason.status_code == 422 and "Say why you reject this call" in no_reason.get_data(as_text=True)
    assert db.session.scalar(select(func.count(Decision.id))) == 0


def test_the_asker_cannot_decide_their_own_call_even_as_a_reviewer(app, api, model):
    from webapp.identity import create_user, get_or_create_tenant

    both = create_user(
        db.session, "both@acme.test", "demo-password", ["agent", "reviewer"], get_or_create_tenant(db.session, "acme")
    )
    db.session.commit()
    model.enqueue(Reply.message(reply(refund(4471, 9000))))
    created = api.as_("both@acme.test").post("/api/conversations", json={"message": "mine"}).json
    services().loop(db.session, db.session.get(Conversation, created["id"])).complete()
    call = db.session.scalar(select(ToolCall).where(ToolCall.conversation_id == created["id"]))
    html = session_as(app, both.email).get(f"/approvals/{call.id}").get_data(as_text=True)
    assert "another reviewer must decide it" in html and 'id="approve-button"' not in html
    refused = api.as_("both@acme.test").post(f"/api/approvals/{call.id}", json={"decision": "approve"})
    assert refused.status_code == 403


@pytest.mark.slow
def test_fifty_concurrent_decisions_on_one_call_give_one_200_and_one_refund(app, api, model, workers, read):
    (call,) = waiting_calls(api, model, refund(4471, 9000))
    tokens = [api.token("reviewer@acme.test"), api.token("reviewer2@acme.test")]
    statuses: list[int] = []
    start = threading.Barrier(50)

    def click(n: int) -> None:
        client = app.test_client()
        start.wait()
        response = client.post(
            f"/api/approvals/{call.id}",
            json={"decision": "approve"},
            headers={"Authorization": f"Bearer {tokens[n % 2]}"},
        )
        statuses.append(response.status_code)

    threads = [threading.Thread(target=click, args=(n,)) for n in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(set(statuses)) == [200, 409] and statuses.count(200) == 1
    workers()
    wait_until(lambda: read(lambda s: s.get(ToolCall, call.id).status) == "succeeded", 30, "the refund to run")
    assert read(lambda s: s.scalar(select(func.count(Refund.id)))) == 1
    assert read(lambda s: s.scalar(select(func.count(Decision.id)).where(Decision.tool_call_id == call.id))) == 1


def test_admins_change_a_policy_on_its_page_and_new_calls_follow_it(app, api, model):
    admin = session_as(app, "admin@acme.test")
    page = admin.get("/admin/policies").get_data(as_text=True)
    assert "issue_refund calls above $50.00 need one approval" in page
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    bad = admin.post("/admin/policies/send_email", data={"csrf_token": token, "mode": "never"})
    assert bad.status_code == 422 and "must wait for at least one person" in bad.get_data(as_text=True)
    for field, typed, says in (
        ("amount_threshold", "100000", "The desk's operator caps issue_refund at $500.00"),  # the ceiling
        ("amount_threshold", "nan", "The amount limit must be a number."),
        ("amount_threshold", "1e400", "The amount limit must be a number."),
        ("ttl_hours", "inf", "Hours to decide must be a number."),
    ):
        refused = admin.post(
            "/admin/policies/issue_refund",
            data={"csrf_token": token, "mode": "above_amount", "amount_threshold": "50", "approvals_required": "1"}
            | {field: typed},
        )
        assert refused.status_code == 422 and says in unescape(refused.get_data(as_text=True)), typed
    saved = admin.post(
        "/admin/policies/issue_refund",
        data={
            "csrf_token": token,
            "mode": "above_amount",
            "amount_threshold": "200",
            "approvals_required": "2",
            "ttl_hours": "2",
        },
    )
    assert saved.status_code == 303
    # A higher amount lets calls wait less: not in force until another admin approves it.
    waiting = " ".join(unescape(re.sub(r"<[^>]+>", " ", admin.get("/admin/policies").get_data(as_text=True))).split())
    assert "Asked for: issue_refund calls above $200.00 need 2 approvals within 2 hours" in waiting
    assert "The amount above which calls wait goes from $50.00 to $200.00." in waiting
    second_admin_approves(app, "issue_refund")
    assert "above $200.00 need 2 approvals within 2 hours" in admin.get("/admin/policies").get_data(as_text=True)
    small, large = waiting_calls(api, model, refund(4471, 9000), refund(4401, 20001))
    assert (small.status, large.status) == ("succeeded", "awaiting_approval")
    assert large.policy["version"] == 1 and large.approvals_required == 2
    changed = db.session.scalar(  # the newest: the audit log keeps earlier tests' events
        select(AuditEvent).where(AuditEvent.action == "policy_changed").order_by(AuditEvent.id.desc()).limit(1)
    )
    assert changed.data["before"]["version"] == 0 and changed.data["after"]["version"] == 1
    assert session_as(app, "reviewer@acme.test").get("/admin/policies").status_code == 403


def without_csrf(html: str) -> str:
    return re.sub(r'name="csrf_token" value="[^"]*"', 'name="csrf_token" value=""', html)


def test_htmx_gets_the_same_fragment_the_full_page_includes(app, api, model):
    (call,) = waiting_calls(api, model, refund(4471, 9000))
    agent = session_as(app, "agent@acme.test")
    page = agent.get(f"/conversations/{call.conversation_id}").get_data(as_text=True)
    fragment = agent.get(f"/conversations/{call.conversation_id}", headers={"HX-Request": "true"}).get_data(
        as_text=True
    )
    assert fragment.lstrip().startswith('<section id="conversation"') and "<html" not in fragment
    # One rendering path: the page embeds exactly this fragment (CSRF tokens carry a timestamp signed
    # to the second, so two requests may get different ones).
    assert without_csrf(fragment.strip()) in without_csrf(page)
    # while something is still moving, the fragment also polls, in case live updates are unavailable
    assert "every 10s" in fragment
    reviewer = session_as(app, "reviewer@acme.test")
    panel = reviewer.get(f"/approvals/{call.id}/panel").get_data(as_text=True)
    assert panel.lstrip().startswith('<section class="panel decision" id="decision-panel"')


def test_the_navigation_badge_stops_counting_at_99_plus_while_the_inbox_gives_the_total(app, api, model):
    (call,) = waiting_calls(api, model, refund(4471, 9000))
    copies = [
        {
            column.key: getattr(call, column.key)
            for column in ToolCall.__table__.columns
            if column.key not in ("id", "tool_use_id", "position")
        }
        | {"tool_use_id": f"toolu_copy_{n}", "position": n + 1}
        for n in range(99)
    ]
    db.session.execute(insert(ToolCall), copies)
    db.session.commit()
    db.session.remove()
    reviewer = session_as(app, "reviewer@acme.test")
    html = reviewer.get("/approvals").get_data(as_text=True)
    assert re.search(r'id="approvals-badge"[^>]*>99\+<', html)  # 100 waiting: the badge stops counting
    assert "of 100 waiting" in html  # the inbox itself counts them all
    assert reviewer.get("/approvals/badge").get_data(as_text=True).count(">99+<") == 1
