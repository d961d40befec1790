"""How a tenant's admins want the assistant to work, beside the model that serves it: the register it
writes in (one line, e.g. "formal, no emoji"), extra rules appended to its system prompt, and one
tool call per reply (the API's disable_parallel_tool_use). Versioned like the policies: every save
is a new version, the newest is in force, and each model call records the version it was sent."""

from __future__ import annotations

import re

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from webapp.database import newest_of_tenant
from webapp.models import AssistantSettings

MAX_REGISTER = 200
MAX_RULES = 2000
MAX_COMPLEX_WORDS = 50  # routing rules: words (or phrases) that make a question complex
MAX_COMPLEX_WORD = 60


class SettingsError(ValueError):
    """Settings that cannot be saved; `field` names the one to fix, the message says how."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def current(session: Session, tenant_id: int) -> AssistantSettings | None:
    """The settings in force for the tenant (None: never set; the assistant works as built)."""
    return session.scalar(
        select(AssistantSettings)
        .where(AssistantSettings.tenant_id == tenant_id)
        .order_by(AssistantSettings.version.desc())
        .limit(1)
    )


def history(session: Session, tenant_id: int, limit: int = 10) -> list[AssistantSettings]:
    return newest_of_tenant(session, AssistantSettings, AssistantSettings.version, tenant_id, limit)


def save(
    session: Session,
    tenant_id: int,
    *,
    register: str,
    rules: str,
    one_call_per_reply: bool,
    by_user_id: int | None,
    complex_words: str = "",
    complex_length: str | int | None = None,
) -> tuple[AssistantSettings | None, AssistantSettings]:
    """Save a new version (the caller audits and commits); returns the settings before and after.
    Raises SettingsError naming the field to fix, or saying that nothing changed."""
    register = register.strip()
    rules = rules.replace("\r\n", "\n").strip()
    if "\n" in register or "\r" in register:
        raise SettingsError("register", "The register is one line, e.g. \u201cformal, no emoji\u201d.")
    if len(register) > MAX_REGISTER:
        raise SettingsError("register", f"The register is {len(register):,} characters; keep it to {MAX_REGISTER}.")
    if len(rules) > MAX_RULES:
        raise SettingsError("rules", f"The rules are {len(rules):,} characters; keep them to {MAX_RULES:,}.")
    words = "\n".join(_complex_words(complex_words))
    length = _complex_length(complex_length)
    before = current(session, tenant_id)
    if before is not None and (
        before.register,
        before.rules,
        before.one_call_per_reply,
        before.complex_words or "",
        before.complex_length,
    ) == (register, rules, one_call_per_reply, words, length):
        raise SettingsError("", "Nothing changed: these are the settings in force already.")
    version = (
        session.scalar(select(func.max(AssistantSettings.version)).where(AssistantSettings.tenant_id == tenant_id)) or 0
    ) + 1
    after = AssistantSettings(
        tenant_id=tenant_id,
        version=version,
        register=register,
        rules=rules,
        one_call_per_reply=one_call_per_reply,
        complex_words=words or None,
        complex_length=length,
        created_by_id=by_user_id,
    )
    session.add(after)
    session.flush()
    return before, after


def _complex_words(typed: str) -> list[str]:
    words = []
    for line in typed.replace(",", "\n").splitlines():
        word = " ".join(line.split()).lower()
        if not word or word in words:
            continue
        if len(word) > MAX_COMPLEX_WORD:
            raise SettingsError(
                "complex_words", f"\u201c{word[:20]}\u2026\u201d is too long; keep each to {MAX_COMPLEX_WORD}."
            )
        words.append(word)
    if len(words) > MAX_COMPLEX_WORDS:
        raise SettingsError("complex_words", f"That is {len(words)} words; keep to {MAX_COMPLEX_WORDS}.")
    return words


def _complex_length(typed: str | int | None) -> int | None:
    if typed is None or str(typed).strip() == "":
        return None
    try:
        length = int(str(typed).strip())
    except ValueError:
        shown = str(typed).strip()
        raise SettingsError("complex_length", f"{shown!r} is not a number of characters, e.g. 400.") from None
    if not 20 <= length <= 100_000:
        raise SettingsError("complex_length", "Give a length between 20 and 100,000 characters, or leave it empty.")
    return length


def complex_rule(question: str, settings: AssistantSettings | None) -> str | None:
    """The routing rule that makes this question complex, in words (None: no rule does, so the small
    model classifies it). Words match whole words, case aside."""
    if settings is None:
        return None
    if settings.complex_length and len(question) > settings.complex_length:
        return f"longer than {settings.complex_length:,} characters"
    lowered = question.lower()
    for word in (settings.complex_words or "").splitlines():
        if re.search(r"(?<!\w)" + re.escape(word) + r"(?!\w)", lowered):
            return f"rule '{word}'"
    return None


def snapshot(settings: AssistantSettings | None) -> dict | None:
    """The settings as the audit log keeps them."""
    if settings is None:
        return None
    return {
        "version": settings.version,
        "register": settings.register,
        "rules": settings.rules,
        "one_call_per_reply": settings.one_call_per_reply,
        "complex_words": (settings.complex_words or "").splitlines(),
        "complex_length": settings.complex_length,
    }
