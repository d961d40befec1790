"""Long conversations: one chat of many turns (a fact stated first, then long answers and tool
lookups in turn), run in-process with advance() against the offline demo model (beneath the real
SDK) whose context window is 12,000 tokens, three ways:

- "summaries, cached history": the desk as it is: CONTEXT_WINDOW_TOKENS=12,000, older turns
  summarised past COMPACT_AT, the moving prompt-cache breakpoint on the newest block;
- "whole history, cached": no window guard (the endpoint's window opened up so it answers), every
  request the whole history, with the moving breakpoint;
- "whole history, system and tools cached": the same without the moving breakpoint: how the desk
  sent requests before (only the system prompt and the tools were cache breakpoints).

Per way: turns answered, the largest request (input tokens, cached or not) against the window, the
share of input tokens read from the prompt cache, tokens and cost per turn (US cents at Sonnet's list prices),
and whether the first turn's fact is still in what the model is sent at the end.
"""

from __future__ import annotations

import json

from sqlalchemy import select

from bench.runs import new_conversations

FACT = "The caller is Ada Lovelace, reference ZX-4471-Q, charged $129.00 twice."
QUESTIONS = (
    "Explain how refunds work, in detail [[long answer]]",
    "Show invoices for customer 4471",
    "And how do refunds reach the customer? [[long answer]]",
    "Look up ada@example.com",
)
WAYS = ("summaries, cached history", "whole history, cached", "whole history, system and tools cached")


def measure_context(app, turns: int, window: int = 12_000) -> dict:
    import anthropic
    import httpx2

    from demo.model.wire import DemoTransport
    from webapp.agent import moves
    from webapp.agent.context import Window
    from webapp.agent.loop import Loop, LoopSettings
    from webapp.audit.costs import PriceTable
    from webapp.llm.client import ModelClient
    from webapp.models import Conversation, ModelCall
    from webapp.runtime.extensions import db
    from webapp.runtime.services import services

    prices = PriceTable()
    results = {}
    with app.app_context():
        desk = services()
        max_tokens = desk.config.max_tokens
        for way in WAYS:
            guarded = way == WAYS[0]
            settings = LoopSettings(
                tool_output_limit=desk.config.tool_output_limit,
                window=Window(window, max_tokens) if guarded else None,
                cache_history=way != WAYS[2],
            )
            transport = DemoTransport(context_tokens=window if guarded else 10_000_000)
            sdk = anthropic.Anthropic(
                api_key="bench", base_url="http://demo-model.invalid", http_client=httpx2.Client(transport=transport)
            )
            model = ModelClient(sdk, "claude-sonnet-5", max_tokens)

            def make_loop(session, conversation, should_stop=None, tail=None, *, settings=settings, model=model):
                return Loop(
                    session,
                    conversation,
                    model=model,
                    tools=desk.tools,
                    settings=settings,
                    should_stop=should_stop,
                    tail=tail,
                )

            ((conversation_id, version),) = new_conversations(app, 1, question=FACT)
            answered = 0
            for turn in range(turns):
                if turn:
                    conversation = db.session.get(Conversation, conversation_id)
                    make_loop(db.session, conversation).ask_later(QUESTIONS[turn % len(QUESTIONS)])
                    version = moves.start_run(db.session, conversation)
                    db.session.commit()
                while version is not None:
                    result = moves.advance(
                        db.session, conversation_id, version, owner="bench", make_loop=make_loop, lease_seconds=60
                    )
                    version = result.next_version
                status = db.session.scalar(select(Conversation.status).where(Conversation.id == conversation_id))
                db.session.remove()
                if status != "completed":
                    break
                answered += 1
            calls = list(db.session.scalars(select(ModelCall).where(ModelCall.conversation_id == conversation_id)))
            sizes = [c.input_tokens + c.cache_read_input_tokens + c.cache_creation_input_tokens for c in calls]
            read = sum(c.cache_read_input_tokens for c in calls)
            cost = sum(prices.cost(c) for c in calls)
            # What the model would be sent next: the summary and the turns after it, or the whole history.
            next_request = json.dumps(
                make_loop(db.session, db.session.get(Conversation, conversation_id)).build_request()
            )
            results[way] = {
                "turns": turns,
                "answered": answered,
                "largest_request_tokens": max(sizes),
                "window_tokens": window,
                "over_window": sum(1 for size in sizes if size + max_tokens > window),
                "summaries": sum(1 for c in calls if c.purpose == "summary"),
                "cache_read_share": round(read / sum(sizes), 3),
                "input_tokens_per_turn": round(sum(sizes) / max(1, answered)),
                "output_tokens_per_turn": round(sum(c.output_tokens for c in calls) / max(1, answered)),
                "cents_per_turn": round(float(cost) * 100 / max(1, answered), 2),
                "fact_kept": "ZX-4471-Q" in next_request,
            }
            db.session.remove()
    return results
