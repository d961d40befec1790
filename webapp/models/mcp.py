"""A tenant's MCP servers and their tools, and the secrets of the desk's environment granted to a
tenant for their headers."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from webapp.models.base import Base, JSONType, UTCDateTime, utcnow


class McpServer(Base):
    """A Model Context Protocol server of a tenant: reached over streamable HTTP at `url` (added by the
    tenant's admins or an operator), or started by the desk from `command` (stdio, added only by an
    operator: the command line or /ops/mcp). `headers` are sent with every HTTP request: a list of
    {"name", "sealed", "operator"} (the value encrypted with a key derived from SECRET_KEY) or
    {"name", "env", "operator"} (read from that environment variable at each use; "operator" says an
    operator set it, else only a secret granted to the tenant is read, SecretGrant); values are never
    shown back.
    A started server's process gets PATH and `environment` only (the same {"name", "sealed"} or
    {"name", "env"} entries), in `working_directory` when set. `command_by_operator`: an operator
    set the command; a command a tenant's admin set before only operators could is never started.
    `version` goes up with every change to the server or its tools, so each process rebuilds the
    tenant's tool registry when it moves (webapp/runtime/services.py)."""

    __tablename__ = "mcp_servers"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(40))
    url: Mapped[str | None] = mapped_column(String(500))
    command: Mapped[str | None] = mapped_column(Text)
    headers: Mapped[list] = mapped_column(JSONType, default=list)
    environment: Mapped[list] = mapped_column(JSONType, default=list)
    working_directory: Mapped[str | None] = mapped_column(String(500))
    command_by_operator: Mapped[bool] = mapped_column(Boolean, default=False)
    version: Mapped[int] = mapped_column(Integer, default=1)
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    synced_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    tools: Mapped[list[McpTool]] = relationship(
        back_populates="server", cascade="all, delete-orphan", order_by="McpTool.remote_name"
    )

    __table_args__ = (UniqueConstraint("tenant_id", "name", name="uq_mcp_servers_tenant_name"),)


class SecretGrant(Base):
    """An environment variable the operator lets one tenant's admins name (an MCP server's header or
    environment, `$NAME`): a tenant admin can name only the secrets granted to their tenant."""

    __tablename__ = "secret_grants"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    granted_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    granted_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (UniqueConstraint("name", "tenant_id", name="uq_secret_grants_name_tenant"),)


class McpTool(Base):
    """One tool of an MCP server, as it joins its tenant's registry under `registry_name`. The
    description, input schema and annotations an admin accepted are what the model is offered; the
    server's current ones are kept beside them. When they differ (their fingerprints), the tool is
    `held`: not offered, and a call of it refused, until an admin accepts the change."""

    __tablename__ = "mcp_tools"

    id: Mapped[int] = mapped_column(primary_key=True)
    server_id: Mapped[int] = mapped_column(ForeignKey("mcp_servers.id", ondelete="CASCADE"), index=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    registry_name: Mapped[str] = mapped_column(String(128))
    remote_name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="")
    input_schema: Mapped[dict] = mapped_column(JSONType)
    annotations: Mapped[dict] = mapped_column(JSONType, default=dict)
    fingerprint: Mapped[str] = mapped_column(String(64))
    current_description: Mapped[str] = mapped_column(Text, default="")
    current_input_schema: Mapped[dict] = mapped_column(JSONType)
    current_annotations: Mapped[dict] = mapped_column(JSONType, default=dict)
    current_fingerprint: Mapped[str] = mapped_column(String(64))
    held: Mapped[bool] = mapped_column(Boolean, default=False)
    accepted_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    accepted_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # what an admin told the desk of its arguments (webapp/tools/mcp/mapping.py set_mapping): which is the money
    # it moves and in what unit, which names what it acts on, and a read-only tool of the same server
    # whose live result a reviewer sees as the facts: {"amount": {"argument", "unit"}, "subject":
    # {"argument"}, "facts": {"tool", "arguments": {its argument: the call's argument}}}
    mapping: Mapped[dict | None] = mapped_column(JSONType)

    server: Mapped[McpServer] = relationship(back_populates="tools")

    __table_args__ = (UniqueConstraint("tenant_id", "registry_name", name="uq_mcp_tools_tenant_registry_name"),)
