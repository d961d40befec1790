"""Bulk runs, shared by the API, the pages and the command line: many items, each the first question
of a conversation of its own, owned by the person who started the run; with `batch`, their model
moves go through the Message Batches API at half the price (webapp/agent/batches.py).

A run is stored with its items at once; a job (jobs/runs.py) starts them as conversations,
START_CHUNK at a time, each chunk one transaction, and their moves go on the moves queue, behind
the moves that follow a person's act. A run's figures are its conversations' statuses and the model
calls they made."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.agent import moves
from webapp.agent.states import IDLE, ConversationStatus
from webapp.audit import costs
from webapp.conversations import actions as conversations
from webapp.models import Conversation, ModelCall, Run, RunItem, User, utcnow
from webapp.refusals import Refusal
from webapp.runtime.services import services
from webapp.web.pagination import Page, keyset_page


class RunRefused(Refusal):
    """What bulk runs refuse: a file, a run or a change to one that cannot be taken."""


MAX_ITEMS = 10_000
START_CHUNK = 200  # conversations started in one transaction
MAX_FILE_BYTES = 20 * 1024 * 1024  # a run's file, or its items sent to the API
COUNTS = ("queued", "running", "awaiting_approval", "completed", "failed", "cancelled")
# a conversation's status as a run counts it (an item not started yet is queued, or cancelled)
_COUNTED_AS = {
    ConversationStatus.QUEUED: "queued",
    ConversationStatus.RUNNING: "running",
    ConversationStatus.AWAITING_TASK: "running",
    ConversationStatus.AWAITING_BATCH: "running",
    ConversationStatus.AWAITING_APPROVAL: "awaiting_approval",
    ConversationStatus.COMPLETED: "completed",
    ConversationStatus.FAILED: "failed",
    ConversationStatus.BUDGET_EXHAUSTED: "failed",
    ConversationStatus.CANCELLED: "cancelled",
}


def create(
    session: Session,
    user: User,
    messages: list[str],
    *,
    batch: bool,
    title: str = "",
    lines: Sequence[int] | None = None,
) -> Run:
    """A run of these messages (checked one by one, every problem named by item, or by the line of
    the file it came from when `lines` says which), stored and audited; its conversations start in
    the background."""
    if not messages:
        raise RunRefused("invalid", "invalid_field", "A run needs at least one item.")
    if len(messages) > MAX_ITEMS:
        raise RunRefused(
            "invalid", "invalid_field", f"A run has at most {MAX_ITEMS:,} items; this one has {len(messages):,}."
        )
    problems = []
    for position, text in enumerate(messages, start=1):
        where = f"line {lines[position - 1]}" if lines is not None else f"item {position}"
        try:
            conversations.check_message(text)
        except Refusal as refusal:
            problems.append(f"{where}: {refusal.message}")
            continue
        if "\x00" in text:
            problems.append(f"{where}: A message cannot hold the NUL character (\\u0000).")
        elif not _is_unicode(text):
            problems.append(f"{where}: The message holds text that is not valid Unicode (a lone surrogate).")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise RunRefused("invalid", "invalid_field", "Some items cannot run: " + "; ".join(problems[:5]) + more)
    title = (title or "").strip()[:200] or f"{len(messages):,} item{'s' if len(messages) != 1 else ''}"
    run = Run(tenant_id=user.tenant_id, user_id=user.id, title=title, batch=batch, items=len(messages), started=0)
    session.add(run)
    session.flush()
    session.execute(
        insert(RunItem), [{"run_id": run.id, "position": n, "message": text} for n, text in enumerate(messages, 1)]
    )
    audit_chain.record(
        session,
        "run_started",
        tenant_id=user.tenant_id,
        actor=user,
        data={"run_id": run.id, "items": run.items, "batch": batch, "title": title},
    )
    session.commit()
    services().dispatcher.enqueue_run_start(run.id)  # (Redis away: the sweep enqueues it once it is back)
    return run


@dataclass(frozen=True)
class Started:
    """A chunk of a run's items started as conversations and committed: their first moves are to queue."""

    tenant_id: int | None
    moves: list[tuple[int, int]] = field(default_factory=list)  # (conversation, version)


def start_items(session: Session, run_id: int, limit: int = START_CHUNK) -> Started:
    """Start the next `limit` items of the run as conversations, in one transaction (its job,
    jobs/runs.py, then queues their first moves). A stopped run starts nothing more, nor does a run
    whose agent was disabled since (it is stopped, and says why)."""
    desk = services()
    run = session.get(Run, run_id, with_for_update=True)
    if run is None or run.cancelled_at is not None:
        session.rollback()
        return Started(None)
    owner = session.get(User, run.user_id)
    if not owner.active:
        run.cancelled_at = utcnow()
        audit_chain.record(
            session,
            "run_cancelled",
            tenant_id=run.tenant_id,
            actor_label="desk",
            data={
                "run_id": run.id,
                "reason": f"{owner.email}'s account was disabled",
                "items_not_started": run.items - run.started,
            },
        )
        session.commit()
        return Started(run.tenant_id)
    items = session.scalars(
        select(RunItem)
        .where(RunItem.run_id == run_id, RunItem.conversation_id.is_(None))
        .order_by(RunItem.position)
        .limit(limit)
    ).all()
    started = []
    for item in items:
        conversation = Conversation(
            tenant_id=run.tenant_id,
            user_id=run.user_id,
            run_id=run.id,
            status="queued",
            move_budget=desk.config.move_budget,
            token_budget=desk.config.token_budget,
        )
        session.add(conversation)
        session.flush()
        desk.loop(session, conversation).ask_later(item.message)
        version = moves.start_run(session, conversation)
        item.conversation_id = conversation.id
        audit_chain.record(
            session,
            "conversation_started",
            tenant_id=run.tenant_id,
            actor=owner,
            conversation_id=conversation.id,
            data={"message": item.message, "run_id": run.id, "item": item.position},
        )
        started.append((conversation.id, version))
    run.started += len(started)
    session.commit()
    return Started(run.tenant_id, started)


def visible_to(user: User):
    """The runs this person may see: their own, or their tenant's for supervisors."""
    condition = Run.tenant_id == user.tenant_id
    if not any(user.has_role(role) for role in conversations.SUPERVISING):
        condition = condition & (Run.user_id == user.id)
    return condition


def find(session: Session, user: User, run_id: int) -> Run:
    run = session.scalar(select(Run).where(Run.id == run_id, Run.tenant_id == user.tenant_id))
    if run is None:
        raise RunRefused("missing", "not_found", f"No run {run_id} in your account.")
    if run.user_id != user.id and not any(user.has_role(role) for role in conversations.SUPERVISING):
        raise RunRefused("forbidden", "forbidden", "This run belongs to another agent.")
    return run


def listing(session: Session, user: User, cursor: str | None = None, limit: int = 50) -> Page:
    """A page of the runs this person may see, newest first."""
    statement = select(Run).where(visible_to(user))
    return keyset_page(session, statement, [Run.id], cursor, limit, key_values=lambda run: (run.id,))


@dataclass
class Figures:
    """Where a run stands: its status, its items counted by where their conversations are, and what
    its model calls cost (and would have cost made one by one)."""

    status: str  # starting | running | completed | cancelled
    counts: dict[str, int]
    conversation_ids: list[int] = field(default_factory=list)
    model_calls: int = 0
    batched_calls: int = 0
    cost: Decimal = Decimal(0)
    cost_interactive: Decimal = Decimal(0)

    @property
    def done(self) -> int:
        return self.counts["completed"] + self.counts["failed"] + self.counts["cancelled"]


def figures(session: Session, run: Run, prices: costs.PriceTable | None = None, ids: bool = True) -> Figures:
    """Where the run stands, counted in the database (a run of 10,000 reads a few rows, not 10,000);
    its conversations' ids only when `ids`."""
    counts = dict.fromkeys(COUNTS, 0)
    of_run = Conversation.run_id == run.id
    started = 0
    for status, number in session.execute(
        select(Conversation.status, func.count()).where(of_run).group_by(Conversation.status)
    ):
        counts[_COUNTED_AS.get(status, "running")] += number
        started += number
    unstarted = run.items - started
    counts["cancelled" if run.cancelled_at is not None else "queued"] += unstarted
    if run.cancelled_at is not None:
        status = "cancelled"
    elif unstarted:
        status = "starting"
    else:
        status = "running" if counts["queued"] + counts["running"] + counts["awaiting_approval"] else "completed"
    listed = list(session.scalars(select(Conversation.id).where(of_run).order_by(Conversation.id))) if ids else []
    result = Figures(status, counts, listed)
    prices = prices or price_table()
    batched = ModelCall.batch_id.is_not(None)
    sums = session.execute(
        select(
            ModelCall.model,
            batched.label("batch"),
            func.count().label("calls"),
            *(func.coalesce(func.sum(getattr(ModelCall, name)), 0).label(name) for name in costs.TOKEN_FIELDS),
        )
        .join(Conversation, Conversation.id == ModelCall.conversation_id)
        .where(of_run)
        .group_by(ModelCall.model, batched)
    )
    for row in sums:
        usage = row._asdict()
        result.model_calls += row.calls
        result.batched_calls += row.calls if row.batch else 0
        result.cost += prices.cost(usage)
        result.cost_interactive += prices.cost(usage, interactive=True)
    return result


def price_table() -> costs.PriceTable:
    return costs.PriceTable(overrides=dict(services().config.model_prices))


def cancel(session: Session, user: User, run: Run) -> None:
    """Stop the run: no more items start, and every conversation of it still moving or waiting is
    asked to stop (its waiting calls settle as cancelled)."""
    if run.user_id != user.id and not (user.has_role("reviewer") or user.has_role("admin")):
        raise RunRefused("forbidden", "forbidden", "Only the run's agent, reviewers and admins may stop it.")
    run = session.get(Run, run.id, with_for_update=True, populate_existing=True)
    if run.cancelled_at is not None:
        raise RunRefused("conflict", "already_cancelled", "This run was stopped already.")
    run.cancelled_at, run.cancelled_by_id = utcnow(), user.id
    stopping = session.scalars(
        select(Conversation).where(
            Conversation.run_id == run.id,
            Conversation.status.not_in(list(IDLE - {ConversationStatus.BUDGET_EXHAUSTED})),
            Conversation.cancel_requested_at.is_(None),
        )
    ).all()
    changed = [(conversation, moves.request_cancel(session, conversation, user.id)) for conversation in stopping]
    audit_chain.record(
        session,
        "run_cancelled",
        tenant_id=run.tenant_id,
        actor=user,
        data={"run_id": run.id, "conversations_stopped": len(changed), "items_not_started": run.items - run.started},
    )
    session.commit()
    conversations.after_commit(changed)


def read_items(filename: str, data: bytes) -> list[str]:
    """The messages of an uploaded file: JSON Lines (`{"message": ...}` a line) or CSV (a `message`
    column, else the first column; a header row is told by that name). Refuses what cannot be read,
    naming the line."""
    return [message for _, message in read_lines(filename, data)]


def read_lines(filename: str, data: bytes) -> list[tuple[int, str]]:
    """As read_items, each message with the line of the file it starts on (for `create`'s `lines`)."""
    if len(data) > MAX_FILE_BYTES:
        raise RunRefused("invalid", "invalid_file", f"The file is larger than {MAX_FILE_BYTES // (1024 * 1024)} MB.")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise RunRefused(
            "invalid", "invalid_file", "The file is not UTF-8 text; save it as UTF-8 CSV or JSON Lines."
        ) from None
    name = (filename or "").lower()
    if name.endswith((".jsonl", ".ndjson", ".json")) or text.lstrip().startswith("{"):
        return _json_lines(text)
    return _csv_rows(text)


def _json_lines(text: str) -> list[tuple[int, str]]:
    messages = []
    for number, line in enumerate(text.split("\n"), start=1):  # (not splitlines: JSON text may hold U+2028)
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            raise RunRefused("invalid", "invalid_file", f"Line {number} is not JSON.") from None
        if not isinstance(item, dict) or set(item) != {"message"} or not isinstance(item["message"], str):
            raise RunRefused(
                "invalid", "invalid_file", f'Line {number} must be an object with one field, "message", holding text.'
            )
        messages.append((number, item["message"]))
    return messages


def _csv_rows(text: str) -> list[tuple[int, str]]:
    reader = csv.reader(io.StringIO(text))
    rows, starts = [], 1  # each row with the line it starts on (a quoted cell may hold line breaks)
    try:
        for row in reader:
            if any(cell.strip() for cell in row):
                rows.append((starts, row))
            starts = reader.line_num + 1
    except csv.Error as exc:
        raise RunRefused("invalid", "invalid_file", f"The CSV cannot be read: {exc}.") from None
    if not rows:
        return []
    header = [cell.strip().lower() for cell in rows[0][1]]
    column = header.index("message") if "message" in header else 0
    if "message" in header:
        rows = rows[1:]
    messages = []
    for line, row in rows:
        if column >= len(row):
            raise RunRefused("invalid", "invalid_file", f"Line {line} has no message column.")
        messages.append((line, row[column]))
    return messages


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
