"""Lists page with one keyset cursor: every row once, in order, however the rows tie, and a cursor
edited by hand gets a sentence, not an error page."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

from sqlalchemy import select, update

from tests.clients import session_as
from tests.model_server import Reply
from tests.replies import reply, tool_use
from webapp.models import Conversation, Tenant, ToolCall, User, utcnow
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.web.pagination import BadCursor, decode_cursor, encode_cursor

OLDER = re.compile(r'<a href="([^"]+)">Older conversations</a>')
MORE = re.compile(r'<a href="([^"]+)">More</a>')


def walk(client, url: str, link: re.Pattern, row: re.Pattern) -> list[int]:
    """The ids of the rows of every page, following the page's next link to the end."""
    seen: list[int] = []
    while url:
        page = client.get(url)
        assert page.status_code == 200, url
        html = page.get_data(as_text=True)
        seen += [int(found) for found in row.findall(html)]
        following = link.search(html)
        url = unescape(following.group(1)) if following else None
    return seen


def test_the_conversation_list_pages_through_every_conversation_once_newest_first(app):
    acme = db.session.scalar(select(Tenant).where(Tenant.slug == "acme"))
    agent = db.session.scalar(select(User).where(User.email == "agent@acme.test"))
    moment = utcnow()
    rows = [
        # every third one shares its timestamp with the next two: the id breaks the tie
        Conversation(tenant_id=acme.id, user_id=agent.id, title=f"talk {n}", updated_at=moment - timedelta(n // 3))
        for n in range(60)
    ]
    db.session.add_all(rows)
    db.session.commit()
    expected = [c.id for c in sorted(rows, key=lambda c: (c.updated_at, c.id), reverse=True)]
    db.session.remove()

    seen = walk(session_as(app, "agent@acme.test"), "/conversations", OLDER, re.compile(r'id="conversation-row-(\d+)"'))
    assert seen == expected  # 25 + 25 + 10, no row twice, none skipped


def test_a_search_pages_too_and_matches_percent_and_underscore_literally(app):
    acme = db.session.scalar(select(Tenant).where(Tenant.slug == "acme"))
    agent = db.session.scalar(select(User).where(User.email == "agent@acme.test"))
    db.session.add_all(
        [Conversation(tenant_id=acme.id, user_id=agent.id, title=f"refund 100% of #{n}") for n in range(30)]
        + [Conversation(tenant_id=acme.id, user_id=agent.id, title="refund 1000 of #x")]
    )
    db.session.commit()
    db.session.remove()
    client = session_as(app, "agent@acme.test")
    seen = walk(client, "/conversations?q=100%25", OLDER, re.compile(r'id="conversation-row-(\d+)"'))
    assert len(seen) == len(set(seen)) == 30  # "100%" is text, not a pattern: "1000" is not found
    assert "No conversation matches" in client.get("/conversations?q=_efund").get_data(as_text=True)


def test_a_cursor_edited_by_hand_is_a_sentence_not_an_error(app):
    client = session_as(app, "agent@acme.test")
    for cursor in ("not-a-cursor", encode_cursor([1]), encode_cursor(["yesterday", 5]), "W1tdXQ", "%%%"):
        page = client.get("/conversations", query_string={"cursor": cursor})
        assert page.status_code == 200, cursor
        assert "This page link is not valid any more; go back to the first page." in page.get_data(as_text=True)
    reviewer = session_as(app, "reviewer@acme.test")
    page = reviewer.get("/approvals", query_string={"cursor": "not-a-cursor"})
    assert page.status_code == 200 and "This page link is not valid any more" in page.get_data(as_text=True)


def test_cursors_carry_their_keys_types_and_refuse_naive_timestamps():
    keys = (Conversation.updated_at, Conversation.id)
    moment = utcnow()
    assert decode_cursor(encode_cursor([moment, 7]), keys) == (moment, 7)
    for values in ([moment.replace(tzinfo=None), 7], [moment, "7"], [moment, True], [moment]):
        try:
            decode_cursor(encode_cursor(values), keys)
        except BadCursor:
            continue
        raise AssertionError(f"{values} decoded")


def test_the_inbox_pages_oldest_first_through_calls_created_in_the_same_instant(app, api, model):
    refunds = [
        tool_use("issue_refund", {"invoice_id": 4471, "amount_cents": 6000 + n, "reason": "late"}) for n in range(55)
    ]
    model.enqueue(Reply.message(reply(*refunds)), match="many refunds")
    created = api.as_("agent@acme.test").post("/api/conversations", json={"message": "many refunds"}).json
    services().loop(db.session, db.session.get(Conversation, created["id"])).complete()
    calls = list(db.session.scalars(select(ToolCall).where(ToolCall.conversation_id == created["id"])))
    assert len(calls) == 55 and all(call.status == "awaiting_approval" for call in calls)
    same = utcnow() - timedelta(minutes=5)  # half of them tie on created_at: the id orders them
    db.session.execute(update(ToolCall).where(ToolCall.id.in_([c.id for c in calls[::2]])).values(created_at=same))
    db.session.commit()
    expected = [c.id for c in sorted(db.session.scalars(select(ToolCall)), key=lambda c: (c.created_at, c.id))]
    db.session.remove()

    seen = walk(session_as(app, "reviewer@acme.test"), "/approvals", MORE, re.compile(r'id="approval-(\d+)"'))
    assert seen == expected  # 50 on the first page, 5 on the second
