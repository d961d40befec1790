"""The operations page: queue depth, workers, failed conversations and jobs, stuck conversations,
who may see it, and how it reads when Redis is away; and the scheduler command."""

from __future__ import annotations

import re
import socket
from datetime import timedelta

import pytest
import redis as redis_lib
from rq import Queue
from rq.registry import FailedJobRegistry
from sqlalchemy import select

from tests.clients import Browser, session_as, sign_in
from tests.conftest import desk_app, pushed
from tests.model_server import Fault
from webapp.models import Conversation, Message, Tenant, ToolCall, User, utcnow
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.runtime.worker import PromptWorker


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def failed_conversation(api, model) -> int:
    """A conversation of agent@acme.test whose move met a permanent model error, run as a worker would."""
    from jobs.moves import advance_conversation

    model.enqueue(Fault.status(400, "Scripted: the request is refused", "invalid_request_error"))
    created = api.as_("agent@acme.test").post("/api/conversations", json={"message": "hello there"}).json
    conversation = db.session.get(Conversation, created["id"])
    advance_conversation(conversation.id, conversation.version)
    db.session.remove()
    assert db.session.get(Conversation, created["id"]).status == "failed"
    db.session.remove()
    return created["id"]


def bare_conversation(tenant_slug: str, **values) -> int:
    """A conversation row of a tenant's agent, in the state given."""
    tenant = db.session.scalar(select(Tenant).where(Tenant.slug == tenant_slug))
    agent = db.session.scalar(select(User).where(User.email == f"agent@{tenant_slug}.test"))
    conversation = Conversation(tenant_id=tenant.id, user_id=agent.id, title=f"{tenant_slug} talk", **values)
    db.session.add(conversation)
    db.session.commit()
    conversation_id = conversation.id
    db.session.remove()
    return conversation_id


def tool_call_of(conversation_id: int) -> int:
    """A settled tool call in the conversation (a background export of it is that tenant's job)."""
    conversation = db.session.get(Conversation, conversation_id)
    message = Message(conversation_id=conversation_id, seq=1, role="assistant", content=[])
    db.session.add(message)
    db.session.flush()
    call = ToolCall(
        conversation_id=conversation_id,
        tenant_id=conversation.tenant_id,
        message_id=message.id,
        position=0,
        tool_use_id="toolu_ops",
        name="export_customer_data",
        input={"customer_id": 1},
        acting_user_id=conversation.user_id,
        status="succeeded",
    )
    db.session.add(call)
    db.session.commit()
    call_id = call.id
    db.session.remove()
    return call_id


def queue_of(app) -> Queue:
    desk = app.extensions["desk"]
    return Queue(desk.config.queue_name, connection=redis_lib.Redis.from_url(desk.config.redis_url))


def cell(html: str, element_id: str) -> str:
    return re.search(rf'id="{element_id}"[^>]*>([^<]*)<', html).group(1)


def test_admin_sees_a_failed_conversation_and_retries_it(app, api, model):
    conversation_id = failed_conversation(api, model)
    queue = services().dispatcher.people_queue  # the API's first move and the admin's retry: people's acts
    admin = sign_in(app, "admin@acme.test")
    page = admin.get("/ops")
    assert page.status_code == 200
    html = page.text
    assert queue.count == 1  # the first move, enqueued by the API; no worker runs
    assert 'id="queue-depth"' not in html  # the fleet's queue is the operators' (tests/ops/test_operators.py)
    assert 'id="no-workers"' in html
    assert f'id="failed-{conversation_id}"' in html and "Scripted: the request is refused" in html
    assert 'href="/ops"' in html and ">Operations</a>" in html  # the admin's navigation links here

    retried = admin.post(f"/ops/conversations/{conversation_id}/retry")
    assert retried.status_code == 303 and retried.location.endswith("/ops#failed-conversations")
    assert db.session.get(Conversation, conversation_id).status == "queued"
    db.session.remove()
    after = admin.get("/ops").text
    assert f"Conversation {conversation_id} is queued again." in after
    assert f'id="failed-{conversation_id}"' not in after
    assert queue.count == 2

    again = admin.post(f"/ops/conversations/{conversation_id}/retry")  # no longer failed: a sentence, no 500
    assert again.status_code == 303
    assert "only a failed one is retried" in admin.get("/ops").text
    missing = admin.post("/ops/conversations/999999/retry")
    assert missing.status_code == 303 and "No conversation 999999" in admin.get("/ops").text


def test_other_roles_are_refused_the_page_and_the_nav_link(app):
    for email in ("agent@acme.test", "reviewer@acme.test", "auditor@acme.test"):
        client = session_as(app, email)
        assert client.get("/ops").status_code == 403, email
        assert ">Operations</a>" not in client.get("/").text, email
        db.session.remove()
    signed_out = app.test_client().get("/ops")
    assert signed_out.status_code == 302 and "/login?next" in signed_out.location


def test_failed_jobs_are_listed_with_their_exception_and_can_be_requeued_or_deleted(app):
    ours = bare_conversation("acme", status="completed")
    theirs = bare_conversation("globex", status="completed")
    their_call = tool_call_of(theirs)
    queue = queue_of(app)
    others = (f"move-{theirs}-v3", f"wake-{theirs}-1700000000", f"export-{their_call}", "sweep-1")
    for job_id in (f"move-{ours}-v7", f"move-{ours}-v8", *others):
        queue.enqueue("builtins.int", "not a number", job_id=job_id)
    PromptWorker([queue], connection=queue.connection).work(burst=True)  # a real worker: each job raises
    failed = FailedJobRegistry(queue=queue)
    assert failed.get_job_count() == 6

    admin = sign_in(app, "admin@acme.test")
    html = admin.get("/ops").text
    assert f'id="job-move-{ours}-v7"' in html and f'id="job-move-{ours}-v8"' in html
    for job_id in others:  # another tenant's move, wake-up and export, and the desk's own sweep
        assert job_id not in html, job_id
    assert "Only the jobs that worked for your organisation are listed." in html
    assert "ValueError: invalid literal for int()" in html

    requeued = admin.post("/ops/jobs/requeue", {"job_id": f"move-{ours}-v7"})
    assert requeued.status_code == 303
    assert f"move-{ours}-v7" in queue.get_job_ids() and f"move-{ours}-v7" not in failed.get_job_ids()
    assert admin.post("/ops/jobs/delete", {"job_id": f"move-{ours}-v8"}).status_code == 303
    assert f"move-{ours}-v8" not in failed.get_job_ids() and queue.fetch_job(f"move-{ours}-v8") is None
    page = admin.get("/ops").text
    assert f"Job move-{ours}-v8 is deleted." in page

    for bad, message in (
        ("", "its id was missing or malformed"),
        ("../../etc", "its id was missing or malformed"),
        *((job_id, "is not among the failed jobs any more") for job_id in others),  # not ours: as if absent
        ("no-such-job", "is not among the failed jobs any more"),
    ):
        answer = admin.post("/ops/jobs/delete", {"job_id": bad})
        assert answer.status_code == 303, bad
        assert message in admin.get("/ops").text, bad
    assert set(others) <= set(failed.get_job_ids())  # never touched by acme's admin


@pytest.fixture
def patient_app(env, clean):
    """The app with a minute's sweep interval (the suite's is a second): "just queued" stays fresh
    however slowly a loaded machine signs in and renders the page."""
    with pushed(desk_app({**env, "SWEEP_INTERVAL_SECONDS": "60"})) as app:
        yield app


def test_stuck_conversations_are_listed_with_the_reason(patient_app):
    app = patient_app
    now = utcnow()
    expired = bare_conversation(
        "acme", status="running", lease_owner="host:1:move-x", lease_expires_at=now - timedelta(minutes=5)
    )
    lost = bare_conversation("acme", status="queued", updated_at=now - timedelta(minutes=10))
    fresh = bare_conversation("acme", status="queued")  # just queued: not stuck yet
    waiting = bare_conversation("acme", status="awaiting_approval", updated_at=now - timedelta(hours=6))
    recent_wait = bare_conversation("acme", status="awaiting_approval")
    elsewhere = bare_conversation("globex", status="queued", updated_at=now - timedelta(minutes=10))
    html = sign_in(app, "admin@acme.test").get("/ops").text
    assert f'id="stuck-{expired}"' in html and "the lease of host:1:move-x expired" in html
    assert f'id="stuck-{lost}"' in html and "queued with no live job" in html
    assert f'id="stuck-{waiting}"' in html and "waiting for a decision for 6.0 hours" in html
    for absent in (fresh, recent_wait, elsewhere):
        assert f'id="stuck-{absent}"' not in html
    # A live job for the lost one: it is no longer stuck.
    app.extensions["desk"].dispatcher.enqueue_move(lost, 0)
    assert f'id="stuck-{lost}"' not in sign_in(app, "admin@acme.test").get("/ops").text


@pytest.fixture
def redis_down_app(env, clean):
    """A second app whose Redis is a closed port."""
    with pushed(desk_app({**env, "REDIS_URL": f"redis://127.0.0.1:{closed_port()}/0"})) as app:
        yield app


def test_the_page_renders_with_a_message_when_redis_is_unreachable(app, api, model, redis_down_app):
    conversation_id = failed_conversation(api, model)
    stuck = bare_conversation("acme", status="queued", updated_at=utcnow() - timedelta(minutes=10))
    admin = session_as(redis_down_app, "admin@acme.test")
    db.session.remove()
    page = admin.get("/ops")
    assert page.status_code == 200
    html = page.text
    assert 'id="redis-unavailable"' in html and "Redis is unreachable (ConnectionError)" in html
    assert f'id="failed-{conversation_id}"' in html  # the database still answers
    assert f'id="stuck-{stuck}"' in html and "unknown while Redis is away" in html
    browser = Browser(redis_down_app)
    browser.client = admin
    answer = browser.post("/ops/jobs/requeue", {"job_id": "move-1-v1"})
    assert answer.status_code == 303
    assert "nothing was changed" in browser.get("/ops").text


def test_the_scheduler_command_enqueues_due_retries_and_a_sweep(app, cli):
    from datetime import UTC, datetime

    queue = queue_of(app)
    queue.enqueue_at(datetime.now(UTC) - timedelta(seconds=5), "builtins.int", "5", job_id="due-retry")
    queue.enqueue_at(datetime.now(UTC) + timedelta(hours=1), "builtins.int", "6", job_id="later-retry")
    assert "due-retry" not in queue.get_job_ids()
    result = cli("desk", "scheduler", "--once")
    assert result.exit_code == 0, result.output
    assert "Enqueued 1 due job, and a sweep." in result.output
    ids = queue.get_job_ids()
    assert "due-retry" in ids and "later-retry" not in ids
    assert any(job_id.startswith("sweep-") for job_id in ids)


def test_the_scheduler_command_says_when_redis_is_unreachable(redis_down_app):
    result = redis_down_app.test_cli_runner().invoke(args=["desk", "scheduler", "--once"])
    assert result.exit_code != 0
    assert "Redis is unreachable" in result.output and "REDIS_URL" in result.output
