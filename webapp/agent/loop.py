"""The loop's verbs over one persisted conversation.

Every verb decides what to do from the persisted rows alone and writes through the given Session;
the caller commits (the mover in moves.py commits a claim before any side effect, and the result
after). Nothing here knows about Flask or RQ.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from sqlalchemy import and_, bindparam, func, select
from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.agent import access, assistant_settings, context, wording
from webapp.agent.context import Window
from webapp.agent.policies import policy_for
from webapp.agent.states import IDLE, RUNNABLE, SETTLED, CallStatus, ConversationStatus
from webapp.agent.transcript import tool_uses
from webapp.llm import routing
from webapp.llm.client import ModelClient, ModelError, ModelReply
from webapp.logs import bind
from webapp.models import (
    AssistantSettings,
    Conversation,
    Decision,
    Message,
    ModelCall,
    Summary,
    Tenant,
    ToolCall,
    User,
    utcnow,
)
from webapp.tools import presenting
from webapp.tools.registry import ToolContext, ToolOutcome, ToolRegistry
from webapp.tools.tasks import INPUT_REQUIRED, WORKING, Task, TaskError

TITLE_LENGTH = 80  # a conversation is named by its first question, cut at a word boundary

# The model's turn goes on only after these stops (tools to run, or the API paused a long turn); any
# other stop ends the run with what the model said: end_turn, max_tokens, refusal, a stop sequence, a
# stop by a person, and a stop reason newer than this code (calling the model again would only spend
# the move budget on the same answer).
GOES_ON = frozenset({"tool_use", "pause_turn"})
# The stops the desk knows (the chat page names any other, so a person knows the answer may be partial).
KNOWN_STOPS = GOES_ON | {"end_turn", "max_tokens", "stop_sequence", "refusal", "cancelled"}


_UNREAD = object()

# The statements every move runs, built once: a statement object caches its own compiled form's
# key, so each move skips building the expression and its cache key (a tenth of a move's CPU).
_TRANSCRIPT = (
    select(Message.seq, Message.role, Message.content)
    .where(Message.conversation_id == bindparam("conversation_id"), Message.seq > bindparam("after"))
    .order_by(Message.seq)
)
# The person the assistant works with, their tenant's name, and the tenant's AssistantSettings in force.
_NEWEST_SETTINGS = (
    select(func.max(AssistantSettings.version))
    .where(AssistantSettings.tenant_id == User.tenant_id)
    .correlate(User)
    .scalar_subquery()
)
_ASKER = (
    select(User, Tenant.name, AssistantSettings)
    .join(Tenant, Tenant.id == User.tenant_id)
    .outerjoin(
        AssistantSettings,
        and_(AssistantSettings.tenant_id == User.tenant_id, AssistantSettings.version == _NEWEST_SETTINGS),
    )
    .where(User.id == bindparam("user_id"))
)
_SUMMARY = (
    select(Summary).where(Summary.conversation_id == bindparam("conversation_id")).order_by(Summary.id.desc()).limit(1)
)
_LAST_ROW = (
    select(Message).where(Message.conversation_id == bindparam("conversation_id")).order_by(Message.seq.desc()).limit(1)
)
_ROUND = select(ToolCall).where(ToolCall.message_id == bindparam("message_id")).order_by(ToolCall.position)
_HOLD = select(Conversation.id).where(Conversation.id == bindparam("conversation_id")).with_for_update()


class ConversationBusy(Exception):
    """The conversation cannot take a new message now; the message says why."""


class Events(Protocol):
    def publish(self, conversation_id: int, event: dict) -> None: ...


class _NoEvents:
    def publish(self, conversation_id: int, event: dict) -> None:
        pass


@dataclass(frozen=True)
class LoopSettings:
    tool_output_limit: int = 8000
    window: Window | None = None  # None: every request is sent whole, whatever its size
    cache_history: bool = True  # the moving cache breakpoint on the newest block (off: only system and tools)


@dataclass
class Move:
    """The next move of a conversation, as decided from its rows."""

    kind: str  # cancel | budget | route | generate | run_tool | resume_task | settle | wait | done
    call: ToolCall | None = None
    waiting_on: str | None = None  # for wait: awaiting_approval | awaiting_task
    waiting_count: int = 0
    # for generate, read in begin() so the model call reads nothing: the request, and the rows it was
    # built from (after the summary it stands on)
    request: dict | None = None
    rows: list | None = None
    summary: Summary | None = None

    @property
    def parks(self) -> bool:
        """Moves that leave the conversation waiting for someone else to wake it."""
        return self.kind in ("wait", "budget")


class Loop:
    """The verbs of one conversation (see DESIGN.md, "The loop")."""

    def __init__(
        self,
        session: Session,
        conversation: Conversation,
        *,
        model: ModelClient,
        tools: ToolRegistry,
        settings: LoopSettings | None = None,
        events: Events | None = None,
        should_stop: Callable[[], bool] | None = None,
        background: Any = None,
        router: ModelClient | None = None,
        route: str = "not routed",
    ) -> None:
        self.session = session
        self.conversation = conversation
        self.model = model
        self.tools = tools
        self.settings = settings or LoopSettings()
        self.events = events or _NoEvents()
        self.should_stop = should_stop
        self.background = background  # handed to tools that start background work for tasks
        # the tenant's small model, which routes a run not routed yet (None: no routing), and why
        # self.model serves this run (recorded on each model call)
        self.router = router
        self.route = route
        # Read once per Loop: the last row only changes through _append, and only the mover holding
        # the lease (or a web request that won the status compare-and-set) appends.
        self._last: Message | None | object = _UNREAD
        self._round: list[ToolCall] | None = None
        self._summary: Summary | None | object = _UNREAD
        self._settings_version: int | None = None  # the tenant's AssistantSettings the request was built with
        self._usable: frozenset[str] | None = None  # the tools the owner may use, read once per Loop
        self._sqlite = session.get_bind().dialect.name == "sqlite"

    # --- reading the state ---------------------------------------------------------------------

    def rows(self, after: int = 0) -> list:
        """The transcript's rows after seq `after`, oldest first: each with its `seq`, `role` and
        `content` (plain rows, not ORM objects: the transcript is read on every model move)."""
        return list(self.session.execute(_TRANSCRIPT, {"conversation_id": self.conversation.id, "after": after}))

    def summary(self) -> Summary | None:
        """The newest summary of the conversation's older turns, if it has one."""
        if self._summary is _UNREAD:
            self._summary = self.session.scalar(_SUMMARY, {"conversation_id": self.conversation.id})
        return self._summary

    def last_row(self) -> Message | None:
        if self._last is _UNREAD:
            self._last = self.session.scalar(_LAST_ROW, {"conversation_id": self.conversation.id})
        return self._last

    def open_round(self) -> list[ToolCall]:
        """The calls of the last assistant turn when it asked for tools and has no results yet."""
        last = self.last_row()
        if last is None or last.role != "assistant" or not tool_uses(last.content):
            return []
        if self._round is None:
            self._round = list(self.session.scalars(_ROUND, {"message_id": last.id}))
        return self._round

    def is_complete(self) -> bool:
        """True when the model's last turn answered without asking for a tool."""
        last = self.last_row()
        return (
            last is not None
            and last.role == "assistant"
            and not tool_uses(last.content)
            and self.conversation.stop_reason not in GOES_ON
        )

    def over_budget(self) -> bool:
        c = self.conversation
        return c.moves_used >= c.move_budget or (c.token_budget > 0 and c.run_tokens >= c.token_budget)

    def next_move(self) -> Move:
        """Whichever move is next: cancel, budget pause, run a tool, look at a due task, settle a round,
        wait, generate, done."""
        c = self.conversation
        if c.cancel_requested_at is not None:
            return Move("cancel")
        calls = self.open_round()
        if calls:
            for call in calls:
                if call.status in RUNNABLE or call.status == CallStatus.RUNNING:
                    return Move("budget") if self.over_budget() else Move("run_tool", call=call)
            now = utcnow()
            for call in calls:
                if task_due(call, now):
                    return Move("resume_task", call=call)
            waiting = [call for call in calls if call.status not in SETTLED]
            if not waiting:
                return Move("settle")
            waiting_on = (
                ConversationStatus.AWAITING_APPROVAL
                if any(call.status == CallStatus.AWAITING_APPROVAL for call in waiting)
                else ConversationStatus.AWAITING_TASK
            )
            return Move("wait", waiting_on=waiting_on, waiting_count=len(waiting))
        if self.is_complete():
            return Move("done")
        last = self.last_row()
        if last is None:
            return Move("done")
        if self.over_budget():
            return Move("budget")
        return Move("route") if self.router is not None and c.route is None else Move("generate")

    # --- the verbs -----------------------------------------------------------------------------

    def ask_later(self, text: str) -> Message:
        """Stage a user message (no model call) and start a new run with a fresh budget."""
        c = self.conversation
        is_new = c.status == ConversationStatus.QUEUED and self.last_row() is None
        if not (is_new or c.status in IDLE) or self.open_round():
            raise ConversationBusy(_busy_reason(c.status))
        message = self._append("user", [{"type": "text", "text": text}])
        if not c.title:
            c.title = presenting.shorten(text, TITLE_LENGTH)
        c.status = ConversationStatus.QUEUED
        c.moves_used = 0
        c.run_tokens = 0
        c.error_code = c.error_message = None
        c.cancel_requested_at = None
        c.cancel_requested_by_id = None
        c.cancel_reason = None
        c.stop_reason = None
        c.route = c.route_reason = None  # each new question is routed afresh
        return message

    def usable_tools(self) -> frozenset[str]:
        """The tools the conversation's owner may have the assistant use (webapp/agent/access.py)."""
        if self._usable is None:
            owner = self.session.get(User, self.conversation.user_id)
            self._usable = access.usable(self.session, owner, self.tools.names())
        return self._usable

    def build_request(self, rows: list | None = None) -> dict:
        """The next model request: the system prompt and the tools (both cache breakpoints), then the
        transcript: the newest summary and the rows after it, with a cache breakpoint on its newest
        block so that the next move reads all of this one's prefix from the prompt cache."""
        summary = self.summary()
        if rows is None:
            rows = self.rows(after=summary.through_seq if summary else 0)
        user, tenant_name, settings = self.session.execute(_ASKER, {"user_id": self.conversation.user_id}).one()
        self._settings_version = settings.version if settings else None
        system = [
            {
                "type": "text",
                "text": wording.system_prompt(tenant_name, user.label, settings),
                "cache_control": {"type": "ephemeral"},
            }
        ]
        messages = context.with_summary(summary.text if summary else None, rows)
        if self.settings.cache_history:
            _mark_cache_breakpoint(messages)
        request = {"system": system, "tools": self.tools.definitions(self.usable_tools()), "messages": messages}
        if settings and settings.one_call_per_reply:
            request["tool_choice"] = {"type": "auto", "disable_parallel_tool_use": True}
        return request

    def generate(self, request: dict | None = None) -> ModelReply:
        """One model call: appends the assistant message and one tool-call row per tool_use block.

        Give it a request from build_request() to make the call without touching the database
        until the reply is in (the mover does, so no transaction stays open during the call)."""
        c = self.conversation
        deltas = _DeltaBuffer(self.events, c.id)
        request = request or self.build_request()
        reply = self.model.generate(
            **request,
            on_text=deltas.add,
            on_tool_start=lambda name: deltas.publish({"type": "tool_start", "name": name}),
            should_stop=self.should_stop,
        )
        deltas.flush()
        self.hold()
        summary = self.summary()
        self._record_usage(reply, request, summary_id=summary.id if summary else None)
        content = reply.content
        if reply.stop_reason == "cancelled":
            if content:
                self._append("assistant", content)
            self._count(reply)
            return reply
        message = self._append("assistant", content or [{"type": "text", "text": ""}])
        calls = [
            self._add_call(message, position, block, cut_off=reply.stop_reason == "max_tokens")
            for position, block in enumerate(tool_uses(content))
        ]
        self.session.flush()
        for call in calls:
            self._audit("tool_call_requested", call, outcome=call.status, data={"input": call.input})
            if call.status == CallStatus.AWAITING_APPROVAL:
                self._audit("approval_requested", call, outcome=call.status, data={"input": call.input})
        self.settle_round_if_complete()
        self._count(reply)
        return reply

    def run_tools(self, limit: int | None = None) -> int:
        """Run the open round's calls that may run now, in order; returns how many ran."""
        ran = 0
        for call in self.open_round():
            if limit is not None and ran >= limit:
                break
            if call.status in RUNNABLE or call.status == CallStatus.RUNNING:
                self.claim_call(call)
                self.run_call(call)
                ran += 1
        return ran

    def claim_call(self, call: ToolCall) -> None:
        """Mark the call running before its side effect (the mover commits this first)."""
        call.status = CallStatus.RUNNING
        call.attempts += 1
        call.started_at = utcnow()

    def run_call(self, call: ToolCall) -> None:
        """Execute a claimed call as the acting user; its result (or its open task) lands in the session."""
        tool = self.tools.get(call.name)
        refusal = self._not_allowed(call)
        if refusal:
            outcome = ToolOutcome(refusal, True)
        elif call.attempts > 1 and tool is not None and not tool.repeatable:  # it may have run: never twice
            outcome = ToolOutcome(wording.RESULT_UNCERTAIN.format(name=call.name), True)
        else:
            with bind(tool_call_id=call.id):
                outcome = self.tools.run(call.name, call.input, self._context(call), self.settings.tool_output_limit)
        self.hold()
        if outcome.task is not None:
            self._wait_on_task(call, outcome.task, progressed=True)
        else:
            self._finish(call, outcome)
        call.duration_ms = outcome.duration_ms
        data = {
            "input": call.input,
            "duration_ms": round(outcome.duration_ms, 1),
            "result_chars": len(outcome.content),
            "attempt": call.attempts,
        }
        if outcome.task is not None:
            data["task"] = {"status": outcome.task.status, "message": outcome.task.message}
        actor = self.session.get(User, call.acting_user_id)
        self._audit("tool_call_executed", call, actor=actor, outcome=call.status, data=data)
        self.events.publish(self.conversation.id, {"type": "tool_call", "id": call.id, "status": call.status})
        self.settle_round_if_complete()

    def resume_task(self, call: ToolCall) -> None:
        """Hand a waiting task back to its tool (with a person's input, if one came): it settles the
        call, stays as it is, or moves on; a task without progress past its tool's limit fails."""
        pending_input = call.task_input
        try:
            task = Task.from_dict(call.task).with_input(pending_input)
        except TaskError as exc:
            self.hold()
            call.task_input = None
            self._finish(call, ToolOutcome(wording.RESULT_TASK_UNREADABLE.format(error=exc), True))
            self._audit("task_finished", call, outcome=call.status, data={"error": str(exc)})
            self.settle_round_if_complete()
            return
        context = self._context(call)
        with bind(tool_call_id=call.id):
            outcome = self.tools.resume(call.name, task, context, self.settings.tool_output_limit)
        self.hold()
        if pending_input is not None:  # (left alone otherwise: input may arrive while this move runs)
            call.task_input = None
        if outcome.task is None:
            self._finish(call, outcome)
            self._audit("task_finished", call, outcome=call.status, data={"result_chars": len(outcome.content)})
        elif outcome.task.progress_key() != task.progress_key() or pending_input is not None:
            self._wait_on_task(call, outcome.task, progressed=True)
            if outcome.task.status != task.status or pending_input is not None:
                self._audit(
                    "task_updated",
                    call,
                    outcome=outcome.task.status,
                    data={"message": outcome.task.message, "after_input": pending_input is not None},
                )
        elif utcnow() >= call.task_progress_at + self._time_limit(call):
            self.tools.cancel(call.name, task, context)
            result = wording.RESULT_TASK_STALLED.format(
                limit=_duration(self._time_limit(call)), where=_task_where(task)
            )
            self._finish(call, ToolOutcome(result, True))
            self._audit("task_finished", call, outcome=call.status, data={"timed_out": True})
        else:
            self._wait_on_task(call, outcome.task, progressed=False)
        self.events.publish(self.conversation.id, {"type": "tool_call", "id": call.id, "status": call.status})
        self.settle_round_if_complete()

    def settle_round_if_complete(self) -> Message | None:
        """When every call of the open round has a result, append ONE user message with all of them."""
        calls = self.open_round()
        if not calls or any(call.status not in SETTLED for call in calls):
            return None
        blocks = []
        for call in calls:
            block = {"type": "tool_result", "tool_use_id": call.tool_use_id, "content": call.result or ""}
            if call.is_error:
                block["is_error"] = True
            blocks.append(block)
        return self._append("user", blocks)

    def step(self) -> Move:
        """Make whichever move is next; returns the move made."""
        move = self.next_move()
        self.begin(move)
        self.perform(move)
        return move

    def begin(self, move: Move) -> None:
        """The part of a move that must be durable before its side effect."""
        if move.kind == "run_tool":
            self.claim_call(move.call)
        elif move.kind == "route":  # the question and the rules, read before the model call
            question = next(
                (
                    "\n".join(b["text"] for b in row.content if b.get("type") == "text")
                    for row in reversed(self.rows())
                    if row.role == "user" and any(b.get("type") == "text" for b in row.content)
                ),
                "",
            )
            settings = assistant_settings.current(self.session, self.conversation.tenant_id)
            move.request = {"question": question, "rule": assistant_settings.complex_rule(question, settings)}
        elif move.kind == "generate":
            summary = self.summary()
            move.summary = summary
            move.rows = self.rows(after=summary.through_seq if summary else 0)
            move.request = self.build_request(move.rows)

    def perform(self, move: Move) -> None:
        """Do the move's work; the conversation's status says where it leaves things."""
        c = self.conversation
        if move.kind not in ("run_tool", "resume_task", "generate", "route"):  # those hold() after their work
            self.hold()
        if move.kind == "cancel":
            self.honour_cancel()
        elif move.kind == "budget":
            c.status = ConversationStatus.BUDGET_EXHAUSTED
            self._audit(
                "budget_exhausted",
                data={
                    "moves_used": c.moves_used,
                    "move_budget": c.move_budget,
                    "tokens_used": c.run_tokens,
                    "token_budget": c.token_budget,
                },
            )
        elif move.kind == "wait":
            c.status = move.waiting_on
        elif move.kind == "done":
            c.status = ConversationStatus.COMPLETED
        elif move.kind == "settle":
            self.settle_round_if_complete()
            c.status = ConversationStatus.QUEUED
        elif move.kind == "run_tool":
            self.run_call(move.call)
            c.moves_used += 1  # (after: a change flushed during the tool would lock the row while it runs)
            c.status = ConversationStatus.QUEUED
        elif move.kind == "route":  # not counted against the budget: the run has not started its work
            self.route_run(move)
            c.status = ConversationStatus.QUEUED
        elif move.kind == "resume_task":  # not counted against the budget: waiting is not working
            self.resume_task(move.call)
            c.status = ConversationStatus.QUEUED
        elif move.kind == "generate":
            reply = self.answer(move)
            if reply is None:  # older turns summarised instead (the status says what comes next)
                c.updated_at = utcnow()
                return
            c.moves_used += 1
            if reply.stop_reason == "cancelled":
                self.honour_cancel()
            elif reply.stop_reason not in GOES_ON:
                c.status = ConversationStatus.COMPLETED
            else:  # tool_use runs tools next; pause_turn generates again
                c.status = ConversationStatus.QUEUED
        c.updated_at = utcnow()

    def answer(self, move: Move) -> ModelReply | None:
        """A generate move's model call, after weighing its request against the context window: past
        the threshold (or refused as too long by the endpoint) the move summarises older turns
        instead and returns None; see webapp/agent/context.py."""
        window = self.settings.window
        if window is not None:
            size = context.measure(move.request, window, self.model.count_tokens)
            if size > window.threshold and context.cut_point(move.rows, window) is not None:
                return self.summarise(move, size)
            if size > window.room:
                move.request = self._cleared(move.request, window, size)
        try:
            return self.generate(move.request)
        except ModelError as error:
            if error.code != "too_long" or window is None or context.cut_point(move.rows, window) is None:
                if error.code == "too_long":
                    raise _too_long(context.estimate(move.request), window) from error
                raise
            return self.summarise(move, context.estimate(move.request))

    def route_run(self, move: Move) -> None:
        """Route the run by its question's difficulty: the tenant's rules first (a rule that fires makes
        it complex), else the small model's classification. Simple runs go to the small endpoint,
        complex ones to the large one; a classification that fails or says neither goes to the large
        one, and says so. The route is kept on the conversation for every move of the run."""
        c = self.conversation
        question, rule = move.request["question"], move.request["rule"]
        reply = None
        if rule:
            route, reason = "large", f"large: {rule}"
        else:
            try:
                label, reply = routing.classify(self.router, question)
            except ModelError as error:
                label, reason = None, f"large: classification failed ({error.message})"
            else:
                reason = f"large: the classification said neither simple nor complex ({_said(reply)!r})"
            route = "small" if label == "simple" else "large"
            if label:
                reason = f"{route}: classified {label}"
        self.hold()
        if reply is not None:
            request = {"system": routing.SYSTEM}
            self._record_usage(
                reply, request, purpose="route", endpoint=self.router.endpoint, route="small: classifies the question"
            )
            c.run_tokens += sum(reply.usage.values())
        c.route, c.route_reason = route, reason[:160]
        self._audit("run_routed", outcome=route, data={"route": route, "reason": c.route_reason})

    def summarise(self, move: Move, size: int) -> None:
        """Summarise the turns before the cut point (after the previous summary) into a new Summary row:
        a model call of its own, counted and audited like any other."""
        window = self.settings.window
        older = move.rows[: context.cut_point(move.rows, window)]
        previous = move.summary
        request, covered = context.summary_request(previous.text if previous else None, older, window)
        reply = self.model.generate(**request, should_stop=self.should_stop)
        self.hold()
        self._record_usage(reply, request, purpose="summary", summary_id=previous.id if previous else None)
        # Its tokens count against the budget; its stop reason is not the conversation's (a turn the API
        # paused, pause_turn, still goes on after the summary).
        self.conversation.run_tokens += sum(reply.usage.values())
        if reply.stop_reason == "cancelled":
            self.honour_cancel()
            return None
        self.conversation.status = ConversationStatus.QUEUED  # the next move answers, from the summary
        text = "\n".join(block["text"] for block in reply.content if block["type"] == "text").strip()
        if not text:
            raise ModelError(
                "bad_response", "The model returned an empty summary of the earlier turns.", transient=True
            )
        summary = Summary(
            conversation_id=self.conversation.id, through_seq=older[covered - 1].seq, text=text, tokens_before=size
        )
        self.session.add(summary)
        self.session.flush()
        self._summary = summary
        self._audit(
            "conversation_compacted",
            outcome="summarised",
            data={
                "summary_id": summary.id,
                "through_seq": summary.through_seq,
                "rows_summarised": covered,
                "tokens_before": size,
                "window_tokens": window.tokens,
                "summary_chars": len(text),
            },
        )
        return None

    def _cleared(self, request: dict, window: Window, size: int) -> dict:
        """The request with old tool results cleared until it fits, or the failure that says what to do."""
        trimmed = context.clear_old_results(
            request, window, lambda r: context.measure(r, window, self.model.count_tokens)
        )
        if trimmed is None:
            raise _too_long(size, window)
        self._audit("context_trimmed", outcome="cleared", data={"tokens_before": size, "window_tokens": window.tokens})
        return trimmed

    def complete(self, max_moves: int = 1000) -> ConversationStatus:
        """step() until complete, paused, cancelled or out of budget, committing after each move."""
        for _ in range(max_moves):
            self.step()
            self.session.commit()
            if self.conversation.status != ConversationStatus.QUEUED:
                break
        return ConversationStatus(self.conversation.status)

    def cancel(self, by_user_id: int | None = None) -> None:
        """Request cancellation; it is honoured at the next checkpoint of the loop."""
        c = self.conversation
        if c.cancel_requested_at is None:
            c.cancel_requested_at = utcnow()
            c.cancel_requested_by_id = by_user_id

    def honour_cancel(self) -> None:
        """Settle every open call as cancelled (with a result) and stop the run."""
        for call in self.open_round():
            if call.status in SETTLED:
                continue
            if call.status == CallStatus.AWAITING_TASK:
                result = wording.RESULT_TASK_CANCELLED.format(where="its state could not be read")
                try:
                    task = Task.from_dict(call.task)
                except TaskError:
                    pass
                else:
                    self.tools.cancel(call.name, task, self._context(call))
                    result = wording.RESULT_TASK_CANCELLED.format(where=_task_where(task))
                self._finish(call, ToolOutcome(result, True, cancelled=True))
                continue
            if call.status == CallStatus.RUNNING:
                result = wording.RESULT_CANCELLED_RUNNING
            elif self.conversation.cancel_reason:
                result = wording.RESULT_CANCELLED_BECAUSE.format(reason=self.conversation.cancel_reason)
            else:
                result = wording.RESULT_CANCELLED
            self._settle(call, CallStatus.CANCELLED, result, True)
        self.settle_round_if_complete()
        c = self.conversation
        c.status = ConversationStatus.CANCELLED
        c.stop_reason = "cancelled"
        self._audit(
            "conversation_cancelled",
            outcome="cancelled",
            data={"requested_by": c.cancel_requested_by_id, "reason": c.cancel_reason},
        )

    # --- writing -------------------------------------------------------------------------------

    def hold(self) -> None:
        """Lock the conversation's row until the move commits, before writing anything else.

        Whatever writes to a conversation locks in one order: its row, then its calls, then the
        audit chain (decisions and a person's input take the row with lock_conversation()), so two
        writers never deadlock. A move takes it after its work (the tool, the model call), never
        before, so a decision on another call never waits for that work."""
        if self._sqlite:  # every SQLite transaction is BEGIN IMMEDIATE: the write lock is already ours
            return
        with self.session.no_autoflush:
            self.session.execute(_HOLD, {"conversation_id": self.conversation.id})

    def _append(self, role: str, content: list[dict]) -> Message:
        last = self.last_row()
        seq = last.seq + 1 if last is not None else 1  # (conversation_id, seq) is unique: a race fails loudly
        message = Message(
            conversation_id=self.conversation.id, seq=seq, role=role, content=content, created_at=utcnow()
        )
        self.session.add(message)
        self.session.flush()
        self._last, self._round = message, None
        return message

    def _add_call(self, message: Message, position: int, block: dict, *, cut_off: bool) -> ToolCall:
        c = self.conversation
        call = ToolCall(
            conversation_id=c.id,
            tenant_id=c.tenant_id,
            message_id=message.id,
            position=position,
            tool_use_id=block["id"],
            name=block["name"],
            input=block.get("input") or {},
            acting_user_id=c.user_id,
            status=CallStatus.PENDING,
        )
        self.session.add(call)
        if cut_off:
            self._settle(call, CallStatus.FAILED, wording.RESULT_CUT_OFF, True)
            return call
        problem = self.tools.check(call.name, call.input) or self._not_allowed(call)
        if problem:
            self._settle(call, CallStatus.FAILED, problem, True)
            return call
        policy = policy_for(self.session, c.tenant_id, self.tools.get(call.name))
        call.money_cents = self.tools.amount_of(call.name, call.input)
        call.subject = self.tools.subject_of(call.name, call.input, self._context(call))
        waits = policy.needs_approval(call.money_cents)
        limit = None if waits else policy.limit_reached(self.session, call)
        if limit or waits:
            call.requires_approval = True
            call.approvals_required = max(policy.approvals_required, 1)
            call.policy = {**policy.snapshot(), "limit": limit}
            call.expires_at = policy.expires_at()
            call.remind_at, call.escalate_at = policy.notice_times(call.expires_at)
            call.status = CallStatus.AWAITING_APPROVAL
        return call

    def _not_allowed(self, call: ToolCall) -> str | None:
        """Why the call may not run for the conversation's owner (None: it may)."""
        if call.name not in self.tools.names() or call.name in self.usable_tools():
            return None
        owner, tenant_name = self.session.execute(_ASKER, {"user_id": self.conversation.user_id}).one()[:2]
        refusal = wording.RESULT_NOT_ALLOWED.format(owner=owner.label, tool=call.name, tenant=tenant_name)
        return refusal + wording.NOT_ALLOWED_HINT

    def _context(self, call: ToolCall) -> ToolContext:
        """What the call's tool acts with: the acting user, their tenant, and the call's idempotency key."""
        return ToolContext(
            session=self.session,
            user_id=call.acting_user_id,
            tenant_id=call.tenant_id,
            tool_call_id=call.id,
            idempotency_key=f"toolcall-{call.id}",
            background=self.background,
            conversation_id=call.conversation_id,
        )

    def _finish(self, call: ToolCall, outcome: ToolOutcome) -> None:
        """Settle a call with its tool's outcome (after a person's edits, the result says so first)."""

        if outcome.cancelled:
            status = CallStatus.CANCELLED
        else:
            status = CallStatus.FAILED if outcome.is_error else CallStatus.SUCCEEDED
        self._settle(call, status, self._edited_note(call) + outcome.content, outcome.is_error)
        if call.task is not None:
            self._close_task(call, outcome)

    def _edited_note(self, call: ToolCall) -> str:
        """What the model reads before the result when a person changed the call's arguments."""
        if call.original_input is None:
            return ""
        editor = self.session.scalar(
            select(Decision)
            .where(Decision.tool_call_id == call.id, Decision.edited_input.is_not(None))
            .order_by(Decision.id.desc())
            .limit(1)
        )
        name = wording.person(editor.reviewer.display_name, editor.reviewer.email) if editor else "a reviewer"
        return wording.edited_note(name, call.original_input, call.input)

    def _close_task(self, call: ToolCall, outcome: ToolOutcome) -> None:
        """Keep the task's last word on the call: how it ended, for pages and the API."""
        if outcome.cancelled:
            status = "cancelled"
        else:
            status = "failed" if outcome.is_error else "completed"
        # a completed task says nothing more: the call's own sentence says what it did
        message = None if status == "completed" else (outcome.content.strip().splitlines() or [status])[0][:300]
        progress = {"progress": 1.0} if status == "completed" else {}
        call.task = {**call.task, "status": status, "message": message, **progress}
        call.task_due_at = None

    def _wait_on_task(self, call: ToolCall, task: Task, *, progressed: bool) -> None:
        """Keep the call open on its task: due again after the poll interval (working) or, for any task,
        when its time without progress runs out."""
        now = utcnow()
        call.status = CallStatus.AWAITING_TASK
        call.task = task.with_input(None).to_dict()
        if progressed or call.task_progress_at is None:
            call.task_progress_at = now
        deadline = call.task_progress_at + self._time_limit(call)
        if task.status == WORKING:
            call.task_due_at = min(now + timedelta(seconds=task.poll_interval), deadline)
        else:  # input_required: nothing to look at until a person gives input, or time runs out
            call.task_due_at = deadline

    def _time_limit(self, call: ToolCall) -> timedelta:
        tool = self.tools.get(call.name)
        return timedelta(seconds=tool.task_time_limit_seconds if tool else 3600)

    def _settle(self, call: ToolCall, status: CallStatus, result: str, is_error: bool) -> None:
        call.status = status
        call.result = result
        call.is_error = is_error
        call.finished_at = utcnow()

    def _record_usage(
        self,
        reply: ModelReply,
        request: dict,
        purpose: str = "answer",
        summary_id: int | None = None,
        endpoint: str | None | object = _UNREAD,
        route: str | None = None,
    ) -> None:
        """The call's ModelCall row and audit event: its usage, and what it was sent (the hashes of its
        system prompt and tool definitions, the summary it stood on)."""
        c = self.conversation
        usage = reply.usage
        sent = {
            "purpose": purpose,
            "system_hash": _digest(request.get("system")),
            "tools_hash": _digest(request.get("tools") or []),
            "summary_id": summary_id,
            "endpoint": self.model.endpoint if endpoint is _UNREAD else endpoint,
            "settings_version": self._settings_version if purpose == "answer" else None,
            "route": route or self.route,
        }
        self.session.add(
            ModelCall(
                conversation_id=c.id,
                tenant_id=c.tenant_id,
                model=reply.model,
                request_id=reply.request_id,
                stop_reason=reply.stop_reason,
                latency_ms=reply.latency_ms,
                **sent,
                **usage,
            )
        )
        self._audit(
            "model_call",
            outcome=reply.stop_reason,
            data={
                "model": reply.model,
                "latency_ms": round(reply.latency_ms, 1),
                "request_id": reply.request_id,
                **sent,
                **usage,
            },
        )

    def _count(self, reply: ModelReply) -> None:
        """The reply's tokens and stop reason on the conversation, set after the move's last flush so
        that the guarded UPDATE ending the move writes them (moves.py), not a statement of their own."""
        c = self.conversation
        c.run_tokens += sum(reply.usage.values())
        c.stop_reason = reply.stop_reason

    def _audit(self, action: str, call: ToolCall | None = None, actor: User | None = None, **fields) -> None:
        """An audit event of this conversation, in the same transaction as the change it records."""
        c = self.conversation
        audit_chain.record(
            self.session,
            action,
            tenant_id=c.tenant_id,
            conversation_id=c.id,
            actor=actor,
            actor_label=None if actor else "assistant",
            tool_call_id=call.id if call else None,
            tool_name=call.name if call else None,
            **fields,
        )


class _DeltaBuffer:
    """Text deltas gathered into one event per PUBLISH_EVERY seconds: smooth for a reader, and a
    fast model does not cost a Redis round trip per token."""

    PUBLISH_EVERY = 0.05

    def __init__(self, events: Events, conversation_id: int) -> None:
        self.events = events
        self.conversation_id = conversation_id
        self.pending: list[str] = []
        self.last = 0.0  # the first words go out at once, however soon the next ones come

    def add(self, text: str) -> None:
        self.pending.append(text)
        if time.monotonic() - self.last >= self.PUBLISH_EVERY:
            self.flush()

    def publish(self, event: dict) -> None:
        self.flush()
        self.events.publish(self.conversation_id, event)

    def flush(self) -> None:
        if self.pending:
            self.events.publish(self.conversation_id, {"type": "text", "text": "".join(self.pending)})
            self.pending = []
        self.last = time.monotonic()


def _mark_cache_breakpoint(messages: list[dict]) -> None:
    """Mark the newest block as a prompt-cache breakpoint (the third of the API's four, after the
    system prompt and the tools): the next request starts with this one whole, so it reads it from
    the cache."""
    if not messages or not messages[-1]["content"]:
        return
    block = messages[-1]["content"][-1]
    if block.get("type") == "text" and not block.get("text", "").strip():
        return  # the API refuses a breakpoint on an empty text block
    messages[-1]["content"][-1] = {**block, "cache_control": {"type": "ephemeral"}}


def _said(reply: ModelReply) -> str:
    return " ".join(block.get("text", "") for block in reply.content if block.get("type") == "text").strip()[:40]


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _too_long(size: int, window: Window | None) -> ModelError:
    where = f" (about {size:,} tokens; the window is {window.tokens:,})" if window else ""
    return ModelError(
        "too_long",
        "The conversation no longer fits the model's context window, even with its older turns summarised and "
        f"old tool results cleared{where}. Start a new conversation for the next question, or raise "
        "CONTEXT_WINDOW_TOKENS if the model allows a larger window.",
        transient=False,
    )


def task_due(call: ToolCall, now) -> bool:
    """A waiting task the loop should hand back to its tool now: a person's input came, or its time did."""
    return call.status == CallStatus.AWAITING_TASK and (
        call.task_input is not None or (call.task_due_at is not None and call.task_due_at <= now)
    )


def _task_where(task: Task) -> str:
    if task.status == INPUT_REQUIRED:
        return f"waiting for: {task.input_prompt or task.message or 'input'}"
    return f"last status: {task.message or task.status}"


def _duration(span: timedelta) -> str:
    seconds = span.total_seconds()
    for unit, size in (("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}" + ("s" if count != 1 else "")
    return f"{seconds:g} seconds"


def _busy_reason(status: str) -> str:
    return {
        ConversationStatus.QUEUED: "The assistant is still working on the last message; wait or stop it.",
        ConversationStatus.RUNNING: "The assistant is still working on the last message; wait or stop it.",
        ConversationStatus.AWAITING_APPROVAL: "A tool call is waiting for a person's decision.",
        ConversationStatus.AWAITING_TASK: "A tool call is still working.",
    }.get(status, "A round of tool calls is still open; extend the budget or stop the conversation first.")
