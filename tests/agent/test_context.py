"""Long conversations: the context-window guard, summaries of older turns, clearing old tool results,
and the prompt cache, on a real database and the real SDK against the demo model over local HTTP with
a small context window (as the endpoint in the issue: 12,000 tokens)."""

from __future__ import annotations

import hashlib
import json

import pytest
from sqlalchemy import select

from demo.model import context as demo_context
from demo.model.wire import validate_request
from tests.model_server import Reply
from tests.replies import reply, text
from webapp.agent.context import Window, clear_old_results, estimate
from webapp.agent.loop import Loop, LoopSettings
from webapp.llm.client import ModelError
from webapp.models import AuditEvent, ModelCall, Summary, utcnow

WINDOW = 12_000
FACT = "My name is Ada Lovelace, the caller's reference code is ZX-4471-Q and she was charged $129.00 twice."
QUESTIONS = [
    "Explain how refunds work, in detail [[long answer]]",
    "Show invoices for customer 4471",
    "And again: how do refunds reach the customer? [[long answer]]",
    "Look up ada@example.com",
]


@pytest.fixture
def small_model(model):
    """The demo endpoint with a 12,000-token window: longer requests get the API's 400."""
    model.context_tokens = WINDOW
    return model


def loop_with_window(new_loop, window: Window | None) -> Loop:
    loop = new_loop(move_budget=1000)
    loop.settings = LoopSettings(tool_output_limit=4000, window=window)
    return loop


def chat(loop: Loop, turns: int, first: str = FACT) -> list[str]:
    """Ask `turns` questions one after another, each answered before the next; the answers' texts."""
    answers = []
    for turn in range(turns):
        loop.ask_later(first if turn == 0 else QUESTIONS[turn % len(QUESTIONS)])
        loop.session.flush()
        assert loop.complete() == "completed", loop.conversation.error_message
        last = loop.last_row()
        assert last.role == "assistant"
        answers.append(" ".join(b["text"] for b in last.content if b["type"] == "text"))
    return answers


def sent(model) -> list[dict]:
    return [body for body in model.requests if body and not demo_context.is_summary_request(body)]


def test_a_thirty_turn_chat_in_a_small_window_is_answered_every_turn_without_a_request_past_the_window(
    session, new_loop, small_model
):
    loop = loop_with_window(new_loop, Window(WINDOW, 1024))
    answers = chat(loop, 30)
    assert all(answer.strip() for answer in answers)
    assert all(demo_context.count(body) + body["max_tokens"] <= WINDOW for body in small_model.requests)
    assert not small_model.invalid_requests  # no tool_use parted from its tool_result, among others
    summaries = list(session.scalars(select(Summary).where(Summary.conversation_id == loop.conversation.id)))
    assert len(summaries) >= 2
    # What the person said in the first turn reaches the model in the last request, word for word.
    last_request = json.dumps(sent(small_model)[-1])
    for fact in ("Ada Lovelace", "ZX-4471-Q", "$129.00"):
        assert fact in last_request


def test_summaries_are_audited_and_counted_like_any_model_call(session, new_loop, small_model):
    started = utcnow()
    loop = loop_with_window(new_loop, Window(WINDOW, 1024))
    chat(loop, 8)
    calls = list(session.scalars(select(ModelCall).where(ModelCall.conversation_id == loop.conversation.id)))
    summary_calls = [call for call in calls if call.purpose == "summary"]
    assert summary_calls and all(call.input_tokens > 0 and call.output_tokens > 0 for call in summary_calls)
    session.commit()
    summaries = {
        s.id: s for s in session.scalars(select(Summary).where(Summary.conversation_id == loop.conversation.id))
    }
    events = [
        event
        for event in session.scalars(select(AuditEvent).where(AuditEvent.action == "conversation_compacted"))
        if event.conversation_id == loop.conversation.id and event.created_at >= started
    ]  # (the audit log outlives each test's conversations, whose ids are reused)
    assert len(events) == len(summary_calls) == len(summaries)
    assert events[0].data["tokens_before"] > Window(WINDOW, 1024).threshold
    # Each answer after a summary says which summary it stood on.
    assert calls[-1].purpose == "answer" and calls[-1].summary_id == max(summaries)


def test_each_model_call_records_the_hashes_of_the_system_prompt_and_tools_it_was_sent(session, new_loop, model):
    loop = loop_with_window(new_loop, Window(200_000, 1024))
    chat(loop, 1, first="Show invoices for customer 4471")
    calls = list(session.scalars(select(ModelCall).where(ModelCall.conversation_id == loop.conversation.id)))
    body = model.requests[-1]

    def digest(value) -> str:
        return hashlib.sha256(json.dumps(value, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    assert {call.system_hash for call in calls} == {digest(body["system"])}
    assert {call.tools_hash for call in calls} == {digest(body["tools"])}
    assert {call.summary_id for call in calls} == {None}


def test_the_endpoint_refusing_a_request_as_too_long_gets_a_summary_and_then_the_answer(session, new_loop, small_model):
    # The desk believes the window is the model's default; the endpoint's is 12,000 tokens.
    loop = loop_with_window(new_loop, Window(200_000, 1024))
    answers = chat(loop, 8)
    assert all(answer.strip() for answer in answers)
    assert session.scalar(select(Summary).where(Summary.conversation_id == loop.conversation.id)) is not None


def test_a_turn_the_api_paused_goes_on_after_a_summary(session, new_loop, small_model):
    # The paused turn's text pushes the next request past the threshold: a summary comes first, and
    # its own stop reason must not end the turn the API paused.
    loop = loop_with_window(new_loop, Window(WINDOW, 1024))
    chat(loop, 3)
    small_model.enqueue(
        Reply.message(reply(text("Working on it." + " Still checking the ledger." * 700), stop_reason="pause_turn")),
        match="PAUSED-TURN",
    )
    small_model.enqueue(Reply.message(reply(text("Done: the ledger is clean."))), match="PAUSED-TURN")
    loop.ask_later("Check the whole ledger, PAUSED-TURN")
    assert loop.complete() == "completed"
    assert session.scalar(select(Summary).where(Summary.conversation_id == loop.conversation.id)) is not None
    last = loop.last_row()
    assert "Done: the ledger is clean." in json.dumps(last.content)
    assert sent(small_model)[-1]["messages"][-1]["role"] == "assistant"  # the paused turn, sent back to go on


def test_a_message_too_long_for_the_window_fails_with_a_sentence_that_says_what_to_do(new_loop, small_model):
    loop = loop_with_window(new_loop, Window(WINDOW, 1024))
    loop.ask_later("Please read this: " + "lorem ipsum dolor " * 3000)
    with pytest.raises(ModelError) as failure:
        loop.complete()
    assert failure.value.code == "too_long" and not failure.value.transient
    assert "Start a new conversation" in failure.value.message
    assert small_model.requests == []  # refused by the desk's own guard, never sent


def test_old_tool_results_are_cleared_oldest_first_and_the_newest_round_is_left_whole():
    def round_trip(n: int, chars: int) -> list[dict]:
        use = {"type": "tool_use", "id": f"toolu_{n}", "name": "lookup_invoices", "input": {"customer_id": n}}
        result = {"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": "x" * chars}
        return [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]

    messages = [{"role": "user", "content": [{"type": "text", "text": "Check every invoice"}]}]
    for n in range(4):
        messages += round_trip(n, 16_000)  # 4,000 tokens each: the turn outgrows a 12,000-token window
    request = {"system": [{"type": "text", "text": "You help."}], "tools": [], "messages": messages}
    window = Window(WINDOW, 1024)
    assert estimate(request) > window.room

    trimmed = clear_old_results(request, window, estimate)

    assert trimmed is not None and estimate(trimmed) <= window.room
    results = [m["content"][0]["content"] for m in trimmed["messages"] if m["content"][0]["type"] == "tool_result"]
    assert results[0].startswith("[This tool result was cleared to save room")  # the oldest went first
    assert results[-1] == "x" * 16_000  # the newest round, which the model must answer, is whole
    assert not validate_request({"model": "m", "max_tokens": 10, **trimmed})  # every pair still whole
    assert request["messages"][2]["content"][0]["content"] == "x" * 16_000  # the original is unchanged


def test_the_history_is_read_from_the_prompt_cache(session, new_loop, model):
    loop = loop_with_window(new_loop, Window(200_000, 1024))
    chat(loop, 12)
    calls = list(session.scalars(select(ModelCall).where(ModelCall.conversation_id == loop.conversation.id)))
    read = sum(call.cache_read_input_tokens for call in calls)
    total = sum(call.input_tokens + call.cache_read_input_tokens + call.cache_creation_input_tokens for call in calls)
    assert read / total >= 0.6
    # The newest block of every request is its third breakpoint, after the system prompt and the tools.
    for body in model.requests:
        assert body["messages"][-1]["content"][-1].get("cache_control") == {"type": "ephemeral"}
