"""Which model serves a conversation. By default the process's model client for its configuration:
the anthropic SDK pointed at the API (or at ANTHROPIC_BASE_URL), or at the offline demo model
without a key; native tool use, or the text protocol for models without it (MODEL_PROTOCOL=react,
webapp/llm/react.py). An operator may register other Anthropic-compatible endpoints (a local Ollama
or llama.cpp server, another account) and serve a tenant from one of them (`flask endpoint add`,
`flask tenant set-model`). A tenant may use only the endpoints an operator allowed for it
(`endpoint_tenants`, `flask endpoint allow`): its admins choose among those, and a choice of any
other endpoint is never served (`choice_for` checks the grant again at use). A key read from the
environment comes only from a variable named MODEL_KEY_...: the server's other variables are the
host's, never an endpoint's key."""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import anthropic
import httpx2
from cryptography.fernet import Fernet, InvalidToken
from sqlalchemy import case, exists, select
from sqlalchemy.orm import Session

from webapp import audit_chain, outbound
from webapp.config import Config
from webapp.llm.client import BatchItemResult, BatchState, ModelClient, ModelError, ModelReply
from webapp.llm.react import ReactClient
from webapp.models import OPERATIONS_SLUG, EndpointGrant, ModelEndpoint, Tenant, User, utcnow
from webapp.secrets import sealing

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
KEY_ENV_PREFIX = "MODEL_KEY_"
# Only variables meant for an endpoint's key: naming HOME or DATABASE_URL would hand the host's
# environment to whoever the endpoint's server is.
_KEY_ENV_NAME = re.compile(r"^MODEL_KEY_[A-Za-z0-9_]{1,110}$")
MAX_CONTEXT_WINDOW = 10_000_000
CHOICE_SECONDS = 30.0  # how long a process keeps a tenant's endpoint before reading it again


class EndpointError(ValueError):
    """An endpoint that cannot be registered or used as asked; the message says what to fix, `field`
    names the form field it is about (the pages mark it)."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class EndpointNotAllowed(EndpointError):
    """A tenant's choice of an endpoint it may not use (or that does not exist: the two read the same,
    so a tenant learns nothing of other tenants' endpoints). The attempt is audited on `tenant_id`'s chain."""

    def __init__(self, message: str, field: str, tenant_id: int) -> None:
        super().__init__(message, field)
        self.tenant_id = tenant_id


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
    if api_key_env and not _KEY_ENV_NAME.match(api_key_env):
        raise EndpointError(
            f"{api_key_env!r} cannot hold an endpoint's key: the desk reads keys only from variables named "
            f"{KEY_ENV_PREFIX}..., e.g. {KEY_ENV_PREFIX}QWEN. Put the key in one and name it here.",
            "api_key_env",
        )
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
    if endpoint.api_key_env and key_problem(endpoint):
        return f"key from ${endpoint.api_key_env}, never read (not a {KEY_ENV_PREFIX} variable): set the key again"
    if endpoint.api_key_env:
        return f"key from ${endpoint.api_key_env}"
    return "no key"


def key_problem(endpoint: ModelEndpoint) -> str | None:
    """Why the endpoint's key cannot be read, in words for operators (None: it can). An endpoint
    registered before keys had to come from MODEL_KEY_ variables may name any variable: it is never
    read, and every call of the endpoint fails with this sentence until the key is set again."""
    if endpoint.api_key_env and not endpoint.api_key_encrypted and not _KEY_ENV_NAME.match(endpoint.api_key_env):
        return (
            f"The key of endpoint {endpoint.name} is set to come from ${endpoint.api_key_env}, and the desk reads "
            f"keys only from variables named {KEY_ENV_PREFIX}...: an operator sets it again with `flask endpoint "
            f"update {endpoint.name} --api-key-env {KEY_ENV_PREFIX}...` (or on the endpoint's page)."
        )
    return None


def set_tenant_endpoint(
    session: Session,
    tenant_slug: str,
    endpoint_name: str | None,
    small_endpoint_name: str | None | object = KEEP,
    *,
    allow: bool = False,
) -> tuple[Tenant, list[ModelEndpoint]]:
    """Serve the tenant's conversations from the named endpoint (None: the configured default model),
    and route each new question through the small endpoint's classification (None: no routing; KEEP:
    as it is). Each endpoint named must be one the tenant may use (EndpointNotAllowed otherwise);
    `allow` (the operator's own choice) allows it for the tenant instead. Returns the tenant and the
    endpoints this call allowed for it. Running processes follow within CHOICE_SECONDS. The
    caller commits."""
    tenant = tenant_named(session, tenant_slug)
    allowed_now: list[ModelEndpoint] = []

    def usable(name: object, field: str) -> ModelEndpoint:
        endpoint = session.scalar(select(ModelEndpoint).where(ModelEndpoint.name == str(name).strip().lower()))
        if allow:
            endpoint = endpoint or endpoint_named(session, name, field)  # (an operator sees every registered name)
            if allow_tenants(session, endpoint, [tenant]):
                allowed_now.append(endpoint)
        elif endpoint is None or not may_use(session, tenant.id, endpoint.id):
            raise EndpointNotAllowed(
                f"{tenant.name} may not use an endpoint named {str(name)[:64]!r}: choose one from the list, or ask "
                "an operator to allow another.",
                field,
                tenant.id,
            )
        return endpoint

    large = usable(endpoint_name, "endpoint") if endpoint_name is not None else None
    small_id = tenant.small_endpoint_id
    if small_endpoint_name is not KEEP:
        small = usable(small_endpoint_name, "small_endpoint") if small_endpoint_name is not None else None
        small_id = small.id if small else None
    if small_id is not None and small_id == (large.id if large else None):
        raise EndpointError(
            "The small endpoint is the endpoint itself: choose a smaller, cheaper one, or no small endpoint.",
            "small_endpoint",
        )
    _forget_choice(tenant.id)
    tenant.endpoint_id = large.id if large else None
    tenant.small_endpoint_id = small_id
    return tenant, allowed_now


def endpoint_named(session: Session, name: object, field: str = "name") -> ModelEndpoint:
    """The registered endpoint of this name; an EndpointError names the registered ones otherwise
    (for operators: a tenant's admin is told only of what the tenant may use)."""
    endpoint = session.scalar(select(ModelEndpoint).where(ModelEndpoint.name == str(name).strip().lower()))
    if endpoint is None:
        known = ", ".join(session.scalars(select(ModelEndpoint.name).order_by(ModelEndpoint.name))) or "none yet"
        raise EndpointError(f"There is no endpoint {name!r} (registered: {known}).", field)
    return endpoint


def _forget_choice(tenant_id: int) -> None:
    with _choices_lock:
        _choices.pop(tenant_id, None)  # this process follows at once; the others within CHOICE_SECONDS


# --- which tenants may use an endpoint -----------------------------------------------------------


def tenant_named(session: Session, slug: str) -> Tenant:
    """The tenant with this slug; an EndpointError says so for an unknown slug and for the operations
    tenant (operators hold no conversation, so talk to no model)."""
    slug = str(slug).strip().lower()
    if slug == OPERATIONS_SLUG:
        raise EndpointError(
            f"There is no tenant {OPERATIONS_SLUG!r} to serve: it is the operators' own, and operators talk to no "
            "model. Name a tenant's slug.",
            "tenant",
        )
    tenant = session.scalar(select(Tenant).where(Tenant.slug == slug))
    if tenant is None:
        raise EndpointError(f"There is no tenant {slug[:64]!r}; check the slug.", "tenant")
    return tenant


def may_use(session: Session, tenant_id: int, endpoint_id: int) -> bool:
    """Whether an operator allowed the endpoint for the tenant."""
    return session.get(EndpointGrant, (endpoint_id, tenant_id)) is not None


def usable_endpoints(session: Session, tenant_id: int) -> list[ModelEndpoint]:
    """The endpoints the tenant may use, by name: what its admins may choose among."""
    query = (
        select(ModelEndpoint)
        .join(EndpointGrant, EndpointGrant.endpoint_id == ModelEndpoint.id)
        .where(EndpointGrant.tenant_id == tenant_id)
        .order_by(ModelEndpoint.name)
    )
    return list(session.scalars(query))


def allowed_tenants(session: Session) -> dict[int, list[str]]:
    """The slugs of the tenants that may use each endpoint (by endpoint id), sorted."""
    rows = session.execute(
        select(EndpointGrant.endpoint_id, Tenant.slug)
        .join(Tenant, Tenant.id == EndpointGrant.tenant_id)
        .order_by(Tenant.slug)
    )
    allowed: dict[int, list[str]] = {}
    for endpoint_id, slug in rows:
        allowed.setdefault(endpoint_id, []).append(slug)
    return allowed


def who_may_use(session: Session, endpoint: ModelEndpoint) -> str:
    """A sentence naming the tenants that may use the endpoint, for the command line and the pages."""
    slugs = allowed_tenants(session).get(endpoint.id, [])
    if not slugs:
        return f"No tenant may use {endpoint.name} yet: allow it for one with `flask endpoint allow` or on its page."
    return f"{_and(slugs)} may use {endpoint.name}."


@dataclass
class AccessChange:
    """What a change of who may use an endpoint did, as slugs: newly allowed, no longer allowed,
    served by the endpoint until now (now by the default model), routing through it until now (now
    not routed), and asked for but so already. `tenants` are the tenants whose model changed."""

    endpoint: ModelEndpoint
    allowed: list[str] = field(default_factory=list)
    disallowed: list[str] = field(default_factory=list)
    moved_to_default: list[str] = field(default_factory=list)
    lost_routing: list[str] = field(default_factory=list)
    allowed_already: list[str] = field(default_factory=list)
    disallowed_already: list[str] = field(default_factory=list)
    tenants: list[Tenant] = field(default_factory=list, repr=False)

    @property
    def changed(self) -> bool:
        return bool(self.allowed or self.disallowed)

    def audit_data(self, session: Session) -> dict:
        return {
            "endpoint": self.endpoint.name,
            "allowed": self.allowed,
            "disallowed": self.disallowed,
            "moved_to_default": self.moved_to_default,
            "lost_routing": self.lost_routing,
            "may_use_now": allowed_tenants(session).get(self.endpoint.id, []),
        }

    def sentences(self, default_model: str) -> list[str]:
        """What happened, one sentence each, for the command line and the page's flash."""
        name = self.endpoint.name
        said = [] if self.changed else ["Nothing changed."]
        if self.allowed:
            said.append(f"{_and(self.allowed)} may now use {name}.")
        if self.disallowed:
            said.append(f"{_and(self.disallowed)} may no longer use {name}.")
        for slug in self.moved_to_default:
            said.append(f"{slug} was served by {name}: it is now served by the default model ({default_model}).")
        for slug in self.lost_routing:
            said.append(f"{slug} routed simple questions to {name}: it no longer routes by difficulty.")
        if self.allowed_already:
            said.append(f"{_and(self.allowed_already)} could use {name} already.")
        if self.disallowed_already:
            said.append(f"{_and(self.disallowed_already)} could not use {name} anyway.")
        return said


def _and(slugs: list[str]) -> str:
    return ", ".join(slugs[:-1]) + f" and {slugs[-1]}" if len(slugs) > 1 else "".join(slugs)


def allow_tenants(session: Session, endpoint: ModelEndpoint, tenants: list[Tenant]) -> list[str]:
    """Allow the endpoint for these tenants (the caller commits); the slugs of those newly allowed."""
    newly = []
    for tenant in tenants:
        if tenant.slug not in newly and not may_use(session, tenant.id, endpoint.id):
            session.add(EndpointGrant(endpoint_id=endpoint.id, tenant_id=tenant.id))
            newly.append(tenant.slug)
    session.flush()
    return newly


def change_access(
    session: Session, endpoint: ModelEndpoint, allow: list[Tenant], disallow: list[Tenant]
) -> AccessChange:
    """Allow the endpoint for some tenants and withdraw it from others (the caller commits). A tenant
    served by it goes back to the default model, one routing through it stops routing: the tenant
    keeps working, and its admins may choose again among what it may use."""
    if {t.id for t in allow} & {t.id for t in disallow}:
        raise EndpointError("A tenant is both allowed and disallowed here: say one or the other.", "tenant")
    change = AccessChange(endpoint)
    change.allowed = allow_tenants(session, endpoint, allow)
    change.allowed_already = sorted({t.slug for t in allow} - set(change.allowed))
    for tenant in sorted({t.id: t for t in disallow}.values(), key=lambda t: t.slug):
        grant = session.get(EndpointGrant, (endpoint.id, tenant.id))
        if grant is None:
            change.disallowed_already.append(tenant.slug)
            continue
        session.delete(grant)
        change.disallowed.append(tenant.slug)
        if tenant.endpoint_id == endpoint.id:
            tenant.endpoint_id = None
            change.moved_to_default.append(tenant.slug)
        if tenant.small_endpoint_id == endpoint.id:
            tenant.small_endpoint_id = None
            change.lost_routing.append(tenant.slug)
        if tenant.slug in change.moved_to_default + change.lost_routing:
            change.tenants.append(tenant)
            _forget_choice(tenant.id)
    session.flush()
    return change


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
        if problem := key_problem(endpoint):  # (registered before keys came only from MODEL_KEY_ variables)
            raise EndpointError(problem, "api_key_env")
        return os.environ.get(endpoint.api_key_env, "")
    return "none"  # local servers ignore the key, but the SDK wants one


def _fernet(config: Config) -> Fernet:
    return sealing.fernet(config.secret_key, "model endpoint keys")


def record_access_change(
    session: Session, change: AccessChange, *, actor: User | None = None, actor_label: str | None = None
) -> None:
    """Audit a change of who may use an endpoint (the caller commits): on the global chain, and on the
    chain of each tenant whose model it changed, so the tenant's auditors see why."""
    audit_chain.record(
        session,
        "endpoint_access_changed",
        tenant_id=None,
        actor=actor,
        actor_label=actor_label,
        data=change.audit_data(session),
    )
    for tenant in change.tenants:
        name, small_name = endpoint_names(session, tenant)
        audit_chain.record(
            session,
            "tenant_model_set",
            tenant_id=tenant.id,
            actor=actor,
            actor_label=actor_label,
            data={
                "endpoint": name,
                "small_endpoint": small_name,
                "because": f"an operator withdrew endpoint {change.endpoint.name} from {tenant.slug}",
            },
        )
