"""What people, sessions and tokens share: the error a request about accounts gets, and the one-way hash
kept of a session key or an API token (never the key itself)."""

from __future__ import annotations

import hashlib


class AccountError(ValueError):
    """A request about accounts that cannot be honoured; the message says what to fix."""


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
