"""A long chat through the API and a real worker against an endpoint with a 12,000-token window: every
turn is answered, and the chat page shows where the older turns were summarised, the summary a click
away."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from tests.clients import session_as
from tests.integration.test_workers import AGENT, start, wait_status
from webapp.models import Summary

pytestmark = pytest.mark.slow

FACT = "The caller is Ada Lovelace, reference ZX-4471-Q, charged $129.00 twice."


def test_a_long_chat_is_summarised_and_the_chat_page_shows_where(app, api, workers, model, read):
    model.context_tokens = 12_000
    workers(CONTEXT_WINDOW_TOKENS="12000")
    conversation_id = start(api, FACT)
    wait_status(api, conversation_id, "completed")
    for turn in range(6):
        question = "Explain refunds in detail [[long answer]]" if turn % 2 == 0 else "Show invoices for customer 4471"
        sent = api.as_(AGENT).post(f"/api/conversations/{conversation_id}/messages", json={"message": question})
        assert sent.status_code == 202, sent.json
        state = wait_status(api, conversation_id, "completed", "failed")
        assert state["status"] == "completed", state

    summaries = select(func.count()).select_from(Summary).where(Summary.conversation_id == conversation_id)
    assert read(lambda s: s.scalar(summaries)) >= 1
    page = session_as(app, AGENT).get(f"/conversations/{conversation_id}").get_data(as_text=True)
    marker = page.index("The turns above were summarised")
    assert page.index(FACT) < marker  # the person's first words are still on the page, above the marker
    details = page[marker : page.index("</details>", marker)]
    assert "ZX-4471-Q" in details and "Ada Lovelace" in details  # the summary kept what the person said
    assert "<conversation_to_summarise>" not in page  # the words for the model stay out of the page
