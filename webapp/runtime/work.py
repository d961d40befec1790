"""What each background job does, inside a worker's app context: make one move, sweep, wake a
parked conversation for its due tasks, run a tool's export. jobs/ holds the RQ entry points, one
line each; the loop's rules stay in webapp/agent, and every function here commits before it
enqueues."""

from __future__ import annotations

import importlib
import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select

from webapp import audit_chain, notify, webhooks
from webapp.agent import batch_pump, decisions, gate, moves, sweeper
from webapp.agent.batches import CUSTOM_ID
from webapp.llm.choice import choice_for
from webapp.llm.client import ModelError
from webapp.models import Conversation, McpServer, Run, ToolCall, WebhookSubscription, utcnow
from webapp.runtime.extensions import db
from webapp.runtime.queue import QueueUnavailable, move_job_id
from webapp.runtime.services import services
from webapp.tools import mcp
from webapp.tools.tasks import BackgroundWork

log = logging.getLogger(__name__)


def process_owner() -> str:
    """The start of every lease owner of this process (host and pid)."""
    return f"{socket.gethostname()}:{os.getpid()}:"


# Set when this process's worker is asked to stop: a job ends its run of moves after the one it is
# making and hands the rest back to the queue (another worker takes it), instead of working on.
stopping = threading.Event()

_moves_made = 0
_moves_lock = threading.Lock()


def moves_made() -> int:
    """How many moves this process has made (its worker's record in Redis carries it, for /ops)."""
    return _moves_made


def _count_move() -> None:
    global _moves_made
    with _moves_lock:
        _moves_made += 1


def move(conversation_id: int, version: int, job=None) -> str:
    """Make the conversation's moves from this version on, back to back while the next one is ready:
    each move claims and ends its lease and commits exactly as a job of its own would, and what each
    changed is published at once. After MOVE_CHAIN_MOVES moves or MOVE_CHAIN_SECONDS (or when the
    worker is stopping), the next move goes back to the queue, so one busy conversation never holds a
    slot for long. `job` is the RQ job (its id names the lease owner; its retries left say whether
    a transient failure of its first move is final). Returns the outcomes, in order."""
    desk = services()
    config = desk.config
    owner = process_owner() + (job.id if job else "inline")
    until = time.monotonic() + config.move_chain_seconds
    outcomes = []
    while True:
        first = not outcomes
        try:
            result = _one_move(desk, conversation_id, version, owner, final_attempt=_final(job, config, first))
            _count_move()
        except Exception as error:
            if first:
                raise  # the job's own retries (RQ), as for any job
            # A later move failed: the moves before it are committed, and this one gets a job of its own
            # with the retries every move has (a transient error, a database gone for a moment). Any
            # other error failed the conversation, and that job finds nothing to claim.
            _hand_back(desk, conversation_id, version, delay=(config.move_retry_intervals or (0,))[0])
            if isinstance(error, moves.TransientMoveError):
                return " ".join([*outcomes, "handed_back"])
            raise
        outcomes.append(result.outcome)
        if result.next_version is None:
            break
        version = result.next_version
        if len(outcomes) >= config.move_chain_moves or time.monotonic() >= until or stopping.is_set():
            _hand_back(desk, conversation_id, version)
            break
    return " ".join(outcomes)


def _one_move(desk, conversation_id: int, version: int, owner: str, final_attempt: bool) -> moves.MoveResult:
    """One move and what follows its commit: the task wake-up it scheduled, the pages told."""
    try:
        result = moves.advance(
            db.session,
            conversation_id,
            version,
            owner=owner,
            make_loop=desk.loop,
            lease_seconds=desk.config.lease_seconds,
            final_attempt=final_attempt,
        )
    finally:
        db.session.remove()
    if result.wake_at is not None:
        desk.dispatcher.schedule_wake(conversation_id, result.wake_at)
    if result.outcome == "batched":  # parked for a batch: the pump sends it once its run's round is in
        desk.dispatcher.enqueue_batch_pump()
    if result.tenant_id is not None:
        desk.dispatcher.changed(result.tenant_id, conversation_id, move_done=True)
    return result


def _final(job, config, first: bool) -> bool:
    """Whether a transient failure of this move is final: the job's retries for its first move; a later
    move would get a job of its own with MOVE_RETRIES."""
    if first:
        return not (job and job.retries_left)
    return not config.move_retries


def _hand_back(desk, conversation_id: int, version: int, delay: float = 0) -> None:
    """The rest of a conversation's moves back to the queue (QueueUnavailable: the sweeper enqueues it)."""
    try:
        desk.dispatcher.enqueue_move(conversation_id, version, delay=delay)
    except QueueUnavailable:
        pass


def sweep() -> int:
    """Re-enqueue every conversation that should be moving but has no live move, settle the tool calls
    whose time to decide ran out, wake parked conversations that should be moving (a task due, a call
    approved) but were never woken, and send the reminders and escalations that are due (one delivery
    job per channel); returns how many conversations were re-enqueued."""
    desk = services()
    dispatcher = desk.dispatcher
    recovered = []
    try:
        stalled = sweeper.stalled(db.session, grace_seconds=desk.config.sweep_interval_seconds)
        # Every job that may still run a stalled conversation's move, asked of Redis at once.
        candidates = [move_job_id(c.id, c.version, n) for c in stalled for n in {0, c.recoveries}]
        alive_jobs = dispatcher.alive_jobs(candidates, dispatcher.waiting_move_ids()) if stalled else set()
        for conversation in stalled:
            cid = conversation.id

            def alive(version: int, recoveries: int, cid=cid) -> bool:
                return move_job_id(cid, version) in alive_jobs or (
                    recoveries > 0 and move_job_id(cid, version, recoveries) in alive_jobs
                )

            claim = sweeper.recover(db.session, conversation, alive)
            db.session.commit()
            if claim:
                recovered.append((cid, *claim))
        woken = list(decisions.expire_due(db.session))
        db.session.commit()
        for conversation in sweeper.stranded(db.session, grace_seconds=desk.config.sweep_interval_seconds):
            cid, tenant_id = conversation.id, conversation.tenant_id
            version = moves.wake(db.session, conversation)
            db.session.commit()
            if version is not None:
                woken.append((cid, version, tenant_id))
        notices = [
            (call, tenant, kind) for kind in notify.KINDS for call, tenant in sweeper.due_notices(db.session, kind)
        ]
        # read in the transaction that marks the notices sent: after its commit only the enqueues remain
        channels = notify.channel_ids_by_tenant(db.session, {tenant for _, tenant, _ in notices})
        webhooks_due = webhooks.with_work(db.session, utcnow())
        batch_work = batch_pump.has_work(db.session)
        gate.record_defaults(db.session, desk.tools)  # the packs' defaults in force; a looser release's held
        runs_to_start = list(
            db.session.scalars(select(Run.id).where(Run.started < Run.items, Run.cancelled_at.is_(None)))
        )
        db.session.commit()
    finally:
        db.session.remove()
    for call_id, tenant_id, kind in notices:
        for channel_id in channels.get(tenant_id, ()):
            dispatcher.enqueue_notice(channel_id, call_id, kind)
    for subscription_id in webhooks_due:
        dispatcher.enqueue_webhooks(subscription_id)
    for cid, version, tenant_id in woken:
        dispatcher.enqueue_move(cid, version)
        dispatcher.changed(tenant_id, cid)
    for cid, version, recovery in recovered:
        dispatcher.enqueue_move(cid, version, recovery)
        log.info("sweeper re-enqueued conversation %s at version %s", cid, version)
    if desk.config.mcp_check_seconds:
        dispatcher.enqueue_mcp_check(int(time.time() // desk.config.mcp_check_seconds))
    for run_id in runs_to_start:  # (its job takes the run's row first: two at once start nothing twice)
        dispatcher.enqueue_run_start(run_id)
    if batch_work:  # (the pump schedules itself while batches are open; this finds one Redis lost)
        dispatcher.enqueue_batch_pump()
    return len(recovered)


def pump_batches() -> str:
    """The batch runs' requests through the Message Batches API (webapp/agent/batches.py): send those
    ready, one batch per model client; look at each open batch; settle the answers of those ended and
    wake their conversations. While any request is open, the next pump is due in BATCH_POLL_SECONDS.
    No transaction stays open while the service answers."""
    desk = services()
    poll = timedelta(seconds=desk.config.batch_poll_seconds)
    woken: list[batch_pump.Woken] = []
    sent = settled = 0
    try:
        batches = _batches(desk, batch_pump.ready_to_send(db.session, utcnow(), poll))
        db.session.commit()  # (read before: on SQLite a transaction holds the write lock)
        for client, items in batches:
            ids = [row_id for row_id, _ in items]
            try:
                if not client.takes_batches:
                    raise ModelError("batch_refused", BATCHES_REFUSED, transient=False)
                batch_id = client.send_batch([(CUSTOM_ID.format(row_id), params) for row_id, params in items])
            except ModelError as error:
                if error.transient:
                    log.warning("%s request(s) were not sent; the next pump tries again: %s", len(ids), error)
                    batch_pump.mark_unsent(db.session, ids)
                else:
                    woken += batch_pump.fail(db.session, batch_pump.rows(db.session, ids), error, utcnow())
            else:
                batch_pump.mark_sent(db.session, ids, batch_id, utcnow())
                sent += 1
            db.session.commit()
        open_batches = batch_pump.open_batches(db.session)
        for batch_id, tenant_id in open_batches:
            client = choice_for(db.session, desk.config, tenant_id).client
            abandoned = batch_pump.abandoned(db.session, batch_id)
            db.session.commit()
            try:
                status = client.batch_state(batch_id).status
                if status == "in_progress" and abandoned:  # every conversation of it was stopped
                    client.cancel_batch(batch_id)
                    status = client.batch_state(batch_id).status
                if status != "ended":
                    continue
                results = client.batch_results(batch_id)
            except ModelError as error:
                if error.transient:
                    continue
                woken += batch_pump.fail_batch(db.session, batch_id, error, utcnow())
            else:
                woken += batch_pump.settle(db.session, batch_id, results, utcnow())
                settled += 1
            db.session.commit()
        again = batch_pump.has_work(db.session)
        db.session.commit()
    finally:
        db.session.remove()
    for conversation in woken:
        _hand_back(desk, conversation.conversation_id, conversation.version)
        desk.dispatcher.changed(conversation.tenant_id, conversation.conversation_id)
    if again:
        desk.dispatcher.enqueue_batch_pump(at=utcnow() + poll)
    return f"{sent} batch(es) sent, {settled} of {len(open_batches)} open answered, {len(woken)} conversation(s) woken"


BATCHES_REFUSED = (
    "The model endpoint serving this run takes no message batches (it speaks the text protocol); start the run "
    "again without batch."
)


def _batches(desk, rows: list) -> list[tuple]:
    """The requests as the batches they go in: (the model client that serves their tenant, its
    (id, params) items), one batch per client unless the API's limits cut it."""
    groups: dict = {}
    for row in rows:
        client = choice_for(db.session, desk.config, row.tenant_id).client
        groups.setdefault(client, []).append((row.id, row.params))
    return [(client, batch) for client, items in groups.items() for batch in batch_pump.in_batches(items)]


def check_mcp_servers() -> str:
    """Check every MCP server's listing against the tools an admin accepted (every MCP_CHECK_SECONDS,
    from the sweep): a tool changed since is held at once, so the model is no longer offered it, and
    one changed back is released; each is audited. A server that cannot be reached is left as it is
    until the next check (a call of its tools says it cannot be reached)."""
    desk = services()
    held = released = 0
    try:
        servers = [(server.id, mcp.Access.of(server, desk.config)) for server in db.session.scalars(select(McpServer))]
        db.session.rollback()  # no transaction stays open while the servers are asked
        for server_id, access in servers:
            try:
                listing = mcp.fetch_tools(access)
            except mcp.McpError as exc:
                log.warning("MCP check skipped a server: %s", exc)
                continue
            # Locked (on PostgreSQL; SQLite's transactions take its one write lock at BEGIN), so two
            # checks that overlap (a slow server outlasting its interval) hold a tool once, not twice.
            server = db.session.get(McpServer, server_id, with_for_update=True)
            if server is None:  # removed meanwhile
                continue
            newly_held, back = mcp.check_server(db.session, server, listing)
            for action, names in (("mcp_tool_held", newly_held), ("mcp_tool_released", back)):
                for name in names:
                    audit_chain.record(
                        db.session,
                        action,
                        tenant_id=server.tenant_id,
                        actor_label="scheduled check",
                        tool_name=name,
                        data={"server": server.name},
                    )
            db.session.commit()
            held, released = held + len(newly_held), released + len(back)
    finally:
        db.session.remove()
    return f"{len(servers)} server(s) checked: {held} tool(s) held, {released} released"


def deliver_notice(channel_id: int, tool_call_id: int, kind: str, job=None) -> str:
    """Send a waiting call's reminder or escalation through one channel, logging the attempt; a failed
    attempt raises DeliveryFailed while `job` has retries left, so RQ tries again after its backoff."""
    desk = services()
    try:
        call = db.session.get(ToolCall, tool_call_id)
        tools = desk.tools_for(db.session, call.tenant_id) if call is not None else desk.tools  # its MCP tools too
        row, outcome = notify.deliver(db.session, desk.config, tools, channel_id, tool_call_id, kind)
        db.session.commit()
    finally:
        db.session.remove()
    if row is None:
        return "nothing to send"
    if not outcome.delivered and outcome.retry and job is not None and job.retries_left:
        raise notify.DeliveryFailed(outcome.error)
    return row.status


def deliver_webhooks(subscription_id: int) -> str:
    """Send a webhook subscription's deliveries, as its one sender (another job running asks it for
    one more pass instead): turn the tenant's new events into deliveries, then send each that may go
    now, in order, with no transaction open while the receivers answer; a retry due later gets a job
    at its time."""
    dispatcher = services().dispatcher
    dispatcher.webhooks_started(subscription_id)
    sending = dispatcher.webhooks_sending(subscription_id)
    if sending is None:
        return "another job is sending them, and makes one more pass"
    made = sent = failed = 0
    due = None
    try:
        while True:
            passed = _webhooks_pass(subscription_id)
            if passed is None:
                return "no such webhook"
            made, sent, failed = made + passed[0], sent + passed[1], failed + passed[2]
            due = passed[3]
            if not dispatcher.webhooks_again(subscription_id):
                break
    finally:
        dispatcher.webhooks_done(subscription_id, sending)
    if due is not None:
        dispatcher.enqueue_webhooks(subscription_id, at=due)
    return f"{made} event(s) collected, {sent} delivered, {failed} attempt(s) failed"


def _webhooks_pass(subscription_id: int) -> tuple[int, int, int, datetime | None] | None:
    """One pass over a subscription: (events collected, delivered, failed attempts, when the next
    pending delivery is due), or None when the subscription is gone."""
    config = services().config
    sent = failed = 0
    try:
        subscription = db.session.get(WebhookSubscription, subscription_id, with_for_update=True)
        if subscription is None or subscription.deleted_at is not None:
            return None
        made = webhooks.collect(db.session, subscription)
        db.session.commit()
        while ready := webhooks.sendable(db.session, subscription_id, utcnow()):
            taken = webhooks.take(db.session, ready, utcnow())
            db.session.commit()  # the attempts count before they are made
            if not taken:
                break
            # One delivery per conversation at most (sendable holds the later ones back), so they go
            # at the same time without changing any conversation's order.
            with ThreadPoolExecutor(min(len(taken), webhooks.SENDS_AT_ONCE)) as pool:
                attempts = list(pool.map(lambda delivery: webhooks.send(config, subscription, delivery), taken))
            now = utcnow()
            for delivery, attempt in zip(taken, attempts, strict=True):
                webhooks.settle(delivery, attempt, config.webhook_retry_intervals, now)
                sent, failed = sent + attempt.delivered, failed + (not attempt.delivered)
            db.session.commit()
            if failed:  # what failed waits for its retry; the rest of this round went
                break
        due = webhooks.next_due(db.session, subscription_id)
        db.session.commit()
    finally:
        db.session.remove()
    return made, sent, failed, due


def wake_for_tasks(conversation_id: int) -> bool:
    """Queue a move to hand a parked conversation's due task back to its tool. Returns whether the
    conversation was woken (a moving one picks the task up itself)."""
    desk = services()
    try:
        conversation = db.session.get(Conversation, conversation_id)
        due = conversation is not None and sweeper.has_due_task(db.session, conversation_id)
        version = moves.wake(db.session, conversation) if due else None
        tenant_id = conversation.tenant_id if conversation is not None else None
        db.session.commit()
    finally:
        db.session.remove()
    if version is None:
        return False
    desk.dispatcher.enqueue_move(conversation_id, version)
    desk.dispatcher.changed(tenant_id, conversation_id)
    return True


def run_tool_work(target: str, *args, job=None) -> Any:
    """Run a tool's background work, named by the tool as "package.module:function" when it started
    the job: function(work, *args) with a session, the settings, and progress reported in the job's
    meta and live on the call's conversation page, stopping when the tool asked the job to."""
    desk = services()
    follower = (job.meta or {}) if job is not None else {}
    conversation_id, tool_call_id = follower.get("conversation_id"), follower.get("tool_call_id")

    def cancelled() -> bool:
        return job is not None and desk.dispatcher.background_cancelled(job.id)

    def tell(status: str, fraction: float, message: str) -> None:
        if conversation_id is not None and tool_call_id is not None:
            desk.dispatcher.task_progress(conversation_id, tool_call_id, status, message, fraction)

    def progress(fraction: float, message: str) -> None:
        if job is not None:
            job.meta.update(progress=fraction, message=message)
            job.save_meta()
        tell("working", fraction, message)

    work = BackgroundWork(db.session, desk.config, progress, tell, cancelled, db.session.remove)
    try:
        return _work_function(target)(work, *args)
    finally:
        db.session.remove()


def _work_function(target: str):
    module_name, _, name = target.partition(":")
    function = getattr(importlib.import_module(module_name), name, None)
    if not callable(function):
        raise ValueError(f"{target!r} names no function of a tool's background work")
    return function
