"""A conversation's events for programs (GET /api/conversations/<id>/events): the webhooks' events of one
conversation as server-sent events, resumable with Last-Event-ID, read here as a program reads them,
a message at a time from the open stream while a reviewer decides."""

from __future__ import annotations

import json

from sqlalchemy import func, select

from tests.approvals.test_inbox import refund, waiting_calls
from tests.model_server import Reply
from tests.replies import reply, text
from webapp.api.events import EVENT_MODELS
from webapp.models import AuditEvent
from webapp.runtime.extensions import db

AGENT, REVIEWER = "agent@acme.test", "reviewer@acme.test"


class Stream:
    """An open event stream, read one SSE message at a time."""

    def __init__(self, app, api, conversation_id: int, email: str = AGENT, last_event_id: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {api.token(email)}"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        self.response = app.test_client().get(
            f"/api/conversations/{conversation_id}/events", headers=headers, buffered=False
        )
        db.session.remove()
        self.chunks = iter(self.response.response)
        self.buffer = ""

    def next_event(self) -> dict:
        """The next message with an event name other than a keepalive: {"id", "event", "data"}."""
        while True:
            while "\n\n" not in self.buffer:
                chunk = next(self.chunks)
                self.buffer += chunk.decode() if isinstance(chunk, bytes) else chunk
            message, self.buffer = self.buffer.split("\n\n", 1)
            fields: dict[str, str] = {}
            for line in message.split("\n"):
                name, _, value = line.partition(": ")
                if name in ("id", "event", "data"):
                    fields[name] = value
            if "event" in fields:
                return {"id": fields.get("id"), "event": fields["event"], "data": json.loads(fields["data"])}

    def close(self) -> None:
        self.response.close()


def test_a_program_follows_a_conversation_live_and_resumes_where_it_was(app, api, model):
    # The audit log outlives each test while conversation ids start again: an earlier test's conversation
    # of the same id has events too, so this stream starts after the last event before this test's.
    before = db.session.scalar(select(func.coalesce(func.max(AuditEvent.id), 0)))
    db.session.remove()
    (call,) = waiting_calls(api, model, refund(4471, 9000))
    stream = Stream(app, api, call.conversation_id, last_event_id=f"evt_{before}")
    try:
        assert stream.response.status_code == 200 and stream.response.mimetype == "text/event-stream"
        requested, waiting = stream.next_event(), stream.next_event()  # what happened before it connected
        assert [requested["event"], waiting["event"]] == ["approval.requested", "conversation.awaiting_approval"]
        assert requested["data"]["data"]["call_id"] == call.id and requested["id"].startswith("evt_")
        for event in (requested, waiting):  # the same bodies as the webhooks', as the document says
            EVENT_MODELS[event["event"]].model_validate(event["data"])

        model.enqueue(Reply.message(reply(text("Refunded $90."))), match="refund")
        decided = api.as_(REVIEWER).post(f"/api/approvals/{call.id}", json={"decision": "approve"})
        assert decided.status_code == 200, decided.json
        live = stream.next_event()  # sent while the stream was open
        assert live["event"] == "approval.decided" and live["data"]["data"]["decided_by"] == REVIEWER
    finally:
        stream.close()

    # a program that lost its connection after the first event gets the rest, and nothing twice
    again = Stream(app, api, call.conversation_id, last_event_id=requested["id"])
    try:
        assert [again.next_event()["id"], again.next_event()["id"]] == [waiting["id"], live["id"]]
    finally:
        again.close()


def test_a_stream_refuses_what_it_cannot_follow_in_words(app, api, model):
    (call,) = waiting_calls(api, model, refund(4471, 9000))
    url = f"/api/conversations/{call.conversation_id}/events"
    bad = app.test_client().get(url, headers={"Authorization": f"Bearer {api.token(AGENT)}", "Last-Event-ID": "x"})
    assert bad.status_code == 422 and "evt_42" in bad.json["message"]
    assert app.test_client().get(url).status_code == 401
    assert api.as_("agent@globex.test").get(url).status_code == 404  # another tenant's is not found
    assert api.as_(AGENT).get("/api/conversations/999999/events").status_code == 404
