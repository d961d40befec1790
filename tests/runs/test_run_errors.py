"""A bulk run refused says which item and what of it: the API names each bad item's field
("items[3].message"), the Runs page the line of the file, and nothing of the run is kept."""

from __future__ import annotations

from html import unescape

from sqlalchemy import func, select

from tests.clients import session_as
from tests.runs.test_run_pages import upload
from webapp.models import Run
from webapp.runtime.extensions import db

AGENT = "agent@acme.test"


def runs_kept() -> int:
    count = db.session.scalar(select(func.count(Run.id)))
    db.session.remove()
    return count


def test_the_api_names_each_bad_items_field(api):
    items = [{"message": "Show invoices for customer 4471"}] * 3 + [{"message": "   "}, {"message": "x" * 20_001}]
    refused = api.as_(AGENT).post("/api/runs", json={"items": items})
    assert refused.status_code == 422, refused.json
    assert [problem["field"] for problem in refused.json["fields"]] == ["items[3].message", "items[4].message"]
    assert refused.json["message"].startswith('"items[3].message" must be a non-empty string of at most 20,000')
    assert "Write a message first." in refused.json["message"]
    odd = api.as_(AGENT).post("/api/runs", json={"items": [{"message": "hi"}, {"message": "hi", "colour": "red"}]})
    assert odd.status_code == 422 and [p["field"] for p in odd.json["fields"]] == ["items[1].colour"]
    raw = '{"items": [{"message": "hi"}, {"message": "hi \\ud800"}]}'
    surrogate = api.as_(AGENT).post("/api/runs", data=raw, content_type="application/json")
    assert surrogate.status_code == 422 and [p["field"] for p in surrogate.json["fields"]] == ["items[1].message"]
    assert runs_kept() == 0


def test_the_runs_page_names_the_line_of_the_file(app, model):
    agent = session_as(app, AGENT)
    lines = [
        '{"message": "Show invoices for customer 4471"}',
        "",
        '{"message": "Show invoices for customer 4401"}',
        '{"message": "   "}',
        '{"message": "Refund order \\ud800 please"}',  # half of a UTF-16 pair, escaped as JSON allows
    ]
    refused = upload(agent, "\n".join(lines).encode(), "items.jsonl", title="Q3")
    assert refused.status_code == 422
    page = unescape(refused.get_data(as_text=True))
    assert "Some items cannot run: line 4: Write a message first.; line 5: The message holds text that is not " in page
    assert "valid Unicode (a lone surrogate)." in page and 'value="Q3"' in page
    assert "item 3" not in page

    long = "x" * 20_001
    csv = f'message\n"Show invoices\nfor customer 4471"\n\n{long}\n'.encode()  # a message across two lines
    refused = upload(agent, csv, "incident.csv")
    assert refused.status_code == 422
    said = unescape(refused.get_data(as_text=True))
    assert "Some items cannot run: line 5: A message is at most 20,000 characters." in said
    nul = upload(agent, b'{"message": "Refund \\u0000 now"}\n', "items.jsonl")
    assert nul.status_code == 422
    assert "line 1: A message cannot hold the NUL character" in unescape(nul.get_data(as_text=True))
    assert runs_kept() == 0
