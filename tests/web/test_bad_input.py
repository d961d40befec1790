"""Input nobody meant to send (JSON nested thousands deep, a lone surrogate, an id past what a
database column holds, nan, the year 9999) gets a sentence saying what to fix, or a 404, and the page
keeps what the person typed: never an error page."""

from __future__ import annotations

import html

import pytest

from tests.clients import session_as
from webapp.runtime.extensions import db
from webapp.web.pagination import encode_cursor

AGENT, REVIEWER, AUDITOR = "agent@acme.test", "reviewer@acme.test", "auditor@acme.test"
HUGE = 2**63  # one past the largest BIGINT (and SQLite's integers)
BIG = 2**31  # one past the largest INTEGER, the type of every id column but the audit log's
DEEP = "[" * 5_000 + "]" * 5_000  # small enough for the body limit, deeper than the JSON parser goes
SURROGATE = '{"message": "Refund order 4471 \\ud800 please"}'  # JSON's escape for half a UTF-16 pair
JSON = "application/json"

API_CASES = [
    # (who, method, url, body, status, what the answer's message says)
    (AGENT, "post", "/api/conversations", DEEP, 400, "nested too deeply"),
    (REVIEWER, "post", "/api/approvals/1", '{"decision": ' * 3000, 400, "nested too deeply"),
    (AGENT, "post", "/api/conversations", SURROGATE, 422, "lone surrogate"),
    (AGENT, "post", "/api/conversations/1/messages", SURROGATE, 422, "lone surrogate"),
    (AUDITOR, "get", f"/api/conversations/{HUGE}", None, 404, "no such page"),
    (AUDITOR, "get", f"/api/conversations/{2**70}", None, 404, "no such page"),
    (AUDITOR, "get", f"/api/conversations/{BIG}", None, 404, "no such page"),
    (REVIEWER, "get", f"/api/approvals/{HUGE}", None, 404, "no such page"),
    (REVIEWER, "post", f"/api/approvals/{HUGE}", '{"decision": "approve"}', 404, "no such page"),
    (AGENT, "post", f"/api/tool-calls/{HUGE}/input", '{"input": "x"}', 404, "no such page"),
    (AUDITOR, "get", f"/api/audit?cursor={encode_cursor([HUGE])}", None, 422, "next_cursor of an earlier answer"),
    (AUDITOR, "get", "/api/audit?to=9999-12-31", None, 422, "“To” must be a date from 1970-01-01 to 2999-12-31"),
    (AUDITOR, "get", "/api/audit?from=0001-01-01", None, 422, "“From” must be a date from 1970-01-01"),
    (AUDITOR, "get", f"/api/audit?person={HUGE}", None, 200, None),  # no one has that id: no events
    (AUDITOR, "get", f"/api/audit?person={BIG}", None, 200, None),
    (AUDITOR, "get", f"/api/audit?conversation={BIG}", None, 422, "The conversation is a number"),
]


@pytest.mark.parametrize("who, method, url, sent, status, says", API_CASES)
def test_the_api_answers_odd_input_with_what_to_fix(api, who, method, url, sent, status, says):
    kwargs = {} if sent is None else {"data": sent, "content_type": JSON}
    answer = getattr(api.as_(who), method)(url, **kwargs)
    assert answer.status_code == status, answer.text
    if says is None:
        assert answer.json["events"] == []
    else:
        assert says in answer.json["message"] or any(says in f["problem"] for f in answer.json.get("fields", []))


PAGE_CASES = [
    # (who, url, status, a sentence on the page, what the person typed, kept on the page)
    (AGENT, f"/conversations/{HUGE}", 404, "", None),
    (REVIEWER, f"/approvals/{HUGE}", 404, "", None),
    (REVIEWER, f"/approvals/{HUGE}/panel", 404, "", None),
    (AUDITOR, f"/audit/conversations/{HUGE}", 404, "", None),
    (AGENT, f"/live/conversations/{HUGE}", 404, "", None),
    (AGENT, f"/conversations/{BIG}", 404, "", None),
    (REVIEWER, f"/approvals/{BIG}", 404, "", None),
    (AGENT, f"/conversations?cursor={encode_cursor(['2026-01-01T00:00:00+00:00', BIG])}", 200, "page link", None),
    (REVIEWER, f"/approvals?cursor={encode_cursor(['2026-01-01T00:00:00+00:00', BIG])}", 200, "page link", None),
    (AUDITOR, f"/audit?conversation={BIG}", 422, "The conversation is a number", str(BIG)),
    (AGENT, f"/conversations?cursor={encode_cursor(['2026-01-01T00:00:00+00:00', HUGE])}", 200, "page link", None),
    (REVIEWER, "/approvals?min_amount=nan", 200, "Amount from ($) must be a positive number", "nan"),
    (REVIEWER, "/approvals?min_amount=inf", 200, "Amount from ($) must be a positive number", "inf"),
    (REVIEWER, "/approvals?max_amount=-inf", 200, "Amount up to ($) must be a positive number", "-inf"),
    (REVIEWER, "/approvals?min_age=NaN", 200, "Older than (minutes) must be a positive number", "NaN"),
    (AUDITOR, "/audit?to=9999-12-31", 422, "“To” must be a date from 1970-01-01 to 2999-12-31", "9999-12-31"),
    (AUDITOR, "/audit?from=0001-01-01", 422, "“From” must be a date from 1970-01-01", "0001-01-01"),
    (AUDITOR, f"/audit?person={HUGE}", 200, "No event matches these filters.", str(HUGE)),
    (AUDITOR, f"/audit?person={BIG}", 200, "No event matches these filters.", str(BIG)),
    (AUDITOR, "/audit/export.csv?to=9999-12-31", 422, "“To” must be a date from 1970-01-01", "9999-12-31"),
    (AUDITOR, "/audit/dashboard?to=9999-12-31", 200, "“To” must be a date from 1970-01-01", None),
    (AUDITOR, "/audit/dashboard?from=0001-01-01", 200, "“From” must be a date from 1970-01-01", None),
]


@pytest.mark.parametrize("who, url, status, says, typed", PAGE_CASES)
def test_pages_answer_odd_input_with_what_to_fix_and_keep_what_was_typed(app, who, url, status, says, typed):
    answer = session_as(app, who).get(url)
    db.session.remove()
    page = html.unescape(answer.get_data(as_text=True))
    assert answer.status_code == status, page[:2000]
    assert says in page
    if typed is not None:
        assert f'value="{typed}"' in page


def test_a_message_that_is_not_valid_utf8_from_the_chat_form_is_no_error(app):
    """A browser sends a lone surrogate typed into the box as U+FFFD; bytes that are not UTF-8 at
    all (here the lone surrogate's would-be bytes) are kept as they came, and the message goes in."""
    client = session_as(app, AGENT)
    page = client.get("/conversations").get_data(as_text=True)
    token = page.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
    answer = client.post(
        "/conversations",
        data=f"csrf_token={token}&message=Refund+order+4471+%ED%A0%80+please",
        content_type="application/x-www-form-urlencoded",
    )
    db.session.remove()
    assert answer.status_code == 303, answer.get_data(as_text=True)[:2000]
    shown = html.unescape(client.get(answer.headers["Location"]).get_data(as_text=True))
    db.session.remove()
    assert "Refund order 4471 " in shown and " please" in shown
