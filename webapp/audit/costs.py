"""What the assistant costs and how decisions go: model prices, the cost of a model call, and the
auditors' dashboard figures computed from the audit log.

Prices are USD per million tokens. A model is priced by the longest entry its name starts with, else
by its family (opus, sonnet, haiku) named anywhere in it; MODEL_PRICES (JSON, read and checked with
the other settings: `Config.model_prices`) overrides or adds entries, and its entries win over the
built-in ones. An unknown model costs 0 and is flagged.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

from sqlalchemy import String, and_, case, func, literal_column, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import aliased

from webapp.config import Price
from webapp.models import AuditEvent, Conversation, User

MILLION = Decimal(1_000_000)
FAMILIES = ("opus", "sonnet", "haiku")
TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def _price(input_: str, output: str, cache_write: str, cache_read: str) -> Price:
    return Price(Decimal(input_), Decimal(output), Decimal(cache_write), Decimal(cache_read))


BATCH_SHARE = Decimal("0.5")  # the Message Batches API's price: half the list price, every token kind
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

    def cost(self, usage, interactive: bool = False) -> Decimal:
        """USD cost of one model call's usage; 0 for a model without a price. A call answered by a
        Message Batch (`batch_id` set, or `batch` true in an aggregate) costs BATCH_SHARE of the list
        price, unless `interactive` asks what it would have cost made on its own."""
        price = self.lookup(_get(usage, "model"))
        if price is None:
            return Decimal(0)
        tokens = {name: _decimal(_get(usage, name)) for name in TOKEN_FIELDS}
        listed = (
            tokens["input_tokens"] * price.input
            + tokens["output_tokens"] * price.output
            + tokens["cache_creation_input_tokens"] * price.cache_write
            + tokens["cache_read_input_tokens"] * price.cache_read
        ) / MILLION
        batched = _get(usage, "batch_id") is not None or bool(_get(usage, "batch"))
        return listed * BATCH_SHARE if batched and not interactive else listed


def _decimal(value) -> Decimal:
    # Token counts are ints, or floats when a model call is shared between tools.
    return Decimal(0) if value is None else Decimal(value) if isinstance(value, int) else Decimal(str(value))


def _get(usage, name: str):
    return usage.get(name) if isinstance(usage, Mapping) else getattr(usage, name, None)


def cost(usage, prices: PriceTable | None = None) -> Decimal:
    """USD cost of one model call: `usage` is a mapping (a model_call event's data) or an object
    (a ModelCall row) with `model` and the four token counts."""
    return (prices or PriceTable()).cost(usage)


# --- dashboard figures ----------------------------------------------------------------------------

PARTS = ("usage", "approvals", "tools")
DECISIONS = ("approved", "rejected", "expired")
NO_TOOL = "(answers, no tool)"
# The dashboard marks a tool whose calls people changed or refused this often, once it has this many
# decisions: its description, the assistant's rules or its policy asks for what people do not want.
OFTEN_CHANGED = 0.25
OFTEN_CHANGED_AFTER = 5
UNKNOWN_OWNER = "(conversation gone)"
DEFAULT_ENDPOINT = "default"  # the configured model (ANTHROPIC_MODEL), no registered endpoint
NOT_ROUTED = "not routed"  # model calls of a tenant without a small endpoint (and those before routing)
TOP_CONVERSATIONS = 20
_USAGE_FIELDS = ("model_calls", "input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens", "cost")


@dataclass
class Usage:
    """Tokens and cost of a set of model calls."""

    model_calls: Decimal = Decimal(0)  # fractional when a call is shared between tools
    input_tokens: Decimal = Decimal(0)
    output_tokens: Decimal = Decimal(0)
    cache_write_tokens: Decimal = Decimal(0)
    cache_read_tokens: Decimal = Decimal(0)
    cost: Decimal = Decimal(0)

    def add(self, row, prices: PriceTable) -> None:
        """Add an aggregate row: model, model_calls and the four token sums."""
        usage = {"model": row.model, "batch": row.batch, **{name: row._mapping[name] for name in TOKEN_FIELDS}}
        self.model_calls += _decimal(row.model_calls)
        self.input_tokens += _decimal(usage["input_tokens"])
        self.output_tokens += _decimal(usage["output_tokens"])
        self.cache_write_tokens += _decimal(usage["cache_creation_input_tokens"])
        self.cache_read_tokens += _decimal(usage["cache_read_input_tokens"])
        self.cost += prices.cost(usage)

    def __add__(self, other: Usage) -> Usage:
        return Usage(**{name: getattr(self, name) + getattr(other, name) for name in _USAGE_FIELDS})

    def __sub__(self, other: Usage) -> Usage:
        return Usage(**{name: getattr(self, name) - getattr(other, name) for name in _USAGE_FIELDS})

    @property
    def tokens(self) -> Decimal:
        return self.input_tokens + self.output_tokens + self.cache_write_tokens + self.cache_read_tokens

    @property
    def prompt_tokens(self) -> Decimal:
        """Everything sent to the model: fresh input, written to the prompt cache, and read from it."""
        return self.input_tokens + self.cache_write_tokens + self.cache_read_tokens

    @property
    def cache_read_share(self) -> float | None:
        """The share of what was sent that the model read from the prompt cache (at a tenth of the price)."""
        return float(self.cache_read_tokens / self.prompt_tokens) if self.prompt_tokens else None


@dataclass
class Approvals:
    """Decisions on calls waiting for a person, and how long they waited (seconds). `approved`
    counts the calls approved with changes too; `edited` counts those alone."""

    requested: int = 0
    approved: int = 0
    rejected: int = 0
    expired: int = 0
    edited: int = 0
    latencies: list[float] = field(default_factory=list)

    @property
    def decided(self) -> int:
        return self.approved + self.rejected + self.expired

    def share(self, outcome: str) -> float | None:
        return getattr(self, outcome) / self.decided if self.decided else None

    @property
    def as_asked(self) -> int:
        return self.approved - self.edited

    @property
    def changed_share(self) -> float | None:
        """Of the calls a person decided, the share they changed or refused: a tool whose calls are
        often edited or rejected has a prompt or a policy that needs work."""
        judged = self.approved + self.rejected
        return (self.edited + self.rejected) / judged if judged else None

    @property
    def often_changed(self) -> bool:
        """Enough decisions to tell, and people changed or refused at least OFTEN_CHANGED of them."""
        share = self.changed_share
        return self.decided >= OFTEN_CHANGED_AFTER and share is not None and share >= OFTEN_CHANGED

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
    usage_by_person: dict[str, Usage] = field(default_factory=dict)
    usage_by_tool: dict[str, Usage] = field(default_factory=dict)
    # the endpoint that served each call, and why it did (routing by difficulty), most cost first
    usage_by_endpoint: dict[str, Usage] = field(default_factory=dict)
    usage_by_route: dict[str, Usage] = field(default_factory=dict)
    # by how the calls were made: "interactive" (streamed one by one) and "batch" (Message Batches, half price)
    usage_by_mode: dict[str, Usage] = field(default_factory=dict)
    # the conversations that sent the most (id -> (title, usage)), most first
    usage_by_conversation: dict[int, tuple[str, Usage]] = field(default_factory=dict)
    usage_total: Usage = field(default_factory=Usage)
    approvals_by_day: dict[date, Approvals] = field(default_factory=dict)
    approvals_total: Approvals = field(default_factory=Approvals)
    # the decision side: final outcomes by tool; each person's own decisions (the first of two
    # approvals included) and the time from the request to each, by reviewer
    approvals_by_tool: dict[str, Approvals] = field(default_factory=dict)
    approvals_by_reviewer: dict[str, Approvals] = field(default_factory=dict)
    tools: dict[str, ToolRuns] = field(default_factory=dict)
    unpriced_models: set[str] = field(default_factory=set)

    @property
    def usage_days(self) -> list[date]:
        """The days with model calls, newest first (the daily table skips the empty ones)."""
        return [day for day in reversed(self.days) if self.usage_by_day[day].model_calls]

    @property
    def approval_days(self) -> list[date]:
        """The days a call was put to a person or decided, newest first."""
        return [
            day
            for day in reversed(self.days)
            if self.approvals_by_day[day].requested or self.approvals_by_day[day].decided
        ]


def percentile(values: list[float], p: float) -> float:
    """The nearest-rank percentile of `values` (p in 0..100)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(len(ordered) * p / 100) - 1))]


def day_bounds(start: date, end: date) -> tuple[datetime, datetime]:
    """[start 00:00, the day after end 00:00) in UTC."""
    return datetime.combine(start, time(), UTC), datetime.combine(end + timedelta(days=1), time(), UTC)


def dashboard(
    engine: Engine,
    tenant_id: int,
    start: date,
    end: date,
    prices: PriceTable | None = None,
    parts: tuple[str, ...] = PARTS,
) -> Dashboard:
    """The tenant's figures from its audit events between `start` and `end` (inclusive, UTC days),
    for the asked `parts` (usage, approvals, tools); the others stay empty.

    Usage comes from model_call events; a person is the conversation's owner; a model call's tokens
    and cost go to the tools its reply asked for (the tool_call_requested events that follow it in
    its conversation), split evenly, or to NO_TOOL. Decision latency runs from approval_requested
    to the final approval_decided (or approval_expired) of the same tool call, and counts on the day
    of the decision. Each query aggregates in the database on a short connection of its own."""
    days = [start + timedelta(days=n) for n in range((end - start).days + 1)]
    board = Dashboard(start, end, days, usage_by_day={day: Usage() for day in days})
    board.approvals_by_day = {day: Approvals() for day in days}
    query = _Queries(engine, tenant_id, start, end)
    if "usage" in parts:
        _usage(board, query, prices or PriceTable())
    if "approvals" in parts:
        _approvals(board, query)
    if "tools" in parts:
        for row in query.run(query.tool_runs()):
            board.tools[row.tool_name or "?"] = ToolRuns(runs=row.runs, failed=row.failed or 0)
    return board


def _usage(board: Dashboard, query: _Queries, prices: PriceTable) -> None:
    by_model: dict[str, Usage] = defaultdict(Usage)
    for row in query.run(query.usage(query.day)):
        board.usage_by_day[date.fromisoformat(row.key)].add(row, prices)
        board.usage_total.add(row, prices)
        board.usage_by_mode.setdefault(BATCH if row.batch else INTERACTIVE, Usage()).add(row, prices)
        by_model[row.model].add(row, prices)
        if prices.lookup(row.model) is None:
            board.unpriced_models.add(str(row.model))
    rows = query.run(query.usage(Conversation.user_id, owners=True))
    emails = dict(query.run(select(User.id, User.email).where(User.tenant_id == query.tenant_id)))
    by_person: dict[str, Usage] = defaultdict(Usage)
    for row in rows:
        by_person[emails.get(row.key, UNKNOWN_OWNER)].add(row, prices)
    by_tool: dict[str, Usage] = defaultdict(Usage)
    attributed: dict[str, Usage] = defaultdict(Usage)
    for row in query.run(query.usage_by_tool()):
        by_tool[row.key or "?"].add(row, prices)
        attributed[row.model].add(row, prices)
    for model, usage in by_model.items():
        rest = usage - attributed[model]
        if rest.model_calls > Decimal("0.000001"):  # the database shared calls out in floats
            by_tool[NO_TOOL] += rest
    by_conversation: dict[int, Usage] = defaultdict(Usage)
    for row in query.run(query.usage(AuditEvent.conversation_id)):
        if row.key is not None:
            by_conversation[row.key].add(row, prices)
    top = sorted(by_conversation.items(), key=lambda kv: -kv[1].prompt_tokens)[:TOP_CONVERSATIONS]
    titles = dict(
        query.run(select(Conversation.id, Conversation.title).where(Conversation.id.in_([c for c, _ in top])))
    )
    board.usage_by_conversation = {cid: (titles.get(cid) or f"Conversation {cid}", usage) for cid, usage in top}
    for name, labels, default in (
        ("endpoint", board.usage_by_endpoint, DEFAULT_ENDPOINT),
        ("route", board.usage_by_route, NOT_ROUTED),
    ):
        grouped: dict[str, Usage] = defaultdict(Usage)
        for row in query.run(query.usage(AuditEvent.data[name].as_string())):
            grouped[row.key or default].add(row, prices)
        labels.update(sorted(grouped.items(), key=lambda kv: (-kv[1].cost, -kv[1].model_calls, kv[0])))
    board.usage_by_person = dict(sorted(by_person.items(), key=lambda kv: -kv[1].cost))
    board.usage_by_tool = dict(sorted(by_tool.items(), key=lambda kv: -kv[1].cost))


def _approvals(board: Dashboard, query: _Queries) -> None:
    requested_at: dict[int, datetime] = {}
    asked_of: dict[int, str] = {}  # tool call id -> its tool
    decisions = []
    for row in query.run(query.approval_events()):
        if row.action == "approval_requested":
            requested_at[row.tool_call_id] = row.created_at
            asked_of[row.tool_call_id] = row.tool_name
            for bucket in (board.approvals_by_day[row.created_at.date()], board.approvals_total):
                bucket.requested += 1
        else:
            decisions.append(row)
    missing = [row.tool_call_id for row in decisions if row.tool_call_id not in requested_at]
    requested_at.update(query.requested_before(missing))
    by_tool: dict[str, Approvals] = defaultdict(Approvals)
    by_reviewer: dict[str, Approvals] = defaultdict(Approvals)
    edited: set[int] = set()  # calls someone approved with changes
    for row in decisions:
        waited = row.created_at - requested_at[row.tool_call_id] if row.tool_call_id in requested_at else None
        if row.edited_to is not None:
            edited.add(row.tool_call_id)
        if row.action == "approval_decided":  # one person's decision, perhaps the first of two
            _count(by_reviewer[row.actor_label or "?"], row, waited, row.edited_to is not None)
        if row.outcome in DECISIONS:  # the call's final outcome
            tool = by_tool[row.tool_name or asked_of.get(row.tool_call_id) or "?"]
            buckets = (board.approvals_by_day[row.created_at.date()], board.approvals_total, tool)
            for bucket in buckets:
                _count(bucket, row, waited, row.tool_call_id in edited)
    board.approvals_by_tool = dict(sorted(by_tool.items(), key=lambda kv: (-kv[1].decided, kv[0])))
    board.approvals_by_reviewer = dict(sorted(by_reviewer.items(), key=lambda kv: (-kv[1].decided, kv[0])))


def _count(bucket: Approvals, row, waited: timedelta | None, edited: bool) -> None:
    """One decision into a bucket: by its outcome (a person's approval that still waits for a second
    counts as theirs approved), and how long the call had waited for it."""
    outcome = row.outcome if row.outcome in DECISIONS else "approved"
    setattr(bucket, outcome, getattr(bucket, outcome) + 1)
    if outcome == "approved" and edited:
        bucket.edited += 1
    if waited is not None:
        bucket.latencies.append(waited.total_seconds())


# By output column: PostgreSQL cannot tell that two bound copies of an expression are the same one.
# (A model's calls answered by a batch are summed apart from the others: they cost half.)
_BY_KEY_AND_MODEL = (literal_column("key"), literal_column("model"), literal_column("batch"))
BATCH, INTERACTIVE = "batch", "interactive"


def _BATCHED(event):  # noqa: N802 - reads as the column it is
    """1 for a model_call event answered by a Message Batch, else 0."""
    return case((event.data["batch_id"].as_string().is_not(None), 1), else_=0)


class _Queries:
    """The dashboard's queries over one tenant's events in one range of days."""

    def __init__(self, engine: Engine, tenant_id: int, start: date, end: date) -> None:
        self.engine, self.tenant_id = engine, tenant_id
        self.low, self.high = day_bounds(start, end)
        e = AuditEvent
        self.scope = (e.tenant_id == tenant_id, e.created_at >= self.low, e.created_at < self.high)
        if engine.dialect.name == "postgresql":
            self.day = func.to_char(func.timezone("UTC", e.created_at), "YYYY-MM-DD")
        else:  # SQLite stores UTC as "YYYY-MM-DD HH:MM:SS.ffffff"
            self.day = func.substr(e.created_at, 1, 10, type_=String)

    def run(self, query) -> list:
        with self.engine.connect() as connection:
            return connection.execute(query).all()

    @staticmethod
    def _sums(event, share=None):
        def total(name):
            value = event.data[name].as_float() if share is not None else event.data[name].as_integer()
            return func.coalesce(func.sum(value if share is None else value / share), 0).label(name)

        calls = func.count() if share is None else func.sum(1.0 / share)
        return (
            event.data["model"].as_string().label("model"),
            _BATCHED(event).label("batch"),
            calls.label("model_calls"),
            *map(total, TOKEN_FIELDS),
        )

    def usage(self, key, owners: bool = False):
        """Model-call sums by `key` and model."""
        e = AuditEvent
        query = select(key.label("key"), *self._sums(e)).where(*self.scope, e.action == "model_call")
        if owners:
            query = query.outerjoin(
                Conversation, and_(Conversation.id == e.conversation_id, Conversation.tenant_id == e.tenant_id)
            )
        return query.group_by(*_BY_KEY_AND_MODEL)

    def usage_by_tool(self):
        """Model-call sums by tool asked for and model, each call shared evenly between its tools."""
        e = AuditEvent
        # The model call of each step: the newest model_call so far in its conversation.
        turn = func.max(case((e.action == "model_call", e.id))).over(partition_by=e.conversation_id, order_by=e.id)
        steps = (
            select(e.action, e.tool_name, turn.label("turn"))
            .where(*self.scope, e.action.in_(("model_call", "tool_call_requested")))
            .subquery()
        )
        asks = (
            select(steps.c.turn, steps.c.tool_name, func.count().over(partition_by=steps.c.turn).label("n"))
            .where(steps.c.action == "tool_call_requested", steps.c.turn.is_not(None))
            .subquery()
        )
        call = aliased(AuditEvent)
        return (
            select(asks.c.tool_name.label("key"), *self._sums(call, share=asks.c.n))
            .join(call, call.id == asks.c.turn)
            .group_by(*_BY_KEY_AND_MODEL)
        )

    def approval_events(self):
        e = AuditEvent
        actions = ("approval_requested", "approval_decided", "approval_expired")
        return (
            select(
                e.action,
                e.tool_call_id,
                e.tool_name,
                e.actor_label,
                e.outcome,
                e.created_at,
                e.data["edited_to"].as_string().label("edited_to"),  # NULL unless the person changed the call
            )
            .where(*self.scope, e.action.in_(actions))
            .order_by(e.id)
        )

    def requested_before(self, tool_call_ids: list[int]) -> dict[int, datetime]:
        """When calls decided in the range but asked for before it were put to a person."""
        found: dict[int, datetime] = {}
        ids = sorted({i for i in tool_call_ids if i is not None})
        e = AuditEvent
        for n in range(0, len(ids), 500):
            query = select(e.tool_call_id, e.created_at).where(
                e.tenant_id == self.tenant_id,
                e.action == "approval_requested",
                e.created_at < self.low,
                e.tool_call_id.in_(ids[n : n + 500]),
            )
            found.update({row.tool_call_id: row.created_at for row in self.run(query)})
        return found

    def tool_runs(self):
        e = AuditEvent
        return (
            select(e.tool_name, func.count().label("runs"), func.sum(case((e.outcome == "failed", 1))).label("failed"))
            .where(*self.scope, e.action == "tool_call_executed")
            .group_by(e.tool_name)
            .order_by(e.tool_name)
        )
