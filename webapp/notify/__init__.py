"""Telling a tenant's people that tool calls wait for them: a reminder when a call has waited past its
policy's reminder time, an escalation to the tenant's admins when its time to decide nearly ran out.

A tenant's channels are a webhook (a Slack-compatible JSON body, signed with the tenant's secret) and
e-mail through the desk's SMTP server. The sweep marks what is due (agent/sweeper.py `due_notices`)
and enqueues one delivery job per channel; each job sends one notice here and logs the attempt in
`notification_deliveries`, and RQ retries a failed one with backoff. Messages are written for people:
the tool in words (tools/presenting.py), never the text written for the model.

A webhook reaches only public addresses (webapp/outbound/; OUTBOUND_ALLOW names the exceptions):
its address is checked when saved and every send connects through the guard. What the receiver
answers is never shown beyond its HTTP status, and every failure to get an answer reads the same.

The webhook is signed twice. As the Standard Webhooks specification says (as the tenant's event
webhooks are, webapp/webhooks/): `webhook-id` (the notice's, the same at every attempt),
`webhook-timestamp` and `webhook-signature: v1,<base64>`, which the `standardwebhooks` library checks
with the channel's `whsec_` secret. And, as before, as Slack signs its own requests: `X-Desk-Timestamp`
(Unix seconds) and `X-Desk-Signature: v1=<hex>`, the HMAC-SHA256 with the secret of
`v1:<timestamp>:<body>`. (A secret made before the first signature existed, not base64 after its
prefix, signs only the second: rotating it gives one that signs both.)
"""

from webapp.notify.channel import (
    CHANNEL_KINDS,
    KINDS,
    MAX_RECIPIENTS,
    SECRET_PURPOSE,
    ChannelError,
    DeliveryFailed,
    channel_ids_by_tenant,
    channel_secret,
    channels,
    new_secret,
    recent_deliveries,
    recipients,
    seal_secret,
    signature,
    standard_headers,
    webhook_url,
)
from webapp.notify.notices import Notice, email_message, notice_for, test_notice, webhook_body
from webapp.notify.sending import Outcome, admin_addresses, deliver, record, send, send_mail, send_webhook

__all__ = [
    "KINDS",
    "CHANNEL_KINDS",
    "SECRET_PURPOSE",
    "MAX_RECIPIENTS",
    "ChannelError",
    "DeliveryFailed",
    "webhook_url",
    "recipients",
    "new_secret",
    "seal_secret",
    "channel_secret",
    "signature",
    "standard_headers",
    "channels",
    "channel_ids_by_tenant",
    "recent_deliveries",
    "Notice",
    "notice_for",
    "test_notice",
    "webhook_body",
    "email_message",
    "Outcome",
    "send_webhook",
    "send_mail",
    "admin_addresses",
    "send",
    "record",
    "deliver",
]
