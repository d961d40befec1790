"""Who may have the assistant use which tool: the model is offered only the owner's tools, and a call
of any other tool is settled as an error result without running (webapp/agent/access.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from demo.billing.models import OutgoingEmail, Refund
from tests.model_server import Reply
from tests.replies import reply, text, tool_use
from webapp.agent import access
from webapp.agent.decisions import arguments_hash, decide
from webapp.models import ToolCall, User


def person(session, email: str) -> User:
    return session.scalar(select(User).where(User.email == email))


def offered(request: dict) -> list[str]:
    return [tool["name"] for tool in request["tools"]]


def set_access(session, agent, tool_name: str, **values) -> None:
    admin = person(session, "admin@acme.test")
    access.save_access(session, agent.tenant_id, tool_name, by_user_id=admin.id, **values)
    session.commit()


def test_the_model_is_offered_only_the_tools_the_owner_may_use(session, agent, new_loop, model):
    set_access(session, agent, "issue_refund", who="chosen", roles=["reviewer"])
    set_access(session, agent, "send_email", who="nobody")
    model.enqueue(Reply.message(reply(text("Hello."))))
    loop = new_loop()
    loop.ask_later("hello")
    assert loop.complete() == "completed"
    names = offered(model.requests[-1])
    assert "lookup_invoices" in names
    assert "issue_refund" not in names and "send_email" not in names
    assert model.requests[-1]["tools"][-1]["cache_control"] == {"type": "ephemeral"}  # still the breakpoint

    set_access(session, agent, "issue_refund", who="chosen", roles=["reviewer"], user_ids=[agent.id])
    model.enqueue(Reply.message(reply(text("Hello again."))))
    loop = new_loop()
    loop.ask_later("hello")
    loop.complete()
    assert "issue_refund" in offered(model.requests[-1])  # named people may, whatever their roles


def test_a_call_of_a_tool_the_owner_may_not_use_is_an_error_result_and_nothing_runs(session, agent, new_loop, model):
    set_access(session, agent, "send_email", who="nobody")
    model.enqueue(Reply.message(reply(tool_use("send_email", {"customer_id": 4471, "subject": "Hi", "body": "x"}))))
    model.enqueue(Reply.message(reply(text("I could not send it."))))
    loop = new_loop()
    loop.ask_later("email them")
    assert loop.complete() == "completed"
    (call,) = session.scalars(select(ToolCall).where(ToolCall.conversation_id == loop.conversation.id)).all()
    assert (call.status, call.is_error, call.requires_approval) == ("failed", True, False)
    assert "may not have the assistant use send_email" in call.result
    assert session.scalar(select(func.count(OutgoingEmail.id))) == 0
    result = model.requests[-1]["messages"][-1]["content"][0]
    assert result["is_error"] and "Do not call it again" in result["content"]


def test_access_taken_away_while_a_call_waits_keeps_it_from_running(session, agent, new_loop, model):
    model.enqueue(
        Reply.message(reply(tool_use("issue_refund", {"invoice_id": 4471, "amount_cents": 6000, "reason": "late"})))
    )
    model.enqueue(Reply.message(reply(text("Noted."))))
    loop = new_loop()
    loop.ask_later("refund 4471")
    assert loop.complete() == "awaiting_approval"
    (call,) = session.scalars(select(ToolCall).where(ToolCall.conversation_id == loop.conversation.id)).all()
    set_access(session, agent, "issue_refund", who="chosen", roles=["admin"])
    decide(
        session, call, person(session, "reviewer@acme.test"), approve=True, arguments_seen=arguments_hash(call.input)
    )
    session.commit()
    loop.conversation.status = "queued"  # each move reads the settings afresh: a new Loop, as a worker makes
    fresh = type(loop)(session, loop.conversation, model=loop.model, tools=loop.tools, settings=loop.settings)
    assert fresh.complete() == "completed"
    session.refresh(call)
    assert call.status == "failed" and "may not have the assistant use issue_refund" in call.result
    assert session.scalar(select(func.count(Refund.id))) == 0


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"who": "some"}, "must be one of"),
        ({"who": "chosen"}, "at least one role or person"),
        ({"who": "chosen", "roles": ["boss"]}, "Unknown role 'boss'"),
        ({"who": "chosen", "user_ids": ["globex"]}, "your own organisation"),
    ],
)
def test_bad_settings_are_refused_in_words_and_nothing_is_stored(session, agent, values, says):
    if values.get("user_ids") == ["globex"]:
        values["user_ids"] = [person(session, "agent@globex.test").id]
    admin = person(session, "admin@acme.test")
    with pytest.raises(access.AccessError, match=says):
        access.save_access(session, agent.tenant_id, "issue_refund", by_user_id=admin.id, **values)
    assert access.access_for(session, agent.tenant_id, "issue_refund").version == 0


def test_a_disabled_owner_may_use_no_tool(session, agent):
    agent.active = False
    assert access.usable(session, agent, ["lookup_invoices"]) == frozenset()
