"""GET /metrics: Prometheus metrics computed at scrape time from the database and Redis.

Web and worker processes are separate, so nothing is counted in memory: every number comes from
the database (the state) or Redis (the queue), and any web process answers the same totals. A
Prometheus counter is a total over all time; the append-only tables (model_calls, audit_events)
give those, read incrementally (see Tally) so a scrape reads only the rows added lately. Gauges
(what is waiting now) are counts over indexed columns restricted to open states, which stay small.

Access: a bearer token equal to METRICS_TOKEN (Prometheus) or a signed-in operator get the fleet's
figures; a signed-in tenant admin (a browser) gets their own tenant's: the families that split by
tenant (model calls, tokens, latency, moves, tool calls, decisions, audit events, open conversations
and calls, waiting approvals, MCP tools) counted over their tenant's rows only, and none of the fleet's
own (the queue, its workers and their slots). Without either the answer is 401; nothing here is
public. No person or content appears in any label, and no tenant outside the MCP families, which name
the tenant by its slug, the server and the tool (an MCP server belongs to one tenant).
"""

from __future__ import annotations

import hmac
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from datetime import timedelta
from functools import wraps

import redis
from flask import Blueprint, Response, abort, current_app, g, request
from flask_login import current_user
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry
from rq import Worker
from rq.registry import DeferredJobRegistry, FailedJobRegistry, ScheduledJobRegistry, StartedJobRegistry
from sqlalchemy import and_, case, func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from webapp.agent.states import MOVING, CallStatus, ConversationStatus
from webapp.models import OPERATOR, AuditEvent, Conversation, McpServer, McpTool, ModelCall, Tenant, ToolCall, utcnow
from webapp.runtime.extensions import db

bp = Blueprint("metrics", __name__)

# Model latency buckets, in seconds (the histogram's `le` labels).
LATENCY_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
# MCP tool call latency buckets: milliseconds on a live session, a second or more when a server starts.
MCP_LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Conversations and tool calls in these states are counted now; settled ones only grow, and their
# totals come from the audit log's counters instead.
OPEN_CONVERSATION_STATES = tuple(
    s.value
    for s in (
        ConversationStatus.QUEUED,
        ConversationStatus.RUNNING,
        ConversationStatus.AWAITING_APPROVAL,
        ConversationStatus.AWAITING_TASK,
        ConversationStatus.AWAITING_BATCH,
        ConversationStatus.FAILED,
        ConversationStatus.BUDGET_EXHAUSTED,
    )
)
OPEN_CALL_STATES = tuple(
    s.value for s in (CallStatus.PENDING, CallStatus.AWAITING_APPROVAL, CallStatus.APPROVED, CallStatus.RUNNING)
)
# Waiting approvals by age: (label, lower bound in seconds); each call falls in exactly one.
APPROVAL_AGE_BUCKETS = (("0-5m", 0), ("5m-1h", 300), ("1h-4h", 3600), ("4h-24h", 4 * 3600), ("24h+", 24 * 3600))
TOKEN_KINDS = ("input", "output", "cache_read", "cache_write")


class Tally:
    """All-time aggregates of an append-only table, grouped, without reading the whole table at
    every scrape.

    Rows up to a checkpoint id are summed once and kept; each scrape sums only the rows after it
    (a range scan on the primary key). The checkpoint moves to an id seen at least `settle_seconds`
    ago: ids come from a sequence, and a transaction that took an id that long ago has committed
    or rolled back by now (the loop's transactions last milliseconds; none spans a model call), so
    a row below the checkpoint can no longer appear. The first scrape of a process reads the table
    once."""

    def __init__(
        self, id_column, group_by: Sequence, sums: Sequence, settle_seconds: float = 300.0, where: Sequence = ()
    ) -> None:
        self.id_column = id_column
        self.group_by = list(group_by)
        self.sums = list(sums)
        self.where = list(where)  # only the rows these conditions keep
        self.settle_seconds = settle_seconds
        self.checkpoint = 0
        self.settled: dict[tuple, list[float]] = {}
        self.seen: deque[tuple[float, int]] = deque()  # (monotonic time, max id seen then)
        self.lock = threading.Lock()

    def totals(self, session: Session) -> dict[tuple, list[float]]:
        """{group values: [count, *sums]} over every row of the table."""
        with self.lock:
            now = time.monotonic()
            target = None
            while self.seen and now - self.seen[0][0] >= self.settle_seconds:
                target = self.seen.popleft()[1]
            if target is not None and target > self.checkpoint:
                settled, _ = self._sum(session, self.checkpoint, target)
                _add(self.settled, settled)
                self.checkpoint = target
            tail, newest = self._sum(session, self.checkpoint, None)
            self.seen.append((now, max(newest, self.checkpoint)))
            totals = {key: list(values) for key, values in self.settled.items()}
            _add(totals, tail)
            return totals

    def _sum(self, session: Session, after: int, upto: int | None) -> tuple[dict[tuple, list[float]], int]:
        query = select(
            *self.group_by,
            func.count(),
            *(func.coalesce(func.sum(expression), 0) for expression in self.sums),
            func.max(self.id_column),
        ).where(self.id_column > after, *self.where)
        if upto is not None:
            query = query.where(self.id_column <= upto)
        if self.group_by:
            query = query.group_by(*self.group_by)
        groups: dict[tuple, list[float]] = {}
        newest = after
        width = len(self.group_by)
        for row in session.execute(query):
            if row[-1] is None:  # no rows (an aggregate without GROUP BY still answers one row)
                continue
            groups[tuple(row[:width])] = [float(value or 0) for value in row[width:-1]]
            newest = max(newest, int(row[-1]))
        return groups, newest


def _of_tenant(totals: dict[tuple, list[float]], tenant_id: int | None) -> dict[tuple, list[float]]:
    """Totals grouped by (tenant, *rest) as {rest: values}: summed over every tenant (the fleet), or
    one tenant's only."""
    kept: dict[tuple, list[float]] = {}
    for (tenant, *rest), values in totals.items():
        if tenant_id is None or tenant == tenant_id:
            _add(kept, {tuple(rest): values})
    return kept


def _add(into: dict[tuple, list[float]], more: dict[tuple, list[float]]) -> None:
    for key, values in more.items():
        if key in into:
            into[key] = [a + b for a, b in zip(into[key], values, strict=True)]
        else:
            into[key] = list(values)


class DeskCollector(Collector):
    """Everything /metrics reports, read when Prometheus scrapes. One per app."""

    def __init__(self, app) -> None:
        self.app = app
        latency_s = ModelCall.latency_ms / 1000.0
        # Grouped by tenant first, so one tally serves the fleet (summed over tenants) and each tenant.
        self.model_calls = Tally(
            ModelCall.id,
            group_by=[ModelCall.tenant_id, ModelCall.model],
            sums=[
                ModelCall.input_tokens,
                ModelCall.output_tokens,
                ModelCall.cache_read_input_tokens,
                ModelCall.cache_creation_input_tokens,
                latency_s,
                *(case((latency_s <= bound, 1), else_=0) for bound in LATENCY_BUCKETS),
            ],
        )
        self.audit = Tally(
            AuditEvent.id, group_by=[AuditEvent.tenant_id, AuditEvent.action, AuditEvent.outcome], sums=[]
        )
        # Runs of MCP tools (every registry name of one starts with mcp_): the audit log's
        # tool_call_executed events, which carry the outcome and the duration, and are never updated.
        mcp_seconds = func.coalesce(AuditEvent.data["duration_ms"].as_float(), 0.0) / 1000.0
        self.mcp_calls = Tally(
            AuditEvent.id,
            group_by=[AuditEvent.tenant_id, AuditEvent.tool_name],
            sums=[
                case((AuditEvent.outcome == CallStatus.FAILED.value, 1), else_=0),
                mcp_seconds,
                *(case((mcp_seconds <= bound, 1), else_=0) for bound in MCP_LATENCY_BUCKETS),
            ],
            where=[AuditEvent.action == "tool_call_executed", AuditEvent.tool_name.startswith("mcp_", autoescape=True)],
        )

    def collect(self, tenant_id: int | None = None) -> Iterable[Metric]:
        """The fleet's figures, or (tenant_id) one tenant's: its rows only, and no family of the fleet's
        own (the queue and its workers)."""
        started = time.perf_counter()
        desk = self.app.extensions["desk"]
        yield from self._database(desk.config, tenant_id)
        if tenant_id is None:
            yield from self._redis(desk.dispatcher)
        scrape = GaugeMetricFamily("desk_scrape_duration_seconds", "Time this scrape took to compute.")
        scrape.add_metric([], time.perf_counter() - started)
        yield scrape

    # --- the database ---------------------------------------------------------------------------

    def _database(self, config, tenant_id: int | None) -> Iterable[Metric]:
        up = GaugeMetricFamily("desk_database_up", "1 when the database answered this scrape.")
        try:
            families = self._database_families(db.session, config, tenant_id)
        except SQLAlchemyError as exc:
            db.session.rollback()
            self.app.logger.warning("metrics: database unavailable: %s", type(exc).__name__)
            up.add_metric([], 0)
            yield up
            return
        finally:
            db.session.rollback()  # a scrape must not hold a snapshot (or SQLite's lock)
        up.add_metric([], 1)
        yield up
        yield from families

    def _database_families(self, session: Session, config, tenant_id: int | None) -> list[Metric]:
        families: list[Metric] = []
        conversation_scope = [Conversation.tenant_id == tenant_id] if tenant_id is not None else []
        call_scope = [ToolCall.tenant_id == tenant_id] if tenant_id is not None else []

        # Model calls: a counter and tokens by model, and the latency histogram.
        calls = CounterMetricFamily("desk_model_calls", "Model calls made, by model.", labels=["model"])
        tokens = CounterMetricFamily("desk_model_tokens", "Tokens used by model calls.", labels=["model", "kind"])
        latency = HistogramMetricFamily(
            "desk_model_call_latency_seconds", "Latency of model calls, from request to last byte.", labels=["model"]
        )
        for (model,), values in sorted(
            _of_tenant(self.model_calls.totals(session), tenant_id).items(), key=lambda item: str(item[0])
        ):
            count, *token_sums, latency_sum = values[: 2 + len(TOKEN_KINDS)]
            calls.add_metric([model], count)
            for kind, total in zip(TOKEN_KINDS, token_sums, strict=True):
                tokens.add_metric([model, kind], total)
            cumulative = values[2 + len(TOKEN_KINDS) :]
            buckets = [(_le(bound), n) for bound, n in zip(LATENCY_BUCKETS, cumulative, strict=True)]
            latency.add_metric([model], [*buckets, ("+Inf", count)], latency_sum)
        families += [calls, tokens, latency]

        # The audit log's actions: moves, tool calls by outcome, decisions, and every action.
        actions = _of_tenant(self.audit.totals(session), tenant_id)
        moves = CounterMetricFamily("desk_moves", "Moves made: model calls and tool calls run.", labels=["kind"])
        executed = CounterMetricFamily("desk_tool_calls_executed", "Tool calls run, by outcome.", labels=["outcome"])
        decided = CounterMetricFamily(
            "desk_approval_decisions",
            "Decisions on tool calls, by outcome (expired: nobody decided).",
            labels=["outcome"],
        )
        events = CounterMetricFamily(
            "desk_audit_events", "Audit events written, by action and outcome.", labels=["action", "outcome"]
        )
        by_kind = {"model_call": 0.0, "tool_call": 0.0}
        for (action, outcome), (count,) in sorted(actions.items(), key=lambda item: tuple(map(str, item[0]))):
            events.add_metric([action, outcome or ""], count)
            if action == "model_call":
                by_kind["model_call"] += count
            elif action == "tool_call_executed":
                by_kind["tool_call"] += count
                executed.add_metric([outcome or ""], count)
            elif action in ("approval_decided", "approval_expired"):
                decided.add_metric([outcome or ("expired" if action == "approval_expired" else "")], count)
        for kind, count in by_kind.items():
            moves.add_metric([kind], count)
        families += [moves, executed, decided, events]

        # What is open now.
        conversations = GaugeMetricFamily(
            "desk_conversations", "Conversations now in an open or failed state.", labels=["status"]
        )
        counted = dict(
            session.execute(
                select(Conversation.status, func.count())
                .where(Conversation.status.in_(OPEN_CONVERSATION_STATES), *conversation_scope)
                .group_by(Conversation.status)
            ).all()
        )
        for status in OPEN_CONVERSATION_STATES:
            conversations.add_metric([status], counted.get(status, 0))
        stalled = GaugeMetricFamily(
            "desk_conversations_stalled",
            "Queued or running conversations whose worker lease expired (the sweeper re-enqueues them).",
        )
        stalled.add_metric(
            [],
            session.scalar(
                select(func.count()).where(
                    Conversation.status.in_(MOVING), Conversation.lease_expires_at < utcnow(), *conversation_scope
                )
            )
            or 0,
        )
        tool_calls = GaugeMetricFamily("desk_tool_calls", "Tool calls now in an open state.", labels=["status"])
        counted = dict(
            session.execute(
                select(ToolCall.status, func.count())
                .where(ToolCall.status.in_(OPEN_CALL_STATES), *call_scope)
                .group_by(ToolCall.status)
            ).all()
        )
        for status in OPEN_CALL_STATES:
            tool_calls.add_metric([status], counted.get(status, 0))
        families += [conversations, stalled, tool_calls]

        # Approvals waiting for a person: how many, the oldest, and how many by age.
        waiting = and_(ToolCall.status == CallStatus.AWAITING_APPROVAL.value, *call_scope)
        now = utcnow()
        oldest = session.scalar(select(func.min(ToolCall.created_at)).where(waiting))
        pending = GaugeMetricFamily("desk_approvals_pending", "Tool calls waiting for a decision.")
        pending.add_metric([], counted.get(CallStatus.AWAITING_APPROVAL.value, 0))
        age = GaugeMetricFamily(
            "desk_approval_oldest_age_seconds", "Age of the oldest tool call waiting for a decision (0: none)."
        )
        age.add_metric([], max(0.0, (now - _aware(oldest)).total_seconds()) if oldest else 0.0)
        by_age = GaugeMetricFamily("desk_approvals_pending_by_age", "Tool calls waiting, by age.", labels=["age"])
        older_than = [
            session.scalar(select(func.count()).where(waiting, ToolCall.created_at <= now - timedelta(seconds=lower)))
            if lower
            else counted.get(CallStatus.AWAITING_APPROVAL.value, 0)
            for _, lower in APPROVAL_AGE_BUCKETS
        ]
        for index, (label, _) in enumerate(APPROVAL_AGE_BUCKETS):
            beyond = older_than[index + 1] if index + 1 < len(older_than) else 0
            by_age.add_metric([label], max(0, (older_than[index] or 0) - (beyond or 0)))
        families += [pending, age, by_age]
        families += self._mcp_families(session, tenant_id)
        return families

    def _mcp_families(self, session: Session, tenant_id: int | None) -> list[Metric]:
        """Per MCP tool of the catalogue (and so per server, summed): its runs, those that failed, their
        latency, and whether it is held. Labelled by the tenant's slug, the server and the tool's
        registry name: a server belongs to one tenant, and two tenants' servers of one name are two
        servers. A tool no longer in the catalogue is left out, so the series stay bounded by it."""
        labels = ["tenant", "server", "tool"]
        calls = CounterMetricFamily("desk_mcp_tool_calls", "Runs of MCP tools (each run of a call).", labels=labels)
        errors = CounterMetricFamily(
            "desk_mcp_tool_errors",
            "Runs of MCP tools that failed: the server's error, unreachable, refused, held or changed.",
            labels=labels,
        )
        latency = HistogramMetricFamily(
            "desk_mcp_tool_call_latency_seconds",
            "Time an MCP tool's run took, its listing check and any retries included.",
            labels=labels,
        )
        held = GaugeMetricFamily(
            "desk_mcp_tool_held",
            "1 while an MCP tool is held (its server changed it since an admin accepted it), else 0.",
            labels=labels,
        )
        catalogue = select(McpTool.tenant_id, McpTool.registry_name, McpTool.held, McpServer.name, Tenant.slug)
        catalogue = catalogue.join(McpServer, McpServer.id == McpTool.server_id).join(
            Tenant, Tenant.id == McpTool.tenant_id
        )
        if tenant_id is not None:
            catalogue = catalogue.where(McpTool.tenant_id == tenant_id)
        tools = sorted(session.execute(catalogue).all(), key=lambda row: (row.slug, row.name, row.registry_name))
        runs = self.mcp_calls.totals(session) if tools else {}
        nothing = [0.0] * (3 + len(MCP_LATENCY_BUCKETS))
        for tool in tools:
            named = [tool.slug, tool.name, tool.registry_name]
            count, failed, seconds, *cumulative = runs.get((tool.tenant_id, tool.registry_name), nothing)
            calls.add_metric(named, count)
            errors.add_metric(named, failed)
            buckets = [(_le(bound), n) for bound, n in zip(MCP_LATENCY_BUCKETS, cumulative, strict=True)]
            latency.add_metric(named, [*buckets, ("+Inf", count)], seconds)
            held.add_metric(named, 1 if tool.held else 0)
        return [calls, errors, latency, held]

    # --- Redis ----------------------------------------------------------------------------------

    def _redis(self, dispatcher) -> Iterable[Metric]:
        up = GaugeMetricFamily("desk_redis_up", "1 when Redis answered this scrape.")
        try:
            families = list(self._redis_families(dispatcher))
        except (redis.RedisError, OSError) as exc:
            self.app.logger.warning("metrics: redis unavailable: %s", type(exc).__name__)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _redis_families(self, dispatcher) -> Iterable[Metric]:
        queue = dispatcher.queue
        connection = dispatcher.redis
        jobs = GaugeMetricFamily(
            "desk_queue_jobs",
            "RQ jobs of the move queues (people's, the rest), by state.",
            labels=["queue", "state"],
        )
        for move_queue in dispatcher.move_queues:
            for state, count in queue_counts(move_queue).items():
                jobs.add_metric([move_queue.name, state], count)
        yield jobs
        workers = GaugeMetricFamily("desk_workers", "RQ workers registered on the queue, by state.", labels=["state"])
        slots = GaugeMetricFamily(
            "desk_worker_slots",
            "Slots of the queue's workers (moves one process runs at once), by state.",
            labels=["state"],
        )
        states: dict[str, int] = {}
        busy = free = 0
        for worker in Worker.all(queue=queue):
            state = str(worker.get_state())
            states[state] = states.get(state, 0) + 1
            taken, total = worker_slots(worker)
            busy, free = busy + taken, free + max(0, total - taken)
        for state in ("idle", "busy"):
            states.setdefault(state, 0)
        for state, count in sorted(states.items()):
            workers.add_metric([state], count)
        yield workers
        slots.add_metric(["busy"], busy)
        slots.add_metric(["free"], free)
        yield slots
        all_workers = GaugeMetricFamily("desk_workers_registered", "RQ workers registered on this Redis.")
        all_workers.add_metric([], Worker.count(connection=connection))
        yield all_workers


def worker_slots(worker: Worker) -> tuple[int, int]:
    """(busy, total) slots of a registered worker: the jobs it runs now, and how many it may run at
    once (1 for a worker that does not say)."""
    total = worker.connection.hget(worker.key, "slots")
    return worker.current_execution_count, int(total) if total else 1


def move_queue_counts(dispatcher) -> dict[str, int]:
    """The move queues' jobs by state, people's and the rest together."""
    totals: dict[str, int] = {}
    for queue in dispatcher.move_queues:
        for state, count in queue_counts(queue).items():
            totals[state] = totals.get(state, 0) + count
    return totals


def queue_counts(queue) -> dict[str, int]:
    """Jobs of the queue by state, read without RQ's registry cleanups (a scrape changes nothing)."""
    registries = {
        "scheduled": ScheduledJobRegistry,
        "started": StartedJobRegistry,
        "failed": FailedJobRegistry,
        "deferred": DeferredJobRegistry,
    }
    counts = {"queued": queue.count}
    for state, registry in registries.items():
        counts[state] = registry(queue=queue).get_job_count(cleanup=False)
    return counts


def _le(bound: float) -> str:
    return f"{bound:g}" if bound != int(bound) else f"{bound:.1f}"


def _aware(moment):
    from datetime import UTC

    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


# --- the endpoint ---------------------------------------------------------------------------------


def metrics_access(view):
    """The bearer token METRICS_TOKEN (Prometheus) or a signed-in operator: the fleet's figures; a
    signed-in admin: their tenant's (g.metrics_tenant_id). A wrong token answers 401, a signed-in
    person who is neither 403, anyone else 401."""

    @wraps(view)
    def wrapper(*args, **kwargs):
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme:
            expected = current_app.extensions["desk"].config.metrics_token
            if scheme.lower() == "bearer" and expected and hmac.compare_digest(token.strip(), expected):
                g.metrics_tenant_id = None
                return view(*args, **kwargs)
            reason = "is not the metrics token" if expected else "cannot be checked: METRICS_TOKEN is not set"
            return _unauthorized(f"The bearer token {reason}. Send Authorization: Bearer <METRICS_TOKEN>.")
        if current_user.is_authenticated:
            if current_user.is_operator:
                g.metrics_tenant_id = None
                return view(*args, **kwargs)
            if current_user.has_role("admin"):
                g.metrics_tenant_id = current_user.tenant_id
                return view(*args, **kwargs)
            abort(403, description="Metrics are for admins and operators, or for Prometheus with the METRICS_TOKEN.")
        return _unauthorized("Send Authorization: Bearer <METRICS_TOKEN>, or sign in as an admin or an operator.")

    wrapper.allowed_roles = ("admin", OPERATOR)  # and the metrics token, which is no person's role
    return wrapper


def _unauthorized(message: str) -> Response:
    return Response(message + "\n", status=401, mimetype="text/plain", headers={"WWW-Authenticate": "Bearer"})


@bp.get("/metrics")
@metrics_access
def metrics():
    registry: CollectorRegistry = current_app.extensions["desk_metrics"]
    if g.metrics_tenant_id is not None:
        registry = _TenantScrape(current_app.extensions["desk_collector"], g.metrics_tenant_id)
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return Response(encoder(registry), mimetype=None, content_type=content_type, headers={"Cache-Control": "no-store"})


class _TenantScrape:
    """What the encoder reads for one tenant's admin: the collector's figures for that tenant."""

    def __init__(self, collector: DeskCollector, tenant_id: int) -> None:
        self.collector = collector
        self.tenant_id = tenant_id

    def collect(self) -> Iterable[Metric]:
        return self.collector.collect(self.tenant_id)


def init_app(app) -> None:
    """A registry of our own per app (never prometheus_client's global one): the collector reads
    this app's database and Redis."""
    registry = CollectorRegistry(auto_describe=False)
    collector = DeskCollector(app)
    registry.register(collector)
    app.extensions["desk_metrics"] = registry
    app.extensions["desk_collector"] = collector
    app.register_blueprint(bp)
