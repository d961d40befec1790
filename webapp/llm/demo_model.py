"""The offline demo model: a deterministic stand-in for Claude that speaks the billing domain.

respond(request) turns a Messages API request body into a complete Messages API response body. It
reads the last user message: tool results are answered in plain words (one line per result); a
request in words becomes tool_use blocks, one per action asked for, for the tools the request offers.
Same request, same response, down to the ids. Test hooks in the user's text ([[long answer]],
[[max tokens]], [[refusal]], [[invalid tool input]], [[unknown tool]]) force the awkward cases.

Any other tool the request offers (an MCP server's, a team's pack) is called with `[[call TOOL
{json}]]` or by the words of its name (webapp/llm/demo_calls.py). When a sentence names such a tool
and the billing phrases read something in it too, the named tool wins if the sentence also holds
another of its words (its server's name, a word of its description or an argument's name: "look up
A-1 in the inventory"); otherwise the billing phrases win ("look up Alice Moore").
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from webapp.llm import demo_calls
from webapp.tools.registry import unwrap_output

_QUOTE = r"[\"“]([^\"”]+)[\"”]"
_CUSTOMER = r"\bcustomer\s*#?\s*(\d+)"
_INVOICE = r"\binvoice\s*#?\s*(\d+)"
_EMAIL = r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
_LOOKUP_VERB = r"\b(?:look\s*up|lookup|find|search\s+for|who\s+is|who's)\b"
_FILLER = frozenset("the a an me up for customer customers named called please who is".split())
# The billing tools the phrases below speak for; any other tool offered is reached through demo_calls.
PHRASED_TOOLS = frozenset(
    {
        "lookup_customer",
        "lookup_invoices",
        "issue_refund",
        "send_email",
        "delete_account",
        "verify_identity",
        "export_customer_data",
    }
)


@dataclass(frozen=True)
class _Call:
    position: int
    tool: str
    input: dict
    phrase: str


@dataclass(frozen=True)
class _Note:
    position: int
    text: str


@dataclass(frozen=True)
class _DeferredRefund:
    """A refund that needs the customer's invoices first (no amount, or no invoice number)."""

    customer_id: int
    invoice_id: int | None
    amount_cents: int | None
    reason: str


@dataclass
class _Plan:
    calls: list[_Call]
    notes: list[_Note]
    deferred_refund: _DeferredRefund | None = None


def respond(request: dict) -> dict:
    """The demo model's complete Messages API response (a dict) to a request body."""
    messages = request.get("messages") or []
    offered = [tool for tool in request.get("tools") or [] if isinstance(tool, dict) and tool.get("name")]
    if (request.get("tool_choice") or {}).get("type") == "none":
        offered = []
    tools = {tool["name"] for tool in offered}
    user_index = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    if user_index is None:
        content, stop = [_text(_help(offered))], "end_turn"
    elif _tool_results(messages[user_index]) and not _newest_text(messages[user_index]):
        content, stop = _answer_results(messages, user_index, tools)
    else:  # a new question, possibly sent after a stopped round: answer the newest words
        content, stop = _answer_text(_newest_text(messages[user_index]), offered)
    content = [_with_id(block, i, messages) for i, block in enumerate(content)]
    return {
        "id": "msg_demo_" + _digest({**request, "stream": None}),
        "type": "message",
        "role": "assistant",
        "model": request.get("model", "demo"),
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": _usage(request, content, stop),
    }


# --- a request in words ---------------------------------------------------------------------------


def _answer_text(text: str, offered: list[dict]) -> tuple[list[dict], str]:
    tools = {tool["name"] for tool in offered}
    lowered = text.lower()
    if "[[invalid tool input]]" in lowered:
        return [
            _text("I'll issue that refund."),
            _tool_use("issue_refund", {"invoice_id": "not-a-number"}),
        ], "tool_use"
    if "[[unknown tool]]" in lowered:
        return [
            _text("I'll teleport the customer."),
            _tool_use("teleport_customer", {"customer_id": 1}),
        ], "tool_use"
    if "[[long answer]]" in lowered:
        return [_text(_long_answer())], "end_turn"
    if "[[max tokens]]" in lowered:
        return [
            _text("Here is a very thorough answer that keeps going past the token limit, so it stops")
        ], "max_tokens"
    if "[[refusal]]" in lowered:
        return [_text("I can't help with that request.")], "refusal"

    if demo_calls.has_call_syntax(text):  # written calls: nothing else in the message is a request
        written, refused = demo_calls.written_calls(text, offered)
        return _turn(written, [note.text for note in refused], offered)

    plan = _plan(text)
    others = [tool for tool in offered if tool["name"] not in PHRASED_TOOLS]
    worded, worded_notes = demo_calls.worded_calls(text, others)
    phrased = [*(call for call in plan.calls if call.tool in tools), *plan.notes]  # an unoffered tool's claims nothing

    def phrased_in(span: tuple[int, int]) -> bool:
        return any(span[0] <= item.position < span[1] for item in phrased)

    # The part of a sentence that names another tool is that tool's, unless the billing phrases read it
    # too and the sentence holds none of the tool's other words (then "look up Alice" stays a customer
    # lookup). A mere suggestion never takes words the phrases read.
    worded = [call for call in worded if call.context > 0 or not phrased_in(call.span)]
    worded_notes = [note for note in worded_notes if (note.context > 0 and not note.guess) or not phrased_in(note.span)]
    claimed = [item.span for item in [*worded, *worded_notes] if not getattr(item, "guess", False)]

    def unclaimed(item: Any) -> bool:
        return not any(start <= item.position < end for start, end in claimed)

    calls = [call for call in plan.calls if call.tool in tools and unclaimed(call)]
    notes = [*(note for note in plan.notes if unclaimed(note)), *worded_notes]
    said = [note.text for note in sorted(notes, key=lambda n: n.position)]
    said += [
        f"I can't {call.phrase} here: the {call.tool} tool isn't available."
        for call in plan.calls
        if call.tool not in tools and unclaimed(call)
    ]
    return _turn(sorted([*calls, *worded], key=lambda call: call.position), said, offered)


def _turn(calls: list, notes: list[str], offered: list[dict]) -> tuple[list[dict], str]:
    """The reply: "I'll ..." and a tool_use block per call, the notes after; only words without calls."""
    if not calls:
        return [_text(" ".join(notes) if notes else _help(offered))], "end_turn"
    intro = "I'll " + _join([call.phrase for call in calls]) + "."
    return [_text(" ".join([intro, *notes])), *(_tool_use(c.tool, c.input) for c in calls)], "tool_use"


def _plan(text: str) -> _Plan:
    """Every action the text asks for, in the order it asks for them."""
    plan = _Plan(calls=[], notes=[])
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
            _Call(
                at,
                "issue_refund",
                {"invoice_id": invoice, "amount_cents": amount, "reason": reason},
                f"refund {_dollars(amount)} on invoice {invoice}",
            )
        )
    elif customer:
        plan.calls.append(
            _Call(
                at,
                "lookup_invoices",
                {"customer_id": customer},
                f"look up customer {customer}'s invoices first, to find what to refund",
            )
        )
        plan.deferred_refund = _DeferredRefund(customer, invoice, amount, reason)
    elif invoice:
        plan.notes.append(
            _Note(
                at,
                f"How much should I refund on invoice {invoice}? Give me an amount, "
                f"e.g. $12.50, or the customer number so I can look the invoice up.",
            )
        )
    else:
        plan.notes.append(
            _Note(at, "Which invoice should I refund, and how much? For example: refund $12.50 on invoice 4471.")
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
    plan.calls.append(_Call(match.start(), "send_email", email, f"email customer {customer}"))


def _plan_close(plan: _Plan, text: str, at: int) -> None:
    sentence = _sentence_at(text, at)
    customer = _near(_CUSTOMER, text, at)
    if customer is None:
        plan.notes.append(_Note(at, "Whose account should I close? Give me the customer number."))
        return
    plan.calls.append(
        _Call(
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
        plan.notes.append(_Note(at, f"{whose} should I {verb}? Give me the customer number."))
        return
    plan.calls.append(_Call(at, tool, {"customer_id": customer}, phrase.format(customer)))


def _plan_invoices(plan: _Plan, text: str, at: int) -> None:
    sentence = _sentence_at(text, at).lower()
    customer = _near(_CUSTOMER, text, at)
    if customer is None:
        plan.notes.append(_Note(at, "Whose invoices should I look up? Give me the customer number."))
        return
    query: dict[str, Any] = {"customer_id": customer}
    status = re.search(r"\b(open|unpaid|paid|refunded)\b", sentence)
    if status:
        query["status"] = "open" if status.group(1) == "unpaid" else status.group(1)
    limit = _find_int(r"\b(?:last|latest|recent|first)\s+(\d+)\b", sentence)
    if limit:
        query["limit"] = limit
    which = f"{query['status']} " if "status" in query else ""
    plan.calls.append(_Call(at, "lookup_invoices", query, f"look up customer {customer}'s {which}invoices"))


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
        plan.notes.append(_Note(match.start(), "Who should I look up? A name, an email or a customer number works."))
        return
    plan.calls.append(_Call(match.start(), "lookup_customer", {"query": query}, f'look up "{query}"'))


# --- tool results ---------------------------------------------------------------------------------


def _answer_results(messages: list[dict], user_index: int, tools: set[str]) -> tuple[list[dict], str]:
    previous = messages[user_index - 1] if user_index > 0 else {}
    uses = {b.get("id"): b for b in _blocks(previous) if b.get("type") == "tool_use"}
    results = _tool_results(messages[user_index])
    lines = []
    for result in results:
        use = uses.get(result.get("tool_use_id"), {})
        lines.append(_describe_result(use.get("name", "the tool"), use.get("input") or {}, result))
    summary = lines[0] if len(lines) == 1 else "Here's what happened:\n" + "\n".join(f"- {line}" for line in lines)

    original = _original_request(messages, user_index)
    deferred = _plan(original).deferred_refund if original else None
    invoices = [
        _records(_result_data(r), "invoices")
        for r in results
        if not r.get("is_error") and uses.get(r.get("tool_use_id"), {}).get("name") == "lookup_invoices"
    ]
    if deferred and invoices and "issue_refund" in tools:
        return _follow_up_refund(summary, deferred, [inv for found in invoices for inv in found])
    return [_text(summary)], "end_turn"


def _follow_up_refund(summary: str, refund: _DeferredRefund, invoices: list[dict]) -> tuple[list[dict], str]:
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
        return [_text(f"{summary}\n\n{reason}, so I haven't refunded anything.")], "end_turn"
    invoice_id = _int(_pick(invoice, "id", "invoice_id"))
    amount = refund.amount_cents or _refundable(invoice)
    text = (
        f"{summary}\n\nInvoice {invoice_id} has {_dollars(_refundable(invoice))} left to refund, "
        f"so I'll refund {_dollars(amount)} on it."
    )
    call = {"invoice_id": invoice_id, "amount_cents": amount, "reason": refund.reason}
    return [_text(text), _tool_use("issue_refund", call)], "tool_use"


def _describe_result(name: str, call_input: dict, result: dict) -> str:
    text = _result_text(result)
    edit = _edit_note(text)
    if edit:  # a person changed the arguments: what ran is what to describe, and the change is news
        call_input = edit["ran"]
        text = text.split("\n", 1)[1] if "\n" in text else ""
    if result.get("is_error"):
        return _describe_error(name, text)
    data = _result_data(result)
    describe = {
        "lookup_customer": _describe_customers,
        "lookup_invoices": _describe_invoices,
        "issue_refund": _describe_refund,
        "send_email": _describe_email,
        "delete_account": _describe_closure,
        "verify_identity": _describe_verification,
        "export_customer_data": _describe_export,
    }.get(name)
    described = describe(data, call_input) if describe else demo_calls.describe_result(name, data)
    return described + (_describe_edit(edit) if edit else "")


_EDIT_NOTE = re.compile(
    r"^Note from the approval desk: a person \((?P<who>.*?)\) changed the arguments before approving\. "
    r"You asked for (?P<asked>\{.*\}); the tool ran with (?P<ran>\{.*\})\.$"
)


def _edit_note(text: str) -> dict | None:
    """The desk's note that a person edited the call: who, what was asked, what ran."""
    match = _EDIT_NOTE.match(text.split("\n", 1)[0])
    if not match:
        return None
    try:
        return {"who": match["who"], "asked": json.loads(match["asked"]), "ran": json.loads(match["ran"])}
    except ValueError:
        return None


def _describe_edit(edit: dict) -> str:
    asked, ran = edit["asked"], edit["ran"]
    changed = [
        f"{key.removesuffix('_cents').removesuffix('_id').replace('_', ' ')} from {_shown(key, asked.get(key))} "
        f"to {_shown(key, ran.get(key))}"
        for key in sorted({*asked, *ran})
        if asked.get(key) != ran.get(key)
    ]
    who = edit["who"].split(" (")[0]
    return f" {who} changed the {_join(changed)} before approving." if changed else ""


def _shown(key: str, value: Any) -> str:
    if key.endswith("_cents") and isinstance(value, int):
        return _dollars(value)
    return f'"{value}"' if isinstance(value, str) else str(value)


def _describe_error(name: str, text: str) -> str:
    if text.startswith("Declined by a person"):
        return f"A person declined {name} ({_decline_reason(text)}), so I have not done it."
    if text.startswith("No decision was made in time"):
        return f"Nothing was done for {name}, because no decision came in time."
    if text.startswith("Cancelled"):
        detail = _first_sentence(text.split(":", 1)[1]) if ":" in text else ""
        nothing = ", so nothing was done" if "Nothing was done" in text else ""
        return f"{name} was cancelled{f' ({detail})' if detail else ''}{nothing}."
    reason = _first_sentence(unwrap_output(text).strip()) or "no details given"
    return f"{name} failed: {_brief(reason)}"


def _first_sentence(text: str) -> str:
    """The first sentence, without its full stop: what happened, never the advice that follows it."""
    first = re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0] if text.strip() else ""
    return first.rstrip(".")


def _decline_reason(text: str) -> str:
    """The reviewer's reason in a rejection (what follows "Declined by a person (who): " up to the
    desk's closing words, which are for me, not for the person I answer)."""
    rest = text[len("Declined by a person") :]
    marker = re.search(r"\):\s*|:\s*", rest)
    reason = rest[marker.end() :] if marker else rest
    reason = reason.split(". Nothing was done.")[0]
    reason = reason.strip(" \t\n.,;:-—\"'()")
    return reason or "no reason given"


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


# --- message helpers ------------------------------------------------------------------------------


def _blocks(message: dict) -> list[dict]:
    content = message.get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _text_of(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in _blocks(message) if b.get("type") == "text")


def _newest_text(message: dict) -> str:
    """The last thing the person wrote in this turn (a turn can hold several texts after a stop)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    texts = [b.get("text", "") for b in _blocks(message) if b.get("type") == "text" and b.get("text", "").strip()]
    return texts[-1] if texts else ""


def _tool_results(message: dict) -> list[dict]:
    return [b for b in _blocks(message) if b.get("type") == "tool_result"]


def _original_request(messages: list[dict], user_index: int) -> str:
    """The person's words the current tool results serve: the latest user text at or before user_index."""
    for message in reversed(messages[: user_index + 1]):
        if message.get("role") == "user" and _text_of(message).strip():
            return _text_of(message)
    return ""


def _result_text(result: dict) -> str:
    content = result.get("content")
    if isinstance(content, list):
        return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return content if isinstance(content, str) else ""


def _result_data(result: dict) -> Any:
    inner = unwrap_output(_result_text(result))
    try:
        return json.loads(inner)
    except ValueError:
        return inner


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


def _join(phrases: list[str]) -> str:
    return phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]


def _brief(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _help(offered: list[dict]) -> str:
    tools = {tool["name"] for tool in offered}
    others = demo_calls.offer_sentence([tool for tool in offered if tool["name"] not in PHRASED_TOOLS])
    abilities = {
        "lookup_customer": "look up customers",
        "lookup_invoices": "list a customer's invoices",
        "issue_refund": "refund invoices",
        "send_email": "email customers",
        "delete_account": "close accounts",
        "verify_identity": "verify a caller's identity",
        "export_customer_data": "export a customer's data",
    }
    can = [phrase for tool, phrase in abilities.items() if tool in tools]
    if not can and not others:
        return "I'm the offline demo assistant. No tools are available to me here, so I can only chat."
    if not can:
        return f"I'm the offline demo assistant. {others}"
    return (
        f"I'm the offline demo billing assistant. I can {_join(can)}. For example: "
        "'refund $12.50 on invoice 4471', 'email customer 12 saying \"Thanks!\"' or "
        "'look up alice@example.com'." + (f" {others}" if others else "")
    )


def _long_answer() -> str:
    sentences = [
        "Refunds go back to the original payment method and usually arrive within five to ten business days.",
        "A partial refund leaves the invoice paid, while a full refund marks it as refunded.",
        "Every sensitive action waits for a person on the approval desk before it runs.",
        "Customers on the annual plan are billed once a year and can be refunded pro rata.",
        "Emails to customers are sent from the billing address and copied to the account history.",
        "Closing an account stops future invoices but keeps the billing history for audits.",
    ]
    words: list[str] = []
    paragraph = 0
    while len(words) < 2000:
        paragraph += 1
        text = " ".join(sentences[(paragraph + i) % len(sentences)] for i in range(5))
        words += f"{paragraph}. {text}\n\n".split(" ")
    return " ".join(words).strip()


# --- the response ---------------------------------------------------------------------------------


def _text(text: str) -> dict:
    return {"type": "text", "text": text}


def _tool_use(name: str, tool_input: dict) -> dict:
    return {"type": "tool_use", "id": "", "name": name, "input": tool_input}


def _with_id(block: dict, index: int, messages: list[dict]) -> dict:
    if block["type"] != "tool_use":
        return block
    return {**block, "id": "toolu_" + _digest({"messages": messages, "block": index})}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _usage(request: dict, content: list[dict], stop_reason: str) -> dict:
    """Rough token counts (a token is about four characters), with a cached system+tools prefix."""
    prefix_chars = len(json.dumps(request.get("system") or "")) + len(json.dumps(request.get("tools") or []))
    total_tokens = (prefix_chars + len(json.dumps(request.get("messages") or []))) // 4
    cached = prefix_chars // 4 if "cache_control" in json.dumps(request) else 0
    first_call = len(request.get("messages") or []) <= 1
    output = len(json.dumps(content)) // 4
    if stop_reason == "max_tokens":
        output = request.get("max_tokens", output)
    return {
        "input_tokens": max(1, total_tokens - cached),
        "output_tokens": max(1, output),
        "cache_creation_input_tokens": cached if first_call else 0,
        "cache_read_input_tokens": 0 if first_call else cached,
    }
