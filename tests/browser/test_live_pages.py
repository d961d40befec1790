"""The product as people use it, in a real browser: an agent asks, a reviewer decides in another
browser, and the agent's page follows the stream and the decision without a reload."""

from __future__ import annotations

import re
import threading

import pytest
from playwright.sync_api import expect

from tests.model_server import Reply

pytestmark = pytest.mark.slow

REFUND_REQUEST = "Please refund $60 on invoice 4471, the delivery was late"
# A live refresh of the decision panel, swapped in even when it brings the markup the last one brought
# (edits.js leaves the panel alone then: these tests are about what a swap keeps).
REFRESH_PANEL = (
    "document.getElementById('decision-panel').lastRefresh = null;"
    " htmx.ajax('GET', location.pathname + '/panel', {target: '#decision-panel', swap: 'outerHTML'})"
)


@pytest.fixture
def api_token(engine, clean):
    """api_token(email): a bearer token for a demo user, made once per test."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from webapp.identity import create_token
    from webapp.models import User

    made: dict[str, str] = {}

    def token(email: str) -> str:
        if email not in made:
            with Session(engine) as session:
                made[email] = create_token(session, session.scalar(select(User).where(User.email == email)))
                session.commit()
        return made[email]

    return token


def ask(page, message: str) -> None:
    page.goto("/conversations")
    page.get_by_label("Ask the assistant").fill(message)
    page.get_by_role("button", name="Start conversation").click()
    expect(page).to_have_url(re.compile(r"/conversations/\d+$"))


def test_a_reviewer_approves_in_another_browser_and_the_agents_page_shows_the_answer(page_for, workers):
    workers()
    agent = page_for("agent@acme.test")
    ask(agent, REFUND_REQUEST)
    card = agent.locator(".tool-call").first
    expect(card).to_contain_text("Waiting for approval")

    reviewer = page_for("reviewer@acme.test")
    expect(reviewer.locator("#approvals-badge")).to_have_text("1")
    reviewer.locator(".mainnav a", has_text="Approvals").click()
    # by its address: the inbox redraws itself once its live stream opens, and a click landing then
    # goes nowhere
    reviewer.goto(reviewer.locator("#approval-list a").first.get_attribute("href"))
    expect(reviewer.locator("#call-arguments-shown")).to_contain_text("$60.00")
    reviewer.wait_for_load_state("load")  # the shortcuts' script has run
    reviewer.keyboard.press("a")  # above the policy's amount, the shortcut asks first
    expect(reviewer.locator("#approve-confirm")).to_contain_text(
        "Approve $60.00, above the $50.00 that needs a person?"
    )
    reviewer.keyboard.press("a")  # ... and the second key approves
    # the page moves on: nothing else waits, so the inbox says so
    expect(reviewer).to_have_url(re.compile(r"/approvals$"))
    expect(reviewer.locator(".flash").first).to_contain_text("You approved Issue a refund")
    expect(reviewer.locator("#approval-list")).to_contain_text("Nothing waits for a decision")
    expect(reviewer.locator("#approvals-badge")).to_have_text("0")

    # The agent never reloads: the card and the model's final answer arrive live.
    expect(card).to_contain_text("approved by Acme Corp reviewer", ignore_case=True)
    expect(agent.locator(".turn.assistant").last).to_contain_text("$60.00")
    expect(agent.locator("#conversation-status")).to_have_text("completed")


def refund_waiting_on_a_reviewers_page(page_for, workers):
    """An agent's refund waits for approval; a reviewer has its decision page open."""
    workers()
    agent = page_for("agent@acme.test")
    ask(agent, REFUND_REQUEST)
    expect(agent.locator(".tool-call").first).to_contain_text("Waiting for approval")
    reviewer = page_for("reviewer@acme.test")
    reviewer.goto("/approvals")
    # opened by its address: the list may be redrawn live as the click lands (the click then goes nowhere)
    reviewer.goto(reviewer.locator("#approval-list a").first.get_attribute("href"))
    expect(reviewer.locator("#approve-button")).to_be_visible()
    return reviewer


def test_a_decision_taken_elsewhere_removes_the_buttons_from_an_open_decision_page(page_for, workers, api_token):
    reviewer = refund_waiting_on_a_reviewers_page(page_for, workers)
    call_id = int(reviewer.url.rsplit("/", 1)[1])

    other = page_for("reviewer2@acme.test")
    response = other.request.post(
        f"/api/approvals/{call_id}",
        data={"decision": "reject", "reason": "Too much"},
        headers={"Authorization": f"Bearer {api_token('reviewer2@acme.test')}"},
    )
    assert response.status == 200
    expect(reviewer.locator("#approve-button")).to_have_count(0)
    expect(reviewer.locator(".settled")).to_contain_text("Decided by Acme Corp reviewer2")


def test_the_approve_shortcut_right_after_a_panel_refresh_still_decides_through_htmx(page_for, workers):
    """A live refresh swaps the panel in and htmx wires it up only at settle; a key pressed in
    between must not fall back to a full-page form post."""
    reviewer = refund_waiting_on_a_reviewers_page(page_for, workers)
    reviewer.wait_for_load_state("load")
    reviewer.evaluate("htmx.config.defaultSettleDelay = 5000")  # widen the window a person hits by luck
    with reviewer.expect_response(re.compile(r"/panel$")):  # a live refresh of the panel, as htmx makes it
        reviewer.evaluate(REFRESH_PANEL)
    reviewer.wait_for_timeout(100)  # swapped, not yet settled
    with reviewer.expect_request(re.compile(r"/decide$")) as decided:
        reviewer.keyboard.press("a")
        reviewer.keyboard.press("a")  # the confirming key: $60 is above the policy's $50
    assert decided.value.headers.get("hx-request") == "true"
    expect(reviewer).to_have_url(re.compile(r"/approvals$"))
    expect(reviewer.locator(".flash").first).to_contain_text("You approved Issue a refund")


def asked_for_a_long_answer(page_for, workers, model, held, message: str):
    """The agent's page, once it has asked for a long answer that the model streams as `held` lets it
    (a threading.Event: nothing more until it is set; seconds: a chunk that often)."""
    model.enqueue(Reply.held(held), match="[[long answer]]")
    workers(MODEL_TIMEOUT_SECONDS="120")  # the held stream must not time out and be retried unheld
    agent = page_for("agent@acme.test")
    ask(agent, f"[[long answer]] {message}")
    return agent


def test_streamed_text_appears_before_the_model_call_ends(page_for, workers, model):
    gate = threading.Event()
    agent = asked_for_a_long_answer(page_for, workers, model, gate, "please")
    live = agent.locator("#live-answer .text")
    expect(live).not_to_be_empty()  # the first words are on screen while the model still holds the stream
    assert not gate.is_set()
    gate.set()
    expect(agent.locator("#conversation-status")).to_have_text("completed")
    expect(agent.locator("#live-answer")).to_have_count(0)
    expect(agent.locator(".turn.assistant").last).not_to_be_empty()


def test_a_reload_mid_stream_shows_the_text_so_far_then_follows(page_for, workers, model):
    gate = threading.Event()
    agent = asked_for_a_long_answer(page_for, workers, model, gate, "again")
    expect(agent.locator("#live-answer .text")).not_to_be_empty()
    so_far = agent.locator("#live-answer .text").inner_text()
    agent.reload()
    expect(agent.locator("#live-answer .text")).to_contain_text(so_far.strip()[:20])
    gate.set()
    expect(agent.locator("#conversation-status")).to_have_text("completed")


def test_stop_during_a_stream_leaves_a_conversation_that_carries_on(page_for, workers, model):
    agent = asked_for_a_long_answer(page_for, workers, model, 0.3, "and stop")  # a slow model: a chunk every 0.3 s
    expect(agent.locator("#live-answer .text")).not_to_be_empty()
    agent.get_by_role("button", name="Stop").click()
    expect(agent.locator("#conversation-status")).to_have_text("stopped")
    expect(agent.get_by_text("Stopped by you")).to_be_visible()
    agent.get_by_label("Your message").fill("Show invoices for customer 4471")
    agent.get_by_role("button", name="Send").click()
    expect(agent.locator("#conversation-status")).to_have_text("completed")
    expect(agent.locator(".turn.assistant").last).to_contain_text("#4471")


def test_a_draft_survives_live_refreshes_and_sending_empties_the_box(page_for, workers, model):
    gate = threading.Event()
    agent = asked_for_a_long_answer(page_for, workers, model, gate, "please")
    box = agent.get_by_label("Your message")
    expect(agent.locator("#live-answer .text")).not_to_be_empty()
    box.fill("Thanks; next, show invoices for customer 4471")  # typed while the assistant still works
    expect(agent.get_by_role("button", name="Send")).to_be_disabled()
    with agent.expect_response(re.compile(r"/conversations/\d+$")):  # a live refresh of the conversation
        agent.evaluate("document.getElementById('conversation-live').dispatchEvent(new CustomEvent('htmx:sseOpen'))")
    gate.set()
    expect(agent.locator("#conversation-status")).to_have_text("completed")
    expect(box).to_have_value("Thanks; next, show invoices for customer 4471")
    agent.get_by_role("button", name="Send").click()
    expect(agent.locator(".turn.user").last).to_contain_text("show invoices for customer 4471")
    expect(box).to_have_value("")
    expect(agent.locator("#conversation-status")).to_have_text("completed")
    expect(agent.locator(".turn.assistant").last).to_contain_text("#4471")


def test_the_conversation_list_changes_status_live_when_a_decision_lands(page_for, workers, api_token):
    workers()
    agent = page_for("agent@acme.test")
    ask(agent, REFUND_REQUEST)
    expect(agent.locator(".tool-call").first).to_contain_text("Waiting for approval")
    agent.goto("/conversations")
    row = agent.locator("#conversation-list tbody tr").first
    expect(row).to_contain_text("waiting for approval")
    reviewer = page_for("reviewer@acme.test")
    pending = reviewer.request.get(
        "/api/approvals", headers={"Authorization": f"Bearer {api_token('reviewer@acme.test')}"}
    )
    call_id = pending.json()["approvals"][0]["id"]
    reviewer.request.post(
        f"/api/approvals/{call_id}",
        data={"decision": "approve"},
        headers={"Authorization": f"Bearer {api_token('reviewer@acme.test')}"},
    )
    expect(row).to_contain_text("completed")
