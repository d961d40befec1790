"""The billing pack's phrasebook for the offline demo model (demo/model/engine.py): how a support
agent asks for its tools in words, and how their results are told back.

It reads "Show invoices for customer 4471", "Look up ada@example.com", "Refund $12.50 on invoice 4471",
"Refund invoice 4471 in full for customer 4471" (the invoices looked up first, then the refund),
"Email customer 4471 saying "..."", "Close the account of customer 4470", "Verify customer 4471" and
"Export customer 4471's data"; several in one sentence become several calls in one turn, in the order
they are asked. Importing this module registers the phrasebook (once, however often it is imported).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from demo.model.engine import Call, FollowUp, Note, Phrasebook, Result, register_phrasebook
from webapp.tools.presenting import people

_QUOTE = r"[\"“]([^\"”]+)[\"”]"
_CUSTOMER = r"\bcustomer\s*#?\s*(\d+)"
_INVOICE = r"\binvoice\s*#?\s*(\d+)"
_EMAIL = r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
_LOOKUP_VERB = r"\b(?:look\s*up|lookup|find|search\s+for|who\s+is|who's)\b"
_FILLER = frozenset("the a an me up for customer customers named called please who is".split())
# What each tool lets the assistant do, for the help answer, in the order it says them.
_ABILITIES = {
    "lookup_customer": "look up customers",
    "lookup_invoices": "list a customer's invoices",
    "issue_refund": "refund invoices",
    "send_email": "email customers",
    "delete_account": "close accounts",
    "verify_identity": "verify a caller's identity",
    "export_customer_data": "export a customer's data",
}


@dataclass(frozen=True)
class _DeferredRefund:
    """A refund that needs the customer's invoices first (no amount, or no invoice number)."""

    customer_id: int
    invoice_id: int | None
    amount_cents: int | None
    reason: str


@dataclass
class _Plan:
    calls: list[Call] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    deferred_refund: _DeferredRefund | None = None


class BillingPhrases(Phrasebook):
    """The billing tools in words (demo/billing): customers, invoices, refunds, emails, accounts."""

    name = "billing"
    tools = frozenset(_ABILITIES)

    def read(self, text: str) -> tuple[list[Call], list[Note]]:
        plan = _plan(text)
        return plan.calls, plan.notes

    def describe(self, result: Result) -> str | None:
        describe = {
            "lookup_customer": _describe_customers,
            "lookup_invoices": _describe_invoices,
            "issue_refund": _describe_refund,
            "send_email": _describe_email,
            "delete_account": _describe_closure,
            "verify_identity": _describe_verification,
            "export_customer_data": _describe_export,
        }.get(result.tool)
        return describe(result.data, result.input) if describe else None

    def follow_up(self, request: str, results: list[Result], offered: frozenset[str]) -> FollowUp | None:
        """The refund a request asked for once the customer's invoices it needed are looked up."""
        deferred = _plan(request).deferred_refund
        found = [
            _records(result.data, "invoices")
            for result in results
            if not result.is_error and result.tool == "lookup_invoices"
        ]
        if not deferred or not found or "issue_refund" not in offered:
            return None
        return _follow_up_refund(deferred, [invoice for invoices in found for invoice in invoices])

    def help(self, offered: frozenset[str]) -> str:
        can = [phrase for tool, phrase in _ABILITIES.items() if tool in offered]
        if not can:
            return ""
        return (
            f"I can {people(can)}. For example: "
            "'refund $12.50 on invoice 4471', 'email customer 12 saying \"Thanks!\"' or "
            "'look up alice@example.com'."
        )


# --- a request in words ---------------------------------------------------------------------------


def _plan(text: str) -> _Plan:
    """Every action the text asks for, in the order it asks for them."""
    plan = _Plan()
    lowered = text.lower()
    refund = re.search(r"\brefund\b", lowered)
    if refund:
        _plan_refund(plan, text, refund.start())
    email = re.search(r"\b(?:e-?mail|write|message|notify)\s+(?:to\s+)?" + _CUSTOMER[2:], lowered)
    if email:
        _plan_email(plan, text, email)
    closing = re.search(r"\b(?:close|delete|terminate)\b", lowered)
    if closing and "account" in _sentence_at(lowered, closing.start()):
        _plan_close(plan, text, closing.start())
    invoices = re.search(r"\binvoices\b|\bbilling history\b", lowered)
    if invoices and not refund:
        _plan_invoices(plan, text, invoices.start())
    verify = re.search(r"\bverify\b|\bverification\b", lowered)
    if verify:
        _plan_for_customer(
            plan, text, verify.start(), "verify_identity", "verify the identity of customer {}", "Whose identity"
        )
    export = re.search(r"\bexport\b", lowered)
    if export:
        _plan_for_customer(
            plan, text, export.start(), "export_customer_data", "export customer {}'s data", "Whose data"
        )
    lookup = re.search(_LOOKUP_VERB, lowered)
    if lookup and not invoices and not refund and not verify and not export:
        _plan_lookup(plan, text, lookup)
    plan.calls.sort(key=lambda call: call.position)
    return plan


def _plan_refund(plan: _Plan, text: str, at: int) -> None:
    sentence = _sentence_at(text, at)
    invoice = _near(_INVOICE, text, at)
    amount = _amount_cents(text[at:]) or _amount_cents(sentence) or _amount_cents(text)
    customer = _near(_CUSTOMER, text, at)
    reason = sentence[:200]
    if invoice and amount:
        plan.calls.append(
            Call(
                at,
                "issue_refund",
                {"invoice_id": invoice, "amount_cents": amount, "reason": reason},
                f"refund {_dollars(amount)} on invoice {invoice}",
            )
        )
    elif customer:
        plan.calls.append(
            Call(
                at,
                "lookup_invoices",
                {"customer_id": customer},
                f"look up customer {customer}'s invoices first, to find what to refund",
            )
        )
        plan.deferred_refund = _DeferredRefund(customer, invoice, amount, reason)
    elif invoice:
        plan.notes.append(
            Note(
                at,
                f"How much should I refund on invoice {invoice}? Give me an amount, "
                f"e.g. $12.50, or the customer number so I can look the invoice up.",
            )
        )
    else:
        plan.notes.append(
            Note(at, "Which invoice should I refund, and how much? For example: refund $12.50 on invoice 4471.")
        )


def _plan_email(plan: _Plan, text: str, match: re.Match) -> None:
    customer = int(match.group(1))
    after = text[match.end() :]
    subject = re.search(r"\bsubject\s*:?\s*" + _QUOTE, after, re.IGNORECASE)
    saying = re.search(r"\bsaying\s*:?\s*" + _QUOTE, after, re.IGNORECASE)
    quotes = [q for q in re.findall(_QUOTE, after) if not subject or q != subject.group(1)]
    body = saying.group(1) if saying else (quotes[0] if quotes else None)
    email = {
        "customer_id": customer,
        "subject": subject.group(1) if subject else "An update on your account",
        "body": body
        or (
            "Hello,\n\nWe wanted to let you know that we have reviewed your account and "
            "everything is in order. Reply to this email if you have any questions.\n\n"
            "Best regards,\nThe billing team"
        ),
    }
    plan.calls.append(Call(match.start(), "send_email", email, f"email customer {customer}"))


def _plan_close(plan: _Plan, text: str, at: int) -> None:
    sentence = _sentence_at(text, at)
    customer = _near(_CUSTOMER, text, at)
    if customer is None:
        plan.notes.append(Note(at, "Whose account should I close? Give me the customer number."))
        return
    plan.calls.append(
        Call(
            at,
            "delete_account",
            {"customer_id": customer, "reason": sentence[:200]},
            f"close the account of customer {customer}",
        )
    )


def _plan_for_customer(plan: _Plan, text: str, at: int, tool: str, phrase: str, whose: str) -> None:
    customer = _near(_CUSTOMER, text, at)
    if customer is None:
        verb = phrase.split()[0]
        plan.notes.append(Note(at, f"{whose} should I {verb}? Give me the customer number."))
        return
    plan.calls.append(Call(at, tool, {"customer_id": customer}, phrase.format(customer)))


def _plan_invoices(plan: _Plan, text: str, at: int) -> None:
    sentence = _sentence_at(text, at).lower()
    customer = _near(_CUSTOMER, text, at)
    if customer is None:
        plan.notes.append(Note(at, "Whose invoices should I look up? Give me the customer number."))
        return
    query: dict[str, Any] = {"customer_id": customer}
    status = re.search(r"\b(open|unpaid|paid|refunded)\b", sentence)
    if status:
        query["status"] = "open" if status.group(1) == "unpaid" else status.group(1)
    limit = _find_int(r"\b(?:last|latest|recent|first)\s+(\d+)\b", sentence)
    if limit:
        query["limit"] = limit
    which = f"{query['status']} " if "status" in query else ""
    plan.calls.append(Call(at, "lookup_invoices", query, f"look up customer {customer}'s {which}invoices"))


def _plan_lookup(plan: _Plan, text: str, match: re.Match) -> None:
    rest = re.split(r"[.!?](?:\s|$)|\n", text[match.end() :], maxsplit=1)[0]
    quoted = re.search(_QUOTE, text[match.end() :])
    email = re.search(_EMAIL, text[match.end() :])
    customer = _find_int(_CUSTOMER, text[match.start() :])
    if quoted:
        query = quoted.group(1)
    elif email:
        query = email.group(0)
    elif customer:
        query = str(customer)
    else:
        words = re.sub(r"[?!.,;:]+$", "", rest.strip()).split()
        while words and words[0].lower() in _FILLER:
            words.pop(0)
        query = " ".join(words)
    if not query:
        plan.notes.append(Note(match.start(), "Who should I look up? A name, an email or a customer number works."))
        return
    plan.calls.append(Call(match.start(), "lookup_customer", {"query": query}, f'look up "{query}"'))


# --- the refund after the invoices ----------------------------------------------------------------


def _follow_up_refund(refund: _DeferredRefund, invoices: list[dict]) -> FollowUp:
    """The second step of a refund that needed the customer's invoices looked up first."""
    if refund.invoice_id is not None:
        named = [inv for inv in invoices if _int(_pick(inv, "id", "invoice_id")) == refund.invoice_id]
        invoice = named[0] if named else None
        missing = f"Invoice {refund.invoice_id} isn't among customer {refund.customer_id}'s invoices"
    else:
        invoice = next((inv for inv in invoices if _pick(inv, "status") == "paid" and _refundable(inv)), None)
        missing = f"Customer {refund.customer_id} has no paid invoice left to refund"
    if invoice is None or not (refund.amount_cents or _refundable(invoice)):
        reason = missing if invoice is None else f"Invoice {refund.invoice_id} has nothing left to refund"
        return FollowUp(f"{reason}, so I haven't refunded anything.")
    invoice_id = _int(_pick(invoice, "id", "invoice_id"))
    amount = refund.amount_cents or _refundable(invoice)
    left = _dollars(_refundable(invoice))
    text = f"Invoice {invoice_id} has {left} left to refund, so I'll refund {_dollars(amount)} on it."
    call = {"invoice_id": invoice_id, "amount_cents": amount, "reason": refund.reason}
    return FollowUp(text, (Call(0, "issue_refund", call, f"refund {_dollars(amount)} on invoice {invoice_id}"),))


# --- results in words -----------------------------------------------------------------------------


def _describe_customers(data: Any, call_input: dict) -> str:
    customers = _records(data, "customers")
    if not customers:
        return f'No customer matched "{call_input.get("query", "")}".'
    described = [_customer_line(c) for c in customers]
    if len(described) == 1:
        return f"Found {described[0]}."
    return f"Found {len(described)} customers: " + "; ".join(described) + "."


def _customer_line(customer: dict) -> str:
    details = [f"id {_pick(customer, 'id', 'customer_id')}"]
    if _pick(customer, "email"):
        details.append(str(customer["email"]))
    if _pick(customer, "plan"):
        details.append(f"plan {customer['plan']}")
    return f"{_pick(customer, 'name') or 'a customer'} ({', '.join(details)})"


def _describe_invoices(data: Any, call_input: dict) -> str:
    invoices = _records(data, "invoices")
    who = f"Customer {call_input['customer_id']}" if "customer_id" in call_input else "The customer"
    status = f"{call_input['status']} " if call_input.get("status") else ""
    if not invoices:
        return f"{who} has no {status}invoices."
    listed = "; ".join(
        " ".join(
            str(part)
            for part in (
                f"#{_pick(inv, 'id', 'invoice_id')}",
                _dollars(_cents_of(inv) or 0),
                _pick(inv, "status"),
            )
            if part
        )
        for inv in invoices
    )
    noun = "invoice" if len(invoices) == 1 else "invoices"
    return f"{who} has {len(invoices)} {status}{noun}: {listed}."


def _describe_refund(data: Any, call_input: dict) -> str:
    record = data if isinstance(data, dict) else {}
    refund_id = _pick(record, "refund_id", "id")
    amount = _cents_of(record) or call_input.get("amount_cents") or 0
    invoice = _pick(record, "invoice_id") or call_input.get("invoice_id")
    named = f" {refund_id}" if refund_id is not None else ""
    return f"Refund{named} of {_dollars(amount)} issued on invoice {invoice}."


def _describe_email(data: Any, call_input: dict) -> str:
    record = data if isinstance(data, dict) else {}
    to = _pick(record, "to", "email", "recipient") or f"customer {call_input.get('customer_id')}"
    subject = _pick(record, "subject") or call_input.get("subject", "")
    return f'Email sent to {to} with the subject "{subject}".'


def _describe_closure(data: Any, call_input: dict) -> str:
    record = data if isinstance(data, dict) else {}
    customer = _pick(record, "customer_id") or call_input.get("customer_id")
    if record.get("already_closed"):
        return f"The account of customer {customer} was already closed."
    cancelled = _int(record.get("cancelled_subscriptions")) or 0
    subscriptions = f" and cancelled {cancelled} subscription{'s' if cancelled != 1 else ''}" if cancelled else ""
    return f"Closed the account of customer {customer}{subscriptions}."


def _describe_verification(data: Any, call_input: dict) -> str:
    record = data if isinstance(data, dict) else {}
    customer = _pick(record, "customer_id") or call_input.get("customer_id")
    return f"The caller is verified as customer {customer}: they read back the right code."


def _describe_export(data: Any, call_input: dict) -> str:
    record = data if isinstance(data, dict) else {}
    customer = _pick(record, "customer_id") or call_input.get("customer_id")
    size = _int(record.get("bytes"))
    return (
        f"Customer {customer}'s data is exported to {record.get('file', 'a file')}"
        + (f" ({size:,} bytes" if size is not None else " (")
        + f", {record.get('invoices', 0)} invoices and {record.get('refunds', 0)} refunds)."
    )


# --- records --------------------------------------------------------------------------------------


def _records(data: Any, key: str) -> list[dict]:
    if isinstance(data, dict) and isinstance(data.get(key), list):
        data = data[key]
    elif isinstance(data, dict) and isinstance(data.get(key.rstrip("s")), dict):
        data = [data[key.rstrip("s")]]
    if isinstance(data, list):
        return [item for item in data if isinstance(item, dict)]
    return [data] if isinstance(data, dict) and data and key not in data else []


def _pick(record: dict, *keys: str) -> Any:
    return next((record[k] for k in keys if record.get(k) not in (None, "")), None)


def _cents_of(record: dict) -> int | None:
    cents = _pick(record, "amount_cents", "total_cents")
    if cents is not None:
        return _int(cents)
    dollars = _pick(record, "amount", "total")
    try:
        return int(Decimal(str(dollars)) * 100) if dollars is not None else None
    except ArithmeticError:
        return None


def _refundable(invoice: dict) -> int:
    return max(0, (_cents_of(invoice) or 0) - (_int(invoice.get("refunded_cents")) or 0))


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


# --- words ----------------------------------------------------------------------------------------


def _sentence_start(text: str, at: int) -> int:
    starts = [m.end() for m in re.finditer(r"[.!?]\s+|\n", text[:at])]
    return starts[-1] if starts else 0


def _sentence_at(text: str, at: int) -> str:
    start = _sentence_start(text, at)
    end = re.search(r"[.!?](?:\s|$)|\n", text[at:])
    stop = at + end.start() + 1 if end else len(text)
    return text[start:stop].strip()


def _near(pattern: str, text: str, at: int) -> int | None:
    """The number `pattern` captures after `at` in its sentence, else anywhere in the sentence or text."""
    sentence_start = _sentence_start(text, at)
    sentence = _sentence_at(text, at)
    return (
        _find_int(pattern, sentence[at - sentence_start :]) or _find_int(pattern, sentence) or _find_int(pattern, text)
    )


def _find_int(pattern: str, text: str) -> int | None:
    match = re.search(pattern, text, re.IGNORECASE)
    return int(match.group(1)) if match else None


def _amount_cents(text: str) -> int | None:
    dollars = re.search(
        r"\$\s*(\d[\d,]*(?:\.\d{1,2})?)|(\d[\d,]*(?:\.\d{1,2})?)\s*(?:dollars?|usd)\b", text, re.IGNORECASE
    )
    if dollars:
        return int(Decimal((dollars.group(1) or dollars.group(2)).replace(",", "")) * 100)
    return _find_int(r"\b(\d+)\s*cents?\b", text)


def _dollars(cents: int) -> str:
    return f"${Decimal(cents) / 100:,.2f}"


register_phrasebook(BillingPhrases())
