"""The conversation as people read it, shared by the chat page and the decision page."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from webapp.conversations.cards import Card, card, decisions_by_call
from webapp.models import Conversation, Message, Summary, ToolCall
from webapp.runtime.extensions import db
from webapp.runtime.services import services


@dataclass
class Entry:
    """One thing to show in the transcript: a person's text, the assistant's text, or a tool call."""

    kind: str  # user | assistant | tool | summary (older turns summarised for the model here)
    text: str = ""
    call: ToolCall | None = None
    card: Card | None = None


def transcript(conversation: Conversation) -> list[Entry]:
    """The conversation as people read it: texts in order, each tool call as one card with its result."""
    rows = db.session.scalars(select(Message).where(Message.conversation_id == conversation.id).order_by(Message.seq))
    calls = {
        call.tool_use_id: call
        for call in db.session.scalars(select(ToolCall).where(ToolCall.conversation_id == conversation.id))
    }
    summaries = {
        summary.through_seq: summary
        for summary in db.session.scalars(
            select(Summary).where(Summary.conversation_id == conversation.id).order_by(Summary.id)
        )
    }
    decisions = decisions_by_call(db.session, list(calls.values()))
    tools = services().tools_for(db.session, conversation.tenant_id)
    entries: list[Entry] = []
    for row in rows:
        if row.seq - 1 in summaries:  # the turns before this row reach the model as a summary
            entries.append(Entry("summary", text=summaries.pop(row.seq - 1).text))
        for block in row.content:
            kind = block.get("type")
            if kind == "text" and block.get("text"):
                entries.append(Entry("user" if row.role == "user" else "assistant", text=block["text"]))
            elif kind == "tool_use" and block.get("id") in calls:
                call = calls[block["id"]]
                entries.append(Entry("tool", call=call, card=card(call, decisions[call.id], tools)))
    return entries
