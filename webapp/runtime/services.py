"""The app's long-lived collaborators, built once per process by create_app()."""

from __future__ import annotations

from dataclasses import dataclass

from flask import current_app
from sqlalchemy.orm import Session

from webapp.agent.context import Window
from webapp.agent.loop import Loop, LoopSettings
from webapp.config import Config
from webapp.llm.endpoints import model_client
from webapp.models import Conversation
from webapp.runtime.queue import Dispatcher
from webapp.tools.registry import ToolRegistry


@dataclass
class Services:
    config: Config
    dispatcher: Dispatcher
    tools: ToolRegistry

    def loop(self, session: Session, conversation: Conversation, should_stop=None) -> Loop:
        """A Loop over this conversation with the process's model client, tools and event channel."""
        return Loop(
            session,
            conversation,
            model=model_client(self.config),
            tools=self.tools,
            settings=LoopSettings(
                tool_output_limit=self.config.tool_output_limit,
                window=Window(
                    self.config.context_window_tokens, self.config.max_tokens, compact_at=self.config.compact_at
                ),
            ),
            events=self.dispatcher,
            should_stop=should_stop,
            background=self.dispatcher,
        )


def services() -> Services:
    return current_app.extensions["desk"]
