"""Where a registered endpoint's key comes from: stored sealed (a Fernet key derived from SECRET_KEY),
or read at each use from an environment variable named MODEL_KEY_...: the server's other variables
are the host's, never an endpoint's key."""

from __future__ import annotations

import os
import re

from cryptography.fernet import Fernet, InvalidToken

from webapp.config import Config
from webapp.llm.errors import EndpointError
from webapp.models import ModelEndpoint
from webapp.secrets import sealing

KEY_ENV_PREFIX = "MODEL_KEY_"
# Only variables meant for an endpoint's key: naming HOME or DATABASE_URL would hand the host's
# environment to whoever the endpoint's server is.
KEY_ENV_NAME = re.compile(r"^MODEL_KEY_[A-Za-z0-9_]{1,110}$")


def key_source(endpoint: ModelEndpoint) -> str:
    """Where the endpoint's key comes from, in words for operators (never the key itself)."""
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
    if endpoint.api_key_env and not endpoint.api_key_encrypted and not KEY_ENV_NAME.match(endpoint.api_key_env):
        return (
            f"The key of endpoint {endpoint.name} is set to come from ${endpoint.api_key_env}, and the desk reads "
            f"keys only from variables named {KEY_ENV_PREFIX}...: an operator sets it again with `flask endpoint "
            f"update {endpoint.name} --api-key-env {KEY_ENV_PREFIX}...` (or on the endpoint's page)."
        )
    return None


def api_key(endpoint: ModelEndpoint, config: Config) -> str:
    """The key to call the endpoint with, read now; an EndpointError says what an operator must set again."""
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


def seal(config: Config, key: str) -> str:
    """The key as stored: sealed under SECRET_KEY, so the database alone does not give it away."""
    return _fernet(config).encrypt(key.encode()).decode()


def _fernet(config: Config) -> Fernet:
    return sealing.fernet(config.secret_key, "model endpoint keys")
