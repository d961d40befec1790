"""The JSON API's contract: shapes, status codes, and a clear answer for every bad input."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from webapp.models import Conversation, Message
from webapp.runtime.services import services

AGENT = "agent@acme.test"


def test_creating_a_conversation_answers_201_and_enqueues_its_first_move(api, read):
    response = api.as_(AGENT).post("/api/conversations", json={"message": "Show invoices for customer 4471"})
    assert response.status_code == 201
    assert response.json == {"id": response.json["id"], "status": "queued"}
    assert services().dispatcher.people_queue.job_ids == [f"move-{response.json['id']}-v1"]  # a person's act
    shown = api.as_(AGENT).get(f"/api/conversations/{response.json['id']}").json
    assert shown["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Show invoices for customer 4471"}]}
    ]
    assert shown["tool_calls"] == [] and shown["usage"]["input_tokens"] == 0
    assert set(shown) >= {"id", "status", "messages", "tool_calls", "usage"}


def test_a_message_while_the_assistant_works_gets_409_and_changes_nothing(api, read):
    created = api.as_(AGENT).post("/api/conversations", json={"message": "hello"}).json
    response = api.as_(AGENT).post(f"/api/conversations/{created['id']}/messages", json={"message": "again"})
    assert response.status_code == 409
    assert response.json["error"] == "conversation_busy" and "still working" in response.json["message"]
    assert read(lambda s: s.scalar(select(func.count(Message.id)))) == 1


@pytest.mark.parametrize(
    ("body", "content_type", "status", "code"),
    [
        (b"{not json", "application/json", 400, "invalid_json"),
        (b"[1, 2]", "application/json", 400, "invalid_json"),
        (b"message=hi", "application/x-www-form-urlencoded", 400, "invalid_json"),
        (b"{}", "application/json", 422, "invalid_field"),
        (b'{"message": 42}', "application/json", 422, "invalid_field"),
        (b'{"message": "   "}', "application/json", 422, "invalid_field"),
        (b'{"message": "' + b"x" * 20_001 + b'"}', "application/json", 422, "invalid_field"),
        (b'{"message": "' + b"x" * 70_000 + b'"}', "application/json", 413, "too_large"),
    ],
)
def test_bad_bodies_get_a_clear_4xx_and_create_nothing(api, read, body, content_type, status, code):
    response = api.as_(AGENT).post("/api/conversations", data=body, content_type=content_type)
    assert response.status_code == status
    assert response.json["error"] == code and response.json["message"]
    assert read(lambda s: s.scalar(select(func.count(Conversation.id)))) == 0


def test_requests_without_a_valid_token_get_401(api):
    client = api.client
    for headers in (
        {},
        {"Authorization": "Bearer nope"},
        {"Authorization": "Basic abc"},
        {"Authorization": "Bearer " + "x" * 500},
    ):
        response = client.post("/api/conversations", json={"message": "hi"}, headers=headers)
        assert response.status_code == 401
        assert response.json["error"] == "unauthorized"


def test_a_disabled_users_token_stops_working_at_once(api, app):
    from webapp.models import User
    from webapp.runtime.extensions import db

    token_user = api.as_(AGENT)
    assert token_user.get("/api/approvals").status_code == 403  # valid token, wrong role
    db.session.execute(User.__table__.update().where(User.email == AGENT).values(active=False))
    db.session.commit()
    assert token_user.get("/api/conversations/1").status_code == 401
    db.session.execute(User.__table__.update().where(User.email == AGENT).values(active=True))
    db.session.commit()


def test_unknown_ids_and_other_tenants_conversations_are_404_without_a_leak(api):
    created = api.as_(AGENT).post("/api/conversations", json={"message": "hi"}).json
    for email in ("agent@globex.test",):
        response = api.as_(email).get(f"/api/conversations/{created['id']}")
        assert response.status_code == 404 and response.json["error"] == "not_found"
    assert api.as_(AGENT).get("/api/conversations/999999").status_code == 404
    assert api.as_(AGENT).get("/api/conversations/abc").status_code == 404
    assert api.as_(AGENT).get("/api/nowhere").json["error"] == "not_found"
    assert api.as_(AGENT).delete("/api/conversations").status_code == 405


def test_cancel_and_retry_say_when_there_is_nothing_to_do(api, app):
    from webapp.runtime.extensions import db

    created = api.as_(AGENT).post("/api/conversations", json={"message": "hi"}).json
    assert api.as_(AGENT).post(f"/api/conversations/{created['id']}/retry").status_code == 409
    db.session.execute(Conversation.__table__.update().values(status="completed"))
    db.session.commit()
    response = api.as_(AGENT).post(f"/api/conversations/{created['id']}/cancel")
    assert response.status_code == 409 and response.json["error"] == "not_running"


def test_budget_extension_validates_its_input(api):
    created = api.as_(AGENT).post("/api/conversations", json={"message": "hi"}).json
    url = f"/api/conversations/{created['id']}/budget"
    for moves in (0, -1, "5", 1.5, True, 10_000):
        response = api.as_("reviewer@acme.test").post(url, json={"moves": moves})
        assert response.status_code == 422, moves
    assert api.as_("reviewer@acme.test").post(url, json={"moves": 5}).status_code == 409  # not exhausted


def test_decision_requests_are_validated_before_anything_changes(api):
    reviewer = api.as_("reviewer@acme.test")
    assert reviewer.post("/api/approvals/1", json={"decision": "maybe"}).status_code == 422
    assert reviewer.post("/api/approvals/999", json={"decision": "approve"}).status_code == 404
    assert api.as_(AGENT).post("/api/approvals/1", json={"decision": "approve"}).status_code == 403
    assert reviewer.get("/api/approvals").json == {"approvals": [], "next_cursor": None}


def test_healthz_reports_the_database_redis_and_workers(api):
    response = api.client.get("/healthz")
    assert response.status_code == 200
    assert response.json["database"] == "ok" and response.json["redis"] == "ok"
    assert response.json["workers"] == 0 and response.json["status"] == "ok"
