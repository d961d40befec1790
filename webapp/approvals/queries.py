"""The inbox's queries: the calls waiting for a decision, narrowed by the inbox's filters, a page at a
time, counted; one module for the inbox page, the API's list, the navigation's badge and the home page."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from webapp.agent.states import CallStatus
from webapp.models import Conversation, Decision, ToolCall, User, utcnow
from webapp.runtime.extensions import db
from webapp.web.pagination import Page, keyset_page

# The numbers' filters (the page's form fields and the API's query parameters): the words for each in a
# sentence about it, and the largest it takes: a hundred years of minutes, and the most money a call
# carries (its money_cents is a 32-bit integer).
LARGEST_MINUTES = 100 * 365 * 24 * 60
LARGEST_DOLLARS = (2**31 - 1) // 100
NUMBERS = {
    "min_age": ("Older than (minutes)", LARGEST_MINUTES),
    "min_amount": ("Amount from ($)", LARGEST_DOLLARS),
    "max_amount": ("Amount up to ($)", LARGEST_DOLLARS),
}
TOOL_CHARS, EMAIL_CHARS = 128, 254


LARGEST_ID = 2**31 - 1  # the largest id a row has (32-bit)


@dataclass(frozen=True)
class InboxFilters:
    """Which waiting calls to list: of one tool, asked by one person (their e-mail), waiting at least
    `min_age` minutes, moving from `min_amount` to `max_amount` dollars, of one bulk run's
    conversations. Empty: every one."""

    tool: str = ""
    requester: str = ""
    min_age: float | None = None
    min_amount: float | None = None
    max_amount: float | None = None
    run: int | None = None

    @property
    def active(self) -> int:
        """How many filters are set."""
        return sum(
            value not in ("", None)
            for value in (self.tool, self.requester, self.min_age, self.min_amount, self.max_amount, self.run)
        )

    @classmethod
    def read(cls, args: Mapping[str, str]) -> tuple[InboxFilters, list[str]]:
        """The filters sent (a page's query string, the API's), and a sentence for each bad one, which
        is then left out. A filter sent empty is no filter."""
        problems, numbers = [], {}
        for name, (label, largest) in NUMBERS.items():
            raw = (args.get(name) or "").strip()
            numbers[name] = None
            if raw:
                try:
                    number = float(raw)
                    if not math.isfinite(number) or number < 0 or number > largest:  # nan and inf too
                        raise ValueError
                    numbers[name] = number
                except ValueError:
                    problems.append(f"{label} must be a positive number up to {largest:,}; “{raw[:20]}” was ignored.")
        tool = (args.get("tool") or "").strip()[:TOOL_CHARS]
        requester = (args.get("requester") or "").strip().lower()[:EMAIL_CHARS]
        raw_run, run = (args.get("run") or "").strip(), None
        if raw_run:
            if raw_run.isdigit() and 0 < int(raw_run) <= LARGEST_ID:
                run = int(raw_run)
            else:
                problems.append(f"Run must be a run's number; “{raw_run[:20]}” was ignored.")
        return cls(tool, requester, **numbers, run=run), problems

    def narrow(self, query: Select) -> Select:
        """The query of waiting calls, narrowed to these filters."""
        if self.tool:
            query = query.where(ToolCall.name == self.tool)
        if self.requester:
            query = query.join(User, User.id == ToolCall.acting_user_id).where(User.email == self.requester)
        if self.min_age is not None:
            query = query.where(ToolCall.created_at <= utcnow() - timedelta(minutes=self.min_age))
        if self.min_amount is not None:
            query = query.where(ToolCall.money_cents >= round(self.min_amount * 100))
        if self.max_amount is not None:
            query = query.where(ToolCall.money_cents <= round(self.max_amount * 100))
        if self.run is not None:
            of_run = select(Conversation.id).where(Conversation.run_id == self.run)
            query = query.where(ToolCall.conversation_id.in_(of_run))
        return query


def pending(user: User):
    """The tenant's calls waiting for a decision, oldest first."""
    return (
        select(ToolCall)
        .where(ToolCall.tenant_id == user.tenant_id, ToolCall.status == CallStatus.AWAITING_APPROVAL)
        .order_by(ToolCall.created_at, ToolCall.id)
    )


def pending_page(
    session: Session, user: User, cursor: str | None, size: int, filters: InboxFilters | None = None
) -> Page:
    """A page of the tenant's waiting calls (narrowed by `filters`), oldest first, the call closest to
    expiring leading, after the call `cursor` names (raises BadCursor). Keyed by when each started
    waiting, which never changes, so a call waiting the whole time is on exactly one page."""
    return keyset_page(
        session,
        (filters or InboxFilters()).narrow(pending(user)),
        [ToolCall.created_at, ToolCall.id],
        cursor,
        size,
        key_values=lambda call: (call.created_at, call.id),
        descending=False,
    )


def next_for(user: User) -> ToolCall | None:
    """The oldest waiting call this person can still decide: not from their own conversation, not one
    they already approved."""
    mine = select(Decision.id).where(Decision.tool_call_id == ToolCall.id, Decision.reviewer_id == user.id)
    return db.session.scalar(
        pending(user)
        .join(Conversation, Conversation.id == ToolCall.conversation_id)
        .where(Conversation.user_id != user.id, ~mine.exists())
        .limit(1)
    )


# The navigation badge, on every page, counts at most this many waiting calls and then says "99+":
# counting 100,000 waiting calls on every page would cost more than the page itself.
BADGE_CAP = 100


def pending_count(user: User, cap: int | None = None) -> int:
    """How many calls wait for a decision in this person's tenant (at most `cap`, when given)."""
    waiting = select(ToolCall.id).where(
        ToolCall.tenant_id == user.tenant_id, ToolCall.status == CallStatus.AWAITING_APPROVAL
    )
    if cap is not None:
        waiting = waiting.limit(cap)
    return db.session.scalar(select(func.count()).select_from(waiting.subquery()))


# The inbox counts waiting calls up to this many, then says "10,000+" (an exact count of 100,000 rows
# took 65 ms on SQLite, more than the rest of the page).
INBOX_COUNT_CAP = 10_000


def pending_total(user: User) -> tuple[int, str]:
    """How many calls wait (counted up to INBOX_COUNT_CAP), and how to say it: "1,234" or "10,000+"."""
    count = pending_count(user, INBOX_COUNT_CAP)
    return count, f"{INBOX_COUNT_CAP:,}+" if count >= INBOX_COUNT_CAP else f"{count:,}"


def pending_badge(user: User) -> str:
    """The navigation badge: how many calls wait, "99+" past BADGE_CAP - 1."""
    count = pending_count(user, BADGE_CAP)
    return f"{BADGE_CAP - 1}+" if count >= BADGE_CAP else str(count)


def oldest_waiting_since(user: User):
    """When the longest-waiting call of this person's tenant started waiting (None: nothing waits)."""
    return db.session.scalar(
        select(func.min(ToolCall.created_at)).where(
            ToolCall.tenant_id == user.tenant_id, ToolCall.status == CallStatus.AWAITING_APPROVAL
        )
    )
