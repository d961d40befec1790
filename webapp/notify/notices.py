"""What a notice says, in words for people: the waiting call, its tool in words, the link to decide it;
as a webhook's JSON body or as an e-mail."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from email.message import EmailMessage

from sqlalchemy.orm import Session

from webapp.config import Config
from webapp.models import Tenant, ToolCall, User, utcnow
from webapp.tools.presenting import arguments, duration
from webapp.tools.registry import ToolRegistry


@dataclass(frozen=True)
class Notice:
    kind: str  # reminder | escalation | test
    title: str  # the subject line, and the message's first line
    lines: tuple[str, ...]
    url: str  # the decision page (the inbox for a test)
    id: str = ""  # the webhook-id it is sent with: a call's reminder keeps it at every attempt

    @property
    def text(self) -> str:
        return "\n".join((self.title, *self.lines, f"Decide: {self.url}"))


def notice_for(session: Session, config: Config, tools: ToolRegistry, call: ToolCall, kind: str) -> Notice:
    """The reminder or the escalation of a waiting call, in words for people."""
    now = utcnow()
    tool = tools.get(call.name)
    title = tool.title if tool else call.name
    shown = [
        f"{item.label}: {item.text}" for item in arguments(tool.argument_names() if tool else [], call.input or {})
    ]
    shown = [line if len(line) <= 200 else line[:199] + "…" for line in shown]
    requester = session.get(User, call.acting_user_id)
    waited = duration((now - call.created_at).total_seconds())
    asker = f"the outside agent {call.source}" if call.source else "the assistant"
    lines = [f"{title}, asked by {asker} for {requester.label if requester else 'someone'}.", *shown]
    lines.append(f"Waiting for a decision for {waited}.")
    if call.expires_at is not None:
        left = duration((call.expires_at - now).total_seconds())
        lines.append(f"Expires at {call.expires_at:%Y-%m-%d %H:%M} UTC (in {left}); then nothing is done.")
    if kind == "escalation":
        heading = f"Escalation: “{title}” is about to expire undecided (waiting {waited})"
    else:
        heading = f"Reminder: “{title}” has waited {waited} for a decision"
    return Notice(kind, heading, tuple(lines), f"{config.public_url}/approvals/{call.id}", f"ntf_{kind}_{call.id}")


def test_notice(config: Config, tenant: Tenant) -> Notice:
    return Notice(
        "test",
        f"Test from the approval desk of {tenant.name}",
        ("This channel works: reminders of calls waiting for a decision, and escalations, will arrive here.",),
        f"{config.public_url}/approvals",
        f"ntf_test_{secrets.token_hex(8)}",
    )


def webhook_body(notice: Notice) -> bytes:
    """Slack-compatible: `text` for notifications and clients without blocks, `blocks` for the message."""
    blocks = [
        {"type": "header", "text": {"type": "plain_text", "text": notice.title[:150]}},
        {"type": "section", "text": {"type": "plain_text", "text": "\n".join(notice.lines)[:3000]}},
        {
            "type": "actions",
            "elements": [
                {
                    "type": "button",
                    "text": {"type": "plain_text", "text": "Open the decision page"},
                    "url": notice.url,
                    **({"style": "danger"} if notice.kind == "escalation" else {}),
                }
            ],
        },
    ]
    mark = ":rotating_light: " if notice.kind == "escalation" else ""
    return json.dumps({"text": f"{mark}{notice.title}: {notice.url}", "blocks": blocks}).encode()


def email_message(config: Config, notice: Notice, to: list[str]) -> EmailMessage:
    message = EmailMessage()
    message["Subject"] = notice.title
    message["From"] = config.smtp_from
    message["To"] = ", ".join(to)
    if notice.kind == "escalation":
        message["Importance"] = "high"
    message.set_content(notice.text + "\n")
    return message
