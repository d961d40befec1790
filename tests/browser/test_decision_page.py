"""The decision page as a reviewer uses it in a real browser: the facts beside the call, the edit
form checked with the tool's rules, the agent's card in words, and moving on after a decision."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.test_live_pages import REFRESH_PANEL, ask

pytestmark = pytest.mark.slow


def open_first_waiting_call(reviewer) -> None:
    reviewer.goto("/approvals")
    # Opened by its address, read from the inbox: the inbox may be redrawn live as a click lands, and
    # the click then goes nowhere (seen in CI on PostgreSQL, under load: no decision page came).
    address = reviewer.locator("#approval-list a").first.get_attribute("href")
    # The page refreshes its panel once its live stream opens; the tests type only after that refresh,
    # since a swap landing inside Playwright's fill (focus, select, then insert, as separate steps)
    # can take the field from under it (seen once in CI, under load: the amount kept its old value).
    # The page's own "opened" request holds the call; the refresh its claim causes brings the same
    # panel, which edits.js leaves alone.
    with reviewer.expect_response(re.compile(r"/panel$")), reviewer.expect_response(re.compile(r"/opened$")):
        reviewer.goto(address)
    expect(reviewer.locator("#approve-button")).to_be_visible()
    reviewer.wait_for_load_state("load")  # the shortcuts' script has run


def reviewer_on_the_call(page_for, workers, request: str):
    """The agent asks; a reviewer's page, open on the call that waits for a decision."""
    workers()
    ask(page_for("agent@acme.test"), request)
    reviewer = page_for("reviewer@acme.test")
    open_first_waiting_call(reviewer)
    return reviewer


def test_a_reviewer_edits_a_refund_against_the_invoice_and_the_agent_reads_what_was_done(page_for, workers):
    workers()
    agent = page_for("agent@acme.test")
    ask(agent, "Please refund $75 on invoice 4471, the delivery was late")
    card = agent.locator(".tool-call").first
    expect(card).to_contain_text("Waiting for approval")

    reviewer = page_for("reviewer@acme.test")
    open_first_waiting_call(reviewer)
    expect(reviewer.locator("#call-arguments-shown")).to_contain_text("$75.00")
    invoice = reviewer.locator("#record-invoice-4471")
    expect(invoice).to_contain_text("Total$129.00")
    expect(invoice).to_contain_text("Left to refund$129.00")
    expect(reviewer.locator("#call-arguments")).not_to_be_visible()  # the raw JSON is a click away
    reviewer.get_by_text("Arguments as JSON").click()
    expect(reviewer.locator("#call-arguments")).to_contain_text('"amount_cents": 7500')

    reviewer.get_by_text("Edit and approve").click()
    amount = reviewer.get_by_label("Amount ($)")
    expect(amount).to_have_value("75.00")
    amount.fill("9999.99")
    reviewer.get_by_role("button", name="Approve with these arguments").click()
    expect(reviewer.locator("#error-amount_cents")).to_have_text(
        "A refund of $9,999.99 is more than the $129.00 left to refund on invoice 4471 (total $129.00)."
    )
    expect(reviewer.get_by_label("Amount ($)")).to_have_value("9999.99")  # what was typed stays

    reviewer.get_by_label("Amount ($)").fill("40")
    reviewer.get_by_label("Why you changed them").fill("partial refund")
    reviewer.get_by_role("button", name="Approve with these arguments").click()
    expect(reviewer).to_have_url(re.compile(r"/approvals$"))
    expect(reviewer.locator(".flash").first).to_contain_text(
        re.compile(r"You approved Issue a refund #\d+ with changes: amount \$75\.00 → \$40\.00\.")
    )

    expect(card).to_contain_text(
        "Approved with changes by Acme Corp reviewer: amount $75.00 → $40.00 (partial refund)."
    )
    expect(card).to_contain_text("Refunded $40.00 on invoice 4471; $89.00 is left to refund.")
    expect(agent.locator("#conversation-status")).to_have_text("completed")
    expect(agent.locator(".turn.assistant").last).to_contain_text("of $40.00 issued on invoice 4471")
    page_text = agent.locator("#conversation").inner_text()
    assert "tool_output" not in page_text and "Do not retry" not in page_text


def test_after_a_decision_the_page_moves_to_the_next_call_and_a_second_key_confirms_money(page_for, workers):
    workers()
    agent = page_for("agent@acme.test")
    ask(agent, 'Refund $75 on invoice 4471 and email customer 4471 saying "Your refund is on its way"')
    expect(agent.locator(".tool-call")).to_have_count(2)

    reviewer = page_for("reviewer@acme.test")
    reviewer.goto("/approvals")
    reviewer.locator("#approval-list a", has_text="send_email").click()
    expect(reviewer.locator("#call-letter")).to_contain_text("Jordan Ellis <jordan.ellis@example.com>")
    expect(reviewer.locator("#call-letter")).to_contain_text("Your refund is on its way")
    reviewer.wait_for_load_state("load")
    reviewer.keyboard.press("a")  # an email has no amount: one key approves it
    expect(reviewer.locator(".flash").first).to_contain_text(
        re.compile(r"You approved Email a customer #\d+\. Here is the oldest call still waiting for you\.")
    )
    expect(reviewer.locator("#decision-panel h1")).to_contain_text("Issue a refund")
    with reviewer.expect_response(re.compile(r"/panel$")):  # a live refresh (as the live stream opens)
        reviewer.evaluate(REFRESH_PANEL)
    expect(reviewer.locator(".flash").first).to_contain_text("You approved Email a customer")  # still said

    reviewer.wait_for_load_state("load")
    reviewer.keyboard.press("a")
    question = reviewer.locator("#approve-confirm")
    expect(question).to_contain_text("Approve $75.00, above the $50.00")
    expect(question).to_be_in_viewport()  # the question is seen where the reviewer is, not below the fold
    with reviewer.expect_response(re.compile(r"/panel$")):  # a live refresh between the two keys
        reviewer.evaluate(REFRESH_PANEL)
    expect(question).to_contain_text("Approve $75.00, above the $50.00")  # still asked
    reviewer.keyboard.press("Escape")
    expect(question).to_have_text("Not approved.")
    expect(reviewer.locator("#approvals-badge")).to_have_text("1")  # still waiting

    reviewer.keyboard.press("a")
    expect(question).to_contain_text("Approve $75.00")
    reviewer.keyboard.press("a")
    expect(reviewer).to_have_url(re.compile(r"/approvals$"))
    expect(reviewer.locator("#approval-list")).to_contain_text("Nothing waits for a decision")


def test_a_live_refresh_of_the_panel_keeps_what_the_reviewer_is_typing(page_for, workers):
    reviewer = reviewer_on_the_call(page_for, workers, "Please refund $75 on invoice 4471, the delivery was late")
    reviewer.get_by_text("Edit and approve").click()
    reviewer.get_by_label("Amount ($)").fill("12.34")
    reviewer.get_by_label("Reason (the model is told)").fill("half typed")
    with reviewer.expect_response(re.compile(r"/panel$")):  # what a decision elsewhere in the tenant causes
        reviewer.evaluate(REFRESH_PANEL)
    reviewer.wait_for_timeout(200)  # settled
    expect(reviewer.get_by_label("Amount ($)")).to_be_visible()
    expect(reviewer.get_by_label("Amount ($)")).to_have_value("12.34")
    expect(reviewer.get_by_label("Reason (the model is told)")).to_have_value("half typed")


def test_a_live_refresh_while_a_decision_is_in_flight_does_not_cost_the_move(page_for, workers):
    reviewer = reviewer_on_the_call(page_for, workers, 'Email customer 4471 saying "Your refund is on its way"')

    def refresh_then_send(route):
        # the panel's own live refresh (what the decision's live signal makes), before the answer
        reviewer.evaluate("htmx.trigger(document.body, 'htmx:sseOpen')")
        reviewer.wait_for_timeout(300)
        route.continue_()

    reviewer.route(re.compile(r"/decide$"), refresh_then_send)
    reviewer.get_by_role("button", name="Approve", exact=True).click()
    expect(reviewer).to_have_url(re.compile(r"/approvals$"))
    expect(reviewer.locator(".flash").first).to_contain_text("You approved Email a customer")


CLOCK = r"\d{1,2}:\d\d\s[AP]M"  # en-US, the viewer's own time: "7:49 PM" (ICU puts a narrow space before PM)
CLOCK_SECONDS = r"\d{1,2}:\d\d:\d\d\s[AP]M"


def test_every_time_on_the_panel_reads_in_the_viewers_own_clock_a_refused_decision_included(page_for, workers):
    # no money: one click approves; opened first, so first holds it
    first = reviewer_on_the_call(page_for, workers, 'Email customer 4471 saying "Your refund is on its way"')
    first.evaluate("document.getElementById('decision-panel').dataset.marked = 'yes'")
    with first.expect_response(re.compile(r"/panel$")):  # a live refresh that brings the same panel
        first.evaluate(REFRESH_PANEL.split(";", 1)[1])  # as htmx makes it: edits.js compares it with the last
    first.wait_for_timeout(300)  # it would have been swapped by now
    expect(first.locator("#decision-panel[data-marked=yes]")).to_have_count(1)  # left alone

    # a tab whose live stream is cut: it hears of nothing, as a tab does that missed a refresh
    stale = page_for("reviewer2@acme.test", timezone_id="Asia/Kolkata", locale="en-US")
    stale.route(re.compile(r"/live/"), lambda route: route.abort())
    stale.goto(first.url)
    expect(stale.locator("#call-claimed")).to_contain_text(re.compile(rf"Being reviewed by .* until {CLOCK}\."))
    stale.get_by_role("button", name="Take it over").click()
    expect(stale.locator(".flash-info")).to_have_text(  # once: in the panel, not on the page as well
        re.compile(rf"^You are reviewing this call now, until {CLOCK}\.$")
    )
    expect(stale.locator("#call-claimed")).to_have_count(0)

    with first.expect_response(re.compile(r"/decide$")):
        first.locator("#approve-button").click()  # claims guide, they do not lock: first may still decide
    expect(first).to_have_url(re.compile(r"/approvals$"))
    stale.locator("#approve-button").click()
    refused = stale.locator("#decision-panel .flash-error")
    expect(refused).to_have_text(
        re.compile(rf"^Already decided by Acme Corp reviewer \(reviewer@acme.test\) at {CLOCK_SECONDS} \(\w+\)\.$")
    )
    settled = stale.locator("#decision-panel .settled")
    expect(settled).to_contain_text(re.compile(rf"Decided by Acme Corp reviewer .*at {CLOCK_SECONDS}"))
    said, shown = (re.search(CLOCK_SECONDS, text).group(0) for text in (refused.inner_text(), settled.inner_text()))
    assert said == shown  # the same moment in the same words
    assert "UTC" not in stale.locator("#decision-panel").inner_text()
