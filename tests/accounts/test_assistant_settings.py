"""The assistant admin page: the register, extra rules and one tool call per reply, versioned and
audited, reaching the model's system prompt (and the API's disable_parallel_tool_use) for that
tenant only; bad input refused next to its field with what was typed kept."""

from __future__ import annotations

from html import unescape

import pytest
from sqlalchemy import select

from tests.clients import sign_in
from tests.conftest import wait_until
from tests.integration.test_workers import start, wait_status
from webapp.models import AssistantSettings, AuditEvent, Message, ModelCall, Tenant

ADMIN = "admin@acme.test"
RULES = "Never promise a refund date.\nSign every answer as Acme Billing."


@pytest.fixture
def admin(app):
    return sign_in(app, ADMIN)


def settings_of(read) -> list[tuple]:
    rows = read(lambda s: list(s.execute(select(AssistantSettings.version, AssistantSettings.register))))
    return sorted(rows)


def test_saved_settings_make_a_new_version_and_are_audited(admin, read):
    page = admin.get("/admin/assistant").get_data(as_text=True)
    assert "Never changed: the assistant works as built." in page and "claude-sonnet-5" in page
    saved = admin.post("/admin/assistant", {"register": "formal, no emoji", "rules": RULES})
    assert saved.status_code == 303
    page = admin.get("/admin/assistant").get_data(as_text=True)
    assert "Saved as version 1" in page and "formal, no emoji" in page and "(in force)" in page
    admin.post("/admin/assistant", {"register": "formal, no emoji", "rules": RULES, "one_call_per_reply": "on"})
    assert settings_of(read) == [(1, "formal, no emoji"), (2, "formal, no emoji")]
    events = read(
        lambda s: [
            e.data for e in s.scalars(select(AuditEvent).where(AuditEvent.action == "assistant_settings_changed"))
        ]
    )
    assert events[-1]["before"]["version"] == 1 and events[-1]["after"] == {
        "version": 2,
        "register": "formal, no emoji",
        "rules": RULES,
        "one_call_per_reply": True,
        "complex_words": [],
        "complex_length": None,
    }


@pytest.mark.parametrize(
    ("form", "says"),
    [
        ({"register": "formal\nand long", "rules": ""}, "The register is one line"),
        ({"register": "x" * 201, "rules": ""}, "The register is 201 characters; keep it to 200."),
        ({"register": "", "rules": "r" * 2001}, "The rules are 2,001 characters; keep them to 2,000."),
        ({"register": "plain", "rules": "", "tone": "warm"}, "This form has no field tone; reload the page."),
    ],
)
def test_bad_settings_are_refused_next_to_the_field_and_keep_what_was_typed(admin, read, form, says):
    refused = admin.post("/admin/assistant", form)
    page = refused.get_data(as_text=True)
    assert refused.status_code == 422 and says in page
    if form["rules"]:
        assert form["rules"] in page  # the textarea keeps the text
    assert settings_of(read) == []


def test_saving_the_settings_in_force_again_says_nothing_changed(admin, read):
    admin.post("/admin/assistant", {"register": "plain", "rules": ""})
    again = admin.post("/admin/assistant", {"register": " plain ", "rules": ""})
    assert again.status_code == 422 and "Nothing changed" in again.get_data(as_text=True)
    assert settings_of(read) == [(1, "plain")]


def test_only_admins_see_the_page(app):
    agent = sign_in(app, "agent@acme.test")
    assert agent.get("/admin/assistant").status_code == 403
    assert agent.post("/admin/assistant", {"register": "sloppy", "rules": ""}).status_code == 403


def test_the_model_is_sent_the_tenants_register_and_rules_and_one_call_per_reply(admin, app, api, workers, model, read):
    admin.post("/admin/assistant", {"register": "formal, no emoji", "rules": RULES, "one_call_per_reply": "on"})
    workers()
    # Two actions asked at once: with one call per reply, the model is asked to make them one by one.
    ours = start(api, 'Show invoices for customer 4471 and email customer 4471 saying "Thanks"')
    wait_status(api, ours, "awaiting_approval", "completed")
    first = model.requests[0]
    assert "How Acme Corp's admins ask you to write: formal, no emoji" in first["system"][0]["text"]
    assert "Never promise a refund date." in first["system"][0]["text"]
    assert first["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert all(
        len([b for b in body_reply["content"] if b["type"] == "tool_use"]) <= 1 for body_reply in replies(read, ours)
    )
    calls = read(lambda s: list(s.execute(select(ModelCall.conversation_id, ModelCall.settings_version))))
    assert {version for cid, version in calls if cid == ours} == {1}


def test_another_tenants_settings_never_reach_the_model(admin, api, workers, model):
    admin.post("/admin/assistant", {"register": "formal, no emoji", "rules": RULES})
    workers()
    theirs = api.as_("agent@globex.test").post("/api/conversations", json={"message": "Look up ada@example.com"})
    assert theirs.status_code == 201
    wait_until(lambda: model.requests, 30, "the model to be asked")
    assert all("formal, no emoji" not in body["system"][0]["text"] for body in model.requests)
    assert all("tool_choice" not in body for body in model.requests)


def replies(read, conversation_id: int) -> list[dict]:
    """The assistant's messages of the conversation, as stored."""
    rows = select(Message.content).where(Message.conversation_id == conversation_id, Message.role == "assistant")
    return [{"content": content} for content in read(lambda s: list(s.scalars(rows)))]


# --- the model and routing by difficulty ---------------------------------------------------------


def models_of(read, slug: str) -> tuple:
    """The tenant's endpoint and small endpoint (ids)."""
    query = select(Tenant.endpoint_id, Tenant.small_endpoint_id).where(Tenant.slug == slug)
    return tuple(read(lambda s: s.execute(query).one()))


@pytest.fixture
def env(env) -> dict[str, str]:
    """The private address the endpoints below are registered at (never called): OUTBOUND_ALLOW names it."""
    return {**env, "OUTBOUND_ALLOW": "10.0.0.7:8080"}


@pytest.fixture
def registered(cli):
    for name, model in (("big", "claude-sonnet-4-5"), ("mini", "claude-haiku-4-5")):
        added = cli(
            "endpoint", "add", name, "--base-url", "http://10.0.0.7:8080", "--model", model, "--api-key", "k",
            "--tenant", "acme",
        )  # fmt: skip
        assert added.exit_code == 0, added.output


def test_an_admin_chooses_the_endpoint_and_the_small_endpoint_among_the_registered_ones(admin, read, registered):
    page = admin.get("/admin/assistant").text
    assert "big: claude-sonnet-4-5" in page and "mini: claude-haiku-4-5" in page
    assert "10.0.0.7" not in page and "No routing by difficulty" in page  # (the servers are the operators')

    chosen = admin.post("/admin/assistant/model", {"endpoint": "big", "small_endpoint": "mini"})
    assert chosen.status_code == 303
    page = admin.get("/admin/assistant").text
    assert "The assistant is now served by big; simple questions go to mini." in page
    assert "simple ones run on <strong>claude-haiku-4-5</strong>" in page
    assert None not in models_of(read, "acme")
    assert models_of(read, "globex") == (None, None)  # another tenant's choice is untouched
    event = read(
        lambda s: s.scalar(
            select(AuditEvent).where(AuditEvent.action == "tenant_model_set").order_by(AuditEvent.id.desc())
        )
    )
    assert event.actor_label == ADMIN and event.data == {"endpoint": "big", "small_endpoint": "mini"}

    assert admin.post("/admin/assistant/model", {"endpoint": "default", "small_endpoint": ""}).status_code == 303
    assert models_of(read, "acme") == (None, None)


@pytest.mark.parametrize(
    ("form", "says"),
    [
        ({"endpoint": "big", "small_endpoint": "big"}, "The small endpoint is the endpoint itself"),
        ({"endpoint": "big", "small_endpoint": "", "tone": "warm"}, "This form has no field tone; reload the page."),
    ],
)
def test_a_model_choice_that_cannot_be_is_refused_with_the_choice_kept(admin, read, registered, form, says):
    refused = admin.post("/admin/assistant/model", form)
    assert refused.status_code == 422
    page = unescape(refused.text)
    assert says in page
    assert f'<option value="{form["endpoint"]}" selected>' in page
    assert models_of(read, "acme") == (None, None)


def test_routing_rules_are_saved_as_a_version_and_bad_ones_are_refused_with_what_was_typed(admin, read):
    rules = {"register": "", "rules": "", "complex_words": "Refund, close the account\nrefund", "complex_length": "400"}
    saved = admin.post("/admin/assistant", rules)
    assert saved.status_code == 303
    row = read(lambda s: s.scalar(select(AssistantSettings).order_by(AssistantSettings.id.desc())))
    assert (row.complex_words, row.complex_length) == ("refund\nclose the account", 400)
    assert "words: refund, close the account; over 400 characters" in admin.get("/admin/assistant").text

    typed = {"register": "", "rules": "", "complex_words": "dispute", "complex_length": "long"}
    refused = admin.post("/admin/assistant", typed)
    assert refused.status_code == 422
    page = unescape(refused.text)
    assert "'long' is not a number of characters, e.g. 400." in page
    assert 'aria-describedby="complex-length-error"' in page
    assert ">dispute</textarea>" in page and 'value="long"' in page
    short = admin.post("/admin/assistant", {"register": "", "rules": "", "complex_length": "5"})
    assert short.status_code == 422 and "between 20 and 100,000 characters" in short.text
