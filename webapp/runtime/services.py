"""The app's long-lived collaborators, built once per process by create_app()."""

from __future__ import annotations

from dataclasses import dataclass

from flask import current_app
from sqlalchemy.orm import Session

from webapp.agent.context import Window
from webapp.agent.loop import Loop, LoopSettings
from webapp.config import Config
from webapp.llm.endpoints import choice_for
from webapp.models import Conversation
from webapp.runtime.queue import Dispatcher
from webapp.tools.registry import ToolRegistry


@dataclass
class Services:
    config: Config
    dispatcher: Dispatcher
    tools: ToolRegistry

    def loop(self, session: Session, conversation: Conversation, should_stop=None) -> Loop:
        """A Loop over this conversation with the model its run is served by (the tenant's endpoint, or
        the one its route chose), the process's tools and event channel."""
        choice = choice_for(session, self.config, conversation.tenant_id, conversation.route, conversation.route_reason)
        return Loop(
            session,
            conversation,
            model=choice.client,
            tools=self.tools,
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
