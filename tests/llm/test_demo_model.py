"""The demo model, driven through the real anthropic SDK over DemoTransport and over ModelServer."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable

import anthropic
import httpx2
import pytest

from demo.billing.tools import demo_registry
from demo.model.engine import NO_SUCH_TOOL, respond
from demo.model.wire import DemoTransport, validate_request
from tests.model_server import model_server_fixture  # noqa: F401 - the model_server fixture
from webapp.tools.registry import wrap_output

MODEL = "claude-sonnet-4-6"


def _tool(name: str, properties: dict, required: list[str]) -> dict:
    return {
        "name": name,
        "description": f"The {name} tool.",
        "input_schema": {"type": "object", "properties": properties, "required": required},
    }


BILLING_TOOLS = [
    _tool("lookup_customer", {"query": {"type": "string"}}, ["query"]),
    _tool(
        "lookup_invoices",
        {"customer_id": {"type": "integer"}, "status": {"type": "string"}, "limit": {"type": "integer"}},
        ["customer_id"],
    ),
    _tool(
        "issue_refund",
        {
            "invoice_id": {"type": "integer"},
            "amount_cents": {"type": "integer"},
            "reason": {"type": "string"},
        },
        ["invoice_id", "amount_cents", "reason"],
    ),
    _tool(
        "send_email",
        {"customer_id": {"type": "integer"}, "subject": {"type": "string"}, "body": {"type": "string"}},
        ["customer_id", "subject", "body"],
    ),
    {
        **_tool(
            "delete_account",
            {"customer_id": {"type": "integer"}, "reason": {"type": "string"}},
            ["customer_id", "reason"],
        ),
        "cache_control": {"type": "ephemeral"},
    },
]
SYSTEM = [{"type": "text", "text": "You are a careful billing assistant.", "cache_control": {"type": "ephemeral"}}]


def demo_client(**options) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key="demo", http_client=httpx2.Client(transport=DemoTransport()), max_retries=0, **options
    )


def ask(client: anthropic.Anthropic, messages: list, tools: list | None = None, stream: bool = False):
    request = {
        "model": MODEL,
        "max_tokens": 1024,
        "system": SYSTEM,
        "messages": messages,
        "tools": BILLING_TOOLS if tools is None else tools,
    }
    if not stream:
        return client.messages.create(**request)
    with client.messages.stream(**request) as live:
        return live.get_final_message()


def tool_uses(message) -> list:
    return [block for block in message.content if block.type == "tool_use"]


def text_of(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def results_for(message, outcome: Callable[[str, dict], tuple[str, bool]]) -> dict:
    """A user message answering each tool_use in `message` with outcome(name, input): (content, is_error)."""
    blocks = []
    for use in tool_uses(message):
        content, is_error = outcome(use.name, use.input)
        blocks.append({"type": "tool_result", "tool_use_id": use.id, "content": content, "is_error": is_error})
    return {"role": "user", "content": blocks}


def succeed(outputs: dict) -> Callable[[str, dict], tuple[str, bool]]:
    return lambda name, _input: (wrap_output(name, outputs[name], 8000), False)


@pytest.fixture(params=["create", "stream"])
def stream(request) -> bool:
    return request.param == "stream"


# --- turns from words -----------------------------------------------------------------------------


def test_small_talk_gets_a_text_answer_listing_the_offered_tools(stream):
    message = ask(demo_client(), [{"role": "user", "content": "Hello there"}], stream=stream)

    assert message.stop_reason == "end_turn"
    assert tool_uses(message) == []
    assert "refund invoices" in text_of(message) and "close accounts" in text_of(message)
    assert message.id.startswith("msg_demo_") and message.model == MODEL


def test_a_lookup_request_becomes_one_tool_call(stream):
    message = ask(demo_client(), [{"role": "user", "content": "Who is Alice Moore?"}], stream=stream)

    assert message.stop_reason == "tool_use"
    [use] = tool_uses(message)
    assert (use.name, use.input) == ("lookup_customer", {"query": "Alice Moore"})
    assert use.id.startswith("toolu_")


@pytest.mark.parametrize(
    ("text", "query"),
    [
        ('find "Acme Corp" please', "Acme Corp"),
        ("look up bob@example.com", "bob@example.com"),
        ("who is customer 42?", "42"),
    ],
)
def test_lookup_queries(text, query):
    [use] = tool_uses(ask(demo_client(), [{"role": "user", "content": text}]))
    assert use.input == {"query": query}


def test_several_actions_in_one_request_become_several_tool_calls_in_one_turn(stream):
    text = 'Refund $20 on invoice 4471 and email customer 4471 saying "Your refund is on its way".'
    message = ask(demo_client(), [{"role": "user", "content": text}], stream=stream)

    assert message.stop_reason == "tool_use"
    assert message.content[0].type == "text"
    assert "refund $20.00 on invoice 4471" in text_of(message) and "email customer 4471" in text_of(message)
    refund, email = tool_uses(message)
    assert refund.name == "issue_refund"
    assert refund.input == {"invoice_id": 4471, "amount_cents": 2000, "reason": text[:200]}
    assert email.name == "send_email"
    assert email.input["customer_id"] == 4471 and email.input["body"] == "Your refund is on its way"
    assert refund.id != email.id


@pytest.mark.parametrize("amount", ["$12.50", "12.50 dollars", "1250 cents"])
def test_refund_amounts_are_read_in_dollars_or_cents(amount):
    [use] = tool_uses(ask(demo_client(), [{"role": "user", "content": f"refund {amount} on invoice 7"}]))
    assert use.input["amount_cents"] == 1250 and use.input["invoice_id"] == 7


def test_each_action_takes_its_own_customer_number():
    text = "Show paid invoices for customer 3, then close the account of customer 9."
    invoices, closing = tool_uses(ask(demo_client(), [{"role": "user", "content": text}]))
    assert (invoices.name, invoices.input) == ("lookup_invoices", {"customer_id": 3, "status": "paid"})
    assert (closing.name, closing.input["customer_id"]) == ("delete_account", 9)


def test_a_refund_without_amount_or_customer_asks_instead_of_acting():
    message = ask(demo_client(), [{"role": "user", "content": "please refund invoice 12"}])
    assert message.stop_reason == "end_turn" and tool_uses(message) == []
    assert "How much should I refund on invoice 12?" in text_of(message)


def test_only_offered_tools_are_called():
    tools = [t for t in BILLING_TOOLS if t["name"] != "send_email"]
    message = ask(
        demo_client(),
        [{"role": "user", "content": "refund $5 on invoice 1 and email customer 2"}],
        tools=tools,
    )
    assert [use.name for use in tool_uses(message)] == ["issue_refund"]
    assert "the send_email tool isn't available" in text_of(message)


def test_after_a_stopped_run_the_newest_words_are_answered():
    # Several texts in one turn happen when a person stops a run and writes again: the new words win,
    # even after the stopped round's results.
    content = [
        {"type": "tool_result", "tool_use_id": "toolu_x", "content": "Cancelled: nothing was done.", "is_error": True},
        {"type": "text", "text": "refund $5 on invoice 1."},
        {"type": "text", "text": "email customer 2"},
    ]
    history = [
        {"role": "user", "content": "refund $5 on invoice 1."},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_x",
                    "name": "issue_refund",
                    "input": {"invoice_id": 1, "amount_cents": 500, "reason": "x"},
                }
            ],
        },
        {"role": "user", "content": content},
    ]
    message = ask(demo_client(), history)
    assert [use.name for use in tool_uses(message)] == ["send_email"]


# --- turns after tool results ---------------------------------------------------------------------


def test_results_are_summarised_one_line_each_including_a_declined_and_an_expired_call(stream):
    client = demo_client()
    ask_text = "refund $20 on invoice 4471, email customer 4471 and close the account of customer 5"
    history = [{"role": "user", "content": ask_text}]
    first = ask(client, history, stream=stream)
    assert [use.name for use in tool_uses(first)] == ["issue_refund", "send_email", "delete_account"]

    outcomes = {
        "issue_refund": (
            wrap_output("issue_refund", {"refund_id": "re_9", "amount_cents": 2000, "invoice_id": 4471}, 8000),
            False,
        ),
        "send_email": ("Declined by a person: the customer already got a credit", True),
        "delete_account": ("No decision was made in time (24 hours).", True),
    }
    history += [first.to_param(), results_for(first, lambda name, _input: outcomes[name])]
    answer = ask(client, history, stream=stream)

    assert answer.stop_reason == "end_turn" and tool_uses(answer) == []
    lines = text_of(answer).splitlines()
    assert lines[1:] == [
        "- Refund re_9 of $20.00 issued on invoice 4471.",
        "- A person declined send_email (the customer already got a credit), so I have not done it.",
        "- Nothing was done for delete_account, because no decision came in time.",
    ]


def test_an_edited_refund_is_told_with_the_amount_that_was_really_refunded():
    from webapp.agent import wording

    client = demo_client()
    history = [{"role": "user", "content": "refund $75 on invoice 4471"}]
    first = ask(client, history)
    (asked,) = [use.input for use in tool_uses(first)]
    ran = {**asked, "amount_cents": 4000}
    output = {"refund_id": 3, "invoice_id": 4471, "amount_cents": 4000, "remaining_refundable_cents": 8900}
    note = wording.edited_note("Acme Corp reviewer (reviewer@acme.test)", asked, ran)
    result = note + wrap_output("issue_refund", output, 8000)
    history += [first.to_param(), results_for(first, lambda *_: (result, False))]
    answer = text_of(ask(client, history))
    assert answer == (
        "Refund 3 of $40.00 issued on invoice 4471. Acme Corp reviewer changed the amount from $75.00 to $40.00 "
        "before approving."
    )


def test_the_desks_instructions_to_the_model_are_never_repeated_to_people():
    from webapp.agent import wording

    client = demo_client()
    history = [{"role": "user", "content": "refund $75 on invoice 4471 and email customer 4471"}]
    first = ask(client, history)
    outcomes = {
        "issue_refund": (
            wording.RESULT_REJECTED.format(who="Acme Corp reviewer (r@acme.test)", reason="too much"),
            True,
        ),
        "send_email": ("Invalid input for send_email: body: Field required. Fix the arguments and call again.", True),
    }
    history += [first.to_param(), results_for(first, lambda name, _input: outcomes[name])]
    answer = text_of(ask(client, history))
    assert "A person declined issue_refund (too much), so I have not done it." in answer
    assert "send_email failed: Invalid input for send_email: body: Field required" in answer
    for instruction in ("Do not retry", "retry", "Fix the arguments", "call again", "Nothing was done. "):
        assert instruction not in answer


def test_lookup_results_are_described_with_their_details():
    client = demo_client()
    history = [{"role": "user", "content": "who is Alice"}]
    first = ask(client, history)
    customers = {"customers": [{"id": 12, "name": "Alice Moore", "email": "alice@example.com", "plan": "pro"}]}
    history += [first.to_param(), results_for(first, succeed({"lookup_customer": customers}))]

    assert text_of(ask(client, history)) == "Found Alice Moore (id 12, alice@example.com, plan pro)."


def test_a_failed_call_is_reported_and_not_retried():
    # [[invalid tool input]]: the first offered tool with a required argument that is not text gets a word for it
    client = demo_client()
    history = [{"role": "user", "content": "[[invalid tool input]]"}]
    first = ask(client, history)
    [use] = tool_uses(first)
    assert (use.name, use.input) == ("lookup_invoices", {"customer_id": "not-a-number"})

    error = "Invalid input for lookup_invoices: customer_id: Input should be a valid integer. Fix the arguments."
    history += [first.to_param(), results_for(first, lambda *_: (error, True))]
    answer = ask(client, history)
    assert answer.stop_reason == "end_turn"
    assert text_of(answer).startswith("lookup_invoices failed: Invalid input for lookup_invoices")


def test_refund_in_full_looks_up_the_invoice_first_then_refunds_its_amount(stream):
    client = demo_client()
    history = [{"role": "user", "content": "Refund invoice 4471 in full for customer 12."}]
    first = ask(client, history, stream=stream)
    [lookup] = tool_uses(first)
    assert (lookup.name, lookup.input) == ("lookup_invoices", {"customer_id": 12})

    invoices = {
        "invoices": [
            {"id": 4470, "amount_cents": 5000, "status": "paid"},
            {"id": 4471, "amount_cents": 12000, "status": "paid"},
        ]
    }
    history += [first.to_param(), results_for(first, succeed({"lookup_invoices": invoices}))]
    second = ask(client, history, stream=stream)
    assert second.stop_reason == "tool_use"
    [refund] = tool_uses(second)
    assert refund.name == "issue_refund"
    assert refund.input == {
        "invoice_id": 4471,
        "amount_cents": 12000,
        "reason": "Refund invoice 4471 in full for customer 12.",
    }

    refunded = {"refund_id": "re_1", "amount_cents": 12000, "invoice_id": 4471}
    history += [second.to_param(), results_for(second, succeed({"issue_refund": refunded}))]
    third = ask(client, history, stream=stream)
    assert third.stop_reason == "end_turn" and tool_uses(third) == []
    assert text_of(third) == "Refund re_1 of $120.00 issued on invoice 4471."


def test_a_declined_lookup_does_not_lead_to_the_refund():
    client = demo_client()
    history = [{"role": "user", "content": "Refund invoice 4471 in full for customer 12."}]
    first = ask(client, history)
    history += [first.to_param(), results_for(first, lambda *_: ("Declined by a person: no", True))]
    answer = ask(client, history)
    assert answer.stop_reason == "end_turn" and tool_uses(answer) == []


# --- test hooks, determinism and usage ------------------------------------------------------------


def test_unknown_tool_hook_calls_a_tool_that_was_not_offered():
    [use] = tool_uses(ask(demo_client(), [{"role": "user", "content": "[[unknown tool]]"}]))
    assert use.name == NO_SUCH_TOOL
    assert use.name not in {tool["name"] for tool in BILLING_TOOLS}


@pytest.mark.parametrize(("hook", "stop_reason"), [("[[max tokens]]", "max_tokens"), ("[[refusal]]", "refusal")])
def test_stop_reason_hooks(hook, stop_reason, stream):
    message = ask(demo_client(), [{"role": "user", "content": f"tell me {hook}"}], stream=stream)
    assert message.stop_reason == stop_reason


def test_long_answer_streams_in_many_text_chunks():
    request = {
        "model": MODEL,
        "max_tokens": 1024,
        "messages": [{"role": "user", "content": "[[long answer]]"}],
    }
    with demo_client().messages.stream(**request) as live:
        chunks = list(live.text_stream)
        final = live.get_final_message()
    assert len(chunks) > 500
    assert "".join(chunks) == text_of(final)
    assert len(text_of(final).split()) >= 2000


def test_same_request_same_response_and_fresh_ids_per_turn():
    request = {
        "model": MODEL,
        "max_tokens": 100,
        "tools": BILLING_TOOLS,
        "messages": [{"role": "user", "content": "refund $5 on invoice 1 and email customer 2"}],
    }
    first = respond(request)
    assert respond(copy.deepcopy(request)) == first

    other = copy.deepcopy(request)
    other["messages"][0]["content"] += "."
    first_ids = {b["id"] for b in first["content"] if b["type"] == "tool_use"}
    other_ids = {b["id"] for b in respond(other)["content"] if b["type"] == "tool_use"}
    assert len(first_ids) == 2 and first_ids.isdisjoint(other_ids)
    assert respond(other)["id"] != first["id"]


def test_usage_creates_the_cache_on_the_first_call_and_reads_it_afterwards():
    client = demo_client()
    history = [{"role": "user", "content": "who is Alice"}]
    first = ask(client, history)
    history += [first.to_param(), results_for(first, succeed({"lookup_customer": []}))]
    second = ask(client, history)

    assert first.usage.cache_creation_input_tokens > 0 and first.usage.cache_read_input_tokens == 0
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert second.usage.cache_creation_input_tokens == 0
    assert second.usage.input_tokens > first.usage.input_tokens > 0
    assert first.usage.output_tokens > 0


def test_every_demo_answer_is_a_valid_next_assistant_turn():
    for text in ["hello", "who is bob", "refund $1 on invoice 1 and email customer 1", "[[refusal]]"]:
        user = {"role": "user", "content": text}
        answer = respond({"model": MODEL, "max_tokens": 100, "tools": BILLING_TOOLS, "messages": [user]})
        history = [user, {"role": "assistant", "content": answer["content"]}]
        uses = [b for b in answer["content"] if b["type"] == "tool_use"]
        history.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": b["id"], "content": "[]"} for b in uses] or "thanks",
            }
        )
        assert validate_request({"model": MODEL, "max_tokens": 100, "messages": history}) == []
        assert json.loads(json.dumps(answer)) == answer


# --- over HTTP ------------------------------------------------------------------------------------


def test_a_whole_conversation_over_http(model_server, stream):
    client = anthropic.Anthropic(base_url=model_server.url, api_key="test-key", max_retries=0)
    history = [{"role": "user", "content": "Refund invoice 4471 in full for customer 12."}]
    first = ask(client, history, stream=stream)
    invoices = {"invoices": [{"id": 4471, "amount_cents": 3300, "status": "paid"}]}
    history += [first.to_param(), results_for(first, succeed({"lookup_invoices": invoices}))]
    second = ask(client, history, stream=stream)
    history += [second.to_param(), results_for(second, lambda *_: ("Declined by a person: too large", True))]
    third = ask(client, history, stream=stream)

    assert [u.name for u in tool_uses(first) + tool_uses(second)] == ["lookup_invoices", "issue_refund"]
    assert tool_uses(second)[0].input["amount_cents"] == 3300
    assert text_of(third) == "A person declined issue_refund (too large), so I have not done it."
    assert len(model_server.requests) == 3 and model_server.invalid_requests == []
    assert [bool(r.get("stream")) for r in model_server.requests] == [stream] * 3


def test_partly_refunded_invoice_in_full_refunds_what_is_left():
    client = demo_client()
    history = [{"role": "user", "content": "Refund customer 12's invoice in full"}]
    first = ask(client, history)
    invoices = {
        "invoices": [
            {"id": 1, "amount_cents": 900, "refunded_cents": 900, "status": "paid"},
            {"id": 2, "amount_cents": 5000, "refunded_cents": 1500, "status": "paid"},
        ]
    }
    history += [first.to_param(), results_for(first, succeed({"lookup_invoices": invoices}))]
    second = ask(client, history)
    [refund] = tool_uses(second)
    assert (refund.input["invoice_id"], refund.input["amount_cents"]) == (2, 3500)
    assert "Invoice 2 has $35.00 left to refund, so I'll refund $35.00 on it." in text_of(second)


def test_a_named_invoice_missing_from_the_lookup_is_not_refunded():
    client = demo_client()
    history = [{"role": "user", "content": "Refund invoice 99 in full for customer 12."}]
    first = ask(client, history)
    invoices = {"invoices": [{"id": 4471, "amount_cents": 3300, "status": "paid"}]}
    history += [first.to_param(), results_for(first, succeed({"lookup_invoices": invoices}))]
    second = ask(client, history)
    assert second.stop_reason == "end_turn" and tool_uses(second) == []
    assert text_of(second).endswith("Invoice 99 isn't among customer 12's invoices, so I haven't refunded anything.")


def test_tool_calls_fit_the_real_billing_tools():
    registry = demo_registry()
    tools = registry.definitions()
    asks = [
        "who is Alice Moore?",
        "show open invoices for customer 7",
        'refund $12.50 on invoice 4471 and email customer 12 saying "Sorry about that"',
        "close the account of customer 9, they asked us to",
    ]
    for words in asks:
        message = respond(
            {
                "model": MODEL,
                "max_tokens": 100,
                "tools": tools,
                "messages": [{"role": "user", "content": words}],
            }
        )
        calls = [b for b in message["content"] if b["type"] == "tool_use"]
        assert calls, words
        assert [registry.check(c["name"], c["input"]) for c in calls] == [None] * len(calls)

    [bad] = tool_uses(ask(demo_client(), [{"role": "user", "content": "[[invalid tool input]]"}], tools=tools))
    assert registry.check(bad.name, bad.input).startswith(f"Invalid input for {bad.name}:")


@pytest.mark.parametrize(
    ("words", "output", "expected"),
    [
        (
            "email customer 12",
            {"email_id": 3, "customer_id": 12, "to": "alice@example.com", "subject": "Hi"},
            'Email sent to alice@example.com with the subject "Hi".',
        ),
        (
            "close the account of customer 9",
            {"customer_id": 9, "status": "closed", "cancelled_subscriptions": 2, "already_closed": False},
            "Closed the account of customer 9 and cancelled 2 subscriptions.",
        ),
        (
            "close the account of customer 9",
            {"customer_id": 9, "status": "closed", "cancelled_subscriptions": 0, "already_closed": True},
            "The account of customer 9 was already closed.",
        ),
        (
            "invoices for customer 4",
            {"customer_id": 4, "count": 0, "invoices": []},
            "Customer 4 has no invoices.",
        ),
    ],
)
def test_results_in_the_billing_tools_shapes_are_described(words, output, expected):
    client = demo_client()
    history = [{"role": "user", "content": words}]
    first = ask(client, history)
    [use] = tool_uses(first)
    history += [first.to_param(), results_for(first, succeed({use.name: output}))]
    assert text_of(ask(client, history)) == expected


def test_the_readmes_walk_asks_for_calls_that_both_wait_for_a_reviewer():
    """The README's "Trying it" approves call 1 and rejects call 2: the message it sends must make both
    wait (a refund under the $50 rule ran at once, and the approval answered already_decided)."""
    from pathlib import Path

    from webapp.agent import gate
    from webapp.agent.policies import default_policy

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    walk = readme.split("## Trying it", 1)[1].split("```", 2)[1]
    sent = json.loads(walk.split("-d '", 1)[1].split("'", 1)[0])["message"]
    uses = tool_uses(ask(demo_client(), [{"role": "user", "content": sent}]))
    registry = demo_registry()
    assert [use.name for use in uses] == ["issue_refund", "send_email"]
    for use in uses:  # each waits under its tool's own policy, the one a new tenant has
        tool = registry.get(use.name)
        assert gate.waits(default_policy(tool), tool.amount(tool.Input(**use.input))), use.name
    assert '"decision": "approve"' in walk and "approvals/1 " in walk and "approvals/2 " in walk
