"""The tenant boundary of operations: a tenant's admin reads only their tenant's figures on /metrics and
none of the fleet's workers on /ops; an operator (no tenant, made with `flask create-operator`) reads
the whole fleet there and nothing of any tenant."""

from __future__ import annotations

import re

import pytest
import redis as redis_lib
from rq import Queue
from rq.registry import FailedJobRegistry
from sqlalchemy import func, select

from tests.approvals.test_decision_page import words
from tests.clients import session_as, sign_in, try_sign_in
from tests.conftest import desk_app, pushed
from tests.ops.test_metrics import TOKEN, samples, waiting_conversation
from tests.ops.test_ops import bare_conversation, cell
from webapp import audit_chain
from webapp.models import AuditEvent, Conversation, ModelCall, Tenant, ToolCall, User
from webapp.runtime.extensions import db
from webapp.runtime.worker import PromptWorker

OPERATOR = "operator@desk.test"
# Families of the fleet itself: the queue, its workers, their slots. No tenant admin reads them.
FLEET_ONLY = ("desk_queue_jobs", "desk_workers", "desk_worker_slots", "desk_workers_registered", "desk_redis_up")


@pytest.fixture
def app(env, clean):
    """The app with a METRICS_TOKEN, so Prometheus' fleet-wide scrape can be compared."""
    with pushed(desk_app({**env, "METRICS_TOKEN": TOKEN})) as app:
        yield app


def queue_of(app) -> Queue:
    desk = app.extensions["desk"]
    return Queue(desk.config.queue_name, connection=redis_lib.Redis.from_url(desk.config.redis_url))


def globex_activity() -> int:
    """A globex conversation waiting for a decision, with a model call of a model only globex uses and
    an audit event only globex has: what acme's admin must not read."""
    conversation_id = bare_conversation("globex", status="awaiting_approval")
    conversation = db.session.get(Conversation, conversation_id)
    db.session.add(
        ModelCall(
            conversation_id=conversation_id,
            tenant_id=conversation.tenant_id,
            model="claude-globex-only",
            input_tokens=7000,
            output_tokens=700,
        )
    )
    from tests.ops.test_ops import tool_call_of

    db.session.commit()
    db.session.remove()
    call_id = tool_call_of(conversation_id)
    call = db.session.get(ToolCall, call_id)
    call.status = "awaiting_approval"
    audit_chain.record(db.session, "globex_only_action", tenant_id=call.tenant_id, actor_label="test")
    db.session.commit()
    db.session.remove()
    return conversation_id


def names(found: dict) -> set[str]:
    return {name for name, _ in found}


def labelled(found: dict, **labels) -> dict:
    wanted = set(labels.items())
    return {key: value for key, value in found.items() if wanted <= set(key[1])}


def test_an_admin_of_acme_reads_only_acmes_figures_on_metrics_and_no_fleet_family(app, api, model):
    waiting_conversation(api, model)  # acme: one call waiting, one model call of claude-test
    globex_activity()
    fleet = samples(app.test_client().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text)
    db.session.remove()
    response = session_as(app, "admin@acme.test").get("/metrics")
    db.session.remove()
    assert response.status_code == 200
    acme = samples(response.text)

    # Prometheus' token reads the fleet: both tenants, and the queue and its workers.
    assert labelled(fleet, model="claude-globex-only")
    assert fleet[("desk_approvals_pending", ())] == 2
    assert fleet[("desk_conversations", (("status", "awaiting_approval"),))] == 2
    assert labelled(fleet, action="globex_only_action")
    assert all(any(name.startswith(family) for name in names(fleet)) for family in FLEET_ONLY)

    # acme's admin: acme's rows only, the same family names, and nothing of the fleet's own.
    assert not labelled(acme, model="claude-globex-only")
    assert not labelled(acme, action="globex_only_action")
    assert "claude-globex-only" not in response.text and "globex" not in response.text
    assert acme[("desk_approvals_pending", ())] == 1
    assert acme[("desk_conversations", (("status", "awaiting_approval"),))] == 1
    assert acme[("desk_tool_calls", (("status", "awaiting_approval"),))] == 1
    assert acme[("desk_model_calls_total", (("model", "claude-test"),))] == 1
    assert acme[("desk_model_tokens_total", (("kind", "input"), ("model", "claude-test")))] == 100
    acme_id = db.session.scalar(select(Tenant.id).where(Tenant.slug == "acme"))
    acme_events = db.session.scalar(select(func.count(AuditEvent.id)).where(AuditEvent.tenant_id == acme_id))
    db.session.remove()
    assert sum(v for (name, _), v in acme.items() if name == "desk_audit_events_total") == acme_events
    for family in FLEET_ONLY:
        assert not any(name.startswith(family) for name in names(acme)), family
    assert acme[("desk_database_up", ())] == 1

    # An operator reads what Prometheus reads.
    operator = samples(session_as(app, OPERATOR).get("/metrics").text)
    db.session.remove()
    assert labelled(operator, model="claude-globex-only") and operator[("desk_approvals_pending", ())] == 2
    assert all(any(name.startswith(family) for name in names(operator)) for family in FLEET_ONLY)


@pytest.fixture
def registered_worker(app):
    """A worker registered in Redis as a real one is (its name, host and pid), running nothing."""
    queue = queue_of(app)
    worker = PromptWorker([queue], connection=queue.connection, name="globex-box-7")
    worker.register_birth()
    yield worker
    worker.register_death()


def test_an_admin_sees_no_worker_host_on_ops_and_an_operator_sees_every_worker(app, registered_worker):
    host = f"{registered_worker.hostname}:{registered_worker.pid}"
    admin = sign_in(app, "admin@acme.test").get("/ops").text
    assert "globex-box-7" not in admin and host not in admin and 'id="workers"' not in admin
    assert 'id="queue-depth"' not in admin  # the fleet's queue is no tenant's
    assert "The desk runs 1 worker with 1 slot for every organisation; 0 are busy now." in admin

    operator = sign_in(app, OPERATOR)
    page = operator.get("/ops").text
    assert 'id="workers"' in page and "globex-box-7" in page and host in page
    assert cell(page, "queue-queued") == "0"
    assert ">Operations</a>" in page and ">Metrics</a>" in page


def test_failed_jobs_an_admin_sees_only_their_tenants_and_an_operator_every_one(app):
    ours = bare_conversation("acme", status="completed")
    theirs = bare_conversation("globex", status="completed")
    queue = queue_of(app)
    for job_id in (f"move-{ours}-v7", f"move-{theirs}-v3", "sweep-1"):
        queue.enqueue("builtins.int", "not a number", job_id=job_id)
    PromptWorker([queue], connection=queue.connection).work(burst=True)  # a real worker: each job raises
    failed = FailedJobRegistry(queue=queue)
    assert failed.get_job_count() == 3

    admin = sign_in(app, "admin@acme.test").get("/ops").text
    assert f"move-{ours}-v7" in admin
    assert f"move-{theirs}-v3" not in admin and "sweep-1" not in admin
    assert "other organisations" not in admin  # not even how many other tenants' jobs failed

    operator = sign_in(app, OPERATOR)
    page = operator.get("/ops").text
    assert cell(page, "queue-failed") == "3"
    for job_id in (f"move-{ours}-v7", f"move-{theirs}-v3", "sweep-1"):
        assert f'id="job-{job_id}"' in page, job_id
    assert "for tenant <code>globex</code>" in page and "the desk's own" in page
    assert f'href="/conversations/{theirs}"' not in page  # a job names its conversation, never links to it
    assert 'id="conversations"' in page and 'id="failed-conversations"' not in page

    assert operator.post("/ops/jobs/requeue", {"job_id": f"move-{theirs}-v3"}).status_code == 303
    assert f"move-{theirs}-v3" in queue.get_job_ids()
    assert operator.post("/ops/jobs/delete", {"job_id": "sweep-1"}).status_code == 303
    assert "Job sweep-1 is deleted." in operator.get("/ops").text
    assert failed.get_job_ids() == [f"move-{ours}-v7"]


def test_an_operator_gets_403_or_404_on_every_tenant_page_and_no_live_stream(app, api, model):
    conversation = waiting_conversation(api, model)
    call_id = db.session.scalar(select(ToolCall.id).where(ToolCall.conversation_id == conversation.id))
    db.session.remove()
    operator = sign_in(app, OPERATOR)
    home = operator.get("/")
    assert home.status_code == 200 and "You are an <strong>operator</strong>" in home.text
    assert "sse-connect" not in home.text  # the live stream is a tenant's
    for url in (
        "/conversations",
        f"/conversations/{conversation.id}",
        "/approvals",
        f"/approvals/{call_id}",
        "/audit",
        "/admin/users",
        "/account/tokens",
    ):
        answer = operator.get(url)
        assert answer.status_code in (403, 404), f"{url}: {answer.status_code}"
        assert "refund please" not in answer.text, url
    refused = operator.post(f"/ops/conversations/{conversation.id}/retry")
    assert refused.status_code == 403


# --- the command line -------------------------------------------------------------------------------


def test_create_operator_makes_a_person_of_no_tenant_who_signs_in_to_ops(app, cli):
    result = cli("create-operator", "Night.Shift@Example.com", "--password", "a-long-password", "--name", "Night")
    assert result.exit_code == 0, result.output
    assert "Created operator night.shift@example.com" in result.output
    user = db.session.scalar(select(User).where(User.email == "night.shift@example.com"))
    assert user.roles == ["operator"] and user.is_operator and user.tenant.slug == "~operations"
    assert not any(user.has_role(role) for role in ("agent", "reviewer", "auditor", "admin"))
    event = db.session.scalar(select(AuditEvent).where(AuditEvent.action == "operator_created"))
    assert event.data["email"] == "night.shift@example.com" and event.actor_label == "command line"
    db.session.remove()
    browser = sign_in(app, "night.shift@example.com", "a-long-password")
    assert browser.get("/ops").status_code == 200
    assert browser.get("/conversations").status_code == 403


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["create-operator", "not-an-email", "--password", "a-long-password"], "is not an email address"),
        (["create-operator", "ops@example.com", "--password", "short"], "at least 8 characters"),
        (
            ["create-operator", "admin@acme.test", "--password", "a-long-password"],
            "admin@acme.test is already a person of tenant acme; an operator needs an e-mail with no account",
        ),
        (
            ["create-operator", OPERATOR, "--password", "a-long-password"],
            f"{OPERATOR} is already an operator",
        ),
        (
            ["create-user", "x@example.com", "--role", "admin", "--tenant", "~operations", "--password", "long-enough"],
            "must be lowercase letters, digits and dashes",
        ),
        (
            ["create-token", OPERATOR],
            "is an operator, and the API is for tenants' people",
        ),
    ],
)
def test_operator_command_line_mistakes_are_refused_in_words(cli, read, args, says):
    before = read(lambda s: s.scalar(select(func.count(User.id))))
    result = cli(*args)
    assert result.exit_code == 2, result.output
    assert says in " ".join(result.output.split())
    assert read(lambda s: s.scalar(select(func.count(User.id)))) == before


def test_no_tenant_role_can_be_given_in_the_operations_tenant_or_to_an_operator(app):
    from webapp.identity import AccountError, create_user, operations_tenant, set_roles

    with pytest.raises(AccountError, match="holds only operators"):
        create_user(db.session, "sneaky@example.com", "a-long-password", ["admin"], operations_tenant(db.session))
    operator = db.session.scalar(select(User).where(User.email == OPERATOR))
    with pytest.raises(AccountError, match="no tenant role can be given"):
        set_roles(db.session, operator, ["admin"])
    db.session.rollback()
    db.session.remove()


def test_an_operator_signs_in_through_the_form_and_out_again(app):
    browser, response = try_sign_in(app, OPERATOR)
    assert response.status_code == 302 and response.location.endswith("/")
    assert browser.post("/logout").status_code == 302
    assert browser.get("/ops").status_code == 302


def test_the_operations_tenant_serves_no_model_and_is_listed_as_no_tenant(cli):
    assert "~operations" not in cli("endpoint", "list").output
    refused = cli("tenant", "set-model", "~operations", "--endpoint", "default")
    assert refused.exit_code != 0 and "There is no tenant '~operations'" in refused.output


def test_an_operator_is_told_in_words_when_redis_is_unreachable(env, clean):
    from tests.ops.test_ops import closed_port

    with pushed(desk_app({**env, "REDIS_URL": f"redis://127.0.0.1:{closed_port()}/0"})) as app:
        page = sign_in(app, OPERATOR).get("/ops")
        assert page.status_code == 200
        assert "Redis is unreachable (ConnectionError)" in page.text and "Conversations below" not in page.text


def test_an_operator_sees_what_each_worker_is_working_on_and_has_done(app, api, workers, registered_worker):
    from rq.job import Job

    from tests.conftest import wait_until
    from tests.integration.test_workers import start, wait_status

    # a registered worker in the middle of a move of conversation 41 and a job of the desk's own
    queue = queue_of(app)
    for job_id in ("move-41-v3", "sweep-7"):
        registered_worker.prepare_execution(Job.create("builtins.int", id=job_id, connection=queue.connection))
    # and a real pool worker that has answered a question (three moves: model, tool, model)
    workers()
    wait_status(api, start(api, "Show invoices for customer 4471"), "completed")
    operator = sign_in(app, OPERATOR)

    def rows() -> dict[str, str]:
        page = operator.get("/ops").text
        table = page[page.index('id="workers"') : page.index("</table>", page.index('id="workers"'))]
        said = [words("<tr" + row) for row in table.split("<tr")[2:]]  # the rows after the heading's
        return {row.split()[0]: row for row in said}

    busy = rows()["globex-box-7"]
    assert "conversation 41 and 1 other job" in busy and "0 jobs" in busy
    # the pool worker's moves reach its record with its next heartbeat (every few seconds)
    pool = wait_until(
        lambda: next((row for name, row in rows().items() if name != "globex-box-7" and "3 moves" in row), None),
        timeout=30,
        message="the pool worker's row says 3 moves",
    )
    assert re.search(r"3 moves in \d+ jobs?; busy \d+% of its slots' time", pool) and "failed" not in pool
    assert "conversation" not in pool  # its conversation is answered: no move of it in flight (a sweep may be)
