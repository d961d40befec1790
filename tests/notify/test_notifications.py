"""Reminders and escalation of waiting calls, end to end on real parts: a local HTTP receiver that
checks each webhook's signature (and can fail the first attempts), a local SMTP server (aiosmtpd),
RQ workers running the delivery jobs, and the admin page through real sign-ins. The receivers' ports
are the only private addresses the desk may call (OUTBOUND_ALLOW): the outbound guard stays on."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
import time
from datetime import timedelta
from email import message_from_bytes
from email.policy import default as email_policy
from html import unescape

import pytest
from aiosmtpd.controller import Controller
from sqlalchemy import select, update
from sqlalchemy.orm import Session
from standardwebhooks.webhooks import EmptyWebhookSecretError, Webhook, WebhookVerificationError

from jobs import moves as move_jobs
from jobs import notify as notice_jobs
from tests.accounts.people import last_event
from tests.approvals.test_inbox import refund, waiting_calls
from tests.clients import session_as, sign_in
from tests.conftest import desk_app, free_port, pushed, wait_until
from tests.listeners import HookReceiver, QuietHandler
from tests.model_server import Reply
from tests.replies import reply, tool_use
from webapp.agent import sweeper
from webapp.models import Conversation, NotificationChannel, NotificationDelivery, ToolCall, utcnow
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.runtime.worker import PromptWorker

PUBLIC_URL = "https://desk.example.test"
ANSWERED_503 = "The webhook answered HTTP 503 (its receiver's own log says why)."


class Receiver(HookReceiver):
    """A webhook receiver on a local port: it keeps every request, says whether its signature is
    right for `secret`, and answers 503 to the first `fail_first` requests."""

    def __init__(self, fail_first: int = 0) -> None:
        self.secret = ""
        self.fail_first = fail_first
        self.requests: list[dict] = []
        receiver = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                timestamp = self.headers.get("X-Desk-Timestamp", "")
                expected = hmac.new(
                    receiver.secret.encode(), b"v1:" + timestamp.encode() + b":" + body, hashlib.sha256
                ).hexdigest()
                try:  # and as Standard Webhooks say, checked by their library
                    Webhook(receiver.secret).verify(body, dict(self.headers.items()))
                    standard = True
                except (WebhookVerificationError, EmptyWebhookSecretError):  # (a receiver given no secret)
                    standard = False
                receiver.requests.append(
                    {
                        "json": json.loads(body),
                        "kind": self.headers.get("X-Desk-Kind"),
                        "id": self.headers.get("webhook-id"),
                        "signed": hmac.compare_digest(self.headers.get("X-Desk-Signature", ""), f"v1={expected}")
                        and abs(time.time() - int(timestamp)) < 300
                        and standard,
                    }
                )
                failing = len(receiver.requests) <= receiver.fail_first
                self.send_response(503 if failing else 200)
                self.end_headers()
                self.wfile.write(b"busy, try later" if failing else b"ok")

        self.serve(Handler)


class Mailbox:
    """What the local SMTP server received; it refuses recipients at refused.test."""

    def __init__(self) -> None:
        self.messages: list[tuple[list[str], object]] = []
        self.port = 0

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address.endswith("@refused.test"):
            return "550 5.1.1 No such mailbox here"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.messages.append((list(envelope.rcpt_tos), message_from_bytes(envelope.content, policy=email_policy)))
        return "250 Message accepted"


@pytest.fixture
def mailbox():
    box = Mailbox()
    box.port = free_port()
    controller = Controller(box, hostname="127.0.0.1", port=box.port)
    controller.start()
    yield box
    controller.stop()


@pytest.fixture
def receivers():
    """Two receivers, started before the app so that OUTBOUND_ALLOW can name their ports."""
    pool = [Receiver(), Receiver()]
    yield pool
    for each in pool:
        each.close()


@pytest.fixture
def receiver(receivers):
    """receiver(fail_first): the next receiver of the pool, answering 503 to its first requests."""
    handed: list[Receiver] = []

    def make(fail_first: int = 0) -> Receiver:
        handed.append(receivers[len(handed)])
        handed[-1].fail_first = fail_first
        return handed[-1]

    return make


@pytest.fixture
def notify_env(mailbox, env, receivers) -> dict[str, str]:
    return {
        **env,
        "OUTBOUND_ALLOW": ",".join(f"127.0.0.1:{each.port}" for each in receivers),
        "PUBLIC_URL": PUBLIC_URL,
        "SMTP_HOST": "127.0.0.1",
        "SMTP_PORT": str(mailbox.port),
        "SMTP_STARTTLS": "0",
        "SMTP_FROM": "desk@acme.test",
        "NOTIFY_RETRY_INTERVALS": "0,1,1",
        "NOTIFY_TIMEOUT_SECONDS": "5",
    }


@pytest.fixture
def app(notify_env, clean):
    with pushed(desk_app(notify_env)) as app:
        yield app


# --- helpers -----------------------------------------------------------------------------------------


def set_up_webhook(app, url: str) -> str:
    """Set the tenant's webhook on the admin page; the signing secret it shows this once."""
    page = sign_in(app, "admin@acme.test").post("/admin/notifications/webhook", {"url": url})
    assert page.status_code == 201, page.text
    return re.search(r'id="new-secret-value">(whsec_[^<]+)</code>', page.text, re.S).group(1)


def set_up_email(app, addresses: str) -> None:
    page = sign_in(app, "admin@acme.test").post("/admin/notifications/email", {"recipients": addresses})
    assert page.status_code == 303, page.text


def make_due(calls, kind: str) -> None:
    """As if the call had waited past its reminder time (or near its expiry)."""
    column = ToolCall.remind_at if kind == "reminder" else ToolCall.escalate_at
    db.session.execute(
        update(ToolCall)
        .where(ToolCall.id.in_([c.id for c in calls]))
        .values({column.key: utcnow() - timedelta(seconds=1)})
    )
    db.session.commit()


def deliver_queued() -> None:
    """Run the queued jobs (the sweep's deliveries) with a real RQ worker, in this process."""
    dispatcher = services().dispatcher
    PromptWorker([dispatcher.queue], connection=dispatcher.redis).work(burst=True)
    db.session.remove()


def deliveries() -> list[NotificationDelivery]:
    rows = list(db.session.scalars(select(NotificationDelivery).order_by(NotificationDelivery.id)))
    # On SQLite every transaction begins IMMEDIATE: one left open while a test polls would hold the
    # write lock the worker's sweep waits for (it gave up after 30 s, and the reminder never went).
    db.session.remove()
    return rows


def words(html: str) -> str:
    """A page's text as a person reads it (tags left out)."""
    return unescape(re.sub(r"<[^>]+>", "", html))


def notice_text(request: dict) -> str:
    return json.dumps(request["json"], ensure_ascii=False)


# --- the tests ---------------------------------------------------------------------------------------


def test_a_policys_reminder_time_sets_when_its_calls_remind_and_a_bad_one_is_refused(app, api, model):
    (call,) = waiting_calls(api, model, refund(4471, 9000))
    # the default: an hour (a quarter of the 24 hours to decide, at most an hour); escalation at 80%
    assert abs((call.remind_at - call.created_at).total_seconds() - 3600) < 30
    assert abs((call.expires_at - call.escalate_at).total_seconds() - 0.2 * 86400) < 1
    admin = sign_in(app, "admin@acme.test")
    form = {"mode": "above_amount", "amount_threshold": "50", "approvals_required": "1", "ttl_hours": "24"}
    bad = admin.post("/admin/policies/issue_refund", {**form, "remind_after_minutes": "0.5"})
    assert bad.status_code == 422
    assert "The reminder must come at least a minute after a call starts waiting" in unescape(bad.text)
    late = admin.post("/admin/policies/issue_refund", {**form, "remind_after_minutes": "1500"})
    assert late.status_code == 422 and "less than 1440 minutes" in unescape(late.text)
    assert admin.post("/admin/policies/issue_refund", {**form, "remind_after_minutes": "10"}).status_code == 303
    assert "Waiting calls remind after 10 minutes" in admin.get("/admin/policies").text
    (second,) = waiting_calls(api, model, refund(4401, 20000), message="another one")
    assert abs((second.remind_at - second.created_at).total_seconds() - 600) < 30
    assert last_event("policy_changed").data["after"]["remind_after_seconds"] == 600


def test_reminders_and_escalations_are_emailed_through_smtp_once(app, api, model, mailbox):
    set_up_email(app, "approvals@acme.test, Lead@Acme.test")
    (call,) = waiting_calls(api, model, refund(4471, 9000))
    move_jobs.sweep()
    deliver_queued()
    assert mailbox.messages == []  # not due yet
    make_due([call], "reminder")
    move_jobs.sweep()
    deliver_queued()
    (to, message), *_ = mailbox.messages
    assert sorted(to) == ["approvals@acme.test", "lead@acme.test"]
    assert message["Subject"].startswith("Reminder: “Issue a refund” has waited")
    body = message.get_content()
    assert "Amount: $90.00" in body and "Invoice: 4471" in body and "Reason: late delivery" in body
    assert "Waiting for a decision for" in body and "Expires at " in body
    assert f"{PUBLIC_URL}/approvals/{call.id}" in body
    assert "<tool_output" not in body and "amount_cents" not in body  # words for people only
    make_due([call], "escalation")
    move_jobs.sweep()
    move_jobs.sweep()  # a second sweep sends nothing again
    deliver_queued()
    assert len(mailbox.messages) == 2
    to, escalation = mailbox.messages[1]
    assert "admin@acme.test" in to and "approvals@acme.test" not in to  # escalations go to the admins
    assert escalation["Subject"].startswith("Escalation: “Issue a refund” is about to expire undecided")
    assert escalation["Importance"] == "high"
    assert [(row.kind, row.status, row.attempt) for row in deliveries()] == [
        ("reminder", "delivered", 1),
        ("escalation", "delivered", 1),
    ]


def test_an_smtp_refusal_is_logged_with_the_servers_reason(app, mailbox):
    set_up_email(app, "nobody@refused.test")
    admin = sign_in(app, "admin@acme.test")
    assert admin.post("/admin/notifications/email/test").status_code == 303
    page = words(admin.get("/admin/notifications").text)
    reason = "The SMTP server refused every address: nobody@refused.test (550 5.1.1 No such mailbox here)"
    assert f"The test e-mail was not delivered: {reason}" in page  # the flash
    assert f"Failed: {reason}" in page  # the delivery log
    assert mailbox.messages == []


def test_the_webhook_secret_is_shown_once_signs_every_message_and_rotates(app, receiver):
    hook = receiver()
    hook.secret = set_up_webhook(app, hook.url)
    admin = sign_in(app, "admin@acme.test")
    assert hook.secret not in admin.get("/admin/notifications").text  # shown once
    channel = db.session.scalar(select(NotificationChannel).where(NotificationChannel.kind == "webhook"))
    assert hook.secret not in channel.secret_sealed  # kept sealed
    saved = last_event("notification_channel_saved")
    assert saved.data["host"] == "127.0.0.1" and hook.secret not in json.dumps(saved.data)
    assert admin.post("/admin/notifications/webhook/test").status_code == 303
    assert "The test webhook was delivered (HTTP 200)." in admin.get("/admin/notifications").text
    assert hook.requests[-1]["signed"] and hook.requests[-1]["kind"] == "test"
    old = hook.secret
    rotated = admin.post("/admin/notifications/webhook/rotate")
    new = re.search(r'id="new-secret-value">(whsec_[^<]+)</code>', rotated.text, re.S).group(1)
    assert new != old
    admin.post("/admin/notifications/webhook/test")
    assert not hook.requests[-1]["signed"]  # the old secret no longer verifies
    hook.secret = new
    admin.post("/admin/notifications/webhook/test")
    assert hook.requests[-1]["signed"]
    assert last_event("notification_secret_rotated").data["kind"] == "webhook"
    # a receiver that fails: the test says so with the reason, and the log keeps it
    failing = receiver(fail_first=99)
    assert admin.post("/admin/notifications/webhook", {"url": failing.url}).status_code == 303  # same secret
    admin.post("/admin/notifications/webhook/test")
    page = words(admin.get("/admin/notifications").text)
    assert f"The test webhook was not delivered: {ANSWERED_503}" in page and f"Failed: {ANSWERED_503}" in page
    assert "busy, try later" not in page  # what a receiver says is never repeated


def test_the_admin_page_refuses_bad_settings_with_the_reason_and_keeps_what_was_typed(app):
    admin = sign_in(app, "admin@acme.test")
    assert "Notifications" in admin.get("/").text  # in the admin's menu
    bad_url = admin.post("/admin/notifications/webhook", {"url": "hooks.slack.com/services/T0"})
    assert bad_url.status_code == 422
    assert "The webhook's address must start with https://" in unescape(bad_url.text)
    assert 'value="hooks.slack.com/services/T0"' in bad_url.text
    spaced = admin.post("/admin/notifications/webhook", {"url": "https://hooks.example.com/a b"})
    assert spaced.status_code == 422 and 'value="https://hooks.example.com/a b"' in spaced.text
    bad_mail = admin.post("/admin/notifications/email", {"recipients": "ops@acme.test\nbob@"})
    assert bad_mail.status_code == 422
    assert "“bob@” is not an e-mail address" in unescape(bad_mail.text)
    assert "ops@acme.test\nbob@</textarea>" in bad_mail.text
    assert db.session.scalar(select(NotificationChannel.id)) is None  # nothing half-saved
    assert sign_in(app, "reviewer@acme.test").get("/admin/notifications").status_code == 403


def test_two_sweeps_at_once_remind_each_call_exactly_once(app, api, model, receiver, engine):
    hook = receiver()
    hook.secret = set_up_webhook(app, hook.url)
    calls = waiting_calls(api, model, refund(4471, 9000), refund(4401, 20000), refund(4471, 6000))
    make_due(calls, "reminder")
    barrier, found = threading.Barrier(2), []

    def sweep() -> None:
        with Session(engine) as session:
            barrier.wait()
            found.append(sweeper.due_notices(session, "reminder"))
            session.commit()

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    marked = [call_id for batch in found for call_id, _ in batch]
    assert sorted(marked) == sorted(c.id for c in calls)  # each call went to one sweep only
    # and whole sweeps: a call marked is never sent again
    make_due(calls[:1], "escalation")
    move_jobs.sweep()
    move_jobs.sweep()
    deliver_queued()
    assert [r["kind"] for r in hook.requests] == ["escalation"]
    assert ":rotating_light: Escalation" in hook.requests[0]["json"]["text"]


def test_calls_of_another_tenant_never_reach_this_tenants_channels(app, api, model, receiver, mailbox):
    hook = receiver()
    hook.secret = set_up_webhook(app, hook.url)
    set_up_email(app, "approvals@acme.test")
    model.enqueue(
        Reply.message(reply(tool_use("send_email", {"customer_id": 1, "subject": "Hi", "body": "b"}))),
        match="globex please",
    )
    created = api.as_("agent@globex.test").post("/api/conversations", json={"message": "globex please"}).json
    services().loop(db.session, db.session.get(Conversation, created["id"])).complete()
    globex_call = db.session.scalar(select(ToolCall).where(ToolCall.conversation_id == created["id"]))
    db.session.remove()
    make_due([globex_call], "reminder")
    make_due([globex_call], "escalation")
    move_jobs.sweep()
    deliver_queued()
    assert hook.requests == [] and mailbox.messages == [] and deliveries() == []
    assert db.session.get(ToolCall, globex_call.id).reminded_at is not None  # it was due; globex has no channels
    # the delivery job itself sends nothing for a call of another tenant
    acme_hook = db.session.scalar(select(NotificationChannel.id).where(NotificationChannel.kind == "webhook"))
    assert notice_jobs.deliver(acme_hook, globex_call.id, "reminder") == "nothing to send"
    assert hook.requests == []


def test_the_inbox_shows_how_long_the_oldest_call_has_waited(app, api, model):
    reviewer = session_as(app, "reviewer@acme.test")
    assert "Oldest waiting" not in reviewer.get("/approvals").text
    first, _ = waiting_calls(api, model, refund(4471, 9000), refund(4401, 20000))
    db.session.execute(
        update(ToolCall)
        .where(ToolCall.id == first.id)
        .values(created_at=utcnow() - timedelta(hours=2, minutes=10, seconds=5))
    )
    db.session.commit()
    assert "Oldest waiting: <strong>2 h 10 min</strong>" in reviewer.get("/approvals").text
    # the tenant's oldest, whatever the filter shows; another tenant's reviewer sees none of it
    assert "Oldest waiting: <strong>2 h 10 min</strong>" in reviewer.get("/approvals?min_amount=150").text
    assert "Oldest waiting" not in session_as(app, "reviewer@globex.test").get("/approvals").text


@pytest.mark.slow
def test_a_failing_webhook_is_retried_with_backoff_every_attempt_logged_then_delivered(
    app, api, model, receiver, workers, notify_env
):
    hook = receiver(fail_first=2)
    hook.secret = set_up_webhook(app, hook.url)
    (call,) = waiting_calls(api, model, refund(4471, 9000))
    settings = ("PUBLIC_URL", "NOTIFY_RETRY_INTERVALS", "NOTIFY_TIMEOUT_SECONDS", "OUTBOUND_ALLOW")
    workers(**{key: notify_env[key] for key in settings})
    make_due([call], "reminder")  # the worker's own sweep ticker finds it
    wait_until(lambda: any(row.status == "delivered" for row in deliveries()), 40, "the reminder to be delivered")
    assert [(row.attempt, row.status, row.http_status, row.error) for row in deliveries()] == [
        (1, "failed", 503, ANSWERED_503),
        (2, "failed", 503, ANSWERED_503),
        (3, "delivered", 200, None),
    ]
    assert len(hook.requests) == 3 and all(request["signed"] for request in hook.requests)
    assert {request["id"] for request in hook.requests} == {f"ntf_reminder_{call.id}"}  # one id, every attempt
    message = hook.requests[-1]["json"]
    assert message["text"].startswith("Reminder: “Issue a refund” has waited")
    assert message["blocks"][2]["elements"][0]["url"] == f"{PUBLIC_URL}/approvals/{call.id}"
    assert "Amount: $90.00" in notice_text(hook.requests[-1]) and "<tool_output" not in notice_text(hook.requests[-1])
    html = sign_in(app, "admin@acme.test").get("/admin/notifications").text
    assert f'reminder of <a href="/approvals/{call.id}">call {call.id}</a>' in html
    page = words(html)
    assert "2 failures among them" in page and f"Failed: {ANSWERED_503}" in page


def test_endpoint_keys_sealed_before_the_shared_helper_still_open():
    import base64

    from cryptography.fernet import Fernet

    from webapp import notify
    from webapp.secrets import sealing

    before = Fernet(base64.urlsafe_b64encode(hashlib.sha256(b"model endpoint keys\0key").digest()))
    sealed = before.encrypt(b"sk-live").decode()
    assert sealing.unseal("key", "model endpoint keys", sealed) == "sk-live"
    with pytest.raises(sealing.InvalidToken):  # one purpose's key never opens another's
        sealing.unseal("key", notify.SECRET_PURPOSE, sealed)
