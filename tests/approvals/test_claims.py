"""Claims: opening a waiting call holds it for its reviewer a few minutes; the others see who, in the
inbox and on the page, and can take it over; the API claims, takes over and releases."""

from __future__ import annotations

from datetime import timedelta
from html import unescape

from sqlalchemy import func, select, update

from tests.approvals.test_decision_page import section, words
from tests.approvals.test_inbox import refund, waiting_calls
from tests.clients import CSRF, open_call, session_as
from webapp.models import AuditEvent, ToolCall, utcnow
from webapp.runtime.extensions import db

FIRST, SECOND = "reviewer@acme.test", "reviewer2@acme.test"


def page(client, url: str) -> str:
    return words(unescape(client.get(url).get_data(as_text=True)))


def held_by(call_id: int) -> int | None:
    db.session.remove()
    return db.session.get(ToolCall, call_id).claimed_by_id


def test_opening_a_call_holds_it_and_the_others_see_who_and_can_take_it_over(app, api, model):
    (call,) = waiting_calls(api, model, refund(4471, 9000))
    first, second = session_as(app, FIRST), session_as(app, SECOND)
    url = f"/approvals/{call.id}"
    before = db.session.scalar(select(func.max(AuditEvent.id))) or 0
    assert "Being reviewed by" not in page(first, url)
    # reading the page writes nothing: no claim, no audit event (a prefetch or a link preview holds nothing)
    assert held_by(call.id) is None
    assert db.session.scalar(select(func.count()).where(AuditEvent.id > before)) == 0
    assert "Being reviewed by" not in words(unescape(open_call(first, call.id)))  # loaded: it is theirs now
    assert held_by(call.id) is not None
    viewed = db.session.scalars(select(AuditEvent.action).where(AuditEvent.id > before)).all()
    assert viewed == ["approval_viewed"]
    theirs = words(unescape(open_call(second, call.id)))
    assert "Being reviewed by Acme Corp reviewer (reviewer@acme.test) until" in theirs and "Take it over" in theirs
    token = CSRF.search(second.get(url).get_data(as_text=True)).group(1)
    lost = second.post(f"{url}/opened", headers={"X-CSRFToken": token, "HX-Request": "true"})
    assert lost.status_code == 200 and lost.headers["HX-Retarget"] == "#decision-panel"  # the panel says who
    assert "Being reviewed by Acme Corp reviewer (reviewer@acme.test)" in words(unescape(lost.get_data(as_text=True)))
    assert "Being reviewed by Acme Corp reviewer" in page(second, "/approvals")  # the inbox says so too
    assert "Being reviewed by" not in page(first, "/approvals")  # not to the holder

    banner = section(second.get(url).get_data(as_text=True), "call-claimed")
    taken = second.post(f"{url}/claim", data={"csrf_token": CSRF.search(banner).group(1)})
    assert taken.status_code in (302, 303)
    assert "You are reviewing this call now" in page(second, url)
    assert "Being reviewed by Acme Corp reviewer2 (reviewer2@acme.test)" in words(unescape(open_call(first, call.id)))

    decided = api.as_(SECOND).post(f"/api/approvals/{call.id}", json={"decision": "reject", "reason": "duplicate"})
    assert decided.status_code == 200 and decided.json["claimed_by"] is None  # a decision ends the claim


def test_the_api_claims_refuses_another_holder_in_words_takes_over_and_releases(app, api, model):
    (call,) = waiting_calls(api, model, refund(4471, 9000))
    first, second = api.as_(FIRST), api.as_(SECOND)
    url = f"/api/approvals/{call.id}/claim"
    held = first.post(url, json={})
    assert held.status_code == 200 and held.json["claimed_by"] == FIRST and held.json["claimed_until"]
    listed = second.get("/api/approvals").json["approvals"]
    assert [item["claimed_by"] for item in listed if item["id"] == call.id] == [FIRST]

    refused = second.post(url, json={})
    assert refused.status_code == 409 and refused.json["error"] == "claimed"
    assert "Being reviewed by Acme Corp reviewer (reviewer@acme.test) until" in refused.json["message"]
    assert second.delete(url).status_code == 409  # only its holder gives it up
    assert second.post(url, json={"take_over": "yes"}).status_code == 422  # strict: a boolean

    taken = second.post(url, json={"take_over": True})
    assert taken.status_code == 200 and taken.json["claimed_by"] == SECOND
    released = second.delete(url)
    assert released.status_code == 200 and released.json["claimed_by"] is None
    assert first.post(url).status_code == 200  # free again; every field is optional, so no body is fine
    first.delete(url)
    assert first.post(url, data="x", content_type="application/json").status_code == 400  # not JSON
    assert first.post(url, json={}).status_code == 200

    db.session.execute(
        update(ToolCall).where(ToolCall.id == call.id).values(claimed_until=utcnow() - timedelta(seconds=1))
    )
    db.session.commit()
    db.session.remove()
    assert second.post(url, json={}).json["claimed_by"] == SECOND  # a claim that ran out holds nothing
    assert api.as_("agent@acme.test").post(url, json={}).status_code == 403  # agents do not review
