"""The main navigation: each person sees only the pages their roles may use."""

from __future__ import annotations

from dataclasses import dataclass

from flask import current_app, request, url_for
from flask_login import current_user

from webapp.approvals.queries import pending_badge


@dataclass(frozen=True)
class NavItem:
    endpoint: str
    label: str
    roles: tuple[str, ...]
    hint: str
    badge_id: str | None = None


ITEMS = (
    NavItem(
        "conversations.index",
        "Conversations",
        ("agent", "reviewer", "auditor", "admin"),
        "talk with the assistant and follow its tool calls",
    ),
    NavItem("runs.index", "Runs", ("agent", "reviewer", "auditor", "admin"), "many questions at once, from a file"),
    NavItem(
        "approvals.index",
        "Approvals",
        ("reviewer",),
        "decide the tool calls waiting for a person",
        badge_id="approvals-badge",
    ),
    NavItem("audit.index", "Audit log", ("auditor", "admin"), "who did what, when, and what it cost"),
    NavItem("users.index", "Users", ("admin",), "people, roles and passwords"),
    NavItem("tokens.index", "API tokens", ("agent", "reviewer", "auditor", "admin"), "your tokens for programs"),
    NavItem("policies.index", "Policies", ("admin",), "which tool calls wait for people, and how many"),
    NavItem("assistant.index", "Assistant", ("admin",), "how the assistant writes, and its extra rules"),
    NavItem("notifications.index", "Notifications", ("admin",), "reminders of waiting calls: webhook and e-mail"),
    NavItem("mcp.index", "MCP servers", ("admin",), "tools from MCP servers, and changes to accept"),
)


def nav_items() -> list[dict]:
    """The items the signed-in person may use, among the pages this app has."""
    if not current_user.is_authenticated:
        return []
    items = []
    for item in ITEMS:
        if item.endpoint not in current_app.view_functions:
            continue
        if not any(current_user.has_role(role) for role in item.roles):
            continue
        badge = None
        if item.badge_id:
            badge = pending_badge(current_user)
        items.append(
            {
                "url": url_for(item.endpoint),
                "label": item.label,
                "hint": item.hint,
                "active": request.endpoint == item.endpoint,
                "badge": badge,
                "badge_id": item.badge_id,
            }
        )
    return items
