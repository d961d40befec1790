"""A registered model endpoint is reached through the outbound guard: a private base URL is refused
when it is registered or changed (and audited), one stored before is refused at its call, in words
and without a connection, and a redirect is not followed (the SDK's own client would follow it). The
desk's default model (ANTHROPIC_BASE_URL) is the operator's own setting and is not guarded."""

from __future__ import annotations

from html import unescape

import pytest
from sqlalchemy import func, select

from tests.accounts.people import last_event
from tests.clients import sign_in
from tests.listeners import SECRET, Listener
from webapp.config import Config
from webapp.llm import choice, grants
from webapp.llm.client import ModelError
from webapp.models import ModelEndpoint


@pytest.fixture
def listener():
    made = Listener("http")
    yield made
    made.close()


def test_a_private_base_url_is_refused_when_registered_or_changed(app, cli, read, listener):
    added = cli("endpoint", "add", "local", "--base-url", listener.url(), "--model", "qwen3:8b")
    assert added.exit_code == 2
    assert f"The address http://127.0.0.1:{listener.port} was refused: private address (127.0.0.1, loopback)" in (
        added.output
    )
    assert read(lambda s: s.scalar(select(func.count()).select_from(ModelEndpoint))) == 0
    event = last_event("outbound_refused")
    assert event.tenant_id is None and event.actor_label == "command line"
    assert event.data == {"for": "model endpoint", "host": "127.0.0.1", "port": listener.port, "refused": "loopback"}

    assert cli("endpoint", "add", "remote", "--base-url", "https://8.8.8.8", "--model", "m").exit_code == 0
    operator = sign_in(app, "operator@desk.test")
    changed = operator.post(
        "/ops/endpoints/remote",
        {"base_url": f"http://10.0.0.7:{listener.port}", "model": "m", "protocol": "tools", "context_window": ""},
    )
    assert changed.status_code == 422
    assert "was refused: private address (10.0.0.7, private network)" in unescape(changed.text)
    assert read(lambda s: s.scalar(select(ModelEndpoint.base_url))) == "https://8.8.8.8"
    assert last_event("outbound_refused").actor_label == "operator@desk.test"
    assert listener.connections == 0


def _client_of(session, tmp_path, base_url: str, allow: str = ""):
    """The tenant's client as a worker builds it, for an endpoint stored as is (no check on the way in)."""
    config = Config.from_env(
        {"SECRET_KEY": "k", "MODEL_MAX_RETRIES": "0", "INSTANCE_PATH": str(tmp_path), "OUTBOUND_ALLOW": allow}
    )
    session.add(ModelEndpoint(name="stored", base_url=base_url, model="m", protocol="tools"))
    session.flush()
    tenant, _ = grants.set_tenant_endpoint(session, "acme", "stored", None, allow=True)  # the operator's choice
    session.commit()
    return choice.choice_for(session, config, tenant.id).client


def test_an_endpoint_stored_at_a_private_address_fails_its_call_in_words_without_connecting(
    session, tmp_path, listener
):
    client = _client_of(session, tmp_path, listener.url())
    with pytest.raises(ModelError) as failed:
        client.ask("Say hi.", "hi", 16)
    assert failed.value.code == "address_refused" and not failed.value.transient  # a setting to change
    assert failed.value.message.startswith(
        f"The address 127.0.0.1:{listener.port} was refused: private address (127.0.0.1, loopback)."
    )
    assert failed.value.message.endswith("Ask the desk's operator.")
    assert listener.connections == 0


def test_an_endpoint_that_redirects_is_not_followed(session, tmp_path, listener):
    redirecting = Listener("http", status=302, location=listener.url("/v1/messages"))
    try:
        client = _client_of(session, tmp_path, redirecting.url(), allow=f"{redirecting.allowed},{listener.allowed}")
        with pytest.raises(ModelError) as failed:
            client.ask("Say hi.", "hi", 16)
        assert redirecting.connections == 1 and listener.connections == 0
        assert failed.value.message.startswith("The model service answered HTTP 302, a redirect")
        assert SECRET not in failed.value.message
    finally:
        redirecting.close()
