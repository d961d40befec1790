"""Routing by difficulty: the short request that asks a tenant's small model whether a new question is
simple or complex, and the reading of its answer.

A simple question goes to the small endpoint for the whole run; a complex one (or one the small model
could not classify) to the large one. The request is plain words (ModelClient.ask): no tools, no
stream, a few tokens of answer, so it works on any Anthropic-compatible endpoint, local ones included.
The desk's words name no domain: the examples come from the tools the question could use (their
titles, given by their packs), the ones that only read as look-ups, the ones that wait for a person
(sensitive) as changes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from webapp.llm.client import ModelClient, ModelReply

MARKER = "You sort the questions people ask a support assistant by difficulty."
ANSWER_TOKENS = 8
QUESTION_CHARS = 4000  # the part of a question sent to be classified (its start says enough)
EXAMPLES = 6  # tools named as examples of each kind, at most: enough to show what the words mean
_LABEL = re.compile(r"\b(simple|complex)\b", re.IGNORECASE)


def system_prompt(look_ups: Iterable[str] = (), changes: Iterable[str] = ()) -> str:
    """The classification's instructions: `look_ups` and `changes` are the titles of the tools that
    read and of those that change something (a pack's words: "Look up customer", "Issue refund")."""
    return (
        f"{MARKER} A question is simple when one quick look-up or a short answer in words settles "
        f"it{_for_example(look_ups)}. It is complex when it needs several steps, a change to a "
        f"record{_for_example(changes)}, a judgement or a comparison. Answer with one word: simple or complex."
    )


def _for_example(titles: Iterable[str]) -> str:
    named = sorted({title.strip().lower() for title in titles if title.strip()})[:EXAMPLES]
    return f" (such as: {', '.join(named)})" if named else ""


def classify(client: ModelClient, question: str, system: str | None = None) -> tuple[str | None, ModelReply]:
    """Ask the small model (with `system`, system_prompt's words; default: with no tool named);
    returns "simple", "complex" or None (an answer that says neither, or both), with the reply for the
    records. Raises ModelError when the endpoint fails."""
    reply = client.ask(system or system_prompt(), question[:QUESTION_CHARS], ANSWER_TOKENS)
    text = " ".join(block.get("text", "") for block in reply.content if block.get("type") == "text")
    labels = {found.lower() for found in _LABEL.findall(text)}
    return (labels.pop() if len(labels) == 1 else None), reply
