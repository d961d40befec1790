"""Routing by difficulty: the short request that asks a tenant's small model whether a new question is
simple or complex, the reading of its answer, and the offline demo model's answer to it.

A simple question goes to the small endpoint for the whole run; a complex one (or one the small model
could not classify) to the large one. The request is plain words (ModelClient.ask): no tools, no
stream, a few tokens of answer, so it works on any Anthropic-compatible endpoint, local ones included.
"""

from __future__ import annotations

import re

from webapp.llm.client import ModelClient, ModelReply

MARKER = "You sort the questions people ask a support assistant by difficulty."
SYSTEM = (
    MARKER + " A question is simple when one quick look-up or a short answer in words settles it (who is a "
    "customer, what an invoice says). It is complex when it needs several steps, a change to an account "
    "(a refund, an e-mail, closing an account, an export), a judgement or a comparison. "
    "Answer with one word: simple or complex."
)
ANSWER_TOKENS = 8
QUESTION_CHARS = 4000  # the part of a question sent to be classified (its start says enough)
_LABEL = re.compile(r"\b(simple|complex)\b", re.IGNORECASE)


def classify(client: ModelClient, question: str) -> tuple[str | None, ModelReply]:
    """Ask the small model; returns "simple", "complex" or None (an answer that says neither, or both),
    with the reply for the records. Raises ModelError when the endpoint fails."""
    reply = client.ask(SYSTEM, question[:QUESTION_CHARS], ANSWER_TOKENS)
    text = " ".join(block.get("text", "") for block in reply.content if block.get("type") == "text")
    labels = {found.lower() for found in _LABEL.findall(text)}
    return (labels.pop() if len(labels) == 1 else None), reply


# --- the offline demo model's part ----------------------------------------------------------------

DEMO_COMPLEX_CHARS = 160
DEMO_COMPLEX_WORDS = re.compile(
    r"\b(refunds?|e-?mails?|close|closing|export|why|compare|dispute|cancel|and then)\b", re.IGNORECASE
)


def is_route_request(body: dict) -> bool:
    system = body.get("system")
    text = system if isinstance(system, str) else " ".join(b.get("text", "") for b in system or [])
    return text.startswith(MARKER)


def demo_label(body: dict) -> str:
    """The demo model's classification: complex past DEMO_COMPLEX_CHARS or with a word that asks for a
    change or a judgement; simple otherwise."""
    content = (body.get("messages") or [{}])[-1].get("content")
    question = content if isinstance(content, str) else " ".join(b.get("text", "") for b in content or [])
    long = len(question.strip()) > DEMO_COMPLEX_CHARS
    return "complex" if long or DEMO_COMPLEX_WORDS.search(question) else "simple"
