"""The model endpoints an operator registers (`flask endpoint add|update`): other Anthropic-compatible
servers than the configured default (a local Ollama or llama.cpp server, another account), each
checked field by field, and kept as the audit log and the pages show them (never the key). Who may
use which is grants.py; where its key comes from, keys.py; which client serves a tenant, choice.py."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from sqlalchemy import select
from sqlalchemy.orm import Session

from webapp import outbound
from webapp.config import Config
from webapp.llm import keys
from webapp.llm.errors import EndpointError
from webapp.models import OPERATIONS_SLUG, ModelEndpoint, Tenant, utcnow

PROTOCOLS = ("tools", "react")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
MAX_CONTEXT_WINDOW = 10_000_000


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
    if api_key_env and not keys.KEY_ENV_NAME.match(api_key_env):
        raise EndpointError(
            f"{api_key_env!r} cannot hold an endpoint's key: the desk reads keys only from variables named "
            f"{keys.KEY_ENV_PREFIX}..., e.g. {keys.KEY_ENV_PREFIX}QWEN. Put the key in one and name it here.",
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
        endpoint.api_key_encrypted, endpoint.api_key_env = keys.seal(config, api_key), None
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
        "key": keys.key_source(endpoint),
    }


def describe(endpoint: ModelEndpoint) -> str:
    """One line for people: never the key itself."""
    key = keys.key_source(endpoint)
    window = f"{endpoint.context_window:,}-token window" if endpoint.context_window else "default window"
    return f"{endpoint.name}: {endpoint.model} at {endpoint.base_url} ({endpoint.protocol}, {window}, {key})"


def endpoint_named(session: Session, name: object, field: str = "name") -> ModelEndpoint:
    """The registered endpoint of this name; an EndpointError names the registered ones otherwise
    (for operators: a tenant's admin is told only of what the tenant may use)."""
    endpoint = session.scalar(select(ModelEndpoint).where(ModelEndpoint.name == str(name).strip().lower()))
    if endpoint is None:
        known = ", ".join(session.scalars(select(ModelEndpoint.name).order_by(ModelEndpoint.name))) or "none yet"
        raise EndpointError(f"There is no endpoint {name!r} (registered: {known}).", field)
    return endpoint


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


def endpoint_names(session: Session, tenant: Tenant) -> tuple[str, str | None]:
    """The names of the tenant's endpoint ("default": the configured model) and small endpoint."""
    names = dict(session.execute(select(ModelEndpoint.id, ModelEndpoint.name)).all())
    return names.get(tenant.endpoint_id, "default"), names.get(tenant.small_endpoint_id)
