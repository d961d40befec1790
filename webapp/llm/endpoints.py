"""The process's model client for its configuration: the anthropic SDK pointed at the API (or at
ANTHROPIC_BASE_URL), or at the offline demo model without a key; native tool use, or the text
protocol for models without it (MODEL_PROTOCOL=react, webapp/llm/react.py)."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx2

from webapp.config import Config
from webapp.llm.client import ModelClient
from webapp.llm.react import ReactClient

_clients: dict[tuple, ModelClient] = {}


def model_client(config: Config, transport: httpx2.BaseTransport | None = None) -> ModelClient:
    """The process's model client for this configuration (created once, then reused)."""
    key = (
        config.anthropic_api_key,
        config.anthropic_base_url,
        config.model,
        config.max_tokens,
        config.model_timeout_seconds,
        config.model_max_retries,
        config.demo_model_reply_seconds,
        config.demo_model_context_tokens,
        config.model_protocol,
        id(transport),
    )
    if key not in _clients:
        options: dict[str, Any] = {
            "timeout": config.model_timeout_seconds,
            "max_retries": config.model_max_retries,
        }
        if config.anthropic_api_key:
            sdk = anthropic.Anthropic(
                api_key=config.anthropic_api_key,
                base_url=config.anthropic_base_url,
                http_client=httpx2.Client(transport=transport) if transport else None,
                **options,
            )
        else:
            from webapp.llm.wire import DemoTransport

            sdk = anthropic.Anthropic(
                api_key="offline-demo",
                base_url="http://demo-model.invalid",
                http_client=httpx2.Client(
                    transport=transport
                    or DemoTransport(
                        reply_seconds=config.demo_model_reply_seconds, context_tokens=config.demo_model_context_tokens
                    )
                ),
                **options,
            )
        kind = ReactClient if config.model_protocol == "react" else ModelClient
        _clients[key] = kind(sdk, config.model, config.max_tokens)
    return _clients[key]
