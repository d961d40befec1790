"""The operators' model endpoints page and the command line beside it: register and change an
endpoint with the same checks and messages as `flask endpoint add`, the key write-only (stored
encrypted, never shown back, not even after a refused form), every change audited; and
`flask tenant set-model --small-endpoint`."""

from __future__ import annotations

from html import unescape

import pytest
from sqlalchemy import func, select

from tests.clients import sign_in
from webapp.llm import keys
from webapp.models import ModelEndpoint, Tenant

OPERATOR = "operator@desk.test"
SECRET = "sk-page-secret-4471"
GOOD = {
    "name": "local-qwen",
    "base_url": "http://127.0.0.1:11434",
    "model": "qwen3:8b",
    "protocol": "react",
    "context_window": "32000",
    "api_key": SECRET,
    "api_key_env": "",
}


@pytest.fixture
def env(env) -> dict[str, str]:
    """The local addresses these endpoints are registered at (never called): OUTBOUND_ALLOW names them."""
    return {**env, "OUTBOUND_ALLOW": "127.0.0.1:11434,127.0.0.1:9"}


@pytest.fixture
def operator(app):
    return sign_in(app, OPERATOR)


def test_an_operator_registers_an_endpoint_whose_key_is_never_shown_back(app, operator, read, events):
    assert "Model endpoints" in operator.get("/").text
    added = operator.post("/ops/endpoints", GOOD)
    assert added.status_code == 303

    page = operator.get("/ops/endpoints").text
    assert "Added local-qwen: qwen3:8b at http://127.0.0.1:11434 (react, 32,000-token window" in page
    assert "key stored encrypted" in page and SECRET not in page
    endpoint = read(lambda s: s.scalar(select(ModelEndpoint)))
    assert (endpoint.model, endpoint.protocol, endpoint.context_window) == ("qwen3:8b", "react", 32000)
    assert SECRET not in endpoint.api_key_encrypted
    assert keys.api_key(endpoint, app.extensions["desk"].config) == SECRET
    (event,) = events("endpoint_added")
    assert event.actor_label == OPERATOR and event.tenant_id is None
    assert event.data["key"] == "key stored encrypted" and SECRET not in str(event.data)

    edit = operator.get("/ops/endpoints/local-qwen").text
    assert "key stored encrypted" in edit and SECRET not in edit and 'name="api_key" value=""' in edit


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"base_url": "ftp://models"}, "base_url", "'ftp://models' is not a base URL"),
        ({"name": "Local Qwen!"}, "name", "is not an endpoint name"),
        ({"model": " "}, "model", "Name the model to ask at this endpoint"),
        ({"api_key_env": "MODEL_KEY_QWEN"}, "api_key", "not both"),
        ({"context_window": "lots"}, "context_window", "'lots' is not a number of tokens"),
        ({"context_window": "1000"}, "context_window", "leaves no room"),
        ({"protocol": "json"}, "protocol", "The protocol must be one of tools, react, not 'json'."),
        ({"colour": "blue"}, None, "This form has no field colour; reload the page."),
    ],
)
def test_a_bad_endpoint_form_says_what_to_fix_keeps_what_was_typed_but_the_key_and_stores_nothing(
    operator, read, events, change, field, says
):
    before = len(events("endpoint_added"))
    refused = operator.post("/ops/endpoints", {**GOOD, **change})

    assert refused.status_code == 422
    page = unescape(refused.text)
    assert says in page and "The key was not kept: type it again." in page
    assert SECRET not in page
    if field:
        assert f'aria-describedby="{field}-error"' in page
    for name in ("base_url", "model"):
        assert f'value="{change.get(name, GOOD[name])}"' in page
    assert read(lambda s: s.scalar(select(func.count()).select_from(ModelEndpoint))) == 0
    assert len(events("endpoint_added")) == before


def test_a_second_endpoint_of_the_same_name_is_refused(operator, read):
    assert operator.post("/ops/endpoints", GOOD).status_code == 303
    again = operator.post("/ops/endpoints", {**GOOD, "api_key": ""})
    assert again.status_code == 422 and "An endpoint named local-qwen already exists; pick another name." in again.text
    assert "The key was not kept" not in again.text  # (none was typed)


def test_an_operator_changes_an_endpoint_and_its_key_stays_unless_replaced_or_dropped(app, operator, read, events):
    operator.post("/ops/endpoints", GOOD)
    config = app.extensions["desk"].config
    fields = {key: GOOD[key] for key in ("base_url", "model", "protocol", "context_window")}

    changed = operator.post("/ops/endpoints/local-qwen", {**fields, "model": "qwen3:14b", "api_key": ""})
    assert changed.status_code == 303
    endpoint = read(lambda s: s.scalar(select(ModelEndpoint)))
    assert endpoint.model == "qwen3:14b" and keys.api_key(endpoint, config) == SECRET  # the key kept
    (event,) = events("endpoint_changed")
    assert event.data["before"]["model"] == "qwen3:8b" and event.data["after"]["model"] == "qwen3:14b"
    assert event.data["key_replaced"] is False and SECRET not in str(event.data)

    nothing = operator.post("/ops/endpoints/local-qwen", {**fields, "model": "qwen3:14b"})
    assert nothing.status_code == 422 and "Nothing changed" in nothing.text

    bad = operator.post("/ops/endpoints/local-qwen", {**fields, "base_url": "127.0.0.1", "api_key": "sk-new"})
    assert bad.status_code == 422 and "is not a base URL" in unescape(bad.text) and "sk-new" not in bad.text
    assert 'value="127.0.0.1"' in bad.text and "type it again" in bad.text

    operator.post("/ops/endpoints/local-qwen", {**fields, "model": "qwen3:14b", "api_key_env": "MODEL_KEY_QWEN"})
    assert "key from $MODEL_KEY_QWEN" in operator.get("/ops/endpoints").text
    operator.post("/ops/endpoints/local-qwen", {**fields, "model": "qwen3:14b", "forget_key": "on"})
    endpoint = read(lambda s: s.scalar(select(ModelEndpoint)))
    assert endpoint.api_key_encrypted is None and endpoint.api_key_env is None
    assert operator.get("/ops/endpoints/nope").status_code == 404


def test_tenant_people_may_not_use_the_endpoints_page(app):
    admin = sign_in(app, "admin@acme.test")
    assert admin.get("/ops/endpoints").status_code == 403
    assert admin.post("/ops/endpoints", GOOD).status_code == 403


def test_set_model_takes_a_small_endpoint_that_exists_and_differs(cli, read, events):
    for name in ("big", "mini"):
        assert cli("endpoint", "add", name, "--base-url", "http://127.0.0.1:9", "--model", name).exit_code == 0

    routed = cli("tenant", "set-model", "acme", "--endpoint", "big", "--small-endpoint", "mini")
    assert routed.exit_code == 0, routed.output
    assert "Tenant acme is now served by big; simple questions go to mini." in routed.output
    assert "small endpoint of acme" in cli("endpoint", "list").output
    unknown = cli("tenant", "set-model", "acme", "--endpoint", "big", "--small-endpoint", "nope")
    assert unknown.exit_code == 2 and "There is no endpoint 'nope' (registered: big, mini)" in unknown.output
    same = cli("tenant", "set-model", "acme", "--endpoint", "mini")  # the small endpoint kept: now the same
    assert same.exit_code == 2 and "The small endpoint is the endpoint itself" in same.output
    tenant = read(lambda s: s.scalar(select(Tenant).where(Tenant.slug == "acme")))
    assert tenant.small_endpoint_id is not None  # nothing changed by the refusals
    kept = cli("tenant", "set-model", "acme", "--endpoint", "default")
    assert "served by default; simple questions go to mini" in kept.output
    off = cli("tenant", "set-model", "acme", "--endpoint", "big", "--small-endpoint", "none")
    assert "no routing by difficulty" in off.output
    assert read(lambda s: s.scalar(select(Tenant.small_endpoint_id).where(Tenant.slug == "acme"))) is None
    audited = [e.data for e in events("tenant_model_set")]
    assert audited[0] == {"endpoint": "big", "small_endpoint": "mini"}
    assert audited[-1] == {"endpoint": "big", "small_endpoint": None} and len(audited) == 3
