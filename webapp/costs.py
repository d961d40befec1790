"""What the assistant costs and how decisions go: model prices, the cost of a model call, and the
auditors' dashboard figures computed from the audit log.

Prices are USD per million tokens. A model is priced by the longest entry its name starts with, else
by its family (opus, sonnet, haiku) named anywhere in it; MODEL_PRICES (JSON) overrides or adds
entries, and its entries win over the built-in ones. An unknown model costs 0 and is flagged.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation

from sqlalchemy import literal, select, tuple_
from sqlalchemy.engine import Engine

from webapp.models import AuditEvent, Conversation, User

MILLION = Decimal(1_000_000)
FAMILIES = ("opus", "sonnet", "haiku")
TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


class PriceError(ValueError):
    """MODEL_PRICES cannot be read; the message says what is wrong and how to write it."""


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: Decimal
    output: Decimal
    cache_write: Decimal
    cache_read: Decimal


def _price(input_: str, output: str, cache_write: str, cache_read: str) -> Price:
    return Price(Decimal(input_), Decimal(output), Decimal(cache_write), Decimal(cache_read))


# Anthropic's list prices; cache writes (5-minute) cost 1.25x input, cache reads 0.1x input.
DEFAULT_PRICES: dict[str, Price] = {
    "opus": _price("5", "25", "6.25", "0.50"),
    "sonnet": _price("3", "15", "3.75", "0.30"),
    "haiku": _price("1", "5", "1.25", "0.10"),
    "claude-opus-4-1": _price("15", "75", "18.75", "1.50"),
    "claude-opus-4-0": _price("15", "75", "18.75", "1.50"),
    "claude-opus-4-2025": _price("15", "75", "18.75", "1.50"),
    "claude-3-opus": _price("15", "75", "18.75", "1.50"),
    "claude-3-5-haiku": _price("0.80", "4", "1", "0.08"),
    "claude-3-haiku": _price("0.25", "1.25", "0.30", "0.03"),
}

MODEL_PRICES_EXAMPLE = 'MODEL_PRICES=\'{"claude-sonnet-5": {"input": 3, "output": 15, "cache_write": 3.75, "cache_read": 0.3}}\''


@dataclass(frozen=True)
class PriceTable:
    """Prices by model-name prefix or family; `overrides` (from MODEL_PRICES) win over `defaults`."""

    overrides: Mapping[str, Price] = field(default_factory=dict)
    defaults: Mapping[str, Price] = field(default_factory=lambda: DEFAULT_PRICES)

    def lookup(self, model: str | None) -> Price | None:
        """The price of `model`, or None when no entry and no family matches."""
        name = (model or "").strip().lower()
        if not name:
            return None
        words = set(re.split(r"[^a-z0-9]+", name))
        for table in (self.overrides, self.defaults):
            prefixes = [key for key in table if key not in FAMILIES and name.startswith(key)]
            if prefixes:
                return table[max(prefixes, key=len)]
            for family in FAMILIES:
                if family in words and family in table:
                    return table[family]
        return None

    def cost(self, usage) -> Decimal:
        """USD cost of one model call's usage; 0 for a model without a price."""
        price = self.lookup(_get(usage, "model"))
        if price is None:
            return Decimal(0)
        tokens = {name: Decimal(int(_get(usage, name) or 0)) for name in TOKEN_FIELDS}
        return (
            tokens["input_tokens"] * price.input
            + tokens["output_tokens"] * price.output
            + tokens["cache_creation_input_tokens"] * price.cache_write
            + tokens["cache_read_input_tokens"] * price.cache_read
        ) / MILLION


def _get(usage, name: str):
    return usage.get(name) if isinstance(usage, Mapping) else getattr(usage, name, None)


def prices_from_env(env: Mapping[str, str]) -> PriceTable:
    """The price table for this environment: the defaults, with MODEL_PRICES (a JSON object of
    model-name prefix or family -> {"input", "output", "cache_write"?, "cache_read"?} in USD per
    million tokens) laid over them. Missing cache prices follow input (x1.25 write, x0.1 read).
    Raises PriceError naming the problem."""
    raw = (env.get("MODEL_PRICES") or "").strip()
    if not raw:
        return PriceTable()
    try:
        entries = json.loads(raw)
    except ValueError as exc:
        raise PriceError(f"MODEL_PRICES is not valid JSON ({exc}); e.g. {MODEL_PRICES_EXAMPLE}") from None
    if not isinstance(entries, dict):
        raise PriceError(f"MODEL_PRICES must be a JSON object of model -> prices; e.g. {MODEL_PRICES_EXAMPLE}")
    overrides = {}
    for model, value in entries.items():
        if not isinstance(value, dict) or not {"input", "output"} <= value.keys():
            raise PriceError(f'MODEL_PRICES["{model}"] needs at least "input" and "output" (USD per million tokens)')
        unknown = value.keys() - {"input", "output", "cache_write", "cache_read"}
        if unknown:
            raise PriceError(f'MODEL_PRICES["{model}"] has unknown keys {sorted(unknown)}')
        numbers = {key: _amount(model, key, amount) for key, amount in value.items()}
        numbers.setdefault("cache_write", numbers["input"] * Decimal("1.25"))
        numbers.setdefault("cache_read", numbers["input"] * Decimal("0.1"))
        overrides[model.strip().lower()] = Price(**numbers)
    return PriceTable(overrides=overrides)


def _amount(model: str, key: str, value) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise PriceError(f'MODEL_PRICES["{model}"]["{key}"] must be a number of USD per million tokens')
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise PriceError(f'MODEL_PRICES["{model}"]["{key}"] must be a number, got {value!r}') from None
    if not amount.is_finite() or amount < 0:
        raise PriceError(f'MODEL_PRICES["{model}"]["{key}"] must be zero or more, got {value!r}')
    return amount


def cost(usage, prices: PriceTable | None = None) -> Decimal:
    """USD cost of one model call: `usage` is a mapping (a model_call event's data) or an object
    (a ModelCall row) with `model` and the four token counts."""
    return (prices or PriceTable()).cost(usage)


# --- dashboard figures ----------------------------------------------------------------------------

PARTS = {
    "usage": ("model_call", "tool_call_requested", "conversation_started"),
    "approvals": ("approval_requested", "approval_decided", "approval_expired"),
    "tools": ("tool_call_executed",),
}
DECISIONS = ("approved", "rejected", "expired")
NO_TOOL = "(answers, no tool)"
UNKNOWN_OWNER = "(unknown)"
BATCH = 5000


@dataclass
class Usage:
    """Tokens and cost of a set of model calls."""

    model_calls: Decimal = Decimal(0)  # fractional when a call is shared between tools
    input_tokens: Decimal = Decimal(0)
    output_tokens: Decimal = Decimal(0)
    cache_write_tokens: Decimal = Decimal(0)
    cache_read_tokens: Decimal = Decimal(0)
    cost: Decimal = Decimal(0)

    def add(self, data: Mapping, amount: Decimal, share: Decimal = Decimal(1)) -> None:
        self.model_calls += share
        self.input_tokens += int(data.get("input_tokens") or 0) * share
        self.output_tokens += int(data.get("output_tokens") or 0) * share
        self.cache_write_tokens += int(data.get("cache_creation_input_tokens") or 0) * share
        self.cache_read_tokens += int(data.get("cache_read_input_tokens") or 0) * share
        self.cost += amount * share

    @property
    def tokens(self) -> Decimal:
        return self.input_tokens + self.output_tokens + self.cache_write_tokens + self.cache_read_tokens


@dataclass
class Approvals:
    """Decisions on calls waiting for a person, and how long they waited (seconds)."""

    requested: int = 0
    approved: int = 0
    rejected: int = 0
    expired: int = 0
    latencies: list[float] = field(default_factory=list)

    @property
    def decided(self) -> int:
        return self.approved + self.rejected + self.expired

    def share(self, outcome: str) -> float | None:
        return getattr(self, outcome) / self.decided if self.decided else None

    @property
    def median(self) -> float | None:
        return statistics.median(self.latencies) if self.latencies else None

    @property
    def p95(self) -> float | None:
        return percentile(self.latencies, 95) if self.latencies else None


@dataclass
class ToolRuns:
    """Executions of one tool and how many failed."""

    runs: int = 0
    failed: int = 0

    @property
    def error_rate(self) -> float | None:
        return self.failed / self.runs if self.runs else None


@dataclass
class Dashboard:
    """The figures of one tenant over [start, end] (whole UTC days)."""

    start: date
    end: date
    days: list[date]
    usage_by_day: dict[date, Usage]
    usage_by_person: dict[str, Usage]
    usage_by_tool: dict[str, Usage]
    usage_total: Usage
    approvals_by_day: dict[date, Approvals]
    approvals_total: Approvals
    tools: dict[str, ToolRuns]
    unpriced_models: set[str]


def percentile(values: list[float], p: float) -> float:
    """The nearest-rank percentile of `values` (p in 0..100)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(len(ordered) * p / 100) - 1))]


def dashboard(
    engine: Engine,
    tenant_id: int,
    start: date,
    end: date,
    prices: PriceTable | None = None,
    parts: tuple[str, ...] = tuple(PARTS),
) -> Dashboard:
    """The tenant's figures from its audit events between `start` and `end` (inclusive, UTC days),
    for the asked `parts` (usage, approvals, tools); the others stay empty.

    Usage comes from model_call events; a person is the conversation's owner; a model call's tokens
    and cost go to the tools its reply asked for, split evenly (NO_TOOL when it asked for none).
    Decision latency runs from approval_requested to approval_decided of the same tool call; a
    decision counts on the day it was made. Reads in batches on short connections."""
    prices = prices or PriceTable()
    days = [start + timedelta(days=n) for n in range((end - start).days + 1)]
    board = Dashboard(
        start=start,
        end=end,
        days=days,
        usage_by_day={day: Usage() for day in days},
        usage_by_person=defaultdict(Usage),
        usage_by_tool=defaultdict(Usage),
        usage_total=Usage(),
        approvals_by_day={day: Approvals() for day in days},
        approvals_total=Approvals(),
        tools=defaultdict(ToolRuns),
        unpriced_models=set(),
    )
    actions = [action for part in parts for action in PARTS[part]]
    # The model call each conversation made last, waiting for the tool calls its reply asked for.
    open_turns: dict[int, tuple[dict, Decimal, list[str]]] = {}
    owners_seen: dict[int, str] = {}
    usage_by_conversation: dict[int, Usage] = defaultdict(Usage)
    requested_at: dict[int, datetime] = {}
    decisions: list[tuple[int, datetime, str]] = []

    for event in _events(engine, tenant_id, actions, start, end):
        action, conversation_id = event.action, event.conversation_id
        if action == "model_call":
            data = event.data or {}
            amount = prices.cost(data)
            if prices.lookup(data.get("model")) is None:
                board.unpriced_models.add(str(data.get("model")))
            board.usage_by_day[event.created_at.date()].add(data, amount)
            board.usage_total.add(data, amount)
            usage_by_conversation[conversation_id].add(data, amount)
            if conversation_id in open_turns:
                _attribute(board, *open_turns.pop(conversation_id))
            open_turns[conversation_id] = (data, amount, [])
        elif action == "tool_call_requested" and conversation_id in open_turns:
            open_turns[conversation_id][2].append(event.tool_name or "?")
        elif action == "conversation_started" and event.actor_label:
            owners_seen[conversation_id] = event.actor_label
        elif action == "approval_requested" and event.tool_call_id is not None:
            requested_at[event.tool_call_id] = event.created_at
            board.approvals_total.requested += 1
            board.approvals_by_day[event.created_at.date()].requested += 1
        elif action in ("approval_decided", "approval_expired"):
            outcome = "expired" if action == "approval_expired" else event.outcome
            if outcome in DECISIONS:
                decisions.append((event.tool_call_id, event.created_at, outcome))
        elif action == "tool_call_executed":
            runs = board.tools[event.tool_name or "?"]
            runs.runs += 1
            runs.failed += event.outcome == "failed"
    for turn in open_turns.values():
        _attribute(board, *turn)

    earlier = _requested_before(engine, tenant_id, start, [d[0] for d in decisions if d[0] not in requested_at])
    requested_at.update(earlier)
    for tool_call_id, decided_at, outcome in decisions:
        for bucket in (board.approvals_by_day[decided_at.date()], board.approvals_total):
            setattr(bucket, outcome, getattr(bucket, outcome) + 1)
            if tool_call_id in requested_at:
                bucket.latencies.append((decided_at - requested_at[tool_call_id]).total_seconds())

    owners = _owners(engine, tenant_id, list(usage_by_conversation))
    for conversation_id, usage in usage_by_conversation.items():
        person = owners.get(conversation_id) or owners_seen.get(conversation_id) or UNKNOWN_OWNER
        _merge(board.usage_by_person[person], usage)
    board.usage_by_person = dict(sorted(board.usage_by_person.items(), key=lambda kv: -kv[1].cost))
    board.usage_by_tool = dict(sorted(board.usage_by_tool.items(), key=lambda kv: -kv[1].cost))
    board.tools = dict(sorted(board.tools.items()))
    return board


def _attribute(board: Dashboard, data: dict, amount: Decimal, tools: list[str]) -> None:
    if not tools:
        board.usage_by_tool[NO_TOOL].add(data, amount)
        return
    share = Decimal(1) / len(tools)
    for tool in tools:
        board.usage_by_tool[tool].add(data, amount, share)


def _merge(into: Usage, usage: Usage) -> None:
    for name in ("model_calls", "input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens", "cost"):
        setattr(into, name, getattr(into, name) + getattr(usage, name))


def day_bounds(start: date, end: date) -> tuple[datetime, datetime]:
    """[start 00:00, the day after end 00:00) in UTC."""
    return datetime.combine(start, time(), UTC), datetime.combine(end + timedelta(days=1), time(), UTC)


def _events(engine: Engine, tenant_id: int, actions: list[str], start: date, end: date) -> Iterator:
    """The tenant's events of these actions in the range, in time order, BATCH rows per short
    connection (keyset on created_at, id: the (tenant_id, created_at, id) index serves it)."""
    low, high = day_bounds(start, end)
    e = AuditEvent
    columns = (e.id, e.created_at, e.action, e.actor_label, e.conversation_id, e.tool_call_id, e.tool_name, e.outcome)
    base = (
        select(*columns, e.data)
        .where(e.tenant_id == tenant_id, e.created_at >= low, e.created_at < high, e.action.in_(actions))
        .order_by(e.created_at, e.id)
        .limit(BATCH)
    )
    after = None
    while True:
        query = base
        if after is not None:
            query = base.where(tuple_(e.created_at, e.id) > tuple_(literal(after[0], e.created_at.type), literal(after[1])))
        with engine.connect() as connection:
            rows = connection.execute(query).all()
        yield from rows
        if len(rows) < BATCH:
            return
        after = (rows[-1].created_at, rows[-1].id)


def _requested_before(engine: Engine, tenant_id: int, start: date, tool_call_ids: list[int]) -> dict[int, datetime]:
    """When the calls decided in the range but asked for before it were put to a person."""
    found: dict[int, datetime] = {}
    low, _ = day_bounds(start, start)
    ids = [i for i in tool_call_ids if i is not None]
    for n in range(0, len(ids), 500):
        query = select(AuditEvent.tool_call_id, AuditEvent.created_at).where(
            AuditEvent.tenant_id == tenant_id,
            AuditEvent.action == "approval_requested",
            AuditEvent.created_at < low,
            AuditEvent.tool_call_id.in_(ids[n : n + 500]),
        )
        with engine.connect() as connection:
            found.update({row.tool_call_id: row.created_at for row in connection.execute(query)})
    return found


def _owners(engine: Engine, tenant_id: int, conversation_ids: list[int]) -> dict[int, str]:
    """The owner's email of each of these conversations of the tenant."""
    owners: dict[int, str] = {}
    ids = [i for i in conversation_ids if i is not None]
    for n in range(0, len(ids), 500):
        query = (
            select(Conversation.id, User.email)
            .join(User, User.id == Conversation.user_id)
            .where(Conversation.tenant_id == tenant_id, Conversation.id.in_(ids[n : n + 500]))
        )
        with engine.connect() as connection:
            owners.update({row.id: row.email for row in connection.execute(query)})
    return owners
