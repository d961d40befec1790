"""The model endpoints an operator registers, and the tenants each may serve."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from webapp.models.base import Base, UTCDateTime, utcnow


class ModelEndpoint(Base):
    """A model endpoint an operator registered (`flask endpoint add`): an Anthropic-compatible server,
    the model to ask there, and how to talk to it. Its API key is stored encrypted, or read from the
    environment variable it names; none for local servers that ignore keys."""

    __tablename__ = "model_endpoints"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    base_url: Mapped[str] = mapped_column(String(500))
    model: Mapped[str] = mapped_column(String(120))
    protocol: Mapped[str] = mapped_column(String(16), default="tools")  # tools | react
    context_window: Mapped[int | None] = mapped_column(Integer)  # None: CONTEXT_WINDOW_TOKENS
    api_key_encrypted: Mapped[str | None] = mapped_column(Text)
    api_key_env: Mapped[str | None] = mapped_column(String(120))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class EndpointGrant(Base):
    """A tenant that may use a model endpoint: an operator allowed it (`flask endpoint allow`, the
    endpoint's page, or `flask tenant set-model`). Only then may the tenant's admins choose it, and
    only then does it serve the tenant; no row, no use (the operator's key is never a tenant's to take)."""

    __tablename__ = "endpoint_tenants"

    endpoint_id: Mapped[int] = mapped_column(ForeignKey("model_endpoints.id"), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), primary_key=True, index=True)
    granted_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
