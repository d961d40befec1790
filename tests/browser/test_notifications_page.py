"""The notifications admin page in a real browser: a refused address keeps what was typed and says
why, the webhook's secret is shown once, and a test message reaches a local receiver signed with it."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.notify.test_notifications import Receiver


@pytest.fixture
def hook():
    with Receiver() as receiver:
        yield receiver


@pytest.fixture
def env(env, hook) -> dict[str, str]:
    """The receiver's port is the one private address the live server may call (OUTBOUND_ALLOW)."""
    return {**env, "OUTBOUND_ALLOW": f"127.0.0.1:{hook.port}"}


def test_an_admin_sets_up_a_webhook_sees_its_secret_once_and_sends_a_signed_test(page_for, console, hook):
    page = page_for("admin@acme.test")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Notifications").click()
    expect(page.get_by_role("heading", name="Notifications", exact=True)).to_be_visible()
    address = page.get_by_label("Webhook address")
    address.fill("hooks.example.com/desk")
    page.get_by_role("button", name="Set up the webhook").click()
    expect(page.get_by_text("The webhook's address must start with https://")).to_be_visible()
    expect(page.get_by_label("Webhook address")).to_have_value("hooks.example.com/desk")  # kept
    page.get_by_label("Webhook address").fill(hook.url)
    page.get_by_role("button", name="Set up the webhook").click()
    shown = page.locator("#new-secret-value")
    expect(shown).to_have_text(re.compile(r"^whsec_"))
    hook.secret = shown.inner_text()
    page.get_by_role("button", name="Send a test").first.click()
    expect(page.get_by_text("The test webhook was delivered (HTTP 200).")).to_be_visible()
    expect(page.locator("#new-secret")).to_have_count(0)  # shown that once only
    assert len(hook.requests) == 1 and hook.requests[0]["signed"]
    expect(page.locator("#deliveries")).to_contain_text("Delivered (HTTP 200)")
    # Chromium logs the page's own 422 (the answer to the refused address, on purpose), and nothing else.
    assert all("status of 422" in error for error in console.errors()), console.errors()
