"""Which tool calls wait for people, how many people, and for how long.

A tenant's admins set one policy per tool (webapp/admin pages); without one, a sensitive tool uses
its default below and a reading tool runs at once. Each flagged call keeps a snapshot of the policy,
version included, so every decision can say which rule it was made under.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass, field, fields
from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from webapp.agent.states import CallStatus
from webapp.models import ToolCall, ToolPolicy, utcnow
from webapp.tools.registry import Tool

MODES = ("never", "always", "above_amount")
DAY = 24 * 3600
# Defaults for sensitive tools of the demo toolset; any other sensitive tool: always, one approval.
DEFAULTS = {
    "issue_refund": ("above_amount", 5000, 1),
    "send_email": ("always", None, 1),
    "delete_account": ("always", None, 2),
}


class PolicyError(ValueError):
    """A policy that cannot be saved; the message says what to fix, `field` the form field to change."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def has_amount(tool: Tool) -> bool:
    """Whether the tool's calls carry an amount (`amount_cents`) that rules and limits can weigh."""
    return "amount_cents" in tool.argument_names()


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
    """How much of a tool may run with no person, added up: per conversation, per customer in the
    last 24 hours and per tenant in the last 24 hours, as a number of calls and as an amount in cents
    (None: no limit). Past a limit the call waits for a person like any flagged call."""

    conversation_count: int | None = None
    conversation_cents: int | None = None
    customer_day_count: int | None = None
    customer_day_cents: int | None = None
    tenant_day_count: int | None = None
    tenant_day_cents: int | None = None

    @classmethod
    def from_dict(cls, values: dict | None) -> Limits:
        names = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in (values or {}).items() if key in names})

    def any(self) -> bool:
        return any(value is not None for value in asdict(self).values())

    def describe(self) -> str:
        """The limits in words ("" when there are none)."""
        parts = []
        for scope, words in SCOPES:
            count, cents = getattr(self, f"{scope}_count"), getattr(self, f"{scope}_cents")
            said = [f"{count} call{'s' if count != 1 else ''}" if count is not None else None, _dollars(cents)]
            if any(said):
                parts.append(f"{' and '.join(part for part in said if part)} {words}")
        return f"Without a person, at most {'; '.join(parts)}." if parts else ""


# Each limit's scope, in words for people.
SCOPES = (
    ("conversation", "per conversation"),
    ("customer_day", "per customer in 24 hours"),
    ("tenant_day", "for the whole tenant in 24 hours"),
)
# What counts as having run (or being about to run) without a person: calls the policy let through,
# not the ones that failed their checks or were stopped.
_RAN = (CallStatus.PENDING, CallStatus.RUNNING, CallStatus.AWAITING_TASK, CallStatus.SUCCEEDED)
DEFAULT_LIMITS = {
    "issue_refund": Limits(conversation_count=3, conversation_cents=10_000, customer_day_cents=20_000),
}
# A waiting call reminds the tenant's channels after the policy's reminder time; without one, after
# an hour or a quarter of the time to decide, whichever is sooner. It escalates to the tenant's admins
# when this share of the time to decide is left.
DEFAULT_REMIND_AFTER_SECONDS = 3600
ESCALATE_WHEN_LEFT = 0.2
KEEP = object()  # save_policy: keep what the policy has


def _dollars(cents: int | None) -> str | None:
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

    def needs_approval(self, arguments: dict) -> bool:
        """Whether a call with these arguments must wait for people."""
        if self.mode == "always":
            return True
        if self.mode == "above_amount":
            amount = arguments.get("amount_cents")
            return not isinstance(amount, int) or amount > (self.amount_threshold_cents or 0)
        return False

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
        return f"{rule} {self.limits.describe()}".strip() if self.mode != "always" else rule

    def limit_reached(self, session: Session, call: ToolCall, customer_id: int | None) -> str | None:
        """Which limit this call, which the rule alone would let run, would pass (in words), or None.
        Counts the tool's earlier calls that ran with no person, the call's own round included."""
        if not self.limits.any():
            return None
        if session.get_bind().dialect.name == "postgresql":  # one check at a time per tenant and tool
            session.execute(select(func.pg_advisory_xact_lock(zlib.crc32(f"{call.tenant_id}:{call.name}".encode()))))
        session.flush()  # the calls of this round so far, and this one (left out below)
        amount = call.input.get("amount_cents") if isinstance(call.input.get("amount_cents"), int) else 0
        day = utcnow() - timedelta(days=1)
        scopes = {
            "conversation": (ToolCall.conversation_id == call.conversation_id,),
            "customer_day": (ToolCall.customer_id == customer_id, ToolCall.created_at >= day),
            "tenant_day": (ToolCall.created_at >= day,),
        }
        for scope, words in SCOPES:
            most_calls, most_cents = getattr(self.limits, f"{scope}_count"), getattr(self.limits, f"{scope}_cents")
            if (most_calls is None and most_cents is None) or (scope == "customer_day" and customer_id is None):
                continue
            calls, cents = session.execute(
                select(
                    func.count(ToolCall.id), func.coalesce(func.sum(ToolCall.input["amount_cents"].as_integer()), 0)
                ).where(
                    ToolCall.tenant_id == call.tenant_id,
                    ToolCall.name == call.name,
                    ToolCall.id != call.id,
                    ToolCall.requires_approval.is_(False),
                    ToolCall.status.in_(_RAN),
                    *scopes[scope],
                )
            ).one()
            if most_calls is not None and calls + 1 > most_calls:
                ran = f"{calls} {call.name} call{' already ran' if calls == 1 else 's already ran'}"
                return f"{ran} without a person {words}; the limit is {most_calls}."
            if most_cents is not None and cents + amount > most_cents:
                return (
                    f"With this one, {_dollars(cents + amount)} of {call.name} would run without a person {words}; "
                    f"the limit is {_dollars(most_cents)}."
                )
        return None

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


def default_policy(tool: Tool) -> Policy:
    if not tool.sensitive:
        return Policy(tool.name, "never", approvals_required=0)
    mode, threshold, approvals = DEFAULTS.get(tool.name, ("always", None, 1))
    return Policy(tool.name, mode, threshold, approvals, limits=DEFAULT_LIMITS.get(tool.name, Limits()))


def policy_for(session: Session, tenant_id: int, tool: Tool) -> Policy:
    """The tenant's policy for this tool, or the tool's default."""
    row = session.scalar(select(ToolPolicy).where(ToolPolicy.tenant_id == tenant_id, ToolPolicy.tool_name == tool.name))
    if row is None:
        return default_policy(tool)
    # A policy saved before limits existed keeps the tool's default limits.
    limits = DEFAULT_LIMITS.get(tool.name, Limits()) if row.limits is None else Limits.from_dict(row.limits)
    return Policy(
        row.tool_name,
        row.mode,
        row.amount_threshold_cents,
        row.approvals_required,
        row.ttl_seconds,
        row.version,
        limits,
        row.remind_after_seconds,
    )


def save_policy(
    session: Session,
    tenant_id: int,
    tool: Tool,
    *,
    mode: str,
    amount_threshold_cents: int | None,
    approvals_required: int,
    ttl_seconds: int,
    by_user_id: int,
    limits: Limits | None = None,
    remind_after_seconds: int | None | object = KEEP,
) -> tuple[Policy, Policy]:
    """Store a new version of the tool's policy; returns (before, after). PolicyError on bad values.
    Without `limits`, the policy keeps the limits it has; without `remind_after_seconds` (None: the
    default), its reminder time."""
    if mode not in MODES:
        raise PolicyError(f"The rule must be one of: {', '.join(MODES)}.", "mode")
    if tool.sensitive and mode == "never":
        raise PolicyError(f"{tool.name} changes things for customers; it must wait for at least one person.", "mode")
    if mode == "above_amount":
        if not has_amount(tool):
            raise PolicyError(f"{tool.name} has no amount, so it cannot have an amount rule.", "mode")
        if not isinstance(amount_threshold_cents, int) or not 0 <= amount_threshold_cents <= 10_000_000:
            raise PolicyError("The amount limit must be from $0.00 to $100,000.00.", "amount_threshold")
        most = tool.input_schema()["properties"]["amount_cents"].get("maximum")
        if tool.sensitive and most is not None and amount_threshold_cents >= most:
            raise PolicyError(
                f"{tool.name} can ask for at most ${most / 100:,.2f}, so with a limit of "
                f"${amount_threshold_cents / 100:,.2f} no call would ever wait for a person. "
                "It changes things for customers: choose a lower limit.",
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
    before = policy_for(session, tenant_id, tool)
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
    row = session.scalar(select(ToolPolicy).where(ToolPolicy.tenant_id == tenant_id, ToolPolicy.tool_name == tool.name))
    if row is None:
        row = ToolPolicy(tenant_id=tenant_id, tool_name=tool.name, version=0)
        session.add(row)
    row.mode = mode
    row.amount_threshold_cents = amount_threshold_cents
    row.approvals_required = approvals_required
    row.ttl_seconds = ttl_seconds
    row.limits = asdict(limits)
    row.remind_after_seconds = remind_after_seconds
    row.version = max(row.version, before.version) + 1
    row.updated_by_id = by_user_id
    row.updated_at = utcnow()
    session.flush()
    return before, policy_for(session, tenant_id, tool)


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
