"""Errors keep what was typed, in a real browser: a message past the composer's limit is refused with
the reason beside the box, and the box keeps every character, in view; the same for the first message
of a new conversation."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import LAPTOP
from tests.browser.test_live_pages import ask

pytestmark = pytest.mark.slow

TOO_LONG = ("The customer wrote a very long complaint. " * 600)[:25_000]


def test_a_message_past_the_limit_is_refused_beside_the_composer_and_stays_in_it(page_for, workers, console):
    workers()
    agent = page_for("agent@acme.test")
    ask(agent, "hello")
    expect(agent.locator("#conversation-status")).to_have_text("completed")
    url = agent.url

    box = agent.get_by_label("Your message")
    box.fill(TOO_LONG)
    agent.get_by_role("button", name="Send").click()
    expect(agent.locator("#message-error")).to_have_text("A message is at most 20,000 characters.")
    box = agent.get_by_label("Your message")
    expect(box).to_have_value(TOO_LONG)  # every character kept
    expect(box).to_be_focused()
    expect(box).to_be_in_viewport()  # the page shows the box and its error, it did not jump away
    expect(agent.locator("#message-error")).to_be_in_viewport()
    assert agent.url == url

    box.fill("A shorter question")  # the fixed message goes, and the box empties
    agent.get_by_role("button", name="Send").click()
    expect(agent.locator(".turn.user .text").last).to_have_text("A shorter question")
    expect(agent.locator("#message-error")).to_have_count(0)
    expect(agent.get_by_label("Your message")).to_have_value("")
    assert all("status of 422" in error for error in console.errors()), console.errors()


def test_a_first_message_past_the_limit_stays_in_its_box(page_for, console):
    agent = page_for("agent@acme.test")
    agent.goto("/conversations")
    agent.get_by_label("Ask the assistant").fill(TOO_LONG)
    agent.get_by_role("button", name="Start conversation").click()
    expect(agent.locator("#first-message-error")).to_have_text("A message is at most 20,000 characters.")
    expect(agent.get_by_label("Ask the assistant")).to_have_value(TOO_LONG)
    expect(agent).to_have_url(re.compile(r"/conversations$"))
    assert all("status of 422" in error for error in console.errors()), console.errors()


def test_a_refused_new_user_comes_back_at_the_form_with_the_wrong_field_focused(page_for):
    admin = page_for("admin@acme.test", viewport=LAPTOP)
    admin.goto("/admin/users")
    admin.locator("#new-email").fill("reviewer@acme.test")  # taken
    admin.locator("#new-display-name").fill("Second Reviewer")
    admin.locator("#add-user").get_by_label("reviewer").check()
    admin.locator("#new-password").fill("a long enough password")
    admin.get_by_role("button", name="Add user").click()
    error = admin.locator("#add-user [role=alert]").first
    expect(error).to_be_visible()
    expect(error).to_be_in_viewport()  # not at the top of a long page, below the fold
    expect(admin.locator("#new-email")).to_be_focused()
    expect(admin.locator("#new-email")).to_have_value("reviewer@acme.test")  # what was typed stays
    expect(admin.locator("#new-display-name")).to_have_value("Second Reviewer")
