"""The offline demo model's answer to a routing request (webapp/llm/routing.py): a label from the
question's length and words, whatever the prompt says, so a laptop routes with no model to ask."""

from __future__ import annotations

import re

from webapp.llm.routing import MARKER

DEMO_COMPLEX_CHARS = 160
DEMO_COMPLEX_WORDS = re.compile(
    r"\b(refunds?|e-?mails?|close|closing|export|why|compare|dispute|cancel|and then)\b", re.IGNORECASE
)


def is_route_request(body: dict) -> bool:
    """Whether the request asks to classify a question (its system prompt opens with the desk's words)."""
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
