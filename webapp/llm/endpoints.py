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

from webapp import outbound, sealing
from webapp.config import Config
from webapp.llm.client import ModelClient
from webapp.llm.react import ReactClient
from webapp.models import OPERATIONS_SLUG, ModelEndpoint, Tenant, utcnow

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
MAX_CONTEXT_WINDOW = 10_000_000
CHOICE_SECONDS = 30.0  # how long a process keeps a tenant's endpoint before reading it again


class EndpointError(ValueError):
    """An endpoint that cannot be registered or used as asked; the message says what to fix, `field`
    names the form field it is about (the pages mark it)."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


KEEP = object()  # set_tenant_endpoint's small endpoint: leave it as it is


NOT_ROUTED = "not routed"


@dataclass(frozen=True)
class Choice:
    """What serves a conversation's run: the client, the context window it has, and why it serves
    (recorded on each model call); `router` is the tenant's small model while the run is not routed
    yet (None: no routing, or the run is routed)."""

    client: ModelClient
    context_window: int
    reason: str = NOT_ROUTED
    router: ModelClient | None = None


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
        raise EndpointError(
            f"{name!r} is not an endpoint name: use up to 64 of a-z, 0-9, - and _, e.g. local-qwen", "name"
        )
    if session.scalar(select(ModelEndpoint.id).where(ModelEndpoint.name == name)):
        raise EndpointError(f"An endpoint named {name} already exists; pick another name.", "name")
    endpoint = ModelEndpoint(name=name)
    _apply(endpoint, config, base_url, model, protocol, context_window, api_key, api_key_env, forget_key=False)
    session.add(endpoint)
    session.flush()
    return endpoint


def update_endpoint(
    session: Session,
    config: Config,
    endpoint: ModelEndpoint,
    *,
    base_url: str,
    model: str,
    protocol: str,
    context_window: int | None,
    api_key: str | None = None,
    api_key_env: str | None = None,
    forget_key: bool = False,
) -> dict:
    """Change a registered endpoint (the caller commits): an empty `api_key` keeps the stored key,
    `forget_key` drops it (a local server). Returns what it was before, as `snapshot` gives it.
    The processes' clients follow at once (they are keyed by `updated_at`)."""
    before = snapshot(endpoint)
    _apply(endpoint, config, base_url, model, protocol, context_window, api_key, api_key_env, forget_key)
    if snapshot(endpoint) == before and not api_key:
        raise EndpointError("Nothing changed: this is the endpoint as registered already.")
    endpoint.updated_at = utcnow()
    session.flush()
    return before


def _apply(
    endpoint: ModelEndpoint,
    config: Config,
    base_url: str,
    model: str,
    protocol: str,
    context_window: int | None,
    api_key: str | None,
    api_key_env: str | None,
    forget_key: bool,
) -> None:
    """Check every field, then set them: nothing is changed when one is wrong."""
    api_key, api_key_env = (api_key or "").strip(), (api_key_env or "").strip()
    parts = urlsplit(base_url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise EndpointError(f"{base_url!r} is not a base URL: give one like http://127.0.0.1:11434", "base_url")
    if not model.strip():
        raise EndpointError("Name the model to ask at this endpoint, e.g. qwen3:8b", "model")
    if len(model.strip()) > 120:
        raise EndpointError("The model's name is longer than 120 characters; check it.", "model")
    if protocol not in PROTOCOLS:
        raise EndpointError(f"The protocol must be one of {', '.join(PROTOCOLS)}, not {protocol!r}.", "protocol")
    if api_key and api_key_env:
        raise EndpointError("Give the key or the environment variable that holds it, not both.", "api_key")
    if api_key and forget_key:
        raise EndpointError("Give a new key or drop the key, not both.", "api_key")
    if api_key_env and not _ENV_NAME.match(api_key_env):
        raise EndpointError(f"{api_key_env!r} is not an environment variable name, e.g. QWEN_API_KEY", "api_key_env")
    if context_window is not None and context_window < 2 * config.max_tokens:
        raise EndpointError(
            f"A context window of {context_window:,} tokens leaves no room: it must be at least twice "
            f"MAX_TOKENS ({config.max_tokens:,}).",
            "context_window",
        )
    if context_window is not None and context_window > MAX_CONTEXT_WINDOW:
        raise EndpointError(
            f"A context window of {context_window:,} tokens is more than any model has; give at most "
            f"{MAX_CONTEXT_WINDOW:,}.",
            "context_window",
        )
    if len(base_url.strip()) > 500:
        raise EndpointError("The base URL is longer than 500 characters; check it.", "base_url")
    try:  # last: it may look the name up
        outbound.check_url(base_url.strip(), config.outbound_allow)
    except outbound.OutboundError as exc:
        raise EndpointError(str(exc), "base_url") from exc
    endpoint.base_url = base_url.strip().rstrip("/")
    endpoint.model = model.strip()
    endpoint.protocol = protocol
    endpoint.context_window = context_window
    if api_key:
        endpoint.api_key_encrypted, endpoint.api_key_env = _fernet(config).encrypt(api_key.encode()).decode(), None
    elif api_key_env:
        endpoint.api_key_encrypted, endpoint.api_key_env = None, api_key_env
    elif forget_key or endpoint.api_key_env:  # the variable emptied: no key (a stored key stays unless dropped)
        endpoint.api_key_env = None
        if forget_key:
            endpoint.api_key_encrypted = None


def snapshot(endpoint: ModelEndpoint) -> dict:
    """The endpoint as the audit log and the pages keep it: never the key, only where it comes from."""
    return {
        "name": endpoint.name,
        "base_url": endpoint.base_url,
        "model": endpoint.model,
        "protocol": endpoint.protocol,
        "context_window": endpoint.context_window,
        "key": key_source(endpoint),
    }


def key_source(endpoint: ModelEndpoint) -> str:
    if endpoint.api_key_encrypted:
        return "key stored encrypted"
    if endpoint.api_key_env:
        return f"key from ${endpoint.api_key_env}"
    return "no key"


def set_tenant_endpoint(
    session: Session, tenant_slug: str, endpoint_name: str | None, small_endpoint_name: str | None | object = KEEP
) -> Tenant:
    """Serve the tenant's conversations from the named endpoint (None: the configured default model),
    and route each new question through the small endpoint's classification (None: no routing; KEEP:
    as it is). Running processes follow within CHOICE_SECONDS. The caller commits."""
    tenant = session.scalar(select(Tenant).where(Tenant.slug == tenant_slug.strip().lower()))
    if tenant is None or tenant.slug == OPERATIONS_SLUG:  # operators hold no conversation, so talk to no model
        raise EndpointError(f"There is no tenant {tenant_slug!r}.")
    large = _named(session, endpoint_name, "endpoint") if endpoint_name is not None else None
    small_id = tenant.small_endpoint_id
    if small_endpoint_name is not KEEP:
        small = _named(session, small_endpoint_name, "small_endpoint") if small_endpoint_name is not None else None
        small_id = small.id if small else None
    if small_id is not None and small_id == (large.id if large else None):
        raise EndpointError(
            "The small endpoint is the endpoint itself: choose a smaller, cheaper one, or no small endpoint.",
            "small_endpoint",
        )
    with _choices_lock:
        _choices.pop(tenant.id, None)  # this process follows at once; the others within CHOICE_SECONDS
    tenant.endpoint_id = large.id if large else None
    tenant.small_endpoint_id = small_id
    return tenant


def _named(session: Session, name: object, field: str) -> ModelEndpoint:
    endpoint = session.scalar(select(ModelEndpoint).where(ModelEndpoint.name == str(name).strip().lower()))
    if endpoint is None:
        known = ", ".join(session.scalars(select(ModelEndpoint.name).order_by(ModelEndpoint.name))) or "none yet"
        raise EndpointError(f"There is no endpoint {name!r} (registered: {known}).", field)
    return endpoint


def endpoint_names(session: Session, tenant: Tenant) -> tuple[str, str | None]:
    """The names of the tenant's endpoint ("default": the configured model) and small endpoint."""
    names = dict(session.execute(select(ModelEndpoint.id, ModelEndpoint.name)).all())
    return names.get(tenant.endpoint_id, "default"), names.get(tenant.small_endpoint_id)


def describe(endpoint: ModelEndpoint) -> str:
    """One line for people: never the key itself."""
    key = key_source(endpoint)
    window = f"{endpoint.context_window:,}-token window" if endpoint.context_window else "default window"
    return f"{endpoint.name}: {endpoint.model} at {endpoint.base_url} ({endpoint.protocol}, {window}, {key})"


_choices: dict[int, tuple[float, int | None, int | None]] = {}
_endpoint_clients: dict[tuple, ModelClient] = {}
_choices_lock = threading.Lock()


def choice_for(
    session: Session, config: Config, tenant_id: int, route: str | None = None, reason: str | None = None
) -> Choice:
    """The client serving a run of this tenant, with its context window. `route` is the run's route
    ("small" or "large", with its `reason`; None: not routed yet): a tenant with a small endpoint has
    each run routed once, and the run keeps its endpoint for all its moves. A tenant's endpoints are
    read at most every CHOICE_SECONDS per process (a move does not pay a query for them)."""
    now = time.monotonic()
    with _choices_lock:
        kept = _choices.get(tenant_id)
    if kept is None or now - kept[0] > CHOICE_SECONDS:
        row = session.execute(
            select(Tenant.endpoint_id, Tenant.small_endpoint_id).where(Tenant.id == tenant_id)
        ).one_or_none()
        with _choices_lock:
            _choices[tenant_id] = kept = (now, *(row or (None, None)))
    _, large_id, small_id = kept
    small = _client(session, config, small_id)
    if small is None:  # no routing (or the small endpoint is gone): the tenant's endpoint serves
        return Choice(*_large(session, config, large_id))
    if route == "small":
        return Choice(small.client, small.context_window, reason or "small")
    client, window = _large(session, config, large_id)
    if route == "large":
        return Choice(client, window, reason or "large")
    return Choice(client, window, NOT_ROUTED, router=small.client)


def _large(session: Session, config: Config, endpoint_id: int | None) -> tuple[ModelClient, int]:
    chosen = _client(session, config, endpoint_id)
    if chosen is None:  # the configured default (or the endpoint is gone: the default until it is set again)
        return model_client(config), config.context_window_tokens
    return chosen.client, chosen.context_window


def _client(session: Session, config: Config, endpoint_id: int | None) -> Choice | None:
    endpoint = session.get(ModelEndpoint, endpoint_id) if endpoint_id is not None else None
    if endpoint is None:
        return None
    key = (
        endpoint.id,
        endpoint.updated_at,
        config.model_timeout_seconds,
        config.model_max_retries,
        config.max_tokens,
        config.outbound_allow,
    )
    with _choices_lock:
        client = _endpoint_clients.get(key)
    if client is None:
        sdk = anthropic.Anthropic(
            api_key=_api_key(endpoint, config),
            base_url=endpoint.base_url,
            timeout=config.model_timeout_seconds,
            max_retries=config.model_max_retries,
            # A registered endpoint is reached through the outbound guard: public addresses only (or
            # OUTBOUND_ALLOW's), and no redirect (the SDK's own client follows them). The SDK's
            # connection limits stay, and its timeout (above) holds per request.
            http_client=anthropic.DefaultHttpxClient(
                transport=outbound.GuardedTransport(config.outbound_allow, anthropic.DEFAULT_CONNECTION_LIMITS),
                follow_redirects=False,
                trust_env=False,
            ),
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
