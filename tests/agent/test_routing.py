"""Routing by difficulty: a tenant with a small endpoint has each new question classified (by its
rules, else by the small model), and the run's every move goes to the endpoint chosen. Two local
stand-ins of Anthropic-compatible servers over HTTP play the large and the small endpoint; the Loop
is built as the worker builds it (Services.loop, the real choice_for)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest
from sqlalchemy import select

from demo.billing.tools import demo_registry
from demo.model import routing as demo_routing
from tests.clients import session_as
from tests.model_server import Fault, ModelServer, Reply
from tests.replies import reply, text
from webapp.agent import assistant_settings
from webapp.agent.states import ConversationStatus
from webapp.audit import costs
from webapp.config import Config
from webapp.llm import endpoints, grants, routing
from webapp.models import AuditEvent, Conversation, ModelCall, utcnow
from webapp.runtime.services import Services

BIG, MINI = "claude-sonnet-4-5", "claude-haiku-4-5"  # priced, for the costs dashboard
SIMPLE = "Look up ada@example.com"
COMPLEX = "Show invoices for customer 4471 and tell me why the second one differs"


@pytest.fixture
def small():
    with ModelServer() as server:
        yield server
    assert not server.invalid_requests, server.invalid_requests


@pytest.fixture
def desk(session, model, small, tmp_path: Path) -> Services:
    """acme served by `big` (the `model` server) with `mini` (the `small` server) as its small endpoint."""
    allowed = f"{urlsplit(model.url).netloc},{urlsplit(small.url).netloc}"  # the two local servers, no more
    settings = {"SECRET_KEY": "routing-test", "MODEL_MAX_RETRIES": "0", "INSTANCE_PATH": str(tmp_path)}
    config = Config.from_env({**settings, "OUTBOUND_ALLOW": allowed})
    endpoints.add_endpoint(session, config, "big", base_url=model.url, model=BIG, api_key="k1")
    endpoints.add_endpoint(session, config, "mini", base_url=small.url, model=MINI)
    grants.set_tenant_endpoint(session, "acme", "big", "mini", allow=True)  # (as an operator does)
    session.commit()
    return Services(config, None, demo_registry())


def ask(session, desk: Services, agent, question: str, conversation: Conversation | None = None) -> Conversation:
    """Post a question and move the run as workers would (a fresh Loop each move) until it stops."""
    if conversation is None:
        conversation = Conversation(tenant_id=agent.tenant_id, user_id=agent.id, status="queued", move_budget=25)
        session.add(conversation)
        session.flush()
    desk.loop(session, conversation).ask_later(question)
    session.commit()
    for _ in range(30):
        desk.loop(session, conversation).step()
        session.commit()
        if conversation.status != ConversationStatus.QUEUED:
            break
    return conversation


def classifications(server: ModelServer) -> list[dict]:
    return [body for body in server.requests if body and demo_routing.is_route_request(body)]


def calls(session, conversation: Conversation) -> list[tuple[str, str | None, str | None]]:
    rows = session.execute(
        select(ModelCall.purpose, ModelCall.endpoint, ModelCall.route)
        .where(ModelCall.conversation_id == conversation.id)
        .order_by(ModelCall.id)
    )
    return [tuple(row) for row in rows]


def test_a_simple_question_runs_on_the_small_endpoint_for_every_move(session, desk, agent, model, small):
    conversation = ask(session, desk, agent, SIMPLE)

    assert conversation.status == "completed"
    assert model.requests == []  # the large endpoint never heard of it
    assert len(classifications(small)) == 1
    answers = [body for body in small.requests if not demo_routing.is_route_request(body)]
    assert len(answers) == 2 and all(body["model"] == MINI for body in answers)  # the lookup, the answer
    assert calls(session, conversation) == [
        ("route", "mini", "small: classifies the question"),
        ("answer", "mini", "small: classified simple"),
        ("answer", "mini", "small: classified simple"),
    ]
    assert (conversation.route, conversation.route_reason) == ("small", "small: classified simple")
    routed = session.scalar(
        select(AuditEvent).where(AuditEvent.action == "run_routed", AuditEvent.conversation_id == conversation.id)
    )
    assert routed.outcome == "small" and routed.data["reason"] == "small: classified simple"


def test_a_complex_question_runs_on_the_large_endpoint_and_the_next_question_is_routed_afresh(
    session, desk, agent, model, small
):
    conversation = ask(session, desk, agent, COMPLEX)

    assert conversation.status == "completed"
    assert len(small.requests) == 1 and classifications(small)  # only the classification
    assert len(model.requests) >= 2 and all(body["model"] == BIG for body in model.requests)
    served = calls(session, conversation)
    assert served[0] == ("route", "mini", "small: classifies the question")
    assert set(served[1:]) == {("answer", "big", "large: classified complex")}

    ask(session, desk, agent, SIMPLE, conversation)
    assert len(classifications(small)) == 2
    assert calls(session, conversation)[-1] == ("answer", "mini", "small: classified simple")


def test_the_tenants_rules_make_a_question_complex_before_the_small_model_is_asked(session, desk, agent, model, small):
    assistant_settings.save(
        session,
        agent.tenant_id,
        register="",
        rules="",
        one_call_per_reply=False,
        by_user_id=None,
        complex_words="refund, ada",
    )
    session.commit()

    conversation = ask(session, desk, agent, SIMPLE)

    assert small.requests == []
    assert conversation.route_reason == "large: rule 'ada'"
    assert {row for row in calls(session, conversation)} == {("answer", "big", "large: rule 'ada'")}

    assistant_settings.save(
        session, agent.tenant_id, register="", rules="", one_call_per_reply=False, by_user_id=None, complex_length="20"
    )
    session.commit()
    assert ask(session, desk, agent, "Look up bo@example.com").route_reason == "large: longer than 20 characters"


def test_a_failed_classification_falls_back_to_the_large_endpoint_and_says_so(session, desk, agent, model, small):
    small.enqueue(Fault.status(529))
    conversation = ask(session, desk, agent, SIMPLE)

    assert conversation.status == "completed"
    reason = "large: classification failed (The model service is overloaded.)"
    assert set(calls(session, conversation)) == {("answer", "big", reason)}  # no reply, so no row for it
    assert all(body["model"] == BIG for body in model.requests) and model.requests

    small.enqueue(Reply.message(reply(text("Hard to say."))))
    unclear = ask(session, desk, agent, SIMPLE)
    assert unclear.route_reason == "large: the classification said neither simple nor complex ('Hard to say.')"
    assert calls(session, unclear)[0] == ("route", "mini", "small: classifies the question")


def test_without_a_small_endpoint_nothing_is_classified(session, desk, agent, model, small):
    grants.set_tenant_endpoint(session, "acme", "big", None)
    session.commit()

    conversation = ask(session, desk, agent, SIMPLE)

    assert small.requests == [] and conversation.route is None
    assert set(calls(session, conversation)) == {("answer", "big", "not routed")}


def test_the_demo_model_classifies_by_length_and_words():
    def body(question: str) -> dict:
        return {"system": routing.system_prompt(), "messages": [{"role": "user", "content": question}]}

    assert demo_routing.demo_label(body("Who is customer 4471?")) == "simple"
    assert demo_routing.demo_label(body("Refund invoice 1001")) == "complex"
    assert demo_routing.demo_label(body("Look up " + "a" * 200)) == "complex"


@pytest.mark.parametrize(
    ("small_name", "says"),
    [("nope", "Acme Corp may not use an endpoint named 'nope'"), ("big", "is the endpoint itself")],
)
def test_a_small_endpoint_must_exist_and_differ_from_the_endpoint(session, desk, small_name, says):
    with pytest.raises(endpoints.EndpointError, match=r".*") as refused:
        grants.set_tenant_endpoint(session, "acme", "big", small_name)
    assert says in str(refused.value) and refused.value.field == "small_endpoint"


def test_the_costs_dashboard_splits_spend_by_endpoint_and_says_why(app, session, desk, agent, model, small):
    today = utcnow().date()

    def figures() -> costs.Dashboard:
        session.commit()  # (the dashboard reads on connections of its own)
        return costs.dashboard(session.get_bind(), agent.tenant_id, today, today)

    before = figures()  # (the audit log outlives a test: count this test's calls only)
    grants.set_tenant_endpoint(session, "acme", None, None)  # first the desk's default model, offline
    session.commit()
    ask(session, desk, agent, SIMPLE)
    grants.set_tenant_endpoint(session, "acme", "big", "mini")
    session.commit()
    ask(session, desk, agent, SIMPLE)
    ask(session, desk, agent, COMPLEX)

    board = figures()
    by_endpoint = {
        name: usage - before.usage_by_endpoint.get(name, costs.Usage())
        for name, usage in board.usage_by_endpoint.items()
    }
    by_route = {
        name: usage - before.usage_by_route.get(name, costs.Usage()) for name, usage in board.usage_by_route.items()
    }
    assert {name for name, usage in by_endpoint.items() if usage.model_calls} == {"default", "mini", "big"}
    assert by_endpoint["mini"].model_calls == 4  # two classifications, the simple run's two moves
    assert by_endpoint["big"].model_calls == len(model.requests) and by_endpoint["default"].model_calls == 2
    assert by_endpoint["big"].cost > by_endpoint["mini"].cost > 0
    assert {name for name, usage in by_route.items() if usage.model_calls} == {
        "not routed",
        "small: classifies the question",
        "small: classified simple",
        "large: classified complex",
    }
    assert by_route["small: classifies the question"].model_calls == 2

    html = session_as(app, "auditor@acme.test").get("/audit/dashboard").get_data(as_text=True)
    section = html[html.index('id="dashboard-usage-by-endpoint"') : html.index('id="dashboard-approvals"')]
    for words in ('<th scope="row">big</th>', '<th scope="row">mini</th>', '<th scope="row">default</th>'):
        assert words in section
    assert "large: classified complex" in section and "name=endpoints" in section
    chart = session_as(app, "auditor@acme.test").get("/audit/dashboard/chart.svg?name=endpoints")
    assert chart.status_code == 200 and b"big" in chart.data
