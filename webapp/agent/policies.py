"""Which tool calls wait for people, how many people, and for how long.

A tenant's admins set one policy per tool (webapp/admin pages); without one, a sensitive tool uses
its default below and a reading tool runs at once. Each flagged call keeps a snapshot of the policy,
version included, so every decision can say which rule it was made under.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from webapp.models import ToolPolicy, utcnow
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
    """A policy that cannot be saved; the message says what to fix."""


@dataclass(frozen=True)
class Policy:
    tool_name: str
    mode: str
    amount_threshold_cents: int | None = None
    approvals_required: int = 1
    ttl_seconds: int = DAY
    version: int = 0  # 0: the built-in default, never edited

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
            return f"{self.tool_name} calls above {limit} need {people} {within}; smaller ones run at once."
        return f"{self.tool_name} calls run at once."

    def snapshot(self) -> dict:
        return {**asdict(self), "rule": self.describe()}

    def expires_at(self):
        return utcnow() + timedelta(seconds=self.ttl_seconds)


def default_policy(tool: Tool) -> Policy:
    if not tool.sensitive:
        return Policy(tool.name, "never", approvals_required=0)
    mode, threshold, approvals = DEFAULTS.get(tool.name, ("always", None, 1))
    return Policy(tool.name, mode, threshold, approvals)


def policy_for(session: Session, tenant_id: int, tool: Tool) -> Policy:
    """The tenant's policy for this tool, or the tool's default."""
    row = session.scalar(select(ToolPolicy).where(ToolPolicy.tenant_id == tenant_id, ToolPolicy.tool_name == tool.name))
    if row is None:
        return default_policy(tool)
    return Policy(
        row.tool_name, row.mode, row.amount_threshold_cents, row.approvals_required, row.ttl_seconds, row.version
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
) -> tuple[Policy, Policy]:
    """Store a new version of the tool's policy; returns (before, after). PolicyError on bad values."""
    if mode not in MODES:
        raise PolicyError(f"The rule must be one of: {', '.join(MODES)}.")
    if tool.sensitive and mode == "never":
        raise PolicyError(f"{tool.name} changes things for customers; it must wait for at least one person.")
    if mode == "above_amount":
        if "amount_cents" not in tool.Input.model_fields:
            raise PolicyError(f"{tool.name} has no amount, so it cannot have an amount rule.")
        if not isinstance(amount_threshold_cents, int) or not 0 <= amount_threshold_cents <= 10_000_000:
            raise PolicyError("The amount limit must be a whole number of cents from 0 to 10,000,000.")
        most = tool.Input.model_json_schema()["properties"]["amount_cents"].get("maximum")
        if tool.sensitive and most is not None and amount_threshold_cents >= most:
            raise PolicyError(
                f"{tool.name} can ask for at most ${most / 100:,.2f}, so with a limit of "
                f"${amount_threshold_cents / 100:,.2f} no call would ever wait for a person. "
                "It changes things for customers: choose a lower limit."
            )
    else:
        amount_threshold_cents = None
    if mode == "never":
        approvals_required = 0
    elif not isinstance(approvals_required, int) or not 1 <= approvals_required <= 5:
        raise PolicyError("Approvals needed must be from 1 to 5.")
    if not isinstance(ttl_seconds, int) or not 300 <= ttl_seconds <= 30 * DAY:
        raise PolicyError("The time to decide must be from 5 minutes to 30 days.")
    before = policy_for(session, tenant_id, tool)
    row = session.scalar(select(ToolPolicy).where(ToolPolicy.tenant_id == tenant_id, ToolPolicy.tool_name == tool.name))
    if row is None:
        row = ToolPolicy(tenant_id=tenant_id, tool_name=tool.name, version=0)
        session.add(row)
    row.mode = mode
    row.amount_threshold_cents = amount_threshold_cents
    row.approvals_required = approvals_required
    row.ttl_seconds = ttl_seconds
    row.version = max(row.version, before.version) + 1
    row.updated_by_id = by_user_id
    row.updated_at = utcnow()
    session.flush()
    return before, policy_for(session, tenant_id, tool)
