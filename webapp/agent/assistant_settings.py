"""How a tenant's admins want the assistant to work, beside the model that serves it: the register it
writes in (one line, e.g. "formal, no emoji"), extra rules appended to its system prompt, and one
tool call per reply (the API's disable_parallel_tool_use). Versioned like the policies: every save
is a new version, the newest is in force, and each model call records the version it was sent."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from webapp.models import AssistantSettings

MAX_REGISTER = 200
MAX_RULES = 2000


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
    return list(
        session.scalars(
            select(AssistantSettings)
            .where(AssistantSettings.tenant_id == tenant_id)
            .order_by(AssistantSettings.version.desc())
            .limit(limit)
        )
    )


def save(
    session: Session, tenant_id: int, *, register: str, rules: str, one_call_per_reply: bool, by_user_id: int | None
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
    before = current(session, tenant_id)
    if before is not None and (before.register, before.rules, before.one_call_per_reply) == (
        register,
        rules,
        one_call_per_reply,
    ):
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
        created_by_id=by_user_id,
    )
    session.add(after)
    session.flush()
    return before, after


def snapshot(settings: AssistantSettings | None) -> dict | None:
    """The settings as the audit log keeps them."""
    if settings is None:
        return None
    return {
        "version": settings.version,
        "register": settings.register,
        "rules": settings.rules,
        "one_call_per_reply": settings.one_call_per_reply,
    }
