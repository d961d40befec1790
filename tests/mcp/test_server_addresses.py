"""An MCP server's URL is a door to the operator's network only where OUTBOUND_ALLOW opens it: a
private address is refused in words before anything connects (and audited); where it is allowed, a
closed port, one that closes at once, one that speaks something else and one that never answers all
read the same, never with what the port sent; an HTTP answer is named by its status; no redirect is
followed. Through the real admin page and `flask mcp`."""

from __future__ import annotations

import re
from html import unescape

import pytest
from sqlalchemy import select

from tests.accounts.people import last_event
from tests.clients import sign_in
from tests.conftest import desk_app, pushed
from tests.listeners import SECRET, Listener, closing_all
from webapp.models import McpServer, Tenant
from webapp.runtime.extensions import db


@pytest.fixture
def listeners():
    """Listeners started before the app, so that OUTBOUND_ALLOW can name their ports."""
    made = {
        "closes": Listener("close"),
        "garbage": Listener("garbage"),
        "silent": Listener("silent"),
        "target": Listener("http"),
        "outsider": Listener("http"),  # the one OUTBOUND_ALLOW does not name
    }
    made["redirecting"] = Listener("http", status=302, location=made["target"].url("/mcp"))
    made["missing"] = Listener("http", status=404)
    with closing_all(made):
        yield made


@pytest.fixture
def app(env, clean, listeners, closed):
    allowed = [each.allowed for name, each in listeners.items() if name != "outsider"] + [f"127.0.0.1:{closed}"]
    settings = {**env, "MCP_TIMEOUT_SECONDS": "3", "OUTBOUND_ALLOW": ",".join(allowed)}
    with pushed(desk_app(settings)) as app:
        yield app


def added(admin, url: str):
    return admin.post("/admin/mcp", {"name": "inventory", "url": url, "headers": ""})


def said(page) -> str:
    """The page's refusal, as a person reads it."""
    found = re.search(r'<p class="error" role="alert" id="mcp-error">(.*?)</p>', page.text, re.S)
    return unescape(found.group(1)) if found else f"(no refusal on the page: HTTP {page.status_code})"


def test_a_private_address_is_refused_before_anything_connects(app, cli, listeners):
    outsider = listeners["outsider"]
    refused = added(sign_in(app, "admin@acme.test"), outsider.url("/mcp"))
    assert refused.status_code == 422
    assert said(refused) == (
        f"The address http://127.0.0.1:{outsider.port} was refused: private address (127.0.0.1, loopback). "
        f"The desk calls only public addresses; an operator can allow this one with OUTBOUND_ALLOW=127.0.0.1:"
        f"{outsider.port}."
    )
    from_cli = cli("mcp", "add", "inventory", "--url", f"http://2130706433:{outsider.port}/mcp", "--tenant", "acme")
    assert from_cli.exit_code == 2 and "refused: private address (127.0.0.1, loopback)" in from_cli.output
    assert outsider.connections == 0
    assert db.session.scalar(select(McpServer.id)) is None
    event = last_event("outbound_refused")
    assert event.actor_label == "command line" and event.data["for"] == "mcp server"
    assert event.data["host"] == "2130706433"


def test_closed_filtered_and_non_http_ports_read_the_same(app, listeners, closed):
    admin = sign_in(app, "admin@acme.test")
    ports = {
        "closed": closed,
        **{name: listeners[name].port for name in ("closes", "garbage", "silent")},
    }
    refusals = {}
    for name, port in ports.items():
        refused = added(admin, f"http://127.0.0.1:{port}/mcp")
        assert refused.status_code == 422
        refusals[name] = said(refused)
        assert SECRET not in refused.text and "SSH-2.0" not in refused.text
    assert refusals == {
        name: f"The MCP server inventory at http://127.0.0.1:{port}/mcp could not be reached (no HTTP answer within "
        "3 seconds). Check the address (and its headers), and that the server is up."
        for name, port in ports.items()
    }
    assert all(listeners[name].connections >= 1 for name in ("closes", "garbage", "silent"))  # reached, allowed


def test_an_http_answer_is_named_by_its_status_and_no_redirect_is_followed(app, listeners):
    admin = sign_in(app, "admin@acme.test")
    missing = added(admin, listeners["missing"].url("/mcp"))
    assert "could not be reached (it answered HTTP 404)" in said(missing) and SECRET not in missing.text
    redirected = added(admin, listeners["redirecting"].url("/mcp"))
    assert "could not be reached (it answered HTTP 302)" in said(redirected)
    assert listeners["target"].connections == 0


def test_a_server_stored_at_a_private_address_is_refused_at_its_sync_without_a_connection(app, cli, listeners):
    outsider = listeners["outsider"]
    tenant_id = db.session.scalar(select(Tenant.id).where(Tenant.slug == "acme"))
    db.session.add(McpServer(tenant_id=tenant_id, name="legacy", url=outsider.url("/mcp"), headers=[], version=1))
    db.session.commit()
    synced = cli("mcp", "sync", "legacy", "--tenant", "acme")
    assert synced.exit_code == 2
    assert f"The address 127.0.0.1:{outsider.port} was refused: private address (127.0.0.1, loopback)" in (
        synced.output
    )
    assert outsider.connections == 0
