"""What the Loop and its two sides share for one conversation, kept in one place.

The Loop (loop.py, the verbs) conducts; the model side (generation.py) and the tool side (calls.py)
do the work. All three read and write through one Workspace: the session, the conversation's row,
its tools, settings and live events, and its rows as read once per Loop (the transcript, the newest
summary, the last row and its round), with the writes every side makes: a row appended, the row
lock, an audit event. Nothing here calls the model or runs a tool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import and_, bindparam, func, insert, select
from sqlalchemy.engine import Row
from sqlalchemy.orm import Session, make_transient_to_detached

from webapp import audit_chain
from webapp.agent import access
from webapp.agent.context import Window
from webapp.agent.transcript import tool_uses
from webapp.models import (
    AssistantSettings,
    Conversation,
    Message,
    ModelCall,
    Summary,
    Tenant,
    ToolCall,
    User,
    utcnow,
)
from webapp.tools.registry import ToolRegistry

_UNREAD = object()


@dataclass(frozen=True)
class Tail:
    """What a move's claim read of the conversation's newest rows (moves.py: subqueries of the claim's
    RETURNING), so the move starts without a query of its own for them: the last row's id, seq and
    role (None: no rows yet), the newest summary's id (None: never summarised), and the version of the
    tenant's tools and who may use them, which says whether the process's copy of them still holds."""

    last_id: int | None
    last_seq: int | None
    last_role: str | None
    summary_id: int | None
    tools_version: int | None = None  # the tenant's (models.Tenant.tools_version)


# The statements every move runs, built once: a statement object caches its own compiled form's
# key, so each move skips building the expression and its cache key (a tenth of a move's CPU).
_ROWS = Message.__table__
_TRANSCRIPT = (
    select(_ROWS.c.seq, _ROWS.c.role, _ROWS.c.content)
    .where(_ROWS.c.conversation_id == bindparam("conversation_id"), _ROWS.c.seq > bindparam("after"))
    .order_by(_ROWS.c.seq)
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
_APPEND = insert(Message.__table__).returning(Message.__table__.c.id)
_INSERTS = {ModelCall: insert(ModelCall.__table__)}
_CONVERSATIONS = Conversation.__table__
_HOLD = select(_CONVERSATIONS.c.id).where(_CONVERSATIONS.c.id == bindparam("conversation_id")).with_for_update()


class Events(Protocol):
    def publish(self, conversation_id: int, *events: dict) -> None: ...


class NoEvents:
    def publish(self, conversation_id: int, *events: dict) -> None:
        pass


@dataclass(frozen=True)
class LoopSettings:
    tool_output_limit: int = 8000
    window: Window | None = None  # None: every request is sent whole, whatever its size
    cache_history: bool = True  # the moving cache breakpoint on the newest block (off: only system and tools)


class Workspace:
    """One conversation as a Loop and its two sides see it (see the module docstring)."""

    def __init__(
        self,
        session: Session,
        conversation: Conversation,
        *,
        tools: ToolRegistry,
        settings: LoopSettings,
        events: Events,
        access_rules: dict[str, access.Access] | None = None,
        tail: Tail | None = None,
    ) -> None:
        self.session = session
        self.conversation = conversation
        self.tools = tools
        self.settings = settings
        self.events = events
        # Read once per Loop: the last row only changes through append(), and only the mover holding
        # the lease (or a web request that won the status compare-and-set) appends.
        self._last: Message | None | object = _UNREAD
        self._round: list[ToolCall] | None = None
        self._summary: Summary | None | object = _UNREAD
        self._usable: frozenset[str] | None = None  # the tools the owner may use, read once per Loop
        # The owner, held: the session's identity map keeps only what is referenced, and a tool move
        # reads the owner again to audit the call it runs as them (a second SELECT when let go).
        self._owner: User | None = None
        self._sqlite = session.get_bind().dialect.name == "sqlite"
        self._tail = tail  # what the move's claim read (None: read the rows when asked)
        self._access_rules = access_rules  # the tenant's rules as the process keeps them (None: read them)

    # --- reading ---------------------------------------------------------------------------------

    def rows(self, after: int = 0) -> list:
        """The transcript's rows after seq `after`, oldest first: each with its `seq`, `role` and
        `content` (plain rows, not ORM objects: the transcript is read on every model move)."""
        params = {"conversation_id": self.conversation.id, "after": after}
        return list(self.session.connection().execute(_TRANSCRIPT, params))  # Core rows: no ORM layer

    def summary(self) -> Summary | None:
        """The newest summary of the conversation's older turns, if it has one."""
        if self._summary is _UNREAD:
            if self._tail is not None:
                tail_id = self._tail.summary_id
                self._summary = None if tail_id is None else self.session.get(Summary, tail_id)
            else:
                self._summary = self.session.scalar(_SUMMARY, {"conversation_id": self.conversation.id})
        return self._summary

    def last_row(self) -> Message | None:
        """The transcript's last row (a query, unless this Loop appended it: the move's own decisions
        read last_seq(), last_role() and open_round(), which the claim answers)."""
        if self._last is _UNREAD:
            self._last = self.session.scalar(_LAST_ROW, {"conversation_id": self.conversation.id})
        return self._last

    def last_seq(self) -> int | None:
        if self._tail is not None:
            return self._tail.last_seq
        last = self.last_row()
        return last.seq if last is not None else None

    def last_role(self) -> str | None:
        if self._tail is not None:
            return self._tail.last_role
        last = self.last_row()
        return last.role if last is not None else None

    def open_round(self) -> list[ToolCall]:
        """The calls of the last assistant turn when it asked for tools and has no results yet.

        An assistant row asked for tools exactly when it has calls: a reply's tool_use blocks become
        its calls in the transaction that appends it (Calls.add_round; a stopped reply keeps only its
        text). So with the claim's tail the round is read without reading the row."""
        if self._round is None:
            if self._tail is not None:
                last_id = self._tail.last_id if self._tail.last_role == "assistant" else None
            else:
                last = self.last_row()
                asked = last is not None and last.role == "assistant" and tool_uses(last.content)
                last_id = last.id if asked else None
            self._round = [] if last_id is None else list(self.session.scalars(_ROUND, {"message_id": last_id}))
        return self._round

    def asker(self) -> Row:
        """The conversation's owner, their tenant's name and the tenant's AssistantSettings in force
        (None when the tenant never saved any)."""
        return self.session.execute(_ASKER, {"user_id": self.conversation.user_id}).one()

    def usable_tools(self) -> frozenset[str]:
        """The tools the conversation's owner may have the assistant use (webapp/agent/access.py)."""
        if self._usable is None:
            self._owner = self.session.get(User, self.conversation.user_id)
            self._usable = access.usable(self.session, self._owner, self.tools.names(), self._access_rules)
        return self._usable

    # --- writing ---------------------------------------------------------------------------------

    def hold(self) -> None:
        """Lock the conversation's row until the move commits, before writing anything else.

        Whatever writes to a conversation locks in one order: its row, then its calls, then the
        audit chain (decisions and a person's input take the row with lock_conversation()), so two
        writers never deadlock. A move takes it after its work (the tool, the model call), never
        before, so a decision on another call never waits for that work."""
        if self._sqlite:  # every SQLite transaction is BEGIN IMMEDIATE: the write lock is already ours
            return
        self.session.connection().execute(_HOLD, {"conversation_id": self.conversation.id})  # (no autoflush)

    def append(self, role: str, content: list[dict]) -> Message:
        """A new row at the end of the transcript, written at once (the calls of a round name it).

        Rows are append-only, so it is an INSERT of its own rather than a flush of the session (a third
        of the cost), and the Message is attached to the session as written."""
        last_seq = self.last_seq()
        seq = last_seq + 1 if last_seq is not None else 1  # (conversation_id, seq) is unique: a race fails loudly
        row = {"conversation_id": self.conversation.id, "seq": seq, "role": role, "content": content}
        row["created_at"] = utcnow()
        message = Message(id=self.session.connection().scalar(_APPEND, row), **row)
        make_transient_to_detached(message)
        self.session.add(message)
        self._last, self._round, self._tail = message, None, None
        return message

    def insert(self, table, row: dict) -> None:
        """A row nothing in the move reads again (a model call's usage), written at once, without the
        session's unit of work."""
        self.session.connection().execute(_INSERTS[table], row)

    def add_summary(self, summary: Summary) -> None:
        """A new summary of the older turns, the one the next request stands on."""
        self.session.add(summary)
        self.session.flush()
        self._summary = summary

    def audit(self, action: str, call: ToolCall | None = None, actor: User | None = None, **fields) -> None:
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


class OnWorkspace:
    """A part of the Loop: what it shares with the other parts is read through the workspace, never
    copied, so a setting changed on the Loop holds for every part at once."""

    workspace: Workspace

    @property
    def session(self) -> Session:
        return self.workspace.session

    @property
    def conversation(self) -> Conversation:
        return self.workspace.conversation

    @property
    def tools(self) -> ToolRegistry:
        return self.workspace.tools

    @property
    def settings(self) -> LoopSettings:
        return self.workspace.settings

    @settings.setter
    def settings(self, settings: LoopSettings) -> None:
        self.workspace.settings = settings

    @property
    def events(self) -> Events:
        return self.workspace.events

    @events.setter
    def events(self, events: Events) -> None:
        self.workspace.events = events
