"""The model side of the loop: what a move asks the model, and what it makes of the answer.

A request is built from the rows (the system prompt, the tools the owner may use, the newest summary
and the rows after it, with its prompt-cache breakpoints); before it is sent, it is weighed against
the context window, and past the threshold (or refused as too long) the move summarises older turns
instead (webapp/agent/context.py). A reply streams its text to the live events, becomes the
assistant's row, and its tool_use blocks become the round's calls (calls.py). A run not routed yet
is routed first, by the tenant's rules or the small model's classification. Every model call is a
ModelCall row and an audit event with its usage; its tokens and stop reason are set on the
conversation last, so the guarded UPDATE that ends the move writes them (moves.py).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

from webapp.agent import assistant_settings, batches, context, wording
from webapp.agent.calls import Calls
from webapp.agent.context import Window
from webapp.agent.states import ConversationStatus
from webapp.agent.workspace import Events, OnWorkspace, Workspace
from webapp.llm import routing
from webapp.llm.client import ModelClient, ModelError, ModelReply
from webapp.models import ModelCall, Summary

_SERVING = object()  # the endpoint of the model that serves the run


class Generation(OnWorkspace):
    """The model calls of one conversation (see the module docstring)."""

    def __init__(
        self,
        workspace: Workspace,
        calls: Calls,
        *,
        model: ModelClient,
        should_stop: Callable[[], bool] | None = None,
        router: ModelClient | None = None,
        route: str = "not routed",
    ) -> None:
        self.workspace = workspace
        self.calls = calls  # a reply's tool_use blocks become its calls; a stop settles the open ones
        self.model = model
        self.should_stop = should_stop
        # the tenant's small model, which routes a run not routed yet (None: no routing), and why
        # self.model serves this run (recorded on each model call)
        self.router = router
        self.route = route
        self._settings_version: int | None = None  # the tenant's AssistantSettings the request was built with

    def routes_first(self) -> bool:
        """The run is routed before its first answer: the tenant has a small model, and this run has
        no route yet."""
        return self.router is not None and self.conversation.route is None

    def routing_request(self) -> dict:
        """What a route move decides from, read before its model call: the newest words a person
        wrote, the tenant's rule that makes them complex (None: no rule does), and the classification's
        instructions, with the tools the owner may use as examples."""
        question = next(
            (
                "\n".join(b["text"] for b in row.content if b.get("type") == "text")
                for row in reversed(self.workspace.rows())
                if row.role == "user" and any(b.get("type") == "text" for b in row.content)
            ),
            "",
        )
        settings = assistant_settings.current(self.session, self.conversation.tenant_id)
        tools = [self.tools.get(name) for name in sorted(self.workspace.usable_tools())]
        system = routing.system_prompt(
            look_ups=[tool.title for tool in tools if tool and not tool.sensitive],
            changes=[tool.title for tool in tools if tool and tool.sensitive],
        )
        return {"question": question, "rule": assistant_settings.complex_rule(question, settings), "system": system}

    def build_request(self, rows: list | None = None) -> dict:
        """The next model request: the system prompt and the tools (both cache breakpoints), then the
        transcript: the newest summary and the rows after it, with a cache breakpoint on its newest
        block so that the next move reads all of this one's prefix from the prompt cache."""
        summary = self.workspace.summary()
        if rows is None:
            rows = self.workspace.rows(after=summary.through_seq if summary else 0)
        user, tenant_name, settings = self.workspace.asker()
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
        request = {
            "system": system,
            "tools": self.tools.definitions(self.workspace.usable_tools()),
            "messages": messages,
        }
        if settings and settings.one_call_per_reply:
            request["tool_choice"] = {"type": "auto", "disable_parallel_tool_use": True}
        return request

    def generate(self, request: dict | None = None, batch: batches.BatchTurn | None = None) -> ModelReply | None:
        """One model call: appends the assistant message and one tool-call row per tool_use block.

        Give it a request from build_request() to make the call without touching the database
        until the reply is in (the mover does, so no transaction stays open during the call).
        In a batch run (`batch`), the reply is the answer the batch brought; with none yet, the request
        is stored for the next batch and the conversation parks (returns None)."""
        c = self.conversation
        request = request or self.build_request()
        if batch is not None:
            if batch.answer is None:
                self.workspace.hold()
                batches.park(self.session, c, self.model.batch_params(request), self.model.endpoint)
                batch.parked = True
                return None
            reply = batches.reply_of(batch.answer)
        else:
            deltas = _DeltaBuffer(self.events, c.id)
            reply = self.model.generate(
                **request,
                on_text=deltas.add,
                on_tool_start=lambda name: deltas.publish({"type": "tool_start", "name": name}),
                should_stop=self.should_stop,
            )
            deltas.flush()
        self.workspace.hold()
        summary = self.workspace.summary()
        self._record_usage(
            reply,
            request,
            summary_id=summary.id if summary else None,
            batch_id=batch.answer.batch_id if batch is not None else None,
        )
        content = reply.content
        if reply.stop_reason == "cancelled":
            if content:
                self.workspace.append("assistant", content)
            self._count(reply)
            return reply
        message = self.workspace.append("assistant", content or [{"type": "text", "text": ""}])
        self.calls.add_round(message, cut_off=reply.stop_reason == "max_tokens")
        self._count(reply)
        return reply

    def answer(
        self, request: dict, rows: list, summary: Summary | None, batch: batches.BatchTurn | None = None
    ) -> ModelReply | None:
        """A generate move's model call on `request` (built from `rows`, after `summary`), after weighing
        it against the context window: past the threshold (or refused as too long by the endpoint) the
        move summarises older turns instead and returns None; see webapp/agent/context.py. In a batch
        run the call goes by batch (see generate), and a move that parks for it returns None too."""
        window = self.settings.window
        if window is not None:
            size = context.measure(request, window, self.model.count_tokens)
            if size > window.threshold and context.cut_point(rows, window) is not None:
                return self.summarise(rows, summary, size)
            if size > window.room:
                request = self._cleared(request, window, size)
        try:
            return self.generate(request, batch)
        except ModelError as error:
            if error.code != "too_long" or window is None or context.cut_point(rows, window) is None:
                if error.code == "too_long":
                    raise _too_long(context.estimate(request), window) from error
                raise
            return self.summarise(rows, summary, context.estimate(request))

    def route_run(self, request: dict) -> None:
        """Route the run by its question's difficulty: the tenant's rules first (a rule that fires makes
        it complex), else the small model's classification. Simple runs go to the small endpoint,
        complex ones to the large one; a classification that fails or says neither goes to the large
        one, and says so. The route is kept on the conversation for every move of the run."""
        c = self.conversation
        question, rule = request["question"], request["rule"]
        reply = None
        if rule:
            route, reason = "large", f"large: {rule}"
        else:
            try:
                label, reply = routing.classify(self.router, question, request["system"])
            except ModelError as error:
                label, reason = None, f"large: classification failed ({error.message})"
            else:
                reason = f"large: the classification said neither simple nor complex ({_said(reply)!r})"
            route = "small" if label == "simple" else "large"
            if label:
                reason = f"{route}: classified {label}"
        self.workspace.hold()
        if reply is not None:
            self._record_usage(
                reply,
                {"system": request["system"]},
                purpose="route",
                endpoint=self.router.endpoint,
                route="small: classifies the question",
            )
            c.run_tokens += sum(reply.usage.values())
        c.route, c.route_reason = route, reason[:160]
        self.workspace.audit("run_routed", outcome=route, data={"route": route, "reason": c.route_reason})

    def summarise(self, rows: list, previous: Summary | None, size: int) -> None:
        """Summarise the turns before the cut point (after the previous summary) into a new Summary row:
        a model call of its own, counted and audited like any other."""
        window = self.settings.window
        older = rows[: context.cut_point(rows, window)]
        request, covered = context.summary_request(previous.text if previous else None, older, window)
        reply = self.model.generate(**request, should_stop=self.should_stop)
        self.workspace.hold()
        self._record_usage(reply, request, purpose="summary", summary_id=previous.id if previous else None)
        # Its tokens count against the budget; its stop reason is not the conversation's (a turn the API
        # paused, pause_turn, still goes on after the summary).
        self.conversation.run_tokens += sum(reply.usage.values())
        if reply.stop_reason == "cancelled":
            self.calls.honour_cancel()
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
        self.workspace.add_summary(summary)
        self.workspace.audit(
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
        self.workspace.audit(
            "context_trimmed", outcome="cleared", data={"tokens_before": size, "window_tokens": window.tokens}
        )
        return trimmed

    def _record_usage(
        self,
        reply: ModelReply,
        request: dict,
        purpose: str = "answer",
        summary_id: int | None = None,
        endpoint: str | None | object = _SERVING,
        route: str | None = None,
        batch_id: str | None = None,
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
            "endpoint": self.model.endpoint if endpoint is _SERVING else endpoint,
            "settings_version": self._settings_version if purpose == "answer" else None,
            "route": route or self.route,
        }
        if batch_id is not None:  # answered by a batch, at half the price
            sent["batch_id"] = batch_id
        self.workspace.insert(
            ModelCall,
            {
                "conversation_id": c.id,
                "tenant_id": c.tenant_id,
                "model": reply.model,
                "request_id": reply.request_id,
                "stop_reason": reply.stop_reason,
                "latency_ms": reply.latency_ms,
                **sent,
                **usage,
            },
        )
        self.workspace.audit(
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
        """The text so far, then `event`, in one round trip."""
        self.events.publish(self.conversation_id, *self._pending_text(), event)
        self.last = time.monotonic()

    def flush(self) -> None:
        if self.pending:
            self.events.publish(self.conversation_id, *self._pending_text())
        self.last = time.monotonic()

    def _pending_text(self) -> list[dict]:
        text, self.pending = "".join(self.pending), []
        return [{"type": "text", "text": text}] if text else []


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
