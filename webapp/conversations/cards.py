"""A tool call as people read it: a sentence for where it stands and who decided it, what it did
(or why it failed) in words, its result rendered, its arguments in dollars and names. Never the
fenced text written for the model; the chat page's cards and the decision page both use it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from webapp.agent import wording
from webapp.agent.decisions import arguments_hash
from webapp.agent.states import CallStatus
from webapp.models import Decision, ToolCall
from webapp.tools.presenting import Shown, arguments, changes, more_approvals, people, result_rows
from webapp.tools.registry import OUTPUT_OPEN, RETRY_HINT, ToolRegistry, unwrap_output
from webapp.web.rendering import pretty_json

# The desk's notes to the model that may sit before a tool's own words in a result
# (webapp/agent/wording.py): a person's edit is told to people by the decision sentence instead.
_DESK_NOTE = "Note from the approval desk:"


@dataclass
class Card:
    said: str | None  # what the call does, in its tool's sentence: "Refund $40.00 on invoice 4471."
    decision: str | None  # "Approved with changes by X: amount $75.00 → $40.00 (reason)"
    outcome: str | None  # "Refunded $40.00 on invoice 4471; $89.00 is left to refund." / why it failed
    rows: list[Shown] = field(default_factory=list)  # the result, rendered
    data: str | None = None  # the result's data as indented JSON, a click away
    arguments: list[Shown] = field(default_factory=list)
    file: str | None = None  # a file the call made, downloadable from its card (an export)


def decisions_by_call(session: Session, calls: list[ToolCall]) -> dict[int, list[Decision]]:
    """Every decision on these calls, oldest first, by call id (one query)."""
    found: dict[int, list[Decision]] = {call.id: [] for call in calls}
    if found:
        rows = session.scalars(select(Decision).where(Decision.tool_call_id.in_(found)).order_by(Decision.id))
        for decision in rows:
            found[decision.tool_call_id].append(decision)
    return found


def card(call: ToolCall, decisions: list[Decision], tools: ToolRegistry) -> Card:
    tool = tools.get(call.name)
    data, fenced = result_data(call.result)
    outcome, rows, raw, file = None, [], None, None
    if call.status == CallStatus.SUCCEEDED:
        sentence = tool.result_sentence(data, call.input) if tool else None
        outcome = sentence or "Done."
        rows = result_rows(data)
        raw = pretty_json(data) if fenced else None
        file = tool.result_file(data) if tool else None
    elif call.status == CallStatus.FAILED and (call.result or "").startswith(wording.UNCERTAIN):
        outcome = wording.UNCERTAIN_FOR_PEOPLE
    elif call.status == CallStatus.FAILED:
        outcome = f"Failed: {failure(call.result)}"
    return Card(
        said=tools.describe(call.name, call.input),
        decision=decision_sentence(call, decisions),
        outcome=outcome,
        rows=rows,
        data=raw,
        arguments=arguments(tool.argument_names() if tool else [], call.input),
        file=file,
    )


def summary(call: ToolCall, tools: ToolRegistry) -> str:
    """Where a call stands and what it did, in one sentence for people (the API's `summary`): never
    the fenced text written for the model."""
    said = tools.describe(call.name, call.input) or f"{call.name}."
    status = call.status
    if status == CallStatus.SUCCEEDED:
        tool = tools.get(call.name)
        data, _ = result_data(call.result)
        return (tool.result_sentence(data, call.input) if tool else None) or f"Done: {said}"
    if status == CallStatus.FAILED and (call.result or "").startswith(wording.UNCERTAIN):
        return wording.UNCERTAIN_FOR_PEOPLE
    if status == CallStatus.FAILED:
        return f"Failed: {failure(call.result)}"
    if status == CallStatus.REJECTED:
        who = call.decided_by.label if call.decided_by else "a reviewer"
        reason = (call.decision_reason or "").rstrip()
        return f"Rejected by {who}: {reason}{'' if reason.endswith(('.', '!', '?')) else '.'} Nothing was done."
    if status == CallStatus.EXPIRED:
        return f"Expired undecided, so nothing was done: {said}"
    if status == CallStatus.CANCELLED:
        return f"Cancelled, so nothing was done: {said}"
    if status == CallStatus.AWAITING_APPROVAL:
        return f"Waiting for approval: {said}"
    if status == CallStatus.AWAITING_TASK:
        task = call.task or {}
        return f"Working: {said} ({task.get('message') or task.get('status') or 'its task goes on'})"
    return f"{'Running' if status == CallStatus.RUNNING else 'About to run'}: {said}"


def output(call: ToolCall) -> Any:
    """The tool's own output, parsed when it is JSON (the API's `output`; None before it ran or when
    the desk, not the tool, settled the call)."""
    return result_data(call.result)[0]


def decision_sentence(call: ToolCall, decisions: list[Decision]) -> str | None:
    """Who decided, in words: every approver named, the edit spelled out, the reasons given."""
    rejected = next((d for d in decisions if d.decision == "reject"), None)
    if rejected is not None:
        reason = (rejected.reason or "").rstrip()
        return f"Rejected by {rejected.reviewer.label}: {reason}{'' if reason.endswith(('.', '!', '?')) else '.'}"
    current = arguments_hash(call.input)
    approvals = [d for d in decisions if d.decision == "approve" and d.arguments_hash == current]
    if not approvals:
        return None
    editor = next((d for d in reversed(approvals) if d.edited_input is not None), None)
    others = [d for d in approvals if d is not editor]
    if editor is not None and call.original_input is not None:
        what = changes(call.original_input, call.input)
        why = f" ({editor.reason})" if editor.reason else ""
        sentence = f"Approved with changes by {editor.reviewer.label}: {what}{why}"
        if others:
            sentence += f"; also approved by {people([_with_reason(d) for d in others])}"
    else:
        sentence = f"Approved by {people([_with_reason(d) for d in approvals])}"
    if call.status == CallStatus.AWAITING_APPROVAL:
        missing = max(call.approvals_required, 1) - len(approvals)
        sentence += f"; it needs {more_approvals(missing)}"
    return sentence + "."


def _with_reason(decision: Decision) -> str:
    return decision.reviewer.label + (f" ({decision.reason})" if decision.reason else "")


def result_data(content: str | None) -> tuple[Any, bool]:
    """The tool's own output inside a result (parsed when JSON), and whether it was fenced output."""
    if not content or OUTPUT_OPEN not in content:
        return None, False
    inner = unwrap_output(content)
    try:
        return json.loads(inner), True
    except ValueError:
        return inner, True


def failure(content: str | None) -> str:
    """Why a call failed, as the tool said it, without the desk's notes and hints for the model."""
    text = (content or "").strip()
    if text.startswith(_DESK_NOTE):
        text = text.split("\n", 1)[1] if "\n" in text else ""
    if OUTPUT_OPEN in text:
        text = unwrap_output(text)
    text = text.replace(RETRY_HINT, "").replace(wording.NOT_ALLOWED_HINT, "")
    return text.strip() or "the tool gave no reason."
