"""The home page: one part per role the person holds, each the first thing that role comes for.

- agent: their open conversations (anything not completed or stopped), newest activity first;
- reviewer: how many calls wait for a decision, and the oldest few;
- auditor: the tenant's latest audit events;
- admin: the setup checklist (policies, people, API tokens, the model, the assistant, failures, and
  held MCP tools when there are MCP servers), each item linked to the page that does it;
- operator: the fleet in figures (workers, slots, the queue), from Redis.

It sits at the top layer beside navigation.py (webapp/home/): it reads what several feature packages offer.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from flask import Blueprint, render_template, url_for
from flask_login import current_user
from rq import Worker
from sqlalchemy import func, select

from webapp.agent.states import ConversationStatus
from webapp.approvals import queries as inbox
from webapp.conversations.actions import STATUS_LABELS
from webapp.models import (
    ApiToken,
    AssistantSettings,
    AuditEvent,
    Conversation,
    EndpointGrant,
    McpTool,
    ModelEndpoint,
    Tenant,
    ToolCall,
    ToolPolicy,
    User,
    utcnow,
)
from webapp.ops.metrics import move_queue_counts, worker_slots
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.tools.presenting import plural
from webapp.web.security import anyone_signed_in

bp = Blueprint("home", __name__)

SHOWN = 5  # items per part
OPEN = (
    ConversationStatus.QUEUED,
    ConversationStatus.RUNNING,
    ConversationStatus.AWAITING_APPROVAL,
    ConversationStatus.AWAITING_TASK,
    ConversationStatus.BUDGET_EXHAUSTED,
    ConversationStatus.FAILED,
)


@dataclass(frozen=True)
class Check:
    """One step of an admin's setup: done or not, what it means, and where to do it."""

    done: bool
    title: str
    detail: str
    url: str


@bp.get("/")
@anyone_signed_in
def index():
    if current_user.is_operator:
        return render_template("home.html", fleet=fleet())
    parts = {}
    if current_user.has_role("agent"):
        parts["agent"] = open_conversations(current_user)
    if current_user.has_role("reviewer"):
        parts["reviewer"] = waiting_calls(current_user)
    if current_user.has_role("auditor"):
        parts["auditor"] = recent_events(current_user)
    if current_user.has_role("admin"):
        parts["admin"] = checklist(current_user)
    return render_template("home.html", parts=parts, status_labels=STATUS_LABELS)


def open_conversations(user: User) -> dict:
    mine = (
        (Conversation.tenant_id == user.tenant_id) & (Conversation.user_id == user.id) & Conversation.source.is_(None)
    )
    is_open = Conversation.status.in_([status.value for status in OPEN])
    rows = db.session.scalars(
        select(Conversation).where(mine, is_open).order_by(Conversation.updated_at.desc()).limit(SHOWN)
    ).all()
    total = db.session.scalar(select(func.count(Conversation.id)).where(mine, is_open))
    return {"conversations": rows, "total": total}


def waiting_calls(user: User) -> dict:
    oldest = db.session.scalars(inbox.pending(user).limit(SHOWN)).all()
    people = {}
    if oldest:
        ids = {call.acting_user_id for call in oldest}
        people = dict(db.session.execute(select(User.id, User.email).where(User.id.in_(ids))).all())
    count, total = inbox.pending_total(user)
    return {"calls": oldest, "count": count, "total": total, "people": people, "now": utcnow()}


def recent_events(user: User) -> dict:
    events = db.session.scalars(
        select(AuditEvent)
        .where(AuditEvent.tenant_id == user.tenant_id)
        .order_by(AuditEvent.created_at.desc(), AuditEvent.id.desc())
        .limit(SHOWN)
    ).all()
    return {"events": events}


def checklist(user: User) -> list[Check]:
    tenant = user.tenant_id
    policies = db.session.scalar(select(func.count(ToolPolicy.id)).where(ToolPolicy.tenant_id == tenant))
    people = db.session.scalars(select(User).where(User.tenant_id == tenant, User.active)).all()
    roles = {role: sum(person.has_role(role) for person in people) for role in ("agent", "reviewer")}
    now = utcnow()
    tokens = db.session.scalar(
        select(func.count(ApiToken.id))
        .join(User, User.id == ApiToken.user_id)
        .where(
            User.tenant_id == tenant,
            ApiToken.revoked_at.is_(None),
            (ApiToken.expires_at.is_(None)) | (ApiToken.expires_at > now),
        )
    )
    endpoint = db.session.scalar(  # only while the tenant may use it: a withdrawn one serves no more
        select(ModelEndpoint)
        .join(Tenant, Tenant.endpoint_id == ModelEndpoint.id)
        .join(EndpointGrant, (EndpointGrant.endpoint_id == ModelEndpoint.id) & (EndpointGrant.tenant_id == Tenant.id))
        .where(Tenant.id == tenant)
    )
    settings = db.session.scalar(select(func.count(AssistantSettings.id)).where(AssistantSettings.tenant_id == tenant))
    failed = db.session.scalar(
        select(func.count(Conversation.id)).where(
            Conversation.tenant_id == tenant, Conversation.status == ConversationStatus.FAILED
        )
    )
    mcp_tools = db.session.execute(
        select(func.count(McpTool.id), func.count(McpTool.id).filter(McpTool.held)).where(McpTool.tenant_id == tenant)
    ).one()
    default_model = services().config.model
    checks = [
        Check(
            policies > 0,
            "Policies set",
            f"{plural(policies, 'tool policy', 'tool policies')} {'says' if policies == 1 else 'say'} "
            "which calls wait for people"
            if policies
            else "No tool has a policy yet: every tool follows the desk's defaults.",
            url_for("policies.index"),
        ),
        Check(
            roles["agent"] > 0 and roles["reviewer"] > 0,
            "People in every role",
            f"{plural(roles['agent'], 'agent')} and {plural(roles['reviewer'], 'reviewer')} can sign in."
            if roles["agent"] and roles["reviewer"]
            else "Add at least one agent and one reviewer.",
            url_for("users.index"),
        ),
        Check(
            tokens > 0,
            "API tokens",
            f"{plural(tokens, 'active token')} {'lets' if tokens == 1 else 'let'} programs use the API."
            if tokens
            else "No program can use the API yet.",
            url_for("tokens.index"),
        ),
        Check(
            endpoint is not None,
            "Model endpoint",
            f"Conversations use {endpoint.model} at endpoint {endpoint.name}."
            if endpoint
            else f"Conversations use the desk's default model ({default_model}); the operators can give you one.",
            url_for("assistant.index"),
        ),
        Check(
            settings > 0,
            "The assistant's manner",
            "The assistant follows your register and rules."
            if settings
            else "The assistant writes in its default manner; give it your register and rules.",
            url_for("assistant.index"),
        ),
        Check(
            failed == 0,
            "Nothing failed",
            "No conversation is failed."
            if not failed
            else f"{plural(failed, 'failed conversation')} {'waits' if failed == 1 else 'wait'} for a retry.",
            url_for("ops.index"),
        ),
    ]
    total, held = mcp_tools
    if total:  # only for a tenant that uses MCP servers
        checks.append(
            Check(
                held == 0,
                "MCP tools as accepted",
                f"{plural(held, 'MCP tool')} held: {'its' if held == 1 else 'their'} server changed what "
                f"{'it does' if held == 1 else 'they do'}; look at the change."
                if held
                else ("The MCP tool does" if total == 1 else f"All {total} MCP tools do") + " what an admin accepted.",
                url_for("mcp.index"),
            )
        )
    return checks


def fleet() -> dict:
    """The fleet in figures for operators; `error` when Redis cannot be reached."""
    try:
        dispatcher = services().dispatcher
        workers = Worker.all(queue=dispatcher.queue)
        slots = [worker_slots(worker) for worker in workers]
        return {
            "workers": len(workers),
            "slots": sum(total for _, total in slots),
            "busy": sum(min(busy, total) for busy, total in slots),
            "counts": move_queue_counts(dispatcher),
            "waiting": db.session.scalar(select(func.count(ToolCall.id)).where(ToolCall.status == "awaiting_approval")),
            "error": None,
        }
    except (redis.RedisError, OSError) as exc:
        return {"error": f"Redis cannot be reached ({exc.__class__.__name__}); the queue's figures are unknown."}
