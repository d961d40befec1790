"""The loop's verbs over one persisted conversation.

Every verb decides what to do from the persisted rows alone and writes through the given Session;
the caller commits (the mover in moves.py commits a claim before any side effect, and the result
after). Nothing here knows about Flask or RQ.

The Loop is the conductor: it decides the next move and says where each move leaves the
conversation; the work is done by its two sides, over one shared Workspace (workspace.py): the
model side (generation.py: requests, replies, summaries, routing, usage) and the tool side
(calls.py: a round's calls, from flagging to results, tasks, cancellation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from webapp.agent import batches
from webapp.agent.access import Access
from webapp.agent.calls import Calls, task_due
from webapp.agent.generation import Generation
from webapp.agent.states import IDLE, RUNNABLE, SETTLED, CallStatus, ConversationStatus
from webapp.agent.workspace import Events, LoopSettings, NoEvents, OnWorkspace, Tail, Workspace
from webapp.llm.client import ModelClient, ModelReply
from webapp.models import Conversation, Message, Summary, ToolCall, utcnow
from webapp.tools import presenting
from webapp.tools.registry import ToolRegistry

TITLE_LENGTH = 80  # a conversation is named by its first question, cut at a word boundary

# The model's turn goes on only after these stops (tools to run, or the API paused a long turn); any
# other stop ends the run with what the model said: end_turn, max_tokens, refusal, a stop sequence, a
# stop by a person, and a stop reason newer than this code (calling the model again would only spend
# the move budget on the same answer).
GOES_ON = frozenset({"tool_use", "pause_turn"})
# The stops the desk knows (the chat page names any other, so a person knows the answer may be partial).
KNOWN_STOPS = GOES_ON | {"end_turn", "max_tokens", "stop_sequence", "refusal", "cancelled"}


class ConversationBusy(Exception):
    """The conversation cannot take a new message now; the message says why."""


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
    batch: batches.BatchTurn | None = None  # for generate in a batch run (webapp/agent/batches.py)

    @property
    def parks(self) -> bool:
        """Moves that leave the conversation waiting for someone else to wake it."""
        return self.kind in ("wait", "budget") or (self.batch is not None and self.batch.parked)


class Loop(OnWorkspace):
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
        access_rules: dict[str, Access] | None = None,
        tail: Tail | None = None,
    ) -> None:
        self.workspace = Workspace(
            session,
            conversation,
            tools=tools,
            settings=settings or LoopSettings(),
            events=events or NoEvents(),
            access_rules=access_rules,  # the tenant's, when the caller keeps them (else read when needed)
            tail=tail,  # what the move's claim read of the newest rows (see workspace.Tail)
        )
        self.calls = Calls(self.workspace, background=background)
        self.generation = Generation(
            self.workspace, self.calls, model=model, should_stop=should_stop, router=router, route=route
        )

    @property
    def model(self) -> ModelClient:
        """The model that serves this run."""
        return self.generation.model

    # --- reading the state ---------------------------------------------------------------------

    def rows(self, after: int = 0) -> list:
        """The transcript's rows after seq `after`, oldest first (see Workspace.rows)."""
        return self.workspace.rows(after)

    def last_row(self) -> Message | None:
        return self.workspace.last_row()

    def open_round(self) -> list[ToolCall]:
        """The calls of the last assistant turn when it asked for tools and has no results yet."""
        return self.workspace.open_round()

    def is_complete(self) -> bool:
        """True when the model's last turn answered without asking for a tool."""
        return (
            self.workspace.last_role() == "assistant"
            and not self.open_round()  # (an assistant row asked for tools exactly when it has calls)
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
        if self.workspace.last_seq() is None:
            return Move("done")
        if self.over_budget():
            return Move("budget")
        # (a batch run is not routed: its moves go by batch, and routing would ask the small model now)
        routes = self.generation.routes_first() and not batches.is_batched(self.session, c)
        return Move("route") if routes else Move("generate")

    # --- the verbs -----------------------------------------------------------------------------

    def ask_later(self, text: str) -> Message:
        """Stage a user message (no model call) and start a new run with a fresh budget."""
        c = self.conversation
        is_new = c.status == ConversationStatus.QUEUED and self.workspace.last_seq() is None
        if not (is_new or c.status in IDLE) or self.open_round():
            raise ConversationBusy(_busy_reason(c.status))
        message = self.workspace.append("user", [{"type": "text", "text": text}])
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

    def build_request(self, rows: list | None = None) -> dict:
        """The next model request (see Generation.build_request)."""
        return self.generation.build_request(rows)

    def generate(self, request: dict | None = None) -> ModelReply:
        """One model call: appends the assistant message and one tool-call row per tool_use block
        (see Generation.generate)."""
        return self.generation.generate(request)

    def run_tools(self, limit: int | None = None) -> int:
        """Run the open round's calls that may run now, in order; returns how many ran."""
        return self.calls.run_tools(limit)

    def resume_task(self, call: ToolCall) -> None:
        """Hand a waiting task back to its tool (see Calls.resume_task)."""
        self.calls.resume_task(call)

    def step(self) -> Move:
        """Make whichever move is next; returns the move made."""
        move = self.next_move()
        self.begin(move)
        self.perform(move)
        return move

    def begin(self, move: Move) -> None:
        """The part of a move that must be durable before its side effect."""
        if move.kind == "run_tool":
            self.calls.claim_call(move.call)
        elif move.kind == "route":  # the question and the rules, read before the model call
            move.request = self.generation.routing_request()
        elif move.kind == "generate":
            summary = self.workspace.summary()
            move.summary = summary
            move.rows = self.workspace.rows(after=summary.through_seq if summary else 0)
            move.request = self.generation.build_request(move.rows)
            if batches.is_batched(self.session, self.conversation):
                move.batch = batches.BatchTurn(batches.answer_for(self.session, self.conversation))

    def perform(self, move: Move) -> None:
        """Do the move's work; the conversation's status says where it leaves things."""
        c = self.conversation
        if move.kind not in ("run_tool", "resume_task", "generate", "route"):  # those hold() after their work
            self.workspace.hold()
        if move.kind == "cancel":
            self.calls.honour_cancel()
        elif move.kind == "budget":
            c.status = ConversationStatus.BUDGET_EXHAUSTED
            self.workspace.audit(
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
            self.workspace.audit("conversation_waiting", outcome=c.status)  # (rolled back if it does not park)
        elif move.kind == "done":
            if c.status != ConversationStatus.COMPLETED:  # (a step on a finished conversation tells no one twice)
                self._completed(None)
        elif move.kind == "settle":
            self.calls.settle_round_if_complete()
            c.status = ConversationStatus.QUEUED
        elif move.kind == "run_tool":
            self.calls.run_call(move.call)
            c.moves_used += 1  # (after: a change flushed during the tool would lock the row while it runs)
            c.status = ConversationStatus.QUEUED
        elif move.kind == "route":  # not counted against the budget: the run has not started its work
            self.generation.route_run(move.request)
            c.status = ConversationStatus.QUEUED
        elif move.kind == "resume_task":  # not counted against the budget: waiting is not working
            self.calls.resume_task(move.call)
            c.status = ConversationStatus.QUEUED
        elif move.kind == "generate":
            reply = self.generation.answer(move.request, move.rows, move.summary, move.batch)
            if reply is None:  # older turns summarised, or the request parked for a batch (the status says)
                c.updated_at = utcnow()
                return
            c.moves_used += 1
            if reply.stop_reason == "cancelled":
                self.calls.honour_cancel()
            elif reply.stop_reason not in GOES_ON:
                self._completed(reply.stop_reason)
            else:  # tool_use runs tools next; pause_turn generates again
                c.status = ConversationStatus.QUEUED
        c.updated_at = utcnow()

    def _completed(self, stop_reason: str | None) -> None:
        self.conversation.status = ConversationStatus.COMPLETED
        self.workspace.audit("conversation_completed", outcome="completed", data={"stop_reason": stop_reason})

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


def _busy_reason(status: str) -> str:
    return {
        ConversationStatus.QUEUED: "The assistant is still working on the last message; wait or stop it.",
        ConversationStatus.RUNNING: "The assistant is still working on the last message; wait or stop it.",
        ConversationStatus.AWAITING_APPROVAL: "A tool call is waiting for a person's decision.",
        ConversationStatus.AWAITING_TASK: "A tool call is still working.",
        ConversationStatus.AWAITING_BATCH: "The assistant's answer is coming by batch; wait or stop it.",
    }.get(status, "A round of tool calls is still open; extend the budget or stop the conversation first.")
