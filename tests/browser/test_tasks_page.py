"""Tasks on the chat page, in a real browser: the support agent on a call types the code the
customer reads out, sees a wrong one counted, and the conversation carries on after the right one;
an export's card shows its progress bar while it runs."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect
from sqlalchemy import select

from tests.browser.test_live_pages import ask
from webapp.models import OutgoingEmail

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
