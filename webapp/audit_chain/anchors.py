"""Checkpoints of the audit log kept outside the database.

verify() proves each event links to the one before and matches its content, but someone who can
write to the database could rewrite an event and recompute every hash after it: the chain would be
intact again. A checkpoint closes that gap. `flask --app webapp audit anchor` writes, for every
chain, the head's seq and hash, signed with the desk's Ed25519 key, to a file an auditor keeps
elsewhere. `audit verify --against FILE` then checks the signature and that each chain still has
that hash at that seq: with the chain intact from its start, nothing up to the checkpoint can have
been rewritten.

The private key lives in AUDIT_ANCHOR_KEY_FILE (default: instance/audit_anchor_key.pem, made on the
first anchor, readable by its owner only); the checkpoint carries the public key and its
fingerprint, for the auditor to compare with the one they recorded.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from sqlalchemy import select
from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.models import AuditEvent, AuditHead

KIND = "approval-desk audit checkpoint"


class AnchorError(Exception):
    """A checkpoint that cannot be made or read; the message says why and what to do."""


def load_key(path: Path, create: bool) -> Ed25519PrivateKey | None:
    """The desk's signing key; made (owner-only) when `create` and there is none yet."""
    if path.exists():
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (ValueError, TypeError) as exc:
            raise AnchorError(f"{path} is not an Ed25519 private key in PEM ({exc}).") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise AnchorError(f"{path} holds a key of another kind; checkpoints are signed with Ed25519.")
        return key
    if not create:
        return None
    key = Ed25519PrivateKey.generate()
    path.parent.mkdir(parents=True, exist_ok=True)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        out.write(pem)
    return key


def fingerprint(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "sha256:" + hashlib.sha256(raw).hexdigest()[:32]


def _canonical(checkpoint: Mapping) -> bytes:
    return json.dumps(checkpoint, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def make(session: Session, key: Ed25519PrivateKey) -> dict:
    """A signed checkpoint of every chain's head, now."""
    heads = session.execute(select(AuditHead.chain, AuditHead.seq, AuditHead.hash).order_by(AuditHead.chain)).all()
    checkpoint = {
        "kind": KIND,
        "version": 1,
        "made_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "events": sum(head.seq for head in heads),
        "chains": {head.chain: {"seq": head.seq, "hash": head.hash} for head in heads},
    }
    public = key.public_key()
    return {
        "checkpoint": checkpoint,
        "public_key": base64.b64encode(
            public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        ).decode(),
        "fingerprint": fingerprint(public),
        "signature": base64.b64encode(key.sign(_canonical(checkpoint))).decode(),
    }


def read(text: str, our_key: Ed25519PrivateKey | None) -> dict:
    """The checkpoint inside a signed file, once its signature holds (and, when this desk has a key,
    once it is this desk's key that signed it)."""
    try:
        signed = json.loads(text)
        checkpoint = signed["checkpoint"]
        public = Ed25519PublicKey.from_public_bytes(base64.b64decode(signed["public_key"], validate=True))
        signature = base64.b64decode(signed["signature"], validate=True)
        chains = checkpoint["chains"]
        if checkpoint.get("kind") != KIND or not isinstance(chains, dict):
            raise ValueError("not a checkpoint")
        for head in chains.values():
            if not isinstance(head["seq"], int) or not isinstance(head["hash"], str):
                raise ValueError("a chain without seq and hash")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise AnchorError(f"This is not a checkpoint made by `audit anchor` ({exc}).") from None
    try:
        public.verify(signature, _canonical(checkpoint))
    except InvalidSignature:
        raise AnchorError("The checkpoint's signature does not match its content: the file was changed.") from None
    if our_key is not None and fingerprint(our_key.public_key()) != fingerprint(public):
        raise AnchorError(
            f"The checkpoint was signed by key {fingerprint(public)}, not this desk's key "
            f"{fingerprint(our_key.public_key())}."
        )
    return checkpoint


def verify_against(session: Session, checkpoint: Mapping) -> audit_chain.VerifyResult:
    """Every chain intact from its start, and still holding the checkpoint's hash at its seq."""
    result = audit_chain.verify(session)
    if not result.ok:
        return result
    for chain, head in sorted(checkpoint["chains"].items()):
        if head["seq"] == 0:
            continue
        found = session.scalar(select(AuditEvent.hash).where(AuditEvent.chain == chain, AuditEvent.seq == head["seq"]))
        if found is None:
            problem = f"chain {chain}: event seq {head['seq']}, the checkpoint's last, is gone (the chain was cut?)"
        elif found != head["hash"]:
            problem = (
                f"chain {chain}: event seq {head['seq']} no longer has the hash the checkpoint of "
                f"{checkpoint['made_at']} recorded: events up to it were rewritten and their hashes recomputed"
            )
        else:
            continue
        return audit_chain.VerifyResult(False, result.checked, problem, result.chains)
    return result
