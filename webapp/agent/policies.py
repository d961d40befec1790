"""Which tool calls wait for people, how many people, and for how long.

A tenant's admins set one policy per tool (webapp/admin pages); without one, a sensitive tool uses
its default below and a reading tool runs at once. Each flagged call keeps a snapshot of the policy,
version included, so every decision can say which rule it was made under.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import timedelta

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from webapp.models import ToolCeiling, ToolPolicy, utcnow
from webapp.tools.registry import Tool

MODES = ("never", "always", "above_amount")
DAY = 24 * 3600


class PolicyError(ValueError):
    """A policy that cannot be saved; the message says what to fix, `field` the form field to change."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def has_amount(tool: Tool) -> bool:
    """Whether the tool's calls carry an amount (its `amount`) that rules and limits can weigh."""
    return tool.moves_money()


def modes_for(tool: Tool) -> tuple[str, ...]:
    """The rules this tool can have: a tool that changes things for customers never runs without a
    person, and only a tool with an amount can wait above one."""
    return tuple(
        mode
        for mode in MODES
        if not (mode == "never" and tool.sensitive) and not (mode == "above_amount" and not has_amount(tool))
    )


@dataclass(frozen=True)
class Limits:
    """How much of a tool may run with no person, added up: per conversation, per subject (what a call
    acts on, as its tool says: a customer, an order) in the last 24 hours, per tenant in the last 24
    hours and per acting person (whose conversation asked) in the last 24 hours, as a number of calls
    and as an amount in cents (None: no limit). Past a limit the call waits for a person like any
    flagged call."""

    conversation_count: int | None = None
    conversation_cents: int | None = None
    subject_day_count: int | None = None
    subject_day_cents: int | None = None
    tenant_day_count: int | None = None
    tenant_day_cents: int | None = None
    person_day_count: int | None = None
    person_day_cents: int | None = None

    @classmethod
    def from_dict(cls, values: dict | None, defaults: Limits | None = None) -> Limits:
        """The limits a stored dict names; a limit it does not name at all (saved before that limit
        existed) takes its value from `defaults`."""
        names = [f.name for f in fields(cls)]
        values = values or {}
        return cls(**{name: values[name] if name in values else getattr(defaults or cls(), name) for name in names})

    def any(self) -> bool:
        return any(value is not None for value in asdict(self).values())

    def describe(self) -> str:
        """The limits in words ("" when there are none)."""
        parts = []
        for scope, words in SCOPES:
            count, cents = getattr(self, f"{scope}_count"), getattr(self, f"{scope}_cents")
            said = [f"{count} call{'s' if count != 1 else ''}" if count is not None else None, dollars(cents)]
            if any(said):
                parts.append(f"{' and '.join(part for part in said if part)} {words}")
        return f"Without a person, at most {'; '.join(parts)}." if parts else ""


# Each limit's scope, in words for people.
SCOPES = (
    ("conversation", "per conversation"),
    ("subject_day", "per subject in 24 hours"),
    ("tenant_day", "for the whole tenant in 24 hours"),
    ("person_day", "per acting person in 24 hours"),
)
MODE_WORDS = {"never": "runs at once", "always": "always waits", "above_amount": "waits above an amount"}
# A waiting call reminds the tenant's channels after the policy's reminder time; without one, after
# an hour or a quarter of the time to decide, whichever is sooner. It escalates to the tenant's admins
# when this share of the time to decide is left.
DEFAULT_REMIND_AFTER_SECONDS = 3600
ESCALATE_WHEN_LEFT = 0.2
KEEP = object()  # save_policy: keep what the policy has


def dollars(cents: int | None) -> str | None:
    """Cents as dollars for people ("$1,500.00"; None stays None)."""
    return f"${cents / 100:,.2f}" if cents is not None else None


@dataclass(frozen=True)
class Policy:
    tool_name: str
    mode: str
    amount_threshold_cents: int | None = None
    approvals_required: int = 1
    ttl_seconds: int = DAY
    version: int = 0  # 0: the built-in default, never edited
    limits: Limits = field(default_factory=Limits)
    remind_after_seconds: int | None = None  # None: the default (DEFAULT_REMIND_AFTER_SECONDS)
    ceiling_cents: int | None = None  # the operator's: above it every call waits, whatever the rule

    def weighs_money(self) -> bool:
        """Whether it reads the money a call moves: an amount rule, or a money limit."""
        return self.mode == "above_amount" or any(
            getattr(self.limits, f"{scope}_cents") is not None for scope, _ in SCOPES
        )

    def weighs_subject(self) -> bool:
        """Whether it reads what a call acts on: a limit per subject."""
        return self.limits.subject_day_count is not None or self.limits.subject_day_cents is not None

    def describe(self) -> str:
        """The rule in words, for the decision page and the audit log."""
        people = "one approval" if self.approvals_required == 1 else f"{self.approvals_required} approvals"
        hours = self.ttl_seconds / 3600
        within = f"within {hours:g} hours" if hours < 48 else f"within {hours / 24:g} days"
        if self.mode == "always":
            return f"Every {self.tool_name} call needs {people} {within}."
        if self.mode == "above_amount":
            limit = f"${(self.amount_threshold_cents or 0) / 100:,.2f}"
            rule = f"{self.tool_name} calls above {limit} need {people} {within}; smaller ones run at once."
        else:
            rule = f"{self.tool_name} calls run at once."
        if self.mode == "always":
            return rule
        ceiling = (
            f"Above {dollars(self.ceiling_cents)} every call waits for a person (the desk's ceiling)."
            if self.ceiling_cents is not None
            else ""
        )
        return " ".join(part for part in (rule, ceiling, self.limits.describe()) if part)

    def snapshot(self) -> dict:
        return {**asdict(self), "rule": self.describe()}

    def expires_at(self):
        return utcnow() + timedelta(seconds=self.ttl_seconds)

    @property
    def reminder_seconds(self) -> int:
        """How long a call waits before the tenant's channels are reminded."""
        if self.remind_after_seconds is not None:
            return self.remind_after_seconds
        return min(DEFAULT_REMIND_AFTER_SECONDS, self.ttl_seconds // 4)

    def notice_times(self, expires_at):
        """When a call flagged now (expiring at `expires_at`) reminds, and when it escalates."""
        return (
            utcnow() + timedelta(seconds=self.reminder_seconds),
            expires_at - timedelta(seconds=self.ttl_seconds * ESCALATE_WHEN_LEFT),
        )


def default_policy(tool: Tool, ceiling_cents: int | None = None) -> Policy:
    """The policy a tool has before an admin sets one: the one the desk keeps in force when this
    release's own default is looser (`Tool.default_in_force`, agent/gate.py), else the release's."""
    if tool.default_in_force is not None:
        return replace(tool.default_in_force, tool_name=tool.name, version=0, ceiling_cents=ceiling_cents)
    return release_default(tool, ceiling_cents)


def release_default(tool: Tool, ceiling_cents: int | None = None) -> Policy:
    """The default policy this release of the tool declares: its own (`Tool.default_policy`,
    `Tool.default_limits`), else one approval for a sensitive tool and none for another."""
    declared = tool.default_policy
    if declared is None:
        mode, threshold, approvals = ("always", None, 1) if tool.sensitive else ("never", None, 0)
    else:
        mode, threshold, approvals = declared
    return Policy(
        tool.name,
        mode,
        threshold if mode == "above_amount" else None,
        0 if mode == "never" else approvals,
        limits=default_limits(tool),
        ceiling_cents=ceiling_cents,
    )


def default_limits(tool: Tool) -> Limits:
    return Limits.from_dict(tool.default_limits)


def ceiling_for(session: Session, tool: Tool) -> int | None:
    """The most one call of the tool may move with no person: the operator's ceiling for it, else the
    tool's own (None: no ceiling, or a tool without an amount)."""
    if not has_amount(tool):
        return None
    row = session.scalar(_CEILING, {"tool_name": tool.name})
    return tool.ceiling_cents if row is None else row.ceiling_cents


# Read for every new call, so built once (a statement object keeps its cache key).
_CEILING = select(ToolCeiling).where(ToolCeiling.tool_name == bindparam("tool_name"))
_POLICY = select(ToolPolicy).where(
    ToolPolicy.tenant_id == bindparam("tenant_id"), ToolPolicy.tool_name == bindparam("tool_name")
)


DEFAULT_CEILING = object()  # set_ceiling: the tool's own ceiling again


def ceiling_cents(text: str) -> int | None | object:
    """A ceiling as an operator types it: dollars ("500", "250.50"), "none" (no ceiling) or "default"
    (the tool's own); PolicyError says what to type."""
    word = text.strip().lower().removeprefix("$").replace(",", "")
    if word == "none":
        return None
    if word == "default":
        return DEFAULT_CEILING
    try:
        dollars = float(word)
    except ValueError:
        dollars = math.nan
    cents = round(dollars * 100) if math.isfinite(dollars) else -1
    if not 0 <= cents <= 10_000_000:
        raise PolicyError(f'{text!r} is not a ceiling: give dollars from 0 to 100,000 (e.g. 500), "none" or "default".')
    return cents


def ceiling_words(cents: int | None) -> str:
    if cents is None:
        return "no ceiling: its policy alone decides which calls wait"
    return f"above {dollars(cents)} every call waits for a person, whatever a tenant's policy says"


def set_ceiling(session: Session, tool: Tool, cents: int | None | object, by_user_id: int | None) -> int | None:
    """Set the operator's ceiling on the tool for every tenant (DEFAULT_CEILING: the tool's own); the
    ceiling now. A policy's threshold above a lower ceiling stays stored, and the ceiling wins."""
    if not has_amount(tool):
        raise PolicyError(f"{tool.name} moves no amount, so no ceiling applies to it.")
    row = session.scalar(select(ToolCeiling).where(ToolCeiling.tool_name == tool.name))
    if cents is DEFAULT_CEILING:
        if row is not None:
            session.delete(row)
    else:
        if row is None:
            row = ToolCeiling(tool_name=tool.name)
            session.add(row)
        row.ceiling_cents, row.set_by_id, row.set_at = cents, by_user_id, utcnow()
    session.flush()
    return ceiling_for(session, tool)


def policy_for(session: Session, tenant_id: int, tool: Tool) -> Policy:
    """The tenant's policy for this tool, or the tool's default, under the operator's ceiling."""
    ceiling = ceiling_for(session, tool)
    row = session.scalar(_POLICY, {"tenant_id": tenant_id, "tool_name": tool.name})
    if row is None:
        return default_policy(tool, ceiling)
    # A policy saved before limits existed keeps the tool's default limits (all of them, or those it
    # does not name).
    defaults = default_limits(tool)
    limits = defaults if row.limits is None else Limits.from_dict(row.limits, defaults)
    return Policy(
        row.tool_name,
        row.mode,
        row.amount_threshold_cents,
        row.approvals_required,
        row.ttl_seconds,
        row.version,
        limits,
        row.remind_after_seconds,
        ceiling,
    )


def proposed_policy(
    session: Session,
    tenant_id: int,
    tool: Tool,
    *,
    mode: str,
    amount_threshold_cents: int | None,
    approvals_required: int,
    ttl_seconds: int,
    limits: Limits | None = None,
    remind_after_seconds: int | None | object = KEEP,
) -> tuple[Policy, Policy]:
    """The policy in force and the one asked for, checked (nothing is written); PolicyError says what
    to fix. Without `limits`, the policy keeps the limits it has; without `remind_after_seconds` (None:
    the default), its reminder time."""
    if mode not in MODES:
        raise PolicyError(f"The rule must be one of: {', '.join(MODES)}.", "mode")
    if tool.sensitive and mode == "never":
        raise PolicyError(f"{tool.name} changes things for customers; it must wait for at least one person.", "mode")
    before = policy_for(session, tenant_id, tool)
    if mode == "above_amount":
        if not has_amount(tool):
            raise PolicyError(f"{tool.name} has no amount, so it cannot have an amount rule.", "mode")
        if not isinstance(amount_threshold_cents, int) or not 0 <= amount_threshold_cents <= 10_000_000:
            raise PolicyError("The amount limit must be from $0.00 to $100,000.00.", "amount_threshold")
        ceiling = before.ceiling_cents
        if ceiling is not None and amount_threshold_cents > ceiling:
            raise PolicyError(
                f"The desk's operator caps {tool.name} at {dollars(ceiling)}: above that every call waits for a "
                f"person, whatever the policy says. Choose an amount limit of at most {dollars(ceiling)}.",
                "amount_threshold",
            )
    else:
        amount_threshold_cents = None
    if mode == "never":
        approvals_required = 0
    elif not isinstance(approvals_required, int) or not 1 <= approvals_required <= 5:
        raise PolicyError("Approvals needed must be from 1 to 5.", "approvals_required")
    if not isinstance(ttl_seconds, int) or not 300 <= ttl_seconds <= 30 * DAY:
        raise PolicyError("The time to decide must be from 5 minutes to 30 days.", "ttl_hours")
    if remind_after_seconds is KEEP:
        remind_after_seconds = before.remind_after_seconds
    if remind_after_seconds is not None and (
        not isinstance(remind_after_seconds, int) or not 60 <= remind_after_seconds < ttl_seconds
    ):
        raise PolicyError(
            "The reminder must come at least a minute after a call starts waiting, and before its time to decide "
            f"runs out (less than {ttl_seconds / 60:g} minutes); leave it empty for the default.",
            "remind_after_minutes",
        )
    limits = before.limits if limits is None else limits
    _check_limits(tool, limits)
    after = Policy(
        tool.name,
        mode,
        amount_threshold_cents,
        approvals_required,
        ttl_seconds,
        before.version + 1,
        limits,
        remind_after_seconds,
        before.ceiling_cents,
    )
    return before, after


def settings(policy: Policy) -> dict:
    """What an admin sets of a policy, as stored on a change waiting for a second admin."""
    return {
        "mode": policy.mode,
        "amount_threshold_cents": policy.amount_threshold_cents,
        "approvals_required": policy.approvals_required,
        "ttl_seconds": policy.ttl_seconds,
        "limits": asdict(policy.limits),
        "remind_after_seconds": policy.remind_after_seconds,
    }


def policy_from_settings(tool_name: str, values: dict) -> Policy:
    """A default policy kept as settings() keeps it (version 0: the built-in default)."""
    return Policy(tool_name, **from_settings(values))


def from_settings(values: dict) -> dict:
    """proposed_policy's keyword arguments from settings() (limits typed again)."""
    return {**values, "limits": Limits.from_dict(values.get("limits"))}


def apply_policy(session: Session, tenant_id: int, after: Policy, by_user_id: int | None) -> Policy:
    """Store `after` (from proposed_policy) as the tool's policy, a new version; the policy as stored."""
    row = session.scalar(
        select(ToolPolicy).where(ToolPolicy.tenant_id == tenant_id, ToolPolicy.tool_name == after.tool_name)
    )
    if row is None:
        row = ToolPolicy(tenant_id=tenant_id, tool_name=after.tool_name, version=0)
        session.add(row)
    row.mode = after.mode
    row.amount_threshold_cents = after.amount_threshold_cents
    row.approvals_required = after.approvals_required
    row.ttl_seconds = after.ttl_seconds
    row.limits = asdict(after.limits)
    row.remind_after_seconds = after.remind_after_seconds
    row.version = max(row.version, after.version - 1) + 1
    row.updated_by_id = by_user_id
    row.updated_at = utcnow()
    session.flush()
    return replace(after, version=row.version)


def save_policy(
    session: Session, tenant_id: int, tool: Tool, *, by_user_id: int | None, **values
) -> tuple[Policy, Policy]:
    """Store a new version of the tool's policy at once, loosening or not (the four-eyes rule is the
    caller's: webapp/settings/policy_actions.py); returns (before, after). PolicyError on bad values."""
    before, after = proposed_policy(session, tenant_id, tool, **values)
    return before, apply_policy(session, tenant_id, after, by_user_id)


def _check_limits(tool: Tool, limits: Limits) -> None:
    for scope, words in SCOPES:
        count, cents = getattr(limits, f"{scope}_count"), getattr(limits, f"{scope}_cents")
        if count is not None and (not isinstance(count, int) or not 1 <= count <= 100_000):
            raise PolicyError(
                f"The most calls {words} must be a whole number from 1 to 100,000, or empty.", f"limit_{scope}_count"
            )
        if cents is None:
            continue
        if not has_amount(tool):
            raise PolicyError(f"{tool.name} has no amount, so it cannot have an amount limit.", f"limit_{scope}_cents")
        if not isinstance(cents, int) or not 1 <= cents <= 10_000_000:
            raise PolicyError(
                f"The most money {words} must be from $0.01 to $100,000.00, or empty.", f"limit_{scope}_cents"
            )
