"""The webhook is a door to the operator's network only where OUTBOUND_ALLOW opens it: a private
address is refused in words when saved (and audited), and the receiver hears nothing; an allowed
receiver's answer is told by its HTTP status alone; a closed port, one that closes at once and one
that speaks something else read the same; no redirect is followed; and a name that turned to
127.0.0.1 after it was saved is refused when the desk connects. Through the real admin page."""

from __future__ import annotations

import socket
from html import unescape

import pytest
from sqlalchemy import select

from tests.accounts.people import last_event
from tests.clients import sign_in
from tests.conftest import desk_app, pushed
from tests.listeners import SECRET, Listener, closing_all
from tests.notify.test_notifications import Receiver, deliveries, words
from webapp.models import NotificationChannel
from webapp.runtime.extensions import db

TIMEOUT = "2"
NO_ANSWER = "could not be reached (no HTTP answer within 2 seconds)"


@pytest.fixture
def listeners():
    """Listeners started before the app, so that OUTBOUND_ALLOW can name their ports."""
    made = {
        "failing": Listener("http", status=500),  # an internal page: 500 with a secret in its body
        "target": Listener("http"),
        "closes": Listener("close"),
        "garbage": Listener("garbage"),
    }
    made["redirecting"] = Listener("http", status=302, location=made["target"].url("/inside"))
    with closing_all(made):
        yield made


@pytest.fixture
def outsider():
    """A receiver on a port OUTBOUND_ALLOW does not name."""
    with Receiver() as receiver:
        yield receiver


@pytest.fixture
def app(env, clean, listeners, closed):
    allowed = [each.allowed for each in listeners.values()] + [f"127.0.0.1:{closed}"]
    settings = {**env, "NOTIFY_TIMEOUT_SECONDS": TIMEOUT, "OUTBOUND_ALLOW": ",".join(allowed)}
    with pushed(desk_app(settings)) as app:
        yield app


def test_a_private_address_is_refused_when_saved_and_the_receiver_hears_nothing(app, outsider):
    admin = sign_in(app, "admin@acme.test")
    for url in (outsider.url, f"http://localhost:{outsider.port}/hooks", f"http://0x7f000001:{outsider.port}/"):
        refused = admin.post("/admin/notifications/webhook", {"url": url})
        assert refused.status_code == 422
        said = unescape(refused.text)
        assert "was refused: private address (" in said
        assert "an operator can allow this one with OUTBOUND_ALLOW=" in said
        assert f'value="{url}"' in refused.text  # what was typed is kept
    assert outsider.requests == []
    assert db.session.scalar(select(NotificationChannel.id)) is None  # nothing saved
    event = last_event("outbound_refused")
    assert event.outcome == "refused" and event.actor_label == "admin@acme.test"
    assert event.data == {"for": "webhook", "host": "0x7f000001", "port": outsider.port, "refused": "loopback"}


def test_an_allowed_receivers_failure_is_told_by_its_status_and_never_by_its_body(app, listeners):
    admin = sign_in(app, "admin@acme.test")
    assert admin.post("/admin/notifications/webhook", {"url": listeners["failing"].url("/hook")}).status_code == 201
    assert admin.post("/admin/notifications/webhook/test").status_code == 303
    html = admin.get("/admin/notifications").text
    page = words(html)
    sentence = "The webhook answered HTTP 500 (its receiver's own log says why)."
    assert f"The test webhook was not delivered: {sentence}" in page  # the flash
    assert f"Failed: {sentence}" in page  # the delivery log
    assert SECRET not in html and "db_password" not in html
    (row,) = deliveries()
    assert (row.http_status, row.error) == (500, sentence)


def test_a_closed_port_one_that_closes_and_one_that_is_not_http_read_the_same(app, listeners, closed):
    admin = sign_in(app, "admin@acme.test")
    said = []
    for url in (f"http://127.0.0.1:{closed}/", listeners["closes"].url(), listeners["garbage"].url()):
        saved = admin.post("/admin/notifications/webhook", {"url": url})
        assert saved.status_code in (201, 303), saved.text
        admin.post("/admin/notifications/webhook/test")
        said.append(deliveries()[-1].error)
    sentence = f"The webhook {NO_ANSWER}. Check its address, and that the receiver is up."
    assert said == [sentence] * 3
    assert SECRET not in words(admin.get("/admin/notifications").text)
    assert listeners["closes"].connections == 1 and listeners["garbage"].connections == 1  # they were reached


def test_no_redirect_is_followed(app, listeners):
    admin = sign_in(app, "admin@acme.test")
    admin.post("/admin/notifications/webhook", {"url": listeners["redirecting"].url("/hook")})
    admin.post("/admin/notifications/webhook/test")
    assert deliveries()[-1].error == "The webhook answered HTTP 302 (its receiver's own log says why)."
    assert listeners["redirecting"].connections == 1 and listeners["target"].connections == 0


def test_a_name_that_turns_to_127_0_0_1_after_it_was_saved_is_refused_when_the_desk_connects(
    app, outsider, monkeypatch
):
    """The name answered a public address when it was saved, and 127.0.0.1 when the test was sent."""
    real, asked = socket.getaddrinfo, []

    def getaddrinfo(host, port, *args, **kwargs):
        if host != "hooks.rebind.test":
            return real(host, port, *args, **kwargs)
        asked.append(host)
        return real("8.8.8.8" if len(asked) == 1 else "127.0.0.1", port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    admin = sign_in(app, "admin@acme.test")
    url = f"http://hooks.rebind.test:{outsider.port}/hooks/desk"
    assert admin.post("/admin/notifications/webhook", {"url": url}).status_code == 201  # public, then
    admin.post("/admin/notifications/webhook/test")
    (row,) = deliveries()
    assert row.status == "failed" and row.error.startswith(
        f"The address hooks.rebind.test:{outsider.port} was refused: private address "
        "(hooks.rebind.test resolves to a loopback address)."
    )
    assert outsider.requests == [] and len(asked) == 2
