"""Every main page on a 390x844 phone: nothing wider than the screen, the key content in view,
filters folded away, no keyboard hints, touch targets of 44 px; and relative times that carry the
exact time in the viewer's own time zone."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import LAPTOP, PASSWORD, TIMEOUT_MS
from tests.browser.test_live_pages import ask

pytestmark = pytest.mark.slow

PHONE = {"width": 390, "height": 844}
LONG_REQUEST = (
    "Please refund $60 on invoice 4471 because the delivery arrived three weeks late and the customer "
    "has written to us twice about it already"
)


@pytest.fixture
def phone(browser, live_server, console):
    """phone(email, **context options): a page in its own browser context at 390x844 with touch,
    signed in through the real form."""
    contexts = []

    def open_page(email: str, **options) -> Page:
        context = browser.new_context(
            base_url=live_server.url, viewport=PHONE, has_touch=True, is_mobile=True, **options
        )
        context.set_default_timeout(TIMEOUT_MS)
        contexts.append(context)
        page = context.new_page()
        console.record(page)
        page.goto("/login")
        page.get_by_label("Email").fill(email)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        expect(page).to_have_url(re.compile(r"/$"))
        return page

    yield open_page
    for context in contexts:
        context.close()


def fits(page: Page, path: str) -> None:
    """Open the page; it is no wider than the phone's screen."""
    page.goto(path)
    page.wait_for_load_state("load")  # deferred scripts (layout, times) have run
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"{path} is {width} px wide on a {PHONE['width']} px screen"


def tall_enough(locator) -> None:
    # Read in one step, and again while a live update swaps the part it sits in (for an instant it is
    # the new, not yet laid out copy); it must reach 44 px within a few seconds.
    height = 0
    for _ in range(50):
        height = locator.evaluate("element => element.getBoundingClientRect().height")
        if height >= 44:
            return
        locator.page.wait_for_timeout(100)
    raise AssertionError(f"a touch target is {height} px tall")


def test_every_main_page_fits_a_phone(phone, workers, console):
    workers()
    agent = phone("agent@acme.test")
    ask(agent, LONG_REQUEST)
    expect(agent.locator(".tool-call").first).to_contain_text("Waiting for approval")
    conversation = agent.url

    fits(agent, "/")
    expect(agent.locator("#home-agent")).to_contain_text("waiting for approval")
    fits(agent, "/conversations")
    row = agent.locator("#conversation-list tbody tr").first
    expect(row).to_contain_text("Please refund $60 on invoice 4471")
    expect(row.locator("td").nth(2)).to_have_attribute("data-label", "Last activity")  # a card labels each value
    expect(row.locator("time")).to_have_text(re.compile(r"just now|min ago"))
    fits(agent, conversation)
    title = agent.locator(".conversation-head h1")
    expect(title).to_be_visible()
    # two lines at most: the chat starts on the first screen (read in one step: a live update may swap it)
    assert title.evaluate("element => element.getBoundingClientRect().height") < 60
    expect(agent.locator(".tool-call").first).to_be_in_viewport()
    # who said what, and which tool a card is for, stay on a phone; only the top bar's name folds away
    expect(agent.locator(".turn.user .who").first).to_be_visible()
    expect(agent.locator(".tool-call .who").first).to_contain_text("issue_refund")
    expect(agent.locator(".tool-call .who").first).to_be_visible()
    expect(agent.locator(".signout .who")).not_to_be_visible()
    tall_enough(agent.get_by_role("button", name="Stop"))

    reviewer = phone("reviewer@acme.test")
    fits(reviewer, "/")
    expect(reviewer.locator("#home-waiting")).to_have_text("1")
    fits(reviewer, "/approvals")
    card = reviewer.locator("#approval-list tbody tr").first
    expect(card).to_contain_text("issue_refund")
    for label in ("Waiting", "Time left"):  # the columns a 529 px table cut off: in the card, labelled
        cell = card.locator(f'td[data-label="{label}"]')
        expect(cell).to_be_visible()
        expect(cell).to_be_in_viewport()
    expect(reviewer.locator("#approval-filters")).not_to_have_attribute("open", "")  # folded away
    expect(reviewer.get_by_label("Tool")).not_to_be_visible()
    expect(reviewer.locator(".key-hints").first).not_to_be_visible()
    reviewer.locator("#approval-filters summary").click()
    expect(reviewer.get_by_label("Tool")).to_be_visible()
    reviewer.locator("#approval-list a").first.click()
    expect(reviewer.locator("#approve-button")).to_be_visible()
    fits(reviewer, reviewer.url)
    tall_enough(reviewer.locator("#approve-button"))
    expect(reviewer.locator(".key-hints")).not_to_be_visible()

    auditor = phone("auditor@acme.test")
    fits(auditor, "/")
    expect(auditor.locator("#home-auditor")).to_contain_text("approval_viewed")  # the reviewer above
    fits(auditor, "/audit")
    expect(auditor.locator(".audit-event").first).to_be_visible()
    expect(auditor.get_by_label("Person")).not_to_be_visible()  # the filters are folded away
    fits(auditor, "/audit/dashboard")
    expect(auditor.locator("#headline-model-calls")).to_be_visible()
    expect(auditor.locator("#usage-days tbody tr")).to_have_count(1)  # today only

    admin = phone("admin@acme.test")
    fits(admin, "/")
    expect(admin.locator("#home-admin")).to_contain_text("Policies set")
    fits(admin, "/admin/users")
    expect(admin.locator("#users tbody tr").first).to_contain_text("@acme.test")
    fits(admin, "/admin/policies")
    expect(admin.get_by_role("heading", level=1)).to_be_visible()
    fits(admin, "/ops")
    expect(admin.get_by_role("heading", name="Operations")).to_be_visible()
    for link in admin.locator(".mainnav a").all():
        tall_enough(link)
    assert console.errors() == []


def test_relative_times_carry_the_exact_time_in_the_viewers_time_zone(phone, workers):
    workers()
    agent = phone("agent@acme.test", timezone_id="Asia/Kolkata", locale="en-US")
    ask(agent, "Show invoices for customer 4471")
    agent.goto("/conversations")
    moment = agent.locator("#conversation-list time").first
    expect(moment).to_have_text(re.compile(r"^(just now|\d+ min ago)$"))
    expect(moment).to_have_attribute("title", re.compile(r"GMT\+5:30"))  # the viewer's zone, not UTC
    utc = agent.evaluate("document.querySelector('#conversation-list time').getAttribute('datetime')")
    local = agent.evaluate(
        "new Date(document.querySelector('#conversation-list time').getAttribute('datetime'))"
        ".toLocaleString('en-US', {timeZone: 'Asia/Kolkata', hour: '2-digit', minute: '2-digit'})"
    )
    assert utc.endswith("Z")
    # waited for, not read once: the list may be redrawn (live) and its times rewritten again
    expect(moment).to_have_attribute("title", re.compile(re.escape(local)))
    # after an htmx swap (the search), the new rows are relative too
    agent.get_by_label("Search").fill("invoices")
    expect(agent.locator("#conversation-list time").first).to_have_text(re.compile(r"^(just now|\d+ min ago)$"))


WORDS_BROKEN = """cells => {
  const broken = [];
  for (const cell of cells) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const word of node.data.matchAll(/\\S+/g)) {
        const range = document.createRange();
        range.setStart(node, word.index);
        range.setEnd(node, word.index + word[0].length);
        const lines = new Set([...range.getClientRects()].map(rect => Math.round(rect.top)));
        if (lines.size > 1) broken.push(word[0]);
      }
    }
  }
  return broken;
}"""


def test_the_policies_page_keeps_tool_names_and_words_whole_on_a_laptop(page_for):
    page = page_for("admin@acme.test", viewport=LAPTOP)
    page.goto("/admin/policies")
    expect(page.locator("#policy-lookup_customer")).to_be_visible()
    broken = page.locator('tr[id^="policy-"] > td:first-child').evaluate_all(WORDS_BROKEN)
    assert broken == [], f"words broken across lines in the tool column: {broken}"


def test_the_dashboard_shows_every_column_of_its_tables_on_a_laptop(page_for, app):
    """The per-day table sat beside its charts in half the page and lost its last columns at 1400 px."""
    from sqlalchemy import select

    from webapp import audit_chain
    from webapp.models import Tenant
    from webapp.runtime.extensions import db

    usage = {
        "model": "claude-sonnet-5",
        "input_tokens": 123_456_789,
        "output_tokens": 12_345_678,
        "cache_creation_input_tokens": 23_456_789,
        "cache_read_input_tokens": 345_678_901,
        "latency_ms": 10.0,
        "request_id": "req_wide",
    }
    with app.app_context():
        acme = db.session.scalar(select(Tenant.id).where(Tenant.slug == "acme"))
        audit_chain.record(db.session, "model_call", tenant_id=acme, outcome="end_turn", data=usage)
        db.session.commit()
        db.session.remove()
    auditor = page_for("auditor@acme.test", viewport=LAPTOP)
    auditor.goto("/audit/dashboard")
    expect(auditor.locator("#usage-days tbody tr")).to_have_count(1)
    # the input tokens' total: ours and the day's other calls (the audit log outlives each test)
    expect(auditor.locator("#usage-days tfoot td").nth(1)).to_have_text(re.compile(r"^12\d,\d{3},\d{3}$"))
    cut = auditor.locator("table.audit-numbers").evaluate_all(
        """tables => tables.filter(table => {
             const box = table.parentElement.getBoundingClientRect();
             return table.getBoundingClientRect().right > box.right + 1
               || table.parentElement.scrollWidth > table.parentElement.clientWidth + 1;
           }).map(table => table.id || table.querySelector('th').textContent)"""
    )
    assert cut == [], f"tables cut at the right on a {LAPTOP['width']} px screen: {cut}"
    assert auditor.evaluate("document.documentElement.scrollWidth") <= LAPTOP["width"]
