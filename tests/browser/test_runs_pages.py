"""A run by batch as people work it, in a real browser: an agent uploads a file of refunds, its page
follows the run, and a reviewer decides its calls together from the inbox, the ticks surviving the
list's live refresh."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.slow

REFUNDS = b"message\n" + b"".join(
    b"Please refund $60 on invoice %d, the delivery was late\n" % invoice for invoice in (4471, 4401, 4402)
)
REFRESH_LIST = (
    "document.getElementById('approval-list').dataset.before = 'yes';"
    " htmx.ajax('GET', location.pathname + location.search, {target: '#approval-list', swap: 'outerHTML'})"
)


def test_an_agents_run_by_batch_is_decided_together_and_the_ticks_survive_a_live_refresh(page_for, workers):
    workers(BATCH_POLL_SECONDS="0.5")
    agent = page_for("agent@acme.test")
    agent.goto("/runs")
    agent.locator("#run-file").set_input_files({"name": "refunds.csv", "mimeType": "text/csv", "buffer": REFUNDS})
    expect(agent.get_by_label("By batch: half the price, answers within hours")).to_be_checked()
    agent.get_by_role("button", name="Start run").click()
    expect(agent).to_have_url(re.compile(r"/runs/\d+$"))
    run_id = agent.url.rsplit("/", 1)[1]
    expect(agent.locator("#run-count-awaiting_approval strong")).to_have_text("3", timeout=60_000)

    reviewer = page_for("reviewer@acme.test")
    reviewer.goto(f"/runs/{run_id}")
    reviewer.locator("#run-inbox").click()
    expect(reviewer).to_have_url(re.compile(rf"/approvals\?run={run_id}&group=1$"))
    expect(reviewer.locator("tr.group")).to_contain_text("issue_refund · policy v0")
    expect(reviewer.locator("tr.group")).to_contain_text("3 calls")
    reviewer.wait_for_load_state("load")  # picks.js has run
    reviewer.get_by_label("Amount from ($)").fill("10")  # a filter changed in place: the address follows
    reviewer.get_by_label("Amount from ($)").press("Tab")
    expect(reviewer).to_have_url(re.compile(r"min_amount=10"))
    boxes = reviewer.locator('input[name="call"]')
    expect(reviewer.locator("#bulk-form")).to_be_hidden()  # until a call is ticked
    boxes.nth(0).check()
    expect(reviewer.get_by_role("button", name="Approve selected")).to_be_visible()
    boxes.nth(2).check()
    expect(reviewer.locator("#bulk-count")).to_have_text("2 calls selected.")

    reviewer.evaluate(REFRESH_LIST)  # as a decision elsewhere would refresh it
    expect(reviewer.locator("#approval-list[data-before]")).to_have_count(0)  # swapped for a new list
    expect(boxes.nth(0)).to_be_checked()
    expect(boxes.nth(1)).not_to_be_checked()
    expect(boxes.nth(2)).to_be_checked()

    reviewer.locator("input[data-select-group]").check()  # the whole group
    expect(reviewer.locator("#bulk-count")).to_have_text("3 calls selected.")
    boxes.nth(1).uncheck()
    reviewer.get_by_role("button", name="Approve selected").click()
    expect(reviewer.locator(".flash").first).to_contain_text("You approved 2 calls.")
    expect(reviewer).to_have_url(re.compile(rf"/approvals\?.*min_amount=10.*run={run_id}"))  # as it was filtered
    expect(reviewer.locator('input[name="call"]')).to_have_count(1)

    # the approved refunds run, and their conversations answer by batch; the third still waits
    expect(agent.locator("#run-count-completed strong")).to_have_text("2", timeout=60_000)
    expect(agent.locator("#run-count-awaiting_approval strong")).to_have_text("1")
