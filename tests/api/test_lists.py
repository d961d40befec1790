"""The API's lists: conversations and waiting calls, a page at a time with cursors, and a clear 422 for
every filter, cursor or limit that is wrong."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from tests.approvals.test_inbox import refund, waiting_calls
from webapp.models import Conversation, User, utcnow
from webapp.runtime.extensions import db

AGENT = "agent@acme.test"


def all_pages(client, path: str) -> tuple[list[int], int]:
    """Every id of a list, following next_cursor; and how many pages it took."""
    ids, pages, cursor = [], 0, None
    key = path.split("?")[0].rsplit("/", 1)[-1]
    while True:
        joiner = "&" if "?" in path else "?"
        response = client.get(path + (f"{joiner}cursor={cursor}" if cursor else ""))
        assert response.status_code == 200, response.json
        pages += 1
        ids += [row["id"] for row in response.json[key]]
        cursor = response.json["next_cursor"]
        if cursor is None:
            return ids, pages


def test_conversations_list_newest_first_a_page_at_a_time_and_agents_see_their_own(api):
    agent = api.as_(AGENT)
    started = [agent.post("/api/conversations", json={"message": f"question {n}"}).json["id"] for n in range(5)]
    admin = db.session.scalar(select(User).where(User.email == "admin@acme.test"))
    others = Conversation(tenant_id=admin.tenant_id, user_id=admin.id, title="the admin's own", status="completed")
    db.session.add(others)
    db.session.commit()

    first = agent.get("/api/conversations?limit=2").json
    assert [c["id"] for c in first["conversations"]] == started[::-1][:2]
    assert first["conversations"][0] | {"created_at": None, "updated_at": None} == {
        "id": started[-1],
        "title": "question 4",
        "status": "queued",
        "started_by": AGENT,
        "cancel_requested": False,
        "created_at": None,
        "updated_at": None,
    }
    assert all_pages(agent, "/api/conversations?limit=2") == (started[::-1], 3)  # never the admin's
    reviewer = api.as_("reviewer@acme.test")
    assert all_pages(reviewer, "/api/conversations") == ([others.id, *started[::-1]], 1)
    assert all_pages(reviewer, "/api/conversations?status=completed") == ([others.id], 1)
    assert all_pages(reviewer, "/api/conversations?started_by=AGENT@acme.test&limit=4")[0] == started[::-1]
    later = (utcnow() + timedelta(minutes=1)).isoformat()
    assert reviewer.get("/api/conversations", query_string={"since": later}).json == {
        "conversations": [],
        "next_cursor": None,
    }
    today = utcnow().date().isoformat()
    assert len(reviewer.get(f"/api/conversations?since={today}").json["conversations"]) == 6
    assert api.as_("reviewer@globex.test").get("/api/conversations").json["conversations"] == []


@pytest.mark.parametrize(
    ("query", "field", "words"),
    [
        ("status=done", "status", '"queued"'),
        ("limit=0", "limit", "from 1 to 500"),
        ("limit=501", "limit", "from 1 to 500"),
        ("limit=ten", "limit", "from 1 to 500"),
        ("since=yesterday", "since", "2026-12-04T09:30:00Z"),
        ("since=2026-12-04T09:30:00", "since", "2026-12-04T09:30:00Z"),  # no offset: which zone?
        ("cursor=not-one-of-ours", "cursor", "next_cursor"),
        ("page=2", "page", ""),
    ],
)
def test_a_wrong_list_query_is_a_422_naming_the_field(api, query, field, words):
    response = api.as_("reviewer@acme.test").get(f"/api/conversations?{query}")
    assert response.status_code == 422, response.json
    assert response.json["error"] == "invalid_field"
    assert [problem["field"] for problem in response.json["fields"]] == [field]
    assert words in response.json["message"]


def test_waiting_calls_page_with_a_cursor_and_none_is_dropped(api, model):
    calls = waiting_calls(api, model, refund(4471, 9000), refund(4401, 20000), refund(4402, 30000))
    reviewer = api.as_("reviewer@acme.test")
    first = reviewer.get("/api/approvals?limit=2").json
    assert [call["id"] for call in first["approvals"]] == [calls[0].id, calls[1].id]
    assert first["next_cursor"]
    assert all_pages(reviewer, "/api/approvals?limit=2") == ([call.id for call in calls], 2)
    assert reviewer.get("/api/approvals").json["next_cursor"] is None  # 200 a page unless asked
    bad = reviewer.get("/api/approvals?cursor=abc")
    assert bad.status_code == 422 and bad.json["fields"][0]["field"] == "cursor"
    assert reviewer.get("/api/approvals?limit=0").json["fields"][0]["field"] == "limit"
