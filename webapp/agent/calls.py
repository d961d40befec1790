"""The tool side of the loop: the calls of a round, from the model's request to their results.

A reply's tool_use blocks become calls here, each checked and flagged for a person's decision by its
tool's policy; a call that may run is claimed (marked running before its side effect, which the mover
commits first), then run as the person it acts for with its idempotency key; a call whose tool
returned a Task waits on it and is handed back to its tool when due; when every call of the round
has a result, ONE user message carries them all, in tool_use order. A cancel settles every open call
with a result. The Loop (loop.py) decides which of these a move does.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select

from webapp.agent import gate, wording
from webapp.agent.states import RUNNABLE, SETTLED, CallStatus, ConversationStatus
from webapp.agent.transcript import tool_uses
from webapp.agent.workspace import OnWorkspace, Workspace
from webapp.logs import bind
from webapp.models import Decision, Message, ToolCall, User, utcnow
from webapp.tools.registry import ToolContext, ToolOutcome
from webapp.tools.tasks import INPUT_REQUIRED, WORKING, Task, TaskError


class Calls(OnWorkspace):
    """The calls of one conversation's open round (see the module docstring)."""

    def __init__(self, workspace: Workspace, *, background: Any = None) -> None:
        self.workspace = workspace
        self.background = background  # handed to tools that start background work for tasks

    def add_round(self, message: Message, *, cut_off: bool) -> None:
        """One call per tool_use block of the model's turn `message`, each checked and flagged (all
        failed at once when the reply was cut off), audited; the round settles at once when none is
        left to run or wait on."""
        calls = [
            self._add_call(message, position, block, cut_off=cut_off)
            for position, block in enumerate(tool_uses(message.content))
        ]
        self.session.flush()
        for call in calls:
            self.workspace.audit("tool_call_requested", call, outcome=call.status, data={"input": call.input})
            if call.status == CallStatus.AWAITING_APPROVAL:
                self.workspace.audit("approval_requested", call, outcome=call.status, data={"input": call.input})
        self.settle_round_if_complete()

    def run_tools(self, limit: int | None = None) -> int:
        """Run the open round's calls that may run now, in order; returns how many ran."""
        ran = 0
        for call in self.workspace.open_round():
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
            if tool is not None and not tool.writes_database:
                self.session.commit()  # a remote tool: end the reads above, so its wait holds no transaction
            with bind(tool_call_id=call.id):
                outcome = self.tools.run(call.name, call.input, self._context(call), self.settings.tool_output_limit)
        self.workspace.hold()
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
        self.workspace.audit("tool_call_executed", call, actor=actor, outcome=call.status, data=data)
        self.events.publish(self.conversation.id, {"type": "tool_call", "id": call.id, "status": call.status})
        self.settle_round_if_complete()

    def resume_task(self, call: ToolCall) -> None:
        """Hand a waiting task back to its tool (with a person's input, if one came): it settles the
        call, stays as it is, or moves on; a task without progress past its tool's limit fails."""
        pending_input = call.task_input
        try:
            task = Task.from_dict(call.task).with_input(pending_input)
        except TaskError as exc:
            self.workspace.hold()
            call.task_input = None
            self._finish(call, ToolOutcome(wording.RESULT_TASK_UNREADABLE.format(error=exc), True))
            self.workspace.audit("task_finished", call, outcome=call.status, data={"error": str(exc)})
            self.settle_round_if_complete()
            return
        context = self._context(call)
        with bind(tool_call_id=call.id):
            outcome = self.tools.resume(call.name, task, context, self.settings.tool_output_limit)
        self.workspace.hold()
        if pending_input is not None:  # (left alone otherwise: input may arrive while this move runs)
            call.task_input = None
        if outcome.task is None:
            self._finish(call, outcome)
            self.workspace.audit(
                "task_finished", call, outcome=call.status, data={"result_chars": len(outcome.content)}
            )
        elif outcome.task.progress_key() != task.progress_key() or pending_input is not None:
            self._wait_on_task(call, outcome.task, progressed=True)
            if outcome.task.status != task.status or pending_input is not None:
                self.workspace.audit(
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
            self.workspace.audit("task_finished", call, outcome=call.status, data={"timed_out": True})
        else:
            self._wait_on_task(call, outcome.task, progressed=False)
        self.events.publish(self.conversation.id, {"type": "tool_call", "id": call.id, "status": call.status})
        self.settle_round_if_complete()

    def settle_round_if_complete(self) -> Message | None:
        """When every call of the open round has a result, append ONE user message with all of them."""
        calls = self.workspace.open_round()
        if not calls or any(call.status not in SETTLED for call in calls):
            return None
        blocks = []
        for call in calls:
            block = {"type": "tool_result", "tool_use_id": call.tool_use_id, "content": call.result or ""}
            if call.is_error:
                block["is_error"] = True
            blocks.append(block)
        return self.workspace.append("user", blocks)

    def honour_cancel(self) -> None:
        """Settle every open call as cancelled (with a result) and stop the run."""
        for call in self.workspace.open_round():
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
        self.workspace.audit(
            "conversation_cancelled",
            outcome="cancelled",
            data={"requested_by": c.cancel_requested_by_id, "reason": c.cancel_reason},
        )

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
        problem = gate.check(self.tools, call.name, call.input) or self._not_allowed(call)
        if problem:
            self._settle(call, CallStatus.FAILED, problem, True)
            return call
        gate.weigh(self.session, call, self.tools, self._context(call))
        return call

    def _not_allowed(self, call: ToolCall) -> str | None:
        """Why the call may not run for the conversation's owner (None: it may)."""
        tool = self.tools.get(call.name)
        if tool is not None and not tool.runs_here:  # an outside agent's tool: never the assistant's to call
            return wording.RESULT_OUTSIDE_TOOL.format(tool=call.name)
        if tool is None or call.name in self.workspace.usable_tools():
            return None
        owner, tenant_name = self.workspace.asker()[:2]
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
