"""The app's long-lived collaborators, built once per process by create_app()."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from flask import current_app
from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from webapp.agent import access, gate
from webapp.agent.context import Window
from webapp.agent.loop import Loop, LoopSettings
from webapp.agent.workspace import Tail
from webapp.config import Config
from webapp.llm.choice import choice_for
from webapp.models import Conversation, Tenant
from webapp.runtime.background import BackgroundJobs
from webapp.runtime.live_events import LiveEvents
from webapp.runtime.queue import Dispatcher
from webapp.runtime.webhook_trigger import Subscribed
from webapp.tools import external, mcp
from webapp.tools.registry import ToolRegistry


@dataclass(frozen=True)
class TenantTools:
    """A tenant's tools as a process keeps them: its registry and who may use which, as of `version`
    (the tenant's tools_version, which the database moves on with every change to either)."""

    version: int | None
    registry: ToolRegistry
    access_rules: dict[str, access.Access]


@dataclass
class Services:
    config: Config
    dispatcher: Dispatcher  # the queues: what is enqueued, and which moves are alive
    tools: ToolRegistry  # the built-in tools; a tenant's conversations use tools_for(tenant)
    subscribed: Subscribed = field(default_factory=Subscribed, repr=False)  # tenants with webhooks
    live_events: LiveEvents | None = field(init=False, repr=False)  # what the open pages hear
    background: BackgroundJobs | None = field(init=False, repr=False)  # tools' background jobs (context.background)
    _tenant_tools: dict[int, TenantTools] = field(default_factory=dict, repr=False)
    _tenant_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        # Both over the dispatcher's Redis (one connection pool per process); a desk without one (the
        # loop's own tests) publishes nothing and has no background jobs.
        has_queue = self.dispatcher is not None
        self.live_events = LiveEvents(self.config, lambda: self.dispatcher.redis) if has_queue else None
        self.background = BackgroundJobs(self.dispatcher) if has_queue else None

    def tenant_tools(self, session: Session, tenant_id: int, version: int | None = None) -> TenantTools:
        """The tenant's registry (the built-in tools, its MCP servers' tools, webapp/tools/mcp/, and the
        tools its outside agents declared, webapp/tools/external.py) and
        its access rules, kept per process while the tenant's tools_version holds. `version`: that
        version as the caller read it in this transaction (a move's claim does), else it is read. A
        copy read after the version was is never older than it, so none is kept past a change."""
        if version is None:
            version = session.scalar(_TOOLS_VERSION, {"tenant_id": tenant_id})
        kept = self._tenant_tools.get(tenant_id)
        if kept is not None and kept.version == version:
            return kept
        gate.pin_defaults(session, self.tools)  # a release's looser default stays out of force until accepted
        more: list = mcp.tenant_tools(session, self.config, tenant_id)
        more += external.tenant_tools(session, tenant_id, {*self.tools.names(), *(tool.name for tool in more)})
        kept = TenantTools(
            version, self.tools.extended(more) if more else self.tools, access.accesses(session, tenant_id)
        )
        with self._tenant_lock:
            self._tenant_tools[tenant_id] = kept
        return kept

    def tools_for(self, session: Session, tenant_id: int) -> ToolRegistry:
        """The tenant's registry (see tenant_tools)."""
        return self.tenant_tools(session, tenant_id).registry

    def loop(self, session: Session, conversation: Conversation, should_stop=None, tail: Tail | None = None) -> Loop:
        """A Loop over this conversation with the model its run is served by (the tenant's endpoint, or
        the one its route chose), its tenant's tools and who may use them, and the process's event
        channel. `tail`: what a move's claim read (moves.py), the tenant's tools version included."""
        choice = choice_for(session, self.config, conversation.tenant_id, conversation.route, conversation.route_reason)
        tenant = self.tenant_tools(session, conversation.tenant_id, tail.tools_version if tail else None)
        return Loop(
            session,
            conversation,
            model=choice.client,
            tools=tenant.registry,
            access_rules=tenant.access_rules,
            tail=tail,
            settings=LoopSettings(
                tool_output_limit=self.config.tool_output_limit,
                window=Window(choice.context_window, self.config.max_tokens, compact_at=self.config.compact_at),
            ),
            events=self.live_events,
            should_stop=should_stop,
            background=self.background,
            router=choice.router,
            route=choice.reason,
        )


_TOOLS_VERSION = select(Tenant.tools_version).where(Tenant.id == bindparam("tenant_id"))


def services() -> Services:
    return current_app.extensions["desk"]
