"""Which model serves a conversation. By default the process's model client for its configuration:
the anthropic SDK pointed at the API (or at ANTHROPIC_BASE_URL), or at the offline demo model
without a key; native tool use, or the text protocol for models without it (MODEL_PROTOCOL=react,
webapp/llm/react.py). An operator may register other Anthropic-compatible endpoints (a local Ollama
or llama.cpp server, another account) and serve a tenant from one of them (`flask endpoint add`,
`flask tenant set-model`)."""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import anthropic
import httpx2
from cryptography.fernet import Fernet, InvalidToken
from sqlalchemy import select
from sqlalchemy.orm import Session

from webapp import sealing
from webapp.config import Config
from webapp.llm.client import ModelClient
from webapp.llm.react import ReactClient
from webapp.models import OPERATIONS_SLUG, ModelEndpoint, Tenant

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


# --- endpoints an operator registers (`flask endpoint ...`, `flask tenant set-model ...`) ---------

PROTOCOLS = ("tools", "react")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,119}$")
CHOICE_SECONDS = 30.0  # how long a process keeps a tenant's endpoint before reading it again


class EndpointError(ValueError):
    """An endpoint that cannot be registered or used as asked; the message says what to fix."""


@dataclass(frozen=True)
class Choice:
    """What serves a tenant's conversations: the client, and the context window it has."""

    client: ModelClient
    context_window: int


def add_endpoint(
    session: Session,
    config: Config,
    name: str,
    *,
    base_url: str,
    model: str,
    api_key: str | None = None,
    api_key_env: str | None = None,
    protocol: str = "tools",
    context_window: int | None = None,
) -> ModelEndpoint:
    """Register an endpoint (the caller commits). The key is stored encrypted with a key derived from
    SECRET_KEY, or read at each use from the environment variable `api_key_env`."""
    name = name.strip().lower()
    if not _NAME.match(name):
        raise EndpointError(f"{name!r} is not an endpoint name: use up to 64 of a-z, 0-9, - and _, e.g. local-qwen")
    if session.scalar(select(ModelEndpoint.id).where(ModelEndpoint.name == name)):
        raise EndpointError(f"An endpoint named {name} already exists; pick another name.")
    parts = urlsplit(base_url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise EndpointError(f"{base_url!r} is not a base URL: give one like http://127.0.0.1:11434")
    if not model.strip():
        raise EndpointError("Name the model to ask at this endpoint, e.g. --model qwen3:8b")
    if protocol not in PROTOCOLS:
        raise EndpointError(f"The protocol must be one of {', '.join(PROTOCOLS)}, not {protocol!r}.")
    if api_key and api_key_env:
        raise EndpointError("Give the key (--api-key) or the variable that holds it (--api-key-env), not both.")
    if api_key_env and not _ENV_NAME.match(api_key_env):
        raise EndpointError(f"{api_key_env!r} is not an environment variable name, e.g. QWEN_API_KEY")
    if context_window is not None and context_window < 2 * config.max_tokens:
        raise EndpointError(
            f"A context window of {context_window:,} tokens leaves no room: it must be at least twice "
            f"MAX_TOKENS ({config.max_tokens:,})."
        )
    endpoint = ModelEndpoint(
        name=name,
        base_url=base_url.strip().rstrip("/"),
        model=model.strip(),
        protocol=protocol,
        context_window=context_window,
        api_key_encrypted=_fernet(config).encrypt(api_key.encode()).decode() if api_key else None,
        api_key_env=api_key_env or None,
    )
    session.add(endpoint)
    session.flush()
    return endpoint


def set_tenant_endpoint(session: Session, tenant_slug: str, endpoint_name: str | None) -> Tenant:
    """Serve the tenant's conversations from the named endpoint (None: the configured default model).
    Running processes follow within CHOICE_SECONDS. The caller commits."""
    tenant = session.scalar(select(Tenant).where(Tenant.slug == tenant_slug.strip().lower()))
    if tenant is None or tenant.slug == OPERATIONS_SLUG:  # operators hold no conversation, so talk to no model
        raise EndpointError(f"There is no tenant {tenant_slug!r}.")
    with _choices_lock:
        _choices.pop(tenant.id, None)  # this process follows at once; the others within CHOICE_SECONDS
    if endpoint_name is None:
        tenant.endpoint_id = None
        return tenant
    endpoint = session.scalar(select(ModelEndpoint).where(ModelEndpoint.name == endpoint_name.strip().lower()))
    if endpoint is None:
        known = ", ".join(session.scalars(select(ModelEndpoint.name).order_by(ModelEndpoint.name))) or "none yet"
        raise EndpointError(f"There is no endpoint {endpoint_name!r} (registered: {known}).")
    tenant.endpoint_id = endpoint.id
    return tenant


def describe(endpoint: ModelEndpoint) -> str:
    """One line for people: never the key itself."""
    if endpoint.api_key_encrypted:
        key = "key stored encrypted"
    elif endpoint.api_key_env:
        key = f"key from ${endpoint.api_key_env}"
    else:
        key = "no key"
    window = f"{endpoint.context_window:,}-token window" if endpoint.context_window else "default window"
    return f"{endpoint.name}: {endpoint.model} at {endpoint.base_url} ({endpoint.protocol}, {window}, {key})"


_choices: dict[int, tuple[float, int | None]] = {}
_endpoint_clients: dict[tuple, ModelClient] = {}
_choices_lock = threading.Lock()


def choice_for(session: Session, config: Config, tenant_id: int) -> Choice:
    """The client serving this tenant's conversations, with its context window. A tenant's choice is
    read at most every CHOICE_SECONDS per process (a move does not pay a query for it)."""
    now = time.monotonic()
    with _choices_lock:
        kept = _choices.get(tenant_id)
    if kept is None or now - kept[0] > CHOICE_SECONDS:
        endpoint_id = session.scalar(select(Tenant.endpoint_id).where(Tenant.id == tenant_id))
        with _choices_lock:
            _choices[tenant_id] = kept = (now, endpoint_id)
    endpoint = session.get(ModelEndpoint, kept[1]) if kept[1] is not None else None
    if endpoint is None:  # the configured default (or the endpoint is gone: the default until it is set again)
        return Choice(model_client(config), config.context_window_tokens)
    key = (endpoint.id, endpoint.updated_at, config.model_timeout_seconds, config.model_max_retries, config.max_tokens)
    with _choices_lock:
        client = _endpoint_clients.get(key)
    if client is None:
        sdk = anthropic.Anthropic(
            api_key=_api_key(endpoint, config),
            base_url=endpoint.base_url,
            timeout=config.model_timeout_seconds,
            max_retries=config.model_max_retries,
        )
        kind = ReactClient if endpoint.protocol == "react" else ModelClient
        client = kind(sdk, endpoint.model, config.max_tokens, endpoint=endpoint.name)
        with _choices_lock:
            _endpoint_clients[key] = client
    return Choice(client, endpoint.context_window or config.context_window_tokens)


def _api_key(endpoint: ModelEndpoint, config: Config) -> str:
    if endpoint.api_key_encrypted:
        try:
            return _fernet(config).decrypt(endpoint.api_key_encrypted.encode()).decode()
        except InvalidToken:
            raise EndpointError(
                f"The key of endpoint {endpoint.name} cannot be read: SECRET_KEY changed since it was stored. "
                "Register the endpoint again with its key."
            ) from None
    if endpoint.api_key_env:
        return os.environ.get(endpoint.api_key_env, "")
    return "none"  # local servers ignore the key, but the SDK wants one


def _fernet(config: Config) -> Fernet:
    return sealing.fernet(config.secret_key, "model endpoint keys")
