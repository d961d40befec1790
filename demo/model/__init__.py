"""The offline demo model: a deterministic stand-in for Claude beneath the real `anthropic` SDK, so the
desk runs on a laptop with no key and no network. It is a model endpoint like any other, reached by
the desk through configuration only: MODEL_TRANSPORT names a factory of the httpx2 transport the
default model client is handed, and this package's `transport` is the laptop's default when
ANTHROPIC_API_KEY is unset (webapp/llm/choice.py). The desk imports nothing of it.

- engine.py: the generic engine (respond), its test hooks, and the phrasebooks packs register to
  give it their words (register_phrasebook; the billing pack's is demo/billing/phrases.py);
- other_tools.py: its calls of any other tool it is offered (`[[call TOOL {json}]]`, a tool named in words);
- context.py: its context window, prompt cache and summaries;
- routing.py: its answer to the desk's routing request; react.py: the text protocol (MODEL_PROTOCOL=react);
- batches.py: the Message Batches API, offline; wire.py: the Messages API's wire format and DemoTransport.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from demo.model.wire import DemoTransport

if TYPE_CHECKING:
    from webapp.config import Config


def transport(config: Config) -> DemoTransport:
    """The transport of the desk's default model client when no key is set (MODEL_TRANSPORT's default):
    paced by DEMO_MODEL_REPLY_SECONDS, with a window of DEMO_MODEL_CONTEXT_TOKENS."""
    return DemoTransport(reply_seconds=config.demo_model_reply_seconds, context_tokens=config.demo_model_context_tokens)
