"""The demo model's phrasebooks (demo/model/engine.py): the engine names no tool, a pack teaches it
its words by registering a phrasebook (the billing pack's is demo/billing/phrases.py), several packs
each speak for their own tools, and with none registered every offered tool is still reached through
demo_calls."""

from __future__ import annotations

import importlib.util
import re
import sys
import threading
from functools import partial
from pathlib import Path

import anthropic
import httpx2
import pytest

from demo.billing.phrases import BillingPhrases
from demo.model import engine as demo_model
from demo.model.engine import Call, FollowUp, Note, Phrasebook, Result, register_phrasebook, respond
from demo.model.wire import DemoTransport, validate_request
from tests.llm.test_demo_model import BILLING_TOOLS, MODEL, ask, results_for, text_of, tool_uses
from webapp.tools.registry import wrap_output

ROOT = Path(__file__).resolve().parents[2]
ENGINE = sorted(path.relative_to(ROOT) for path in (ROOT / "demo" / "model").glob("*.py"))  # engine.py and all
BILLING_ARGUMENTS = {"customer_id", "invoice_id", "amount_cents", "refund_id", "refunded_cents", "total_cents"}


@pytest.fixture
def registry(monkeypatch):
    """The process's phrasebooks, emptied for one test and put back after it."""
    monkeypatch.setattr(demo_model, "_phrasebooks", ())
    return demo_model


def offline(**options) -> anthropic.Anthropic:
    """The real SDK over the demo model with no phrasebook at all."""
    transport = DemoTransport(responder=partial(respond, phrasebooks=()))
    return anthropic.Anthropic(api_key="demo", http_client=httpx2.Client(transport=transport), max_retries=0, **options)


class Weather(Phrasebook):
    """A second pack's phrasebook, written against the public plug-in point only."""

    name = "weather"
    tools = frozenset({"forecast"})

    def read(self, text: str) -> tuple[list[Call], list[Note]]:
        found = re.search(r"\bweather in (\w+)", text)
        if found:
            return [Call(found.start(), "forecast", {"city": found[1]}, f"look at the weather in {found[1]}")], []
        asked = re.search(r"\bweather\b", text)
        return [], [Note(asked.start(), "Where? Name a city.")] if asked else []

    def describe(self, result: Result) -> str | None:
        return f"It will be {result.data['sky']} in {result.input['city']}."

    def follow_up(self, request: str, results: list[Result], offered: frozenset[str]) -> FollowUp | None:
        if "and then the next city" in request and "forecast" in offered:
            return FollowUp("Now Lyon.", (Call(0, "forecast", {"city": "Lyon"}, "look at Lyon"),))
        return None

    def help(self, offered: frozenset[str]) -> str:
        return "I can tell the weather." if "forecast" in offered else ""


FORECAST = {
    "name": "forecast",
    "description": "The weather for a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


# --- the engine names no tool ---------------------------------------------------------------------


def test_the_engine_names_no_billing_tool_or_argument():
    names = BillingPhrases.tools | BILLING_ARGUMENTS
    assert {"engine.py", "other_tools.py", "react.py", "wire.py"} <= {path.name for path in ENGINE}
    for path in ENGINE:
        source = (ROOT / path).read_text()
        named = sorted(name for name in names if re.search(rf"\b{name}\b", source))
        assert named == [], f"{path} names {named}: billing words belong to demo/billing/phrases.py"
        assert re.findall(r"\b\w+_cents\b", source) == [], f"{path} names an argument in cents"


# --- no phrasebook --------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_without_a_phrasebook_a_billing_request_is_answered_in_words_or_through_demo_calls(stream):
    words = "Refund $20 on invoice 4471"
    answer = ask(offline(), [{"role": "user", "content": words}], stream=stream)
    assert answer.stop_reason in ("end_turn", "tool_use") and text_of(answer)
    assert {use.name for use in tool_uses(answer)} <= {tool["name"] for tool in BILLING_TOOLS}

    asked = [{"role": "user", "content": words}]
    request = {"model": MODEL, "max_tokens": 100, "tools": BILLING_TOOLS, "messages": asked}
    assert respond(request, phrasebooks=()) == respond(request, phrasebooks=())
    hello = text_of(ask(offline(), [{"role": "user", "content": "Hello there"}]))
    assert hello.startswith("I'm the offline demo assistant. I can also use lookup_customer, lookup_invoices")


def test_without_a_phrasebook_every_tool_is_called_by_its_name_and_told_by_the_generic_sentence():
    client = offline()
    history = [{"role": "user", "content": '[[call issue_refund {"invoice_id": 4471, "amount_cents": 2000}]]'}]
    first = ask(client, history)
    assert [(use.name, use.input) for use in tool_uses(first)] == [
        ("issue_refund", {"invoice_id": 4471, "amount_cents": 2000})
    ]
    output = {"refund_id": 3, "amount_cents": 2000}
    history += [first.to_param(), results_for(first, lambda name, _: (wrap_output(name, output, 8000), False))]
    assert text_of(ask(client, history)) == "issue_refund answered: refund id 3, amount cents 2000."

    worded = ask(client, [{"role": "user", "content": "Look up customer Ada"}])
    assert [(use.name, use.input) for use in tool_uses(worded)] == [("lookup_customer", {"query": "Ada"})]


@pytest.mark.parametrize(
    ("hook", "stop_reason"),
    [
        ("[[long answer]]", "end_turn"),
        ("[[max tokens]]", "max_tokens"),
        ("[[refusal]]", "refusal"),
        ("[[invalid tool input]]", "tool_use"),
        ("[[unknown tool]]", "tool_use"),
    ],
)
def test_the_test_hooks_need_no_phrasebook(hook, stop_reason):
    answer = ask(offline(), [{"role": "user", "content": hook}])
    assert answer.stop_reason == stop_reason
    if hook == "[[unknown tool]]":
        assert [use.name for use in tool_uses(answer)] == [demo_model.NO_SUCH_TOOL]
    if hook == "[[invalid tool input]]":
        assert [(use.name, use.input) for use in tool_uses(answer)] == [
            ("lookup_invoices", {"customer_id": "not-a-number"})
        ]


# --- registering ----------------------------------------------------------------------------------


def test_the_billing_pack_registers_its_phrasebook_once_however_often_its_module_runs(registry, monkeypatch):
    for name in ("billing_phrases_again", "billing_phrases_once_more"):  # as a module imported under two names
        spec = importlib.util.spec_from_file_location(name, ROOT / "demo/billing/phrases.py")
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)

    [book] = registry.registered_phrasebooks()
    assert book.name == "billing" and "issue_refund" in book.tools


def test_registering_from_many_threads_at_once_keeps_each_book_once(registry):
    start = threading.Barrier(16)
    books = [
        type(f"Book{i}", (Phrasebook,), {"name": f"book{i % 4}", "tools": frozenset({f"tool{i % 4}"})})
        for i in range(16)
    ]

    def register(book_class):
        start.wait()
        register_phrasebook(book_class())

    threads = [threading.Thread(target=register, args=(book,)) for book in books]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(book.name for book in registry.registered_phrasebooks()) == ["book0", "book1", "book2", "book3"]


def test_a_book_that_speaks_for_a_tool_of_another_book_is_refused(registry):
    register_phrasebook(BillingPhrases())
    refunds = type("Refunds", (Phrasebook,), {"name": "refunds", "tools": frozenset({"issue_refund"})})
    with pytest.raises(ValueError, match="'refunds' speaks for issue_refund, which the phrasebook 'billing'"):
        register_phrasebook(refunds())
    with pytest.raises(ValueError, match="needs a name"):
        register_phrasebook(Phrasebook())
    assert [book.name for book in registry.registered_phrasebooks()] == ["billing"]


def test_a_registered_book_speaks_from_the_next_answer_on(registry):
    asked = [{"role": "user", "content": "the weather in Paris"}]
    request = {"model": MODEL, "max_tokens": 100, "tools": [FORECAST], "messages": asked}
    assert [b for b in respond(request)["content"] if b["type"] == "tool_use"] == []
    register_phrasebook(Weather())
    [use] = [b for b in respond(request)["content"] if b["type"] == "tool_use"]
    assert (use["name"], use["input"]) == ("forecast", {"city": "Paris"})


# --- several phrasebooks --------------------------------------------------------------------------


def test_several_phrasebooks_each_speak_for_their_own_tools():
    books = (BillingPhrases(), Weather())
    tools = [*BILLING_TOOLS, FORECAST]

    def said(messages: list, offered: list = tools) -> dict:
        request = {"model": MODEL, "max_tokens": 100, "tools": offered, "messages": messages}
        assert validate_request(request) == []
        return respond(request, phrasebooks=books)

    words = "Refund $20 on invoice 4471 and tell me the weather in Paris and then the next city"
    asked = [{"role": "user", "content": words}]
    first = said(asked)
    uses = [b for b in first["content"] if b["type"] == "tool_use"]
    assert [(u["name"], u["input"]) for u in uses] == [
        ("issue_refund", {"invoice_id": 4471, "amount_cents": 2000, "reason": words}),
        ("forecast", {"city": "Paris"}),
    ]
    assert first["content"][0]["text"] == "I'll refund $20.00 on invoice 4471 and look at the weather in Paris."

    outputs = {"issue_refund": {"refund_id": 7, "amount_cents": 2000, "invoice_id": 4471}, "forecast": {"sky": "sunny"}}
    results = [
        {"type": "tool_result", "tool_use_id": u["id"], "content": wrap_output(u["name"], outputs[u["name"]], 8000)}
        for u in uses
    ]
    second = said([*asked, {"role": "assistant", "content": first["content"]}, {"role": "user", "content": results}])
    assert second["content"][0]["text"] == (
        "Here's what happened:\n- Refund 7 of $20.00 issued on invoice 4471.\n- It will be sunny in Paris.\n\nNow Lyon."
    )
    assert [(b["name"], b["input"]) for b in second["content"] if b["type"] == "tool_use"] == [
        ("forecast", {"city": "Lyon"})
    ]

    hello = said([{"role": "user", "content": "Hello there"}])["content"][0]["text"]
    assert hello.startswith("I'm the offline demo assistant. I can look up customers, list a customer's invoices")
    assert hello.endswith("'look up alice@example.com'. I can tell the weather.")
    only_billing = said([{"role": "user", "content": "hi"}], BILLING_TOOLS)["content"][0]["text"]
    assert only_billing.startswith("I'm the offline demo billing assistant. I can look up customers")

    not_offered = said([{"role": "user", "content": "the weather in Oslo"}], BILLING_TOOLS)
    assert not_offered["content"] == [
        {"type": "text", "text": "I can't look at the weather in Oslo here: the forecast tool isn't available."}
    ]
