"""The billing tools, run through the registry the way the loop runs them."""

from __future__ import annotations

import itertools
import json

import pytest
from pydantic import BaseModel
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from demo.billing.models import Customer, Invoice, OutgoingEmail, Refund, Subscription
from demo.billing.seed import INJECTION_NOTE, seed_demo
from demo.billing.tools import TOOLS, demo_registry
from webapp.models import Tenant, User
from webapp.tools.registry import Tool, ToolContext, ToolRegistry, unwrap_output

GLOBEX_CUSTOMER = 8802
GLOBEX_INVOICE = 8905
_keys = itertools.count(1)


@pytest.fixture
def registry():
    return demo_registry()


def context_for(session: Session, email: str = "agent@acme.test", key: str | None = None) -> ToolContext:
    user = session.scalar(select(User).where(User.email == email))
    return ToolContext(session, user.id, user.tenant_id, 1, key or f"call-{next(_keys)}")


def run(registry: ToolRegistry, session: Session, name: str, raw: dict, **kw):
    return registry.run(name, raw, context_for(session, **kw), output_limit=8000)


def data(outcome) -> dict:
    assert not outcome.is_error, outcome.content
    return json.loads(unwrap_output(outcome.content))


def count(session: Session, model) -> int:
    return session.scalar(select(func.count()).select_from(model))


# --- happy paths ----------------------------------------------------------------------------------


def test_lookup_customer_by_id_email_and_name(registry, session):
    by_id = data(run(registry, session, "lookup_customer", {"query": "4471"}))
    assert [c["id"] for c in by_id["customers"]] == [4471]
    assert by_id["customers"][0]["notes"] == INJECTION_NOTE
    assert set(by_id["customers"][0]) == {"id", "name", "email", "plan", "status", "notes"}

    by_email = data(run(registry, session, "lookup_customer", {"query": "PRIYA.raman@"}))
    assert [c["name"] for c in by_email["customers"]] == ["Priya Raman"]

    by_name = data(run(registry, session, "lookup_customer", {"query": "chen"}))
    assert [c["id"] for c in by_name["customers"]] == [4472]

    assert data(run(registry, session, "lookup_customer", {"query": "example"}))["count"] <= 10


def test_lookup_customer_treats_like_wildcards_literally(registry, session):
    assert data(run(registry, session, "lookup_customer", {"query": "%"}))["customers"] == []
    assert data(run(registry, session, "lookup_customer", {"query": "_"}))["customers"] == []


def test_lookup_invoices_newest_first_with_filter_and_limit(registry, session):
    out = data(run(registry, session, "lookup_invoices", {"customer_id": 4471}))
    invoices = out["invoices"]
    assert len(invoices) == 4
    assert [i["issued_at"] for i in invoices] == sorted((i["issued_at"] for i in invoices), reverse=True)
    assert invoices[0]["status"] == "open"
    assert {"id": 4471, "amount_cents": 12_900, "status": "paid"}.items() <= invoices[1].items()
    assert invoices[1]["issued_at"].startswith("2025-05-01T09:00:00")

    paid = data(run(registry, session, "lookup_invoices", {"customer_id": 4471, "status": "paid", "limit": 2}))
    assert [i["status"] for i in paid["invoices"]] == ["paid", "paid"]
    assert paid["invoices"][0]["id"] == 4471


def test_issue_refund_partial_then_full(registry, session):
    first = data(run(registry, session, "issue_refund", {"invoice_id": 4471, "amount_cents": 2_900, "reason": "r"}))
    assert first["invoice_id"] == 4471 and first["amount_cents"] == 2_900
    assert first["remaining_refundable_cents"] == 10_000 and first["already_existed"] is False
    assert session.get(Invoice, 4471).status == "paid"

    second = data(run(registry, session, "issue_refund", {"invoice_id": 4471, "amount_cents": 10_000, "reason": "r"}))
    assert second["remaining_refundable_cents"] == 0
    assert session.get(Invoice, 4471).status == "refunded"
    refund = session.get(Refund, second["refund_id"])
    assert refund.created_by_id == context_for(session).user_id
    assert refund.tenant_id == session.scalar(select(Tenant.id).where(Tenant.slug == "acme"))

    again = run(registry, session, "issue_refund", {"invoice_id": 4471, "amount_cents": 1, "reason": "r"})
    assert again.is_error and "fully refunded" in again.content


def test_send_email_goes_to_the_customer_on_file(registry, session):
    out = data(run(registry, session, "send_email", {"customer_id": 4466, "subject": "Hello", "body": "Hi Priya"}))
    assert out["to"] == "priya.raman@example.com" and out["subject"] == "Hello"
    email = session.get(OutgoingEmail, out["email_id"])
    assert email.body == "Hi Priya" and email.created_by_id == context_for(session).user_id


def test_delete_account_closes_and_cancels_then_is_idempotent(registry, session):
    out = data(run(registry, session, "delete_account", {"customer_id": 4468, "reason": "asked to leave"}))
    assert out["status"] == "closed" and out["cancelled_subscriptions"] == 1
    customer = session.get(Customer, 4468)
    assert customer.closed_reason == "asked to leave" and customer.closed_at is not None
    subs = session.scalars(select(Subscription.status).where(Subscription.customer_id == 4468)).all()
    assert subs == ["cancelled"]

    again = data(run(registry, session, "delete_account", {"customer_id": 4468, "reason": "again"}))
    assert again["status"] == "closed" and again["cancelled_subscriptions"] == 0 and again["already_closed"]
    assert session.get(Customer, 4468).closed_reason == "asked to leave"


# --- refusals -------------------------------------------------------------------------------------


def test_refund_over_the_refundable_amount_is_refused(registry, session):
    out = run(registry, session, "issue_refund", {"invoice_id": 4471, "amount_cents": 12_901, "reason": "r"})
    assert out.is_error and "more than the $129.00 left to refund on invoice 4471" in out.content
    data(run(registry, session, "issue_refund", {"invoice_id": 4471, "amount_cents": 12_000, "reason": "r"}))
    out = run(registry, session, "issue_refund", {"invoice_id": 4471, "amount_cents": 901, "reason": "r"})
    assert out.is_error and "A refund of $9.01 is more than the $9.00 left" in out.content
    assert count(session, Refund) == 1


def test_refund_refused_for_void_open_invoices_and_closed_accounts(registry, session):
    session.get(Invoice, 4400).status = "void"
    session.flush()
    void = run(registry, session, "issue_refund", {"invoice_id": 4400, "amount_cents": 100, "reason": "r"})
    assert void.is_error and "void" in void.content

    open_invoice = session.scalar(select(Invoice).where(Invoice.customer_id == 4471, Invoice.status == "open"))
    unpaid = run(registry, session, "issue_refund", {"invoice_id": open_invoice.id, "amount_cents": 100, "reason": "r"})
    assert unpaid.is_error and "open" in unpaid.content

    closed_invoice = session.scalar(select(Invoice.id).where(Invoice.customer_id == 4473))
    closed = run(registry, session, "issue_refund", {"invoice_id": closed_invoice, "amount_cents": 100, "reason": "r"})
    assert closed.is_error and "closed" in closed.content
    assert count(session, Refund) == 0


def test_other_tenants_ids_read_like_missing_ids(registry, session):
    assert session.get(Customer, GLOBEX_CUSTOMER).status == "active"
    assert session.get(Invoice, GLOBEX_INVOICE).status == "paid"
    calls = [
        ("lookup_customer", {"query": str(GLOBEX_CUSTOMER)}),
        ("lookup_customer", {"query": "Ines"}),
        ("lookup_invoices", {"customer_id": GLOBEX_CUSTOMER}),
        ("issue_refund", {"invoice_id": GLOBEX_INVOICE, "amount_cents": 100, "reason": "r"}),
        ("send_email", {"customer_id": GLOBEX_CUSTOMER, "subject": "s", "body": "b"}),
        ("delete_account", {"customer_id": GLOBEX_CUSTOMER, "reason": "r"}),
    ]
    for name, raw in calls:
        outcome = run(registry, session, name, raw)
        if name == "lookup_customer":
            assert data(outcome)["customers"] == []
            continue
        missing = {**raw, **{k: 999_999 for k in ("customer_id", "invoice_id") if k in raw}}
        nonexistent = run(registry, session, name, missing)
        assert outcome.is_error and nonexistent.is_error
        assert outcome.content == nonexistent.content.replace("999999", str(raw.get("invoice_id", GLOBEX_CUSTOMER)))
        assert "in your account" in outcome.content
    session.expire_all()
    assert count(session, Refund) == 0 and count(session, OutgoingEmail) == 0
    assert session.get(Customer, GLOBEX_CUSTOMER).status == "active"
    assert session.get(Invoice, GLOBEX_INVOICE).status == "paid"
    assert session.scalar(select(Subscription.status).where(Subscription.customer_id == GLOBEX_CUSTOMER)) == "active"


def test_globex_agent_sees_only_globex(registry, session):
    assert data(run(registry, session, "lookup_customer", {"query": "4471"}, email="agent@globex.test"))["count"] == 0
    out = data(run(registry, session, "lookup_customer", {"query": "8802"}, email="agent@globex.test"))
    assert [c["id"] for c in out["customers"]] == [GLOBEX_CUSTOMER]


# --- idempotency ----------------------------------------------------------------------------------


def test_same_idempotency_key_refunds_once(registry, session):
    raw = {"invoice_id": 4471, "amount_cents": 5_000, "reason": "goodwill"}
    first = data(run(registry, session, "issue_refund", raw, key="job-1"))
    second = data(run(registry, session, "issue_refund", raw, key="job-1"))
    assert second["refund_id"] == first["refund_id"] and second["already_existed"] is True
    assert second["remaining_refundable_cents"] == 7_900
    assert count(session, Refund) == 1


def test_retried_full_refund_returns_the_refund_not_an_error(registry, session):
    raw = {"invoice_id": 4471, "amount_cents": 12_900, "reason": "goodwill"}
    first = data(run(registry, session, "issue_refund", raw, key="job-full"))
    second = data(run(registry, session, "issue_refund", raw, key="job-full"))
    assert second["refund_id"] == first["refund_id"] and second["already_existed"]


def test_same_idempotency_key_emails_once(registry, session):
    raw = {"customer_id": 4466, "subject": "Receipt", "body": "Your refund is on its way."}
    first = data(run(registry, session, "send_email", raw, key="job-2"))
    second = data(run(registry, session, "send_email", raw, key="job-2"))
    assert second["email_id"] == first["email_id"] and second["already_existed"] is True
    assert count(session, OutgoingEmail) == 1


# --- validation and failures ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "raw", "field"),
    [
        ("issue_refund", {"invoice_id": 4471, "amount_cents": -5, "reason": "r"}, "amount_cents"),
        ("issue_refund", {"invoice_id": 4471, "amount_cents": 10_000_001, "reason": "r"}, "amount_cents"),
        ("issue_refund", {"invoice_id": 4471, "amount_cents": 100, "reason": "r", "force": True}, "force"),
        ("issue_refund", {"invoice_id": "abc", "amount_cents": 100, "reason": "r"}, "invoice_id"),
        ("issue_refund", {"invoice_id": 4471, "amount_cents": 100, "reason": "   "}, "reason"),
        ("lookup_invoices", {"customer_id": 0}, "customer_id"),
        ("lookup_invoices", {"customer_id": 4471, "status": "void"}, "status"),
        ("lookup_invoices", {"customer_id": 4471, "limit": 51}, "limit"),
        ("lookup_customer", {"query": "x" * 201}, "query"),
        ("send_email", {"customer_id": 4466, "subject": "s"}, "body"),
        ("delete_account", {"customer_id": [4466], "reason": "r"}, "customer_id"),
    ],
)
def test_invalid_input_names_the_field(registry, session, name, raw, field):
    outcome = run(registry, session, name, raw)
    assert outcome.is_error
    assert field in outcome.content
    assert count(session, Refund) == 0 and count(session, OutgoingEmail) == 0


def test_a_crashing_tool_leaves_none_of_its_writes(session):
    class Crashes(Tool):
        name = "crashes"
        title = "Crashes"
        description = "Writes, then fails."

        class Input(BaseModel):
            pass

        def execute(self, input, context):  # noqa: A002
            context.session.get(Customer, 4466).status = "closed"
            context.session.add(
                OutgoingEmail(
                    tenant_id=context.tenant_id,
                    customer_id=4466,
                    to_address="x@example.com",
                    subject="s",
                    body="b",
                    idempotency_key=context.idempotency_key,
                    created_by_id=context.user_id,
                )
            )
            context.session.flush()
            raise RuntimeError("boom")

    outcome = ToolRegistry([Crashes]).run("crashes", {}, context_for(session), output_limit=8000)
    assert outcome.is_error and "failed unexpectedly (RuntimeError)" in outcome.content
    session.commit()
    session.expire_all()
    assert count(session, OutgoingEmail) == 0
    assert session.get(Customer, 4466).status == "active"


def test_output_is_capped(registry, session):
    outcome = registry.run("lookup_invoices", {"customer_id": 4469}, context_for(session), output_limit=100)
    assert not outcome.is_error
    assert "[output truncated: 100 of" in outcome.content


# --- definitions and seed -------------------------------------------------------------------------


def test_definitions_are_clean_schemas():
    tools = list(TOOLS)
    assert [t.name for t in tools] == [
        "lookup_customer",
        "lookup_invoices",
        "issue_refund",
        "send_email",
        "delete_account",
        "verify_identity",
        "export_customer_data",
    ]
    assert [t.sensitive for t in tools] == [False, False, True, True, True, False, False]
    assert [t.resumable() for t in tools] == [False] * 5 + [True, True]
    for tool in tools:
        definition = tool.definition()
        schema = definition["input_schema"]
        assert definition["name"] == tool.name and len(definition["description"]) > 80 and tool.title
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        assert "title" not in schema
        for prop in schema["properties"].values():
            assert "title" not in prop and prop.get("description")
    invoices = demo_registry().get("lookup_invoices").definition()["input_schema"]
    assert invoices["properties"]["status"]["enum"] == ["open", "paid", "refunded"]
    assert invoices["required"] == ["customer_id"]
    refund = demo_registry().get("issue_refund").definition()["input_schema"]["properties"]["amount_cents"]
    assert (refund["minimum"], refund["maximum"]) == (1, 10_000_000)


def test_seed_demo_is_idempotent(session):
    counts = {m: count(session, m) for m in (Tenant, User, Customer, Subscription, Invoice)}
    first = seed_demo(session)
    assert seed_demo(session) == first
    session.flush()
    assert {m: count(session, m) for m in counts} == counts
    demo_users = select(func.count(User.id)).where(User.email.in_([login["email"] for login in first]))
    assert len(first) == 9 and session.scalar(demo_users) == 9
    assert {(d["email"], d["tenant"]) for d in first} >= {
        ("reviewer2@acme.test", "acme"),
        ("agent@globex.test", "globex"),
    }
    assert all(d["password"] == "demo-password" for d in first)


def test_seed_plants_customer_and_invoice_4471(session):
    acme = session.scalar(select(Tenant).where(Tenant.slug == "acme"))
    assert acme.name == "Acme Corp"
    customer, invoice = session.get(Customer, 4471), session.get(Invoice, 4471)
    assert customer.tenant_id == acme.id and customer.notes == INJECTION_NOTE
    assert (invoice.customer_id, invoice.status, invoice.amount_cents, invoice.tenant_id) == (
        4471,
        "paid",
        12_900,
        acme.id,
    )
    amounts = session.scalars(select(Invoice.amount_cents)).all()
    assert min(amounts) >= 1_500 and max(amounts) <= 120_000
    per_customer = session.execute(select(Invoice.customer_id, func.count()).group_by(Invoice.customer_id)).all()
    assert len(per_customer) == 16 and all(3 <= n <= 6 for _, n in per_customer)


# --- what a reviewer is told before a call runs ---------------------------------------------------


def review(registry: ToolRegistry, session: Session, name: str, raw: dict, email: str = "agent@acme.test"):
    return registry.review(name, raw, context_for(session, email))


def facts(record) -> dict:
    return {fact.label: fact.value for fact in record.facts}


def test_a_refund_review_shows_the_invoice_as_it_is_now_and_what_is_left(registry, session):
    data(run(registry, session, "issue_refund", {"invoice_id": 4471, "amount_cents": 2_900, "reason": "r"}))
    seen = review(registry, session, "issue_refund", {"invoice_id": 4471, "amount_cents": 4_000, "reason": "r"})
    invoice, customer = seen.records
    assert (invoice.title, customer.title) == ("Invoice 4471", "Customer 4471")
    shown = facts(invoice)
    assert shown["Total"] == "$129.00" and shown["Status"] == "paid"
    assert shown["Refunded so far"] == "$29.00 (1 refund)" and shown["Left to refund"] == "$100.00"
    assert facts(customer)["Email"] == "jordan.ellis@example.com"
    assert seen.concerns == ()


def test_a_refund_review_warns_when_the_refund_cannot_succeed_as_asked(registry, session):
    too_much = review(registry, session, "issue_refund", {"invoice_id": 4471, "amount_cents": 999_999, "reason": "r"})
    (concern,) = too_much.concerns
    assert concern.field == "amount_cents"
    assert concern.message == (
        "A refund of $9,999.99 is more than the $129.00 left to refund on invoice 4471 (total $129.00)."
    )
    unpaid = session.scalar(select(Invoice).where(Invoice.customer_id == 4471, Invoice.status == "open"))
    (concern,) = review(
        registry, session, "issue_refund", {"invoice_id": unpaid.id, "amount_cents": 100, "reason": "r"}
    ).concerns
    assert concern.field == "invoice_id" and "is open (unpaid); there is nothing to refund" in concern.message
    (invoice, _customer) = review(
        registry, session, "issue_refund", {"invoice_id": unpaid.id, "amount_cents": 100, "reason": "r"}
    ).records
    assert facts(invoice)["Left to refund"] == "nothing until it is paid"
    elsewhere = review(
        registry, session, "issue_refund", {"invoice_id": GLOBEX_INVOICE, "amount_cents": 1, "reason": "r"}
    )
    assert elsewhere.records == () and elsewhere.concerns[0].message == f"No invoice {GLOBEX_INVOICE} in your account."


def test_an_email_review_shows_the_email_the_customer_would_get(registry, session):
    seen = review(registry, session, "send_email", {"customer_id": 4471, "subject": "Hello", "body": "Your refund."})
    assert seen.letter.to == "Jordan Ellis <jordan.ellis@example.com>"
    assert (seen.letter.subject, seen.letter.body) == ("Hello", "Your refund.")


def test_closing_an_account_review_lists_what_is_still_open(registry, session):
    (customer,) = review(registry, session, "delete_account", {"customer_id": 4471, "reason": "asked"}).records
    shown = facts(customer)
    assert shown["Active subscriptions (cancelled by closing)"].startswith("standard, $")
    assert shown["Unpaid invoices (stay open)"].startswith("invoice ")
    closed = review(registry, session, "delete_account", {"customer_id": 4473, "reason": "again"})
    assert "already closed" in closed.concerns[0].message
