"""Sign-ins refused by the rate limits: the sign-in page again, with the e-mail kept and when to try
again, and the refusals audited by count (one event when blocking starts, then at 10, 100, ...)."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime

from sqlalchemy import select

from tests.accounts.people import new_user
from tests.clients import PASSWORD, Browser
from webapp.models import AuditEvent
from webapp.runtime.extensions import db


def from_address(app, address: str) -> Browser:
    browser = Browser(app)
    browser.client.environ_base["REMOTE_ADDR"] = address  # its own address: the address limit is its own
    return browser


def attempt(browser: Browser, email: str, password: str):
    token = browser.csrf_token("/login")
    return browser.post("/login", {"csrf_token": token, "email": email, "password": password})


def blocked_events() -> list[AuditEvent]:
    db.session.remove()
    return db.session.scalars(
        select(AuditEvent).where(AuditEvent.action == "sign_in_blocked").order_by(AuditEvent.id)
    ).all()


def test_a_locked_account_gets_the_sign_in_page_with_its_email_and_when_to_try_again(app):
    person = new_user()
    browser = from_address(app, f"10.1.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}")
    for _ in range(5):
        assert attempt(browser, person.email, "wrong-password").status_code == 401
    refused = attempt(browser, person.email, PASSWORD)  # even the right password, while locked
    page = refused.get_data(as_text=True)
    assert refused.status_code == 429
    assert "Too many failed sign-ins for this account; an admin can unlock it sooner." in page
    assert f'value="{person.email}"' in page and 'name="password"' in page  # the form, the e-mail kept
    assert PASSWORD not in page
    until = re.search(r'Try again after <time datetime="([^"]+)">(\d\d:\d\d) UTC</time> \(in (\d+) minutes?\)', page)
    assert until, page
    retry_at = datetime.fromisoformat(until.group(1))
    seconds = (retry_at - datetime.now(UTC)).total_seconds()
    assert 0 < seconds <= 15 * 60 + 1 and 1 <= int(until.group(3)) <= 15
    assert 0 < int(refused.headers["Retry-After"]) <= 15 * 60  # never "16 minutes" for a 15-minute lock


def test_blocked_sign_ins_are_audited_by_count_not_one_event_each(app):
    person = new_user()
    before = len(blocked_events())
    browser = from_address(app, f"10.2.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}")
    for _ in range(5):
        attempt(browser, person.email, "wrong-password")
    assert len(blocked_events()) == before  # failed sign-ins are not blocked ones

    assert attempt(browser, person.email, PASSWORD).status_code == 429
    events = blocked_events()[before:]
    assert len(events) == 1  # blocking starts: one event
    first = events[0]
    assert first.actor_label == person.email and first.outcome == "refused" and first.tenant_id == person.tenant_id
    assert first.data["limit"] == "account" and first.data["refused_in_window"] == 1
    assert first.data["target_user_id"] == person.id and first.data["until"]

    for _ in range(14):  # 15 refused in all: one more event, at the tenth
        assert attempt(browser, person.email, "any-password").status_code == 429
    events = blocked_events()[before:]
    assert [event.data["refused_in_window"] for event in events] == [1, 10]
    until = [datetime.fromisoformat(event.data["until"]) for event in events]
    assert abs((until[1] - until[0]).total_seconds()) <= 2  # the same window


def test_an_address_past_its_limit_is_blocked_whatever_the_email(app):
    address = f"10.3.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}"
    browser = from_address(app, address)
    for number in range(20):  # twenty different accounts, none locked, from one address
        assert attempt(browser, f"nobody-{number}-{uuid.uuid4().hex[:6]}@acme.test", "x").status_code == 401
    refused = attempt(browser, "agent@acme.test", PASSWORD)
    assert refused.status_code == 429
    page = refused.get_data(as_text=True)
    assert "Too many failed sign-ins from your address." in page and "Try again after" in page
    assert 'value="agent@acme.test"' in page
    event = blocked_events()[-1]
    assert event.data["limit"] == "address" and event.data["address"] == address
    assert event.data["refused_in_window"] == 1
    assert from_address(app, "10.4.0.1").get("/login").status_code == 200  # another address is not blocked
