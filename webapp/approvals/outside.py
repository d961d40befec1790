"""What outside agents do through the API (webapp/agent/outside.py has the calls' domain): ask about a
call, wait for its decision, report what it did, give it up. Declaring their tools is the admins'
(webapp/settings/external_tools.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import redis
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from webapp.agent import outside
from webapp.agent.states import CallStatus
from webapp.conversations.actions import SUPERVISING
from webapp.conversations.event_stream import follow
from webapp.models import ToolCall, User
from webapp.runtime.extensions import db

if TYPE_CHECKING:
    from flask import Flask
from webapp.approvals.actions import ApprovalRefused
from webapp.runtime.live_hub import INTERRUPTED
from webapp.runtime.services import services

MAX_WAIT_SECONDS = 60  # the longest one GET /api/calls/<id>?wait= holds (webapp/api/calls.py CallQuery)
LOOK_SECONDS = 2.0  # a wait reads the call again at least this often (a lost signal costs no more)
KIND = {  # of each OutsideError code
    "unknown_tool": "invalid",
    "invalid_input": "invalid",
    "idempotency_conflict": "conflict",
    "not_yours": "forbidden",
    "not_approved": "conflict",
    "already_reported": "conflict",
    "too_large": "invalid",
}


class OutsideRefused(ApprovalRefused):
    """An outside call refused: `field` names the request field to change, `problems` the arguments."""

    def __init__(self, exc: outside.OutsideError) -> None:
        super().__init__(KIND.get(exc.code, "conflict"), exc.code, exc.message)
        self.field, self.problems = exc.field, exc.problems


# --- calls ----------------------------------------------------------------------------------------------


def ask(session: Session, agent: User, **request: Any) -> tuple[ToolCall, bool]:
    """The call for this request (webapp/agent/outside.py `ask`), committed and on the inbox pages."""
    tools = services().tools_for(session, agent.tenant_id)
    try:
        call, created = outside.ask(session, agent, tools, **request)
    except outside.OutsideError as exc:
        raise OutsideRefused(exc) from None
    if created:
        session.commit()
        services().live_events.changed(call.tenant_id, call.conversation_id)
    return call, created


def find(session: Session, user: User, call_id: int) -> ToolCall:
    """An outside call this person may read: of their tenant, and their own unless they supervise."""
    call = session.scalar(
        select(ToolCall).where(
            ToolCall.id == call_id, ToolCall.tenant_id == user.tenant_id, ToolCall.source.is_not(None)
        )
    )
    if call is None:
        raise ApprovalRefused("missing", "not_found", f"No call {call_id} from an outside agent in your account.")
    if call.acting_user_id != user.id and not any(user.has_role(role) for role in SUPERVISING):
        raise ApprovalRefused("forbidden", "forbidden", "This call was asked for by another agent.")
    return call


def wait(app: Flask, user: User, call: ToolCall, seconds: int) -> ToolCall:
    """The call once it no longer waits for a decision, or as it is after `seconds`. The wait holds no
    database session: it follows the call's live channel (the pages' own) and reads the call again
    when something changed, and every LOOK_SECONDS in case a signal was lost."""
    if seconds <= 0 or call.status != CallStatus.AWAITING_APPROVAL:
        return call
    call_id, conversation_id, user_id = call.id, call.conversation_id, user.id
    db.session.remove()
    too_many = "Too many waits and live streams are open, yours or this server's; try again."
    try:
        listener = follow(user_id, conversation_id, ApprovalRefused("too_many", "too_many_streams", too_many))
    except (redis.RedisError, OSError):
        listener = None  # Redis is away: read the call every LOOK_SECONDS instead

    def waiting() -> bool:
        with app.app_context():
            try:
                return db.session.scalar(select(ToolCall.status).where(ToolCall.id == call_id)) == (
                    CallStatus.AWAITING_APPROVAL
                )
            except SQLAlchemyError:
                return True
            finally:
                db.session.remove()

    deadline = time.monotonic() + seconds
    try:
        while waiting() and (left := deadline - time.monotonic()) > 0:
            if listener is None:
                time.sleep(min(LOOK_SECONDS, left))
            elif listener.get(timeout=min(LOOK_SECONDS, left)) is INTERRUPTED:
                listener.close()
                listener = None
    finally:
        if listener is not None:
            listener.close()
    return db.session.get(ToolCall, call_id)


def report(session: Session, agent: User, call_id: int, *, ok: bool, summary: str, output: Any) -> ToolCall:
    call = find(session, agent, call_id)
    try:
        changed = outside.report(session, agent, call, ok=ok, summary=summary, output=output)
    except outside.OutsideError as exc:
        raise OutsideRefused(exc) from None
    if changed:
        session.commit()
        services().live_events.changed(call.tenant_id, call.conversation_id)
    return call


def cancel(session: Session, agent: User, call_id: int, reason: str) -> ToolCall:
    """The agent gives up a call that still waits (answered the same when it no longer waits)."""
    call = find(session, agent, call_id)
    if call.acting_user_id != agent.id:
        raise ApprovalRefused("forbidden", "not_yours", "Only the agent whose token asked for this call gives it up.")
    if call.status == CallStatus.AWAITING_APPROVAL:
        outside.cancel(session, call, agent, reason or f"{call.source} no longer needs it.")
        session.commit()
        services().live_events.changed(call.tenant_id, call.conversation_id)
    return call
