"""The home page per role: the agent's open conversations, the reviewer's waiting calls, the
auditor's recent events, the admin's setup checklist, the operator's fleet; a person with several
roles sees each part. Plain test client, real database."""

from __future__ import annotations

import re
from contextlib import contextmanager

from sqlalchemy import select, update

from tests.clients import session_as
from webapp import audit_chain
from webapp.models import ApiToken, Conversation, Message, Tenant, ToolCall, ToolPolicy, User, utcnow
from webapp.runtime.extensions import db

OPERATOR = "operator@desk.test"


def _conversation(slug: str, title: str, status: str) -> Conversation:
    tenant = db.session.scalar(select(Tenant).where(Tenant.slug == slug))
    agent = db.session.scalar(select(User).where(User.email == f"agent@{slug}.test"))
    conversation = Conversation(tenant_id=tenant.id, user_id=agent.id, title=title, status=status)
    db.session.add(conversation)
    db.session.flush()
    return conversation


def _waiting_call(conversation: Conversation, name: str, customer: int) -> ToolCall:
    message = Message(conversation_id=conversation.id, seq=1, role="assistant", content=[])
    db.session.add(message)
    db.session.flush()
    call = ToolCall(
        conversation_id=conversation.id,
        tenant_id=conversation.tenant_id,
        message_id=message.id,
        position=0,
        tool_use_id=f"toolu_{conversation.id}",
        name=name,
        input={"customer_id": customer},
        acting_user_id=conversation.user_id,
        status="awaiting_approval",
    )
    db.session.add(call)
    db.session.flush()
    return call


def _setup() -> None:
    _conversation("acme", "Refund the late delivery", "awaiting_approval")
    _conversation("acme", "Close the old account", "completed")
    waiting = _conversation("acme", "Email about the invoice", "awaiting_approval")
    _waiting_call(waiting, "send_email", 4471)
    theirs = _conversation("globex", "Globex secret matter", "awaiting_approval")
    _waiting_call(theirs, "close_account", 8801)
    acme = db.session.scalar(select(Tenant).where(Tenant.slug == "acme"))
    audit_chain.record(db.session, "policy_changed", tenant_id=acme.id, actor_label="admin@acme.test")
    globex = db.session.scalar(select(Tenant).where(Tenant.slug == "globex"))
    audit_chain.record(db.session, "globex_only_action", tenant_id=globex.id, actor_label="someone@globex.test")
    db.session.commit()
    db.session.remove()


def page(app, email: str) -> str:
    response = session_as(app, email).get("/")
    assert response.status_code == 200
    return response.text


def part(html: str, part_id: str) -> str:
    """The text of one section of the page, tags stripped."""
    match = re.search(rf'<section class="card" id="{part_id}">(.*?)</section>', html, re.S)
    assert match, f"no #{part_id} on the page"
    return " ".join(re.sub(r"<[^>]+>", " ", match.group(1)).split())


def checklist(html: str) -> dict[str, str]:
    """The admin's checklist: each step's title and whether it is done or to do."""
    items = re.findall(r'<li class="check-(done|todo)-item">.*?<a href="[^"]+">([^<]+)</a>', html, re.S)
    return {title.replace("&#39;", "'"): state for state, title in items}


@contextmanager
def roles_of(email: str, roles: list[str]):
    user = db.session.scalar(select(User).where(User.email == email))
    before = list(user.roles)
    user.roles = roles
    db.session.commit()
    try:
        yield
    finally:
        user = db.session.scalar(select(User).where(User.email == email))
        user.roles = before
        db.session.commit()
        db.session.remove()


def test_the_agent_sees_their_open_conversations_and_nothing_of_other_roles(app):
    _setup()
    html = page(app, "agent@acme.test")
    agent = part(html, "home-agent")
    assert "Refund the late delivery" in agent and "Email about the invoice" in agent
    assert "waiting for approval" in agent
    assert "Close the old account" not in agent  # completed: not open
    assert "Globex secret matter" not in html
    for other in ("home-reviewer", "home-auditor", "home-admin", "home-fleet"):
        assert f'id="{other}"' not in html


def test_the_reviewer_sees_how_many_calls_wait_and_the_oldest(app):
    _setup()
    html = page(app, "reviewer@acme.test")
    reviewer = part(html, "home-reviewer")
    assert reviewer.startswith("Waiting for your decision 1 ")
    assert "send_email" in reviewer and "from agent@acme.test" in reviewer
    assert "close_account" not in reviewer  # globex's call
    assert 'id="home-agent"' not in html


def test_the_auditor_sees_the_latest_events_of_their_tenant(app):
    _setup()
    auditor = part(page(app, "auditor@acme.test"), "home-auditor")
    assert "policy_changed" in auditor and "admin@acme.test" in auditor
    assert "globex_only_action" not in auditor
    assert re.search(r'<time datetime="[^"]+Z" data-relative', page(app, "auditor@acme.test"))


def test_the_admins_checklist_says_what_is_done_and_links_each_step(app):
    _setup()
    # API tokens outlive a test (other tests' tokens may be here): start from none in force
    db.session.execute(update(ApiToken).values(revoked_at=utcnow()))
    db.session.commit()
    db.session.remove()
    html = page(app, "admin@acme.test")
    admin = part(html, "home-admin")
    assert checklist(html) == {
        "Policies set": "todo",
        "People in every role": "done",
        "API tokens": "todo",
        "Model endpoint": "todo",
        "The assistant's manner": "todo",
        "Nothing failed": "done",
    }
    assert "Policies set" in admin and "No tool has a policy yet" in admin
    assert "No program can use the API yet." in admin
    assert "1 failed conversation" not in admin and "No conversation is failed." in admin
    for endpoint in ("/admin/policies", "/admin/users", "/account/tokens", "/admin/assistant", "/ops"):
        assert f'href="{endpoint}' in html, endpoint

    acme = db.session.scalar(select(Tenant).where(Tenant.slug == "acme"))
    agent = db.session.scalar(select(User).where(User.email == "agent@acme.test"))
    db.session.add(ToolPolicy(tenant_id=acme.id, tool_name="issue_refund", mode="always"))
    db.session.add(ApiToken(user_id=agent.id, token_hash="f" * 64, name="crm"))
    _conversation("acme", "Broken one", "failed")
    db.session.commit()
    db.session.remove()
    admin = part(page(app, "admin@acme.test"), "home-admin")
    assert "1 tool policy says which calls wait" in admin
    assert "1 active token lets programs use the API." in admin
    assert "1 failed conversation waits for a retry." in admin
    assert checklist(page(app, "admin@acme.test")) | {"Nothing failed": "todo"} == checklist(html) | {
        "Policies set": "done",
        "API tokens": "done",
        "Nothing failed": "todo",
    }


def test_a_person_with_several_roles_sees_each_part(app):
    _setup()
    with roles_of("admin@acme.test", ["agent", "reviewer", "auditor", "admin"]):
        html = page(app, "admin@acme.test")
        for each in ("home-agent", "home-reviewer", "home-auditor", "home-admin"):
            assert f'id="{each}"' in html, each


def test_the_operator_sees_the_fleet(app):
    html = page(app, OPERATOR)
    fleet = part(html, "home-fleet")
    assert "workers" in fleet and "jobs queued" in fleet and "failed jobs" in fleet
    assert 'id="home-admin"' not in html and "Refund" not in html
