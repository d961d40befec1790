"""Secrets the desk must read back (a model endpoint's API key, a tenant's webhook signing secret),
stored encrypted with a key derived from SECRET_KEY: one Fernet key per purpose, so a key of one kind
never opens another kind. Changing SECRET_KEY makes what was sealed unreadable (InvalidToken)."""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken

__all__ = ["InvalidToken", "fernet", "seal", "unseal"]


def fernet(secret_key: str, purpose: str) -> Fernet:
    digest = hashlib.sha256(purpose.encode() + b"\0" + secret_key.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def seal(secret_key: str, purpose: str, text: str) -> str:
    return fernet(secret_key, purpose).encrypt(text.encode()).decode()


def unseal(secret_key: str, purpose: str, sealed: str) -> str:
    """The text back; InvalidToken when SECRET_KEY changed since it was sealed."""
    return fernet(secret_key, purpose).decrypt(sealed.encode()).decode()
