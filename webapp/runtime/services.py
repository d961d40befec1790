"""The app's long-lived collaborators, built once per process by create_app()."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from flask import current_app
from sqlalchemy.orm import Session

from webapp.agent.context import Window
from webapp.agent.loop import Loop, LoopSettings
from webapp.config import Config
from webapp.llm.endpoints import choice_for
from webapp.models import Conversation
from webapp.runtime.queue import Dispatcher
from webapp.tools import mcp
from webapp.tools.registry import ToolRegistry


@dataclass
class Services:
    config: Config
    dispatcher: Dispatcher
    tools: ToolRegistry  # the built-in tools; a tenant's conversations use tools_for(tenant)
    _tenant_tools: dict[int, tuple[tuple, ToolRegistry]] = field(default_factory=dict, repr=False)
    _tenant_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def tools_for(self, session: Session, tenant_id: int) -> ToolRegistry:
        """The tenant's registry: the built-in tools and its MCP servers' tools (webapp/tools/mcp.py), kept
        per process and built again when its servers or their tools change."""
        stamp = mcp.stamp(session, tenant_id)
        kept = self._tenant_tools.get(tenant_id)
        if kept is not None and kept[0] == stamp:
            return kept[1]
        registry = self.tools.extended(mcp.tenant_tools(session, self.config, tenant_id)) if stamp else self.tools
        with self._tenant_lock:
            self._tenant_tools[tenant_id] = (stamp, registry)
        return registry

    def loop(self, session: Session, conversation: Conversation, should_stop=None) -> Loop:
        """A Loop over this conversation with the model its run is served by (the tenant's endpoint, or
        the one its route chose), its tenant's tools and the process's event channel."""
        choice = choice_for(session, self.config, conversation.tenant_id, conversation.route, conversation.route_reason)
        return Loop(
            session,
            conversation,
            model=choice.client,
            tools=self.tools_for(session, conversation.tenant_id),
            settings=LoopSettings(
                tool_output_limit=self.config.tool_output_limit,
                window=Window(choice.context_window, self.config.max_tokens, compact_at=self.config.compact_at),
            ),
            events=self.dispatcher,
            should_stop=should_stop,
            background=self.dispatcher,
            router=choice.router,
            route=choice.reason,
        )


def services() -> Services:
    return current_app.extensions["desk"]
