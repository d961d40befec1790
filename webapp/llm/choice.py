"""Which model client serves a conversation's run. By default the process's client for its
configuration: the anthropic SDK pointed at the API (or at ANTHROPIC_BASE_URL), over the transport
MODEL_TRANSPORT's factory gives, if one is named; without a key, the laptop's offline model
(MODEL_TRANSPORT defaults to the offline demo model's then, demo/model/); native tool use, or the
text protocol for models without it (MODEL_PROTOCOL=react, webapp/llm/react.py). A tenant an
operator allowed an endpoint for (grants.py) may be served by it instead, and routed by difficulty
through a small one. A process keeps each tenant's choice for CHOICE_SECONDS and each client for as
long as its endpoint is unchanged."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx2
from sqlalchemy import case, exists, select
from sqlalchemy.orm import Session

from webapp import outbound
from webapp.config import Config, named_by
from webapp.llm import keys
from webapp.llm.client import BatchItemResult, BatchState, ModelClient, ModelError, ModelReply
from webapp.llm.errors import EndpointError
from webapp.llm.react import ReactClient
from webapp.models import EndpointGrant, ModelEndpoint, Tenant

CHOICE_SECONDS = 30.0  # how long a process keeps a tenant's endpoint before reading it again
NOT_ROUTED = "not routed"
_clients: dict[Config, ModelClient] = {}
_choices: dict[int, tuple[float, int | None, int | None]] = {}
_endpoint_clients: dict[Config, ModelClient] = {}
_choices_lock = threading.Lock()


def model_client(config: Config) -> ModelClient:
    """The process's model client for this configuration (created once, then reused): with
    ANTHROPIC_API_KEY, the API's (or ANTHROPIC_BASE_URL's); over MODEL_TRANSPORT's transport when one
    is named, which without a key is the laptop's offline model."""
    if config not in _clients:
        options: dict[str, Any] = {"timeout": config.model_timeout_seconds, "max_retries": config.model_max_retries}
        transport = transport_factory(config.model_transport)(config) if config.model_transport else None
        http_client = httpx2.Client(transport=transport) if transport else None
        if config.anthropic_api_key:
            sdk = anthropic.Anthropic(
                api_key=config.anthropic_api_key, base_url=config.anthropic_base_url, http_client=http_client, **options
            )
        else:  # an offline model answers beneath the SDK: the key and address are never checked
            sdk = anthropic.Anthropic(
                api_key="offline", base_url="http://offline-model.invalid", http_client=http_client, **options
            )
        kind = ReactClient if config.model_protocol == "react" else ModelClient
        _clients[config] = kind(sdk, config.model, config.max_tokens)
    return _clients[config]


def transport_factory(path: str) -> Callable[[Config], httpx2.BaseTransport]:
    """The factory MODEL_TRANSPORT names ("package.module:factory": given the Config, it returns the
    httpx2 transport of the default model client); ValueError says what is wrong with the name."""
    factory = named_by(path)
    if not callable(factory):
        raise ValueError(f"{path!r} is not a function of the Config that returns an httpx2 transport")
    return factory


@dataclass(frozen=True)
class Choice:
    """What serves a conversation's run: the client, the context window it has, and why it serves
    (recorded on each model call); `router` is the tenant's small model while the run is not routed
    yet (None: no routing, or the run is routed)."""

    client: ModelClient
    context_window: int
    reason: str = NOT_ROUTED
    router: ModelClient | None = None


def choice_for(
    session: Session, config: Config, tenant_id: int, route: str | None = None, reason: str | None = None
) -> Choice:
    """The client serving a run of this tenant, with its context window. `route` is the run's route
    ("small" or "large", with its `reason`; None: not routed yet): a tenant with a small endpoint has
    each run routed once, and the run keeps its endpoint for all its moves. A tenant's endpoints are
    read at most every CHOICE_SECONDS per process (a move does not pay a query for them), each only
    if the tenant may still use it (else the default model serves, and no run is routed)."""
    now = time.monotonic()
    with _choices_lock:
        kept = _choices.get(tenant_id)
    if kept is None or now - kept[0] > CHOICE_SECONDS:
        row = session.execute(
            select(_if_allowed(Tenant.endpoint_id), _if_allowed(Tenant.small_endpoint_id)).where(Tenant.id == tenant_id)
        ).one_or_none()
        with _choices_lock:
            _choices[tenant_id] = kept = (now, *(row or (None, None)))
    _, large_id, small_id = kept
    small = _served(session, config, small_id)
    if small is None:  # no routing (or the small endpoint is gone): the tenant's endpoint serves
        return Choice(*_large(session, config, large_id))
    if route == "small":
        return Choice(small.client, small.context_window, reason or "small")
    client, window = _large(session, config, large_id)
    if route == "large":
        return Choice(client, window, reason or "large")
    return Choice(client, window, NOT_ROUTED, router=small.client)


def forget_choice(tenant_id: int) -> None:
    with _choices_lock:
        _choices.pop(tenant_id, None)  # this process follows at once; the others within CHOICE_SECONDS


def _if_allowed(endpoint_id_column):
    """The tenant's endpoint id while an operator allows that endpoint for the tenant, else NULL: a
    row left pointing at an endpoint withdrawn since (a choice racing the withdrawal, a hand edit) is
    never served."""
    granted = exists().where(EndpointGrant.tenant_id == Tenant.id, EndpointGrant.endpoint_id == endpoint_id_column)
    return case((granted, endpoint_id_column), else_=None)


class UnusableEndpointClient(ModelClient):
    """Stands in for an endpoint the desk cannot call as registered (its key cannot be read): every
    call fails for good with the sentence that says what an operator must set again, so the run fails
    in words on its page instead of the job crashing on every retry."""

    def __init__(self, problem: str, endpoint: ModelEndpoint, max_tokens: int) -> None:
        super().__init__(None, endpoint.model, max_tokens, endpoint=endpoint.name)  # type: ignore[arg-type]
        self.problem = problem

    def count_tokens(self, request: dict) -> int | None:
        return None

    def generate(self, **request: Any) -> ModelReply:
        raise ModelError("endpoint_unusable", self.problem, transient=False)

    def ask(self, system: str, text: str, max_tokens: int) -> ModelReply:
        raise ModelError("endpoint_unusable", self.problem, transient=False)

    def send_batch(self, items: list[tuple[str, dict]]) -> str:
        raise ModelError("endpoint_unusable", self.problem, transient=False)

    def batch_state(self, batch_id: str) -> BatchState:
        raise ModelError("endpoint_unusable", self.problem, transient=False)

    def batch_results(self, batch_id: str) -> list[BatchItemResult]:
        raise ModelError("endpoint_unusable", self.problem, transient=False)

    def cancel_batch(self, batch_id: str) -> None:
        raise ModelError("endpoint_unusable", self.problem, transient=False)


def _served(session: Session, config: Config, endpoint_id: int | None) -> Choice | None:
    """The endpoint's client (None: no endpoint), or, when its key cannot be read, one that fails in words."""
    try:
        return _client(session, config, endpoint_id)
    except EndpointError as exc:
        endpoint = session.get(ModelEndpoint, endpoint_id)
        window = endpoint.context_window or config.context_window_tokens
        return Choice(UnusableEndpointClient(str(exc), endpoint, config.max_tokens), window)


def _large(session: Session, config: Config, endpoint_id: int | None) -> tuple[ModelClient, int]:
    chosen = _served(session, config, endpoint_id)
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
            api_key=keys.api_key(endpoint, config),
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
