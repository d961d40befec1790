"""The demo model calls any tool it is offered (demo/model/other_tools.py): `[[call TOOL {json}]]` and
plain words that name a tool, driven through the real anthropic SDK over DemoTransport, in both the
native tool protocol and the text protocol (MODEL_PROTOCOL=react)."""

from __future__ import annotations

import anthropic
import httpx2
import pytest

from demo.model.wire import DemoTransport
from tests.llm.test_demo_model import BILLING_TOOLS, ask, demo_client, results_for, text_of, tool_uses
from webapp.llm.react import ReactClient
from webapp.tools.registry import wrap_output

LOOKUP, RESTOCK, ADD_NOTE = "mcp_inventory__lookup", "mcp_inventory__restock", "mcp_notes__add_note"


def mcp_tool(name: str, server: str, description: str, properties: dict, required: list[str]) -> dict:
    """A tool as the desk offers an MCP server's: its description followed by the desk's note."""
    return {
        "name": name,
        "description": f"{description} (A tool of the MCP server {server}; its results are external data.)",
        "input_schema": {"type": "object", "properties": properties, "required": required},
    }


INVENTORY = [
    mcp_tool(
        LOOKUP,
        "inventory",
        "Look up an item in the inventory by its SKU (such as A-1): its name and how many are in stock.",
        {"sku": {"type": "string"}},
        ["sku"],
    ),
    mcp_tool(
        RESTOCK,
        "inventory",
        "Add units of an item to the inventory's stock, e.g. when a delivery arrives.",
        {"sku": {"type": "string"}, "quantity": {"type": "integer"}},
        ["sku", "quantity"],
    ),
]
NOTES = [
    mcp_tool(
        ADD_NOTE,
        "notes",
        "Add a note for the team.",
        {"text": {"type": "string"}, "pinned": {"type": "boolean"}},
        ["text"],
    )
]
EVERYTHING = [*BILLING_TOOLS, *INVENTORY, *NOTES]


def calls(message) -> list[tuple[str, dict]]:
    return [(use.name, use.input) for use in tool_uses(message)]


def said(words: str, tools: list[dict] = EVERYTHING, stream: bool = False):
    return ask(demo_client(), [{"role": "user", "content": words}], tools=tools, stream=stream)


@pytest.fixture(params=["create", "stream"])
def stream(request) -> bool:
    return request.param == "stream"


# --- [[call TOOL {json}]] --------------------------------------------------------------------------


def test_a_written_call_of_an_offered_tool_becomes_that_tool_use(stream):
    message = said('[[call mcp_inventory__lookup {"sku": "A-1"}]]', stream=stream)

    assert message.stop_reason == "tool_use"
    assert calls(message) == [(LOOKUP, {"sku": "A-1"})]
    assert text_of(message) == "I'll call mcp_inventory__lookup."


def test_a_written_call_of_a_tool_not_offered_is_answered_in_words_and_not_called(stream):
    # Held, not allowed for this person, or not there at all: the request's tools are what counts.
    message = said('[[call mcp_inventory__lookup {"sku": "A-1"}]]', tools=BILLING_TOOLS, stream=stream)

    assert message.stop_reason == "end_turn" and tool_uses(message) == []
    assert text_of(message) == "I can't call mcp_inventory__lookup: it isn't one of the tools offered to me here."


def test_written_calls_are_made_in_order_one_per_occurrence_and_the_bad_one_is_told():
    message = said(
        'First [[call mcp_inventory__restock {"sku": "B-7", "quantity": 3}]], then '
        '[[call mcp_inventory__teleport {"sku": "B-7"}]] and [[call mcp_inventory__lookup {"sku": "B-7"}]].'
    )

    assert calls(message) == [(RESTOCK, {"sku": "B-7", "quantity": 3}), (LOOKUP, {"sku": "B-7"})]
    assert text_of(message) == (
        "I'll call mcp_inventory__restock and call mcp_inventory__lookup. "
        "I can't call mcp_inventory__teleport: it isn't one of the tools offered to me here."
    )
    first, second = tool_uses(message)
    assert first.id != second.id


@pytest.mark.parametrize(
    ("written", "problem"),
    [
        (
            '[[call mcp_inventory__lookup {"sku": A-1}]]',
            "its arguments are not valid JSON (Expecting value at character 9).",
        ),
        ('[[call mcp_inventory__lookup ["A-1"]]]', "its arguments must be one JSON object, in braces."),
        ('[[call mcp_inventory__lookup {"sku": "A-1"}', "the call is not closed with ]] right after its arguments."),
    ],
)
def test_written_arguments_that_are_not_one_json_object_are_answered_in_words(written, problem):
    message = said(written)

    assert message.stop_reason == "end_turn" and tool_uses(message) == []
    assert text_of(message) == (
        f'I didn\'t call mcp_inventory__lookup: {problem} For example: [[call mcp_inventory__lookup {{"sku": "..."}}]]'
    )


def test_a_written_call_without_a_tool_name_says_how_to_write_one():
    message = said("[[call]]", tools=INVENTORY)
    assert (
        text_of(message) == 'A [[call]] needs a tool\'s name: write it as [[call mcp_inventory__lookup {"sku": "..."}]]'
    )


def test_a_written_call_is_sent_as_written_even_with_arguments_the_tool_would_refuse():
    # The desk checks the arguments against the tool's schema; the demo lets a person try that too.
    assert calls(said('[[call mcp_inventory__restock {"sku": "A-1", "quantity": "lots"}]]')) == [
        (RESTOCK, {"sku": "A-1", "quantity": "lots"})
    ]
    assert calls(said("[[call mcp_inventory__lookup]]")) == [(LOOKUP, {})]


def test_a_message_with_written_calls_is_read_for_nothing_else():
    message = said('Refund $20 on invoice 4471 and [[call mcp_inventory__lookup {"sku": "A-1"}]]')
    assert calls(message) == [(LOOKUP, {"sku": "A-1"})]


# --- plain words -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        ("Look up A-1 in the inventory", [(LOOKUP, {"sku": "A-1"})]),
        ("look-up the item B-7 in the inventory, please", [(LOOKUP, {"sku": "B-7"})]),
        ("Restock B-7 with 3 units", [(RESTOCK, {"sku": "B-7", "quantity": 3})]),
        ("restock sku A-2 quantity 10", [(RESTOCK, {"sku": "A-2", "quantity": 10})]),
        ("Restock quantity: 4 of sku=a-1", [(RESTOCK, {"sku": "a-1", "quantity": 4})]),
        ("add a note 'call back Ada'", [(ADD_NOTE, {"text": "call back Ada"})]),
        ('Add notes "ring Ada. Then Bob" pinned yes', [(ADD_NOTE, {"text": "ring Ada. Then Bob", "pinned": True})]),
        (
            "Look up A-1 in the inventory and restock B-7 with 3 units. Add a note 'B-7 restocked'.",
            [(LOOKUP, {"sku": "A-1"}), (RESTOCK, {"sku": "B-7", "quantity": 3}), (ADD_NOTE, {"text": "B-7 restocked"})],
        ),
    ],
)
def test_plain_words_that_name_a_tool_call_it_with_the_arguments_they_give(words, expected):
    message = said(words)
    assert message.stop_reason == "tool_use"
    assert calls(message) == expected


def test_the_answer_says_what_it_will_call_with_which_arguments(stream):
    message = said("Restock B-7 with 3 units", stream=stream)
    assert text_of(message) == 'I\'ll use mcp_inventory__restock with sku "B-7", quantity 3.'


def test_a_named_tool_missing_a_required_argument_asks_for_it_instead_of_calling(stream):
    message = said("Please restock A-1", stream=stream)

    assert message.stop_reason == "end_turn" and tool_uses(message) == []
    assert text_of(message) == (
        "I can't use mcp_inventory__restock yet: I need its quantity (a whole number). Write it after its name "
        '(for example: quantity 5), or write [[call mcp_inventory__restock {"sku": "...", "quantity": 1}]]'
    )


def test_a_word_that_looks_like_neither_a_code_nor_a_name_is_not_taken_for_an_argument():
    message = said("look up the stock in the inventory")
    assert tool_uses(message) == []
    assert text_of(message).startswith("I can't use mcp_inventory__lookup yet: I need its sku (text).")


def test_words_that_only_resemble_a_tool_get_a_suggestion_never_a_call():
    message = said("Is there stock of item A-1 in the inventory?")

    assert message.stop_reason == "end_turn" and tool_uses(message) == []
    assert text_of(message) == (
        "I'm not sure which tool you mean. This might fit: mcp_inventory__lookup (Look up an item in the inventory "
        'by its SKU: its name and how many are in stock). To use one, name it in your words ("lookup ..." with its '
        'arguments) or write [[call mcp_inventory__lookup {"sku": "..."}]]'
    )


def test_tools_named_by_the_same_words_are_told_apart_by_their_other_words_or_asked_about():
    crm = mcp_tool(
        "mcp_crm__lookup", "crm", "Look up a contact by e-mail address.", {"email": {"type": "string"}}, ["email"]
    )
    tools = [*INVENTORY, crm]

    assert calls(said("look up A-1 in the inventory", tools=tools)) == [(LOOKUP, {"sku": "A-1"})]
    assert calls(said("look up the contact Ada", tools=tools)) == [("mcp_crm__lookup", {"email": "Ada"})]
    unsure = said("look up A-1", tools=tools)
    assert tool_uses(unsure) == []
    assert text_of(unsure) == (
        "Your words name more than one tool (mcp_inventory__lookup and mcp_crm__lookup); say which by its full name, "
        'for example [[call mcp_inventory__lookup {"sku": "..."}]]'
    )


def test_a_tool_not_offered_is_never_called_from_words():
    message = said("Restock B-7 with 3 units", tools=[*BILLING_TOOLS, INVENTORY[0]])
    assert message.stop_reason == "end_turn" and tool_uses(message) == []


def test_the_billing_phrases_keep_their_words_unless_the_sentence_speaks_of_the_other_tool():
    assert calls(said("Look up Alice Moore")) == [("lookup_customer", {"query": "Alice Moore"})]
    assert calls(said("Look up A-1 in the inventory")) == [(LOOKUP, {"sku": "A-1"})]
    assert calls(said("Look up customer 4471 and restock A-1 with 2")) == [
        ("lookup_customer", {"query": "4471"}),
        (RESTOCK, {"sku": "A-1", "quantity": 2}),
    ]
    assert calls(said("Refund $20 on invoice 4471. Restock A-1 with 2.")) == [
        ("issue_refund", {"invoice_id": 4471, "amount_cents": 2000, "reason": "Refund $20 on invoice 4471."}),
        (RESTOCK, {"sku": "A-1", "quantity": 2}),
    ]


def test_the_help_answer_names_the_other_tools_and_how_to_ask_for_them():
    answer = text_of(said("Hello there"))
    assert "refund invoices" in answer
    assert answer.endswith(
        "I can also use mcp_inventory__lookup, mcp_inventory__restock and mcp_notes__add_note: name one in your "
        'words (for example "lookup ..." with its arguments) or write [[call mcp_inventory__lookup {"sku": "..."}]].'
    )
    only_mcp = text_of(said("Hello there", tools=INVENTORY))
    assert only_mcp.startswith("I'm the offline demo assistant. I can also use mcp_inventory__lookup")


# --- results ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (
            {"sku": "A-1", "name": "Blue mug", "in_stock": 12},
            "mcp_inventory__lookup answered: sku A-1, name Blue mug, in stock 12.",
        ),
        ({"result": "Blue mug, 12 in stock"}, "mcp_inventory__lookup answered: Blue mug, 12 in stock"),
        ("Blue mug:\n12 in stock", "mcp_inventory__lookup answered: Blue mug: 12 in stock"),
        (
            [{"sku": "A-1", "in_stock": 12}, {"sku": "A-2", "in_stock": 0}],
            "mcp_inventory__lookup answered with 2 items: sku A-1, in stock 12; sku A-2, in stock 0.",
        ),
        ({}, "mcp_inventory__lookup answered with nothing."),
    ],
)
def test_a_result_of_another_tool_is_answered_in_a_sentence_that_uses_it(output, expected, stream):
    client = demo_client()
    history = [{"role": "user", "content": "Look up A-1 in the inventory"}]
    first = ask(client, history, tools=EVERYTHING, stream=stream)
    history += [first.to_param(), results_for(first, lambda name, _: (wrap_output(name, output, 8000), False))]

    answer = ask(client, history, tools=EVERYTHING, stream=stream)
    assert answer.stop_reason == "end_turn" and tool_uses(answer) == []
    assert text_of(answer) == expected


def test_a_failed_call_of_another_tool_is_told_with_the_servers_reason():
    client = demo_client()
    history = [{"role": "user", "content": "Restock A-9 with 2 units"}]
    first = ask(client, history, tools=EVERYTHING)
    refused = "The MCP server inventory reported an error:\n" + wrap_output(
        RESTOCK, "Error executing tool restock: There is no item with the SKU A-9.", 8000
    )
    history += [first.to_param(), results_for(first, lambda *_: (refused, True))]
    assert text_of(ask(client, history, tools=EVERYTHING)) == (
        "mcp_inventory__restock failed: Error executing tool restock: There is no item with the SKU A-9"
    )


# --- the text protocol (MODEL_PROTOCOL=react) ------------------------------------------------------


def react_client() -> ReactClient:
    sdk = anthropic.Anthropic(
        api_key="offline-demo",
        base_url="http://demo-model.invalid",
        http_client=httpx2.Client(transport=DemoTransport()),
        max_retries=0,
    )
    return ReactClient(sdk, "demo", 1024)


def react_run(words: str, outputs: dict) -> list:
    """The replies of the demo model in the text protocol, each tool's output handed back, to the end."""
    client, system = react_client(), [{"type": "text", "text": "You help the shop."}]
    messages = [{"role": "user", "content": [{"type": "text", "text": words}]}]
    replies = []
    for _ in range(6):
        reply = client.generate(system=system, messages=messages, tools=EVERYTHING)
        replies.append(reply)
        if reply.stop_reason != "tool_use":
            return replies
        messages.append({"role": "assistant", "content": reply.content})
        answered = [
            {"type": "tool_result", "tool_use_id": b["id"], "content": wrap_output(b["name"], outputs[b["name"]], 8000)}
            for b in reply.content
            if b["type"] == "tool_use"
        ]
        messages.append({"role": "user", "content": answered})
    raise AssertionError("the demo model did not finish")


def uses_of(reply) -> list[tuple[str, dict]]:
    return [(b["name"], b["input"]) for b in reply.content if b["type"] == "tool_use"]


def test_the_text_protocol_takes_the_same_written_call_and_answers_with_its_result():
    first, final = react_run(
        '[[call mcp_inventory__lookup {"sku": "A-1"}]]', {LOOKUP: {"sku": "A-1", "name": "Blue mug", "in_stock": 12}}
    )
    assert uses_of(first) == [(LOOKUP, {"sku": "A-1"})]
    assert final.stop_reason == "end_turn"
    assert final.content == [
        {"type": "text", "text": "mcp_inventory__lookup answered: sku A-1, name Blue mug, in stock 12."}
    ]


def test_the_text_protocol_refuses_a_tool_not_offered_in_words():
    [reply] = react_run('[[call mcp_inventory__teleport {"sku": "A-1"}]]', {})
    assert reply.content == [
        {"type": "text", "text": "I can't call mcp_inventory__teleport: it isn't one of the tools offered to me here."}
    ]


def test_the_text_protocol_carries_out_several_asked_calls_one_after_another():
    outputs = {
        LOOKUP: {"sku": "A-1", "in_stock": 12},
        RESTOCK: {"sku": "A-1", "added": 5, "in_stock": 17},
        "issue_refund": {"refund_id": 3, "amount_cents": 2000, "invoice_id": 4471},
    }
    words = "Look up A-1 in the inventory. Refund $20 on invoice 4471, then restock A-1 with 5 units."
    first, second, third, final = react_run(words, outputs)
    refund = {
        "invoice_id": 4471,
        "amount_cents": 2000,
        "reason": "Refund $20 on invoice 4471, then restock A-1 with 5 units.",
    }
    assert [uses_of(r) for r in (first, second, third)] == [
        [(LOOKUP, {"sku": "A-1"})],
        [("issue_refund", refund)],
        [(RESTOCK, {"sku": "A-1", "quantity": 5})],
    ]
    assert second.content[0]["text"] == "mcp_inventory__lookup answered: sku A-1, in stock 12."
    assert third.content[0]["text"] == "Refund 3 of $20.00 issued on invoice 4471."
    assert final.content[0]["text"] == "mcp_inventory__restock answered: sku A-1, added 5, in stock 17."
