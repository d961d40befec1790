"""The database schema: plain SQLAlchemy 2 typed models, importable without Flask.

Flask-SQLAlchemy is handed this metadata in create_app(); the agent domain uses ordinary
sqlalchemy.orm.Session objects, so it stays free of Flask and RQ.

The tables live in one module per what they belong to; this package is their one face
(`from webapp.models import ToolCall`). Importing it imports every module, so `Base.metadata`
holds every table (Alembic's migrations and the tests compare against it) and relationships named
across modules (`Mapped[User]` in calls.py) resolve when the mappers are configured.
"""

from webapp.models.audit import AuditEvent, AuditHead
from webapp.models.base import MAX_MONEY_CENTS, MAX_ROW_ID, NAMING, Base, JSONType, UTCDateTime, utcnow
from webapp.models.calls import Decision, ToolCall
from webapp.models.conversations import Conversation, Message, ModelCall, Summary
from webapp.models.endpoints import EndpointGrant, ModelEndpoint
from webapp.models.mcp import McpServer, McpTool, SecretGrant
from webapp.models.notifications import (
    NotificationChannel,
    NotificationDelivery,
    WebhookDelivery,
    WebhookSubscription,
)
from webapp.models.outside import ExternalCall, ExternalTool
from webapp.models.people import (
    OPERATIONS_SLUG,
    OPERATOR,
    ROLES,
    ApiToken,
    AssistantSettings,
    RoleChange,
    Tenant,
    User,
    UserKeying,
    UserSession,
)
from webapp.models.policies import PolicyChange, ToolAccess, ToolCeiling, ToolDefault, ToolPolicy
from webapp.models.runs import BatchRequest, Run, RunItem

__all__ = [
    "MAX_MONEY_CENTS",
    "MAX_ROW_ID",
    "NAMING",
    "OPERATIONS_SLUG",
    "OPERATOR",
    "ROLES",
    "ApiToken",
    "AssistantSettings",
    "AuditEvent",
    "AuditHead",
    "Base",
    "BatchRequest",
    "Conversation",
    "Decision",
    "EndpointGrant",
    "ExternalCall",
    "ExternalTool",
    "JSONType",
    "McpServer",
    "McpTool",
    "Message",
    "ModelCall",
    "ModelEndpoint",
    "NotificationChannel",
    "NotificationDelivery",
    "PolicyChange",
    "RoleChange",
    "Run",
    "RunItem",
    "SecretGrant",
    "Summary",
    "Tenant",
    "ToolAccess",
    "ToolCall",
    "ToolCeiling",
    "ToolDefault",
    "ToolPolicy",
    "UTCDateTime",
    "User",
    "UserKeying",
    "UserSession",
    "WebhookDelivery",
    "WebhookSubscription",
    "utcnow",
]
