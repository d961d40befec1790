"""The loop's domain on a plain SQLAlchemy session, the real SDK and the model over local HTTP."""

from __future__ import annotations

import anthropic
import httpx2
import pytest
from sqlalchemy import select

from demo.billing.tools import demo_registry
from webapp.agent.loop import Loop, LoopSettings
from webapp.llm.client import ModelClient
from webapp.models import Conversation, User


@pytest.fixture
def model_client(model) -> ModelClient:
    sdk = anthropic.Anthropic(
        api_key="test-key", base_url=model.url, max_retries=0, timeout=5, http_client=httpx2.Client()
    )
    return ModelClient(sdk, "claude-test", 1024)


@pytest.fixture
def agent(session) -> User:
    return session.scalar(select(User).where(User.email == "agent@acme.test"))


@pytest.fixture
def new_loop(session, agent, model_client):
    """new_loop() -> a Loop over a fresh conversation of agent@acme.test."""

    def make(move_budget: int = 25, token_budget: int = 0, should_stop=None, tools=None, background=None) -> Loop:
        conversation = Conversation(
            tenant_id=agent.tenant_id,
            user_id=agent.id,
            status="queued",
            move_budget=move_budget,
            token_budget=token_budget,
        )
        session.add(conversation)
        session.flush()
        return Loop(
            session,
            conversation,
            model=model_client,
            tools=tools or demo_registry(),
            settings=LoopSettings(tool_output_limit=4000),
            should_stop=should_stop,
            background=background,
        )

    return make
