"""Event webhooks on real parts: an admin subscribes through the API, the loop and the reviewers act,
and a local HTTP receiver verifies every delivery with the off-the-shelf `standardwebhooks` library
and the secret the API showed once. The jobs run in a real RQ worker (in this process, or a worker
subprocess in the last test); the receiver's port is the only private address the desk may call."""

from __future__ import annotations

import json
import re
from html import unescape

import pytest
from pydantic import ValidationError
from sqlalchemy import func, select
from standardwebhooks import Webhook, WebhookVerificationError

from jobs import moves as move_jobs
from jobs import webhooks as webhook_jobs
from tests.approvals.test_inbox import refund, waiting_calls
from tests.clients import sign_in
from tests.conftest import desk_app, pushed, wait_until
from tests.listeners import HookReceiver, QuietHandler
from tests.model_server import Reply
from tests.notify.test_notifications import make_due
from tests.replies import reply, text
from webapp.api.events import EVENT_MODELS
from webapp.models import AuditEvent, Conversation
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.runtime.webhook_senders import WebhookSenders
from webapp.runtime.worker import PromptWorker
from webapp.webhooks import EVENT_TYPES

ADMIN, REVIEWER, AGENT = "admin@acme.test", "reviewer@acme.test", "agent@acme.test"


class Receiver(HookReceiver):
    """A receiver on a local port that verifies each request as an integrator's would (its signature
    with `standardwebhooks`, its body against the API document's schema of its type), keeps it, and
    answers 503 to the first `fail_first`."""

    def __init__(self) -> None:
        self.secret = ""
        self.fail_first = 0
        self.received: list[dict] = []
        receiver = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                headers = {name: value for name, value in self.headers.items()}
                try:
                    Webhook(receiver.secret).verify(raw, headers)
                    # and the body is what the API document's `webhooks` section says of its type
                    EVENT_MODELS[json.loads(raw)["type"]].model_validate_json(raw)
                    verified = True
                except (WebhookVerificationError, ValidationError):
                    verified = False
                receiver.received.append(
                    {"id": headers.get("webhook-id"), "raw": raw, "body": json.loads(raw), "verified": verified}
                )
                failing = len(receiver.received) <= receiver.fail_first
                self.send_response(503 if failing else 204)
                self.end_headers()

        self.serve(Handler)

    def types(self) -> list[str]:
        return [request["body"]["type"] for request in self.received]


@pytest.fixture
def receiver():
    with Receiver() as made:
        yield made


@pytest.fixture
def app(env, clean, receiver):
    hooks_env = {**env, "OUTBOUND_ALLOW": f"127.0.0.1:{receiver.port}", "WEBHOOK_RETRY_INTERVALS": "0,0"}
    with pushed(desk_app(hooks_env)) as app:
        yield app


def subscribe(api, receiver: Receiver, events=tuple(EVENT_TYPES)) -> dict:
    created = api.as_(ADMIN).post("/api/webhooks", json={"url": receiver.url, "events": list(events)})
    assert created.status_code == 201, created.json
    receiver.secret = created.json["secret"]
    return created.json


def run_jobs() -> None:
    """The queued jobs, in a real RQ worker in this process."""
    dispatcher = services().dispatcher
    PromptWorker(dispatcher.move_queues, connection=dispatcher.redis).work(burst=True)
    db.session.remove()


def test_a_subscriber_gets_each_event_signed_in_order_and_can_have_one_sent_again(api, model, receiver):
    before = db.session.scalar(select(func.coalesce(func.max(AuditEvent.id), 0)))  # (the log outlives tests)
    db.session.remove()
    created = subscribe(api, receiver)
    assert created["secret"].startswith("whsec_") and created["events"] == list(EVENT_TYPES)
    listed = api.as_(ADMIN).get("/api/webhooks").json["webhooks"]
    assert [hook["id"] for hook in listed] == [created["id"]] and "secret" not in listed[0]
    assert listed[0]["created_by"] == ADMIN

    (call,) = waiting_calls(api, model, refund(4471, 9000))
    jobs = services().dispatcher.events_queue.jobs
    assert [(job.func_name, job.args) for job in jobs] == [("jobs.webhooks.deliver", (created["id"],))]
    run_jobs()
    assert receiver.types() == ["approval.requested", "conversation.awaiting_approval"]
    assert all(request["verified"] for request in receiver.received)
    requested = receiver.received[0]["body"]
    assert requested["data"] | {"arguments_hash": None} == {
        "call_id": call.id,
        "conversation_id": call.conversation_id,
        "tool": "issue_refund",
        "source": None,
        "input": {"invoice_id": 4471, "amount_cents": 9000, "reason": "late delivery"},
        "arguments_hash": None,
    }
    event = db.session.scalar(
        select(AuditEvent).where(
            AuditEvent.action == "approval_requested", AuditEvent.tool_call_id == call.id, AuditEvent.id > before
        )
    )
    assert receiver.received[0]["id"] == f"evt_{event.id}" and requested["timestamp"] == event.created_at.isoformat()
    db.session.remove()

    # the reviewer edits the refund to $50 and approves: the decision, who, and what runs, at once
    model.enqueue(Reply.message(reply(text("Refunded $50."))), match="refund")
    edited = {"invoice_id": 4471, "amount_cents": 5000, "reason": "late delivery"}
    decided = api.as_(REVIEWER).post(f"/api/approvals/{call.id}", json={"decision": "approve", "input": edited})
    assert decided.status_code == 200, decided.json
    run_jobs()
    assert receiver.types()[2] == "approval.decided"
    assert receiver.received[2]["body"]["data"] | {"approvals": None, "approvals_required": None} == {
        "call_id": call.id,
        "conversation_id": call.conversation_id,
        "tool": "issue_refund",
        "source": None,
        "decision": "approve",
        "decided_by": REVIEWER,
        "reason": None,
        "input": edited,
        "edited": True,
        "status": "approved",
        "approvals": None,
        "approvals_required": None,
    }
    # the approved call runs and the assistant answers: the conversation completes
    services().loop(db.session, db.session.get(Conversation, call.conversation_id)).complete()
    db.session.remove()
    run_jobs()
    assert receiver.types()[3:] == ["conversation.completed"]
    assert receiver.received[3]["body"]["data"] == {"conversation_id": call.conversation_id, "stop_reason": "end_turn"}
    assert len({request["id"] for request in receiver.received}) == 4  # every event its own id

    log = api.as_(ADMIN).get(f"/api/webhooks/{created['id']}/deliveries").json
    assert [row["event_type"] for row in log["deliveries"]][::-1] == receiver.types()
    assert {(row["status"], row["attempts"], row["http_status"]) for row in log["deliveries"]} == {
        ("delivered", 1, 204)
    }
    first = log["deliveries"][-1]
    again = api.as_(ADMIN).post(f"/api/webhooks/{created['id']}/deliveries/{first['id']}/redeliver")
    assert again.status_code == 202 and again.json["status"] == "pending"
    run_jobs()
    assert receiver.received[-1]["id"] == receiver.received[0]["id"]
    assert receiver.received[-1]["raw"] == receiver.received[0]["raw"] and receiver.received[-1]["verified"]

    removed = api.as_(ADMIN).delete(f"/api/webhooks/{created['id']}")
    assert removed.status_code == 200 and removed.json["deleted_at"]
    assert api.as_(ADMIN).get("/api/webhooks").json == {"webhooks": []}
    waiting_calls(api, model, refund(4401, 20000), message="another")
    run_jobs()
    assert len(receiver.received) == 5  # nothing more after it was removed
    hooks = select(AuditEvent.action).where(AuditEvent.action.like("webhook_%"), AuditEvent.id > before)
    hooks = hooks.order_by(AuditEvent.id)
    actions = db.session.scalars(hooks).all()
    assert actions == ["webhook_subscribed", "webhook_redelivered", "webhook_removed"]


def test_a_failed_delivery_is_retried_and_holds_back_its_conversations_later_events(api, model, receiver):
    created = subscribe(api, receiver, ["approval.requested", "conversation.awaiting_approval"])
    receiver.fail_first = 1
    waiting_calls(api, model, refund(4471, 9000))
    run_jobs()
    assert receiver.types() == ["approval.requested"]  # 503; the conversation's next event waits for it
    log = api.as_(ADMIN).get(f"/api/webhooks/{created['id']}/deliveries").json["deliveries"]
    assert [(row["event_type"], row["status"], row["attempts"]) for row in log] == [
        ("conversation.awaiting_approval", "pending", 0),
        ("approval.requested", "pending", 1),
    ]
    assert log[1]["http_status"] == 503 and "HTTP 503" in log[1]["error"]
    webhook_jobs.deliver(created["id"])  # its retry's job (due at once: WEBHOOK_RETRY_INTERVALS=0,0)
    assert receiver.types() == ["approval.requested", "approval.requested", "conversation.awaiting_approval"]
    assert receiver.received[0]["id"] == receiver.received[1]["id"] and all(r["verified"] for r in receiver.received)

    receiver.fail_first = 100  # a receiver that is down: three attempts (the first and two retries), then failed
    waiting_calls(api, model, refund(4401, 20000), message="another")
    run_jobs()
    for _ in range(2):
        webhook_jobs.deliver(created["id"])
    log = api.as_(ADMIN).get(f"/api/webhooks/{created['id']}/deliveries?limit=2").json
    assert [(row["event_type"], row["status"], row["attempts"]) for row in log["deliveries"]] == [
        ("conversation.awaiting_approval", "pending", 0),
        ("approval.requested", "failed", 3),
    ]
    assert log["next_cursor"]  # the first conversation's two, on the next page
    webhook_jobs.deliver(created["id"])  # given up on, it no longer holds its conversation's next event back
    assert receiver.types()[-1] == "conversation.awaiting_approval" and len(receiver.received) == 7


@pytest.mark.parametrize(
    ("sent", "status", "words"),
    [
        ({"url": "https://example.com/h", "events": ["approval.asked"]}, 422, "events"),
        ({"url": "https://example.com/h", "events": []}, 422, "events"),
        ({"url": "https://example.com/h"}, 422, "events"),
        ({"url": "https://example.com/h", "events": ["approval.requested"], "secret": "x"}, 422, "secret"),
        ({"url": "http://10.0.0.7/hooks", "events": ["approval.requested"]}, 422, "10.0.0.7"),
        ({"url": "ftp://example.com/h", "events": ["approval.requested"]}, 422, "https://"),
    ],
)
def test_a_subscription_that_cannot_be_made_says_why_and_makes_nothing(api, sent, status, words):
    answer = api.as_(ADMIN).post("/api/webhooks", json=sent)
    assert answer.status_code == status and words in answer.json["message"], answer.json
    assert api.as_(ADMIN).get("/api/webhooks").json == {"webhooks": []}
    assert api.as_(AGENT).post("/api/webhooks", json=sent).status_code == 403


def test_a_worker_sends_the_events_as_they_happen(api, model, receiver, workers):
    created = subscribe(api, receiver, ["approval.requested", "conversation.completed"])
    workers(OUTBOUND_ALLOW=f"127.0.0.1:{receiver.port}")
    model.enqueue(Reply.message(reply(refund(4471, 9000))), match="please")
    model.enqueue(Reply.message(reply(text("Done: refunded."))), match="refund")
    started = api.as_(AGENT).post("/api/conversations", json={"message": "please"}).json
    wait_until(lambda: receiver.types() == ["approval.requested"], 30, "the approval.requested event")
    call_id = receiver.received[0]["body"]["data"]["call_id"]
    assert api.as_(REVIEWER).post(f"/api/approvals/{call_id}", json={"decision": "approve"}).status_code == 200
    wait_until(lambda: receiver.types() == ["approval.requested", "conversation.completed"], 30, "the completion")
    assert receiver.received[1]["body"]["data"]["conversation_id"] == started["id"]
    assert all(request["verified"] for request in receiver.received) and created["id"]


def test_an_admin_manages_event_webhooks_on_the_notifications_page(app, api, model, receiver):
    admin = sign_in(app, ADMIN)
    refused = admin.post(
        "/admin/notifications/webhooks", {"url": "http://10.0.0.7/hooks", "events": ["policy.changed"]}
    )
    assert refused.status_code == 422 and "10.0.0.7" in refused.text
    assert 'value="http://10.0.0.7/hooks"' in refused.text  # what was typed is kept
    assert re.search(r"<input checked[^>]*value=\"policy.changed\"", refused.text)
    none_chosen = admin.post("/admin/notifications/webhooks", {"url": receiver.url})
    assert none_chosen.status_code == 422 and "at least one event" in none_chosen.text
    assert api.as_(ADMIN).get("/api/webhooks").json == {"webhooks": []}  # nothing half-made

    made = admin.post(
        "/admin/notifications/webhooks", {"url": receiver.url, "events": ["approval.requested", "approval.decided"]}
    )
    assert made.status_code == 201, made.text
    receiver.secret = unescape(re.search(r'id="new-webhook-secret-value">(whsec_[^<]+)</code>', made.text).group(1))
    (listed,) = api.as_(ADMIN).get("/api/webhooks").json["webhooks"]
    assert listed["url"] == receiver.url and listed["events"] == ["approval.requested", "approval.decided"]
    page = admin.get("/admin/notifications").text
    assert receiver.url in page and "new-webhook-secret-value" not in page  # the secret, shown that once

    waiting_calls(api, model, refund(4471, 9000))
    run_jobs()
    assert receiver.types() == ["approval.requested"] and receiver.received[0]["verified"]
    log = admin.get(f"/admin/notifications/webhooks/{listed['id']}")
    assert log.status_code == 200 and "approval.requested" in log.text and "Delivered (HTTP 204)" in log.text
    (delivery,) = api.as_(ADMIN).get(f"/api/webhooks/{listed['id']}/deliveries").json["deliveries"]
    again = admin.post(f"/admin/notifications/webhooks/{listed['id']}/deliveries/{delivery['id']}/redeliver")
    assert again.status_code == 303
    run_jobs()
    assert [request["id"] for request in receiver.received] == [delivery["event_id"]] * 2
    assert admin.get(f"/admin/notifications/webhooks/{listed['id'] + 1}").status_code == 404
    assert sign_in(app, REVIEWER).get(f"/admin/notifications/webhooks/{listed['id']}").status_code == 403

    removed = admin.post(f"/admin/notifications/webhooks/{listed['id']}/remove")
    assert removed.status_code == 303
    assert api.as_(ADMIN).get("/api/webhooks").json == {"webhooks": []}
    assert "No event webhook yet." in admin.get("/admin/notifications").text


def test_reminders_and_escalations_are_events_too(api, model, receiver):
    subscribe(api, receiver, ["approval.reminder", "approval.escalated"])
    (call,) = waiting_calls(api, model, refund(4471, 9000))
    make_due([call], "reminder")
    move_jobs.sweep()
    run_jobs()
    make_due([call], "escalation")
    move_jobs.sweep()
    move_jobs.sweep()  # a second sweep sends nothing twice
    run_jobs()
    assert receiver.types() == ["approval.reminder", "approval.escalated"]
    assert all(request["verified"] for request in receiver.received)
    reminder = receiver.received[0]["body"]["data"]
    assert reminder["call_id"] == call.id and reminder["tool"] == "issue_refund" and reminder["expires_at"]


def test_one_job_at_a_time_sends_a_webhooks_deliveries_and_a_second_leaves_it_one_more_pass(api, model, receiver):
    created = subscribe(api, receiver, ["approval.requested"])
    senders = WebhookSenders(services().dispatcher)
    sending = senders.sending(created["id"])  # as if a job were sending them now
    assert sending is not None
    waiting_calls(api, model, refund(4471, 9000))
    assert webhook_jobs.deliver(created["id"]) == "another job is sending them, and makes one more pass"
    assert receiver.received == []  # nothing sent twice at once, nothing lost:
    senders.done(created["id"], sending)  # the sender lets go and the pass asked for is queued
    run_jobs()
    assert receiver.types() == ["approval.requested"] and receiver.received[0]["verified"]
