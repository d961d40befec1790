"""Tasks on the chat page, in a real browser: the support agent on a call types the code the
customer reads out, sees a wrong one counted, and the conversation carries on after the right one;
an export's card shows its progress bar while it runs."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from playwright.sync_api import expect
from sqlalchemy import select

from demo.billing.models import OutgoingEmail
from tests.browser.test_live_pages import ask

pytestmark = pytest.mark.slow


def test_the_agent_types_the_identity_code_on_the_chat_page(page_for, workers, read):
    workers()
    agent = page_for("agent@acme.test")
    ask(agent, "Verify customer 4471 please, they are on the phone")
    card = agent.locator(".tool-call").first
    expect(card).to_contain_text("Waiting for input.")
    expect(agent.locator("#conversation-status")).to_have_text("waiting on a task")
    code_box = agent.get_by_label("The 6-digit code the customer received by email")
    expect(code_box).to_be_visible()

    email = read(lambda s: s.scalar(select(OutgoingEmail).where(OutgoingEmail.idempotency_key.like("%-verify"))))
    code = re.search(r"code is (\d{6})", email.body).group(1)
    code_box.fill("000000" if code != "000000" else "111111")
    card.get_by_role("button", name="Send").click()
    expect(card).to_contain_text("Wrong code, 2 tries left.")

    agent.get_by_label("The 6-digit code the customer received by email").fill(code)
    agent.locator(".tool-call").first.get_by_role("button", name="Send").click()
    expect(agent.locator("#conversation-status")).to_have_text("completed")
    expect(agent.locator(".turn.assistant").last).to_contain_text("verified as customer 4471")
    expect(agent.locator(".tool-call").first).to_contain_text("completed")


def test_an_exports_card_shows_its_progress_live(page_for, workers):
    workers(EXPORT_STEP_SECONDS="1.5")
    workers(EXPORT_STEP_SECONDS="1.5")
    agent = page_for("agent@acme.test")
    ask(agent, "Export customer 4471's data")
    card = agent.locator(".tool-call").first
    expect(card).to_contain_text("Working in the background")
    expect(card.locator("progress")).to_be_visible()
    expect(card).to_contain_text(re.compile(r"Exported \w+ \(\d of 3\)"), timeout=20_000)  # live, no reload
    expect(agent.locator(".turn.assistant").last).to_contain_text("exported to customer-4471-export-", timeout=20_000)
    # (that text may still be streaming while the card shows the last poll; the settled page shows it full)
    expect(agent.locator("#conversation-status")).to_have_text("completed")
    expect(card.locator("progress")).to_have_attribute("value", "1.0")


# What the page shows on the first task card, every change as the person watching saw it (sampled
# every 50 ms), and every swap the live stream made into a task's card (htmx's sse extension fires
# htmx:sseMessage on the element it swapped into).
RECORD_CARD = """{
  window.cardStates = [];
  window.liveSwaps = [];
  setInterval(() => {
    const card = document.querySelector(".tool-call .task");
    if (!card) return;
    const bar = card.querySelector("progress");
    const state = {text: card.querySelector(".task-text")?.textContent.trim(), value: bar ? bar.value : null};
    const last = window.cardStates[window.cardStates.length - 1];
    if (!last || last.text !== state.text || last.value !== state.value) window.cardStates.push(state);
  }, 50);
  document.addEventListener("htmx:sseMessage", (event) => {
    if (event.detail.type.startsWith("task-")) window.liveSwaps.push(event.target.textContent.trim());
  });
}"""


def test_an_exports_progress_reaches_its_card_live_and_the_finished_file_downloads(page_for, workers):
    # Before, the card jumped from "queued" straight to "completed".
    workers(EXPORT_STEP_SECONDS="1.5")
    agent = page_for("agent@acme.test")
    agent.add_init_script(RECORD_CARD)  # on every page from here, so no change goes unseen
    ask(agent, "Export customer 4471's data")
    card = agent.locator(".tool-call").first
    expect(card).to_contain_text("Working in the background")

    # A part shows while the export works, its bar part-way (which part: whichever the card was drawn
    # in time for; a part lasts 1.5 s, and on a loaded machine a poll of the page can miss one).
    agent.wait_for_function(
        # (a function, compiled once by the driver: an expression is eval'd in the page at each poll,
        # which the page's CSP refuses once a first look fails on a loaded machine)
        "() => window.cardStates.some(s => /\\(\\d of 3\\)\\.$/.test(s.text || '') && s.value > 0 && s.value < 1)",
        timeout=20_000,
    )
    expect(agent.locator("#conversation-status")).to_have_text("completed", timeout=30_000)
    states = agent.evaluate("window.cardStates")
    # Each part shows on the card as it happens, in order, to a full bar. (The first part may go by
    # before the card is drawn; a part may also come with a redraw of the conversation, as the worker
    # looks at the task between parts, and a part landing during a redraw may show only with the next.)
    steps = ["Exported invoices (2 of 3).", "Exported refunds (3 of 3).", "Export file written."]
    shown = list(dict.fromkeys(state["text"] for state in states if state["text"] in steps))  # first showings
    assert shown == sorted(shown, key=steps.index) and len(shown) >= 2, states
    values = list(dict.fromkeys(state["value"] for state in states if state["value"] is not None))
    assert values == sorted(values) and values[-1] == 1, states
    assert agent.evaluate("window.liveSwaps"), "no part came over the live stream"

    # Finished: the bar is drawn full across the card, and the file downloads from the card.
    card = agent.locator(".tool-call").first
    bar = card.locator("progress")
    expect(bar).to_have_attribute("value", "1.0")
    assert bar.bounding_box()["width"] > 0.8 * card.locator(".task").bounding_box()["width"]
    link = card.get_by_role("link", name=re.compile(r"Download customer-4471-export-\d+\.json"))
    with agent.expect_download() as download_info:
        link.click()
    download = download_info.value
    assert re.fullmatch(r"customer-4471-export-\d+\.json", download.suggested_filename)
    exported = json.loads(Path(download.path()).read_text())
    assert exported["profile"]["id"] == 4471 and exported["invoices"]


def test_stop_reads_stopping_at_once_and_the_card_settles_when_the_stop_lands(page_for, workers):
    workers(EXPORT_STEP_SECONDS="3")
    agent = page_for("agent@acme.test")
    ask(agent, "Export customer 4471's data")
    card = agent.locator(".tool-call").first
    expect(card.locator(".task-text")).to_have_text("Exported profile (1 of 3).", timeout=20_000)
    # The worker is busy with the export: the stop itself lands only when the job looks between parts.
    agent.route("**/cancel", lambda route: (time.sleep(4), route.continue_()))  # a slow answer, to see the click
    stop = agent.get_by_role("button", name=re.compile("Stop"))
    stop.click()
    expect(stop).to_have_text("Stopping…", use_inner_text=True, timeout=2_500)  # from the click, before any answer
    expect(stop).to_be_disabled(timeout=2_500)
    expect(agent.locator("#conversation-status")).to_have_text("stopping…")
    expect(agent.locator("#conversation-status")).to_have_text("stopped", timeout=30_000)
    expect(card).to_contain_text("Cancelled: the conversation was stopped.")
    expect(agent.get_by_role("button", name=re.compile("Stop"))).to_have_count(0)
