"""What people do with accounts that the pages, the API and the command line share: API tokens
(issue, list, revoke), unlocking an account that failed sign-ins locked, disabling a person, the
tenant's notification channels, and the model endpoints that serve the tenant. Each checks who may
do it, audits, and commits."""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import urlsplit

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from webapp import audit_chain, identity, notify, outbound
from webapp.config import Config
from webapp.conversations import actions as conversation_actions
from webapp.llm import endpoints
from webapp.models import MAX_ROW_ID, ApiToken, NotificationChannel, NotificationDelivery, Tenant, User, utcnow
from webapp.web.errors import Refused

NO_SUCH_TOKEN = "There is no such API token among yours (admins: among your organisation's)."


def token_data(row: ApiToken) -> dict:
    """What the audit log keeps of a token: never the token, only its number, name and first characters."""
    return {"token_id": row.id, "name": row.name, "prefix": row.prefix, "user_id": row.user_id, "email": row.user.email}


def may_manage(actor: User, owner: User) -> bool:
    """A person manages their own tokens; an admin also those of their tenant's people."""
    return actor.id == owner.id or (actor.has_role("admin") and owner.tenant_id == actor.tenant_id)


def tenant_user(session: Session, actor: User, user_id: int) -> User:
    """A user whose tokens the actor may manage; 404 otherwise, so other tenants' ids reveal nothing."""
    user = session.get(User, user_id) if 1 <= user_id <= MAX_ROW_ID else None
    if user is None or not may_manage(actor, user):
        raise Refused(404, "not_found", "There is no such user in your organisation.")
    return user


def find_token(session: Session, actor: User, token_id: int) -> ApiToken:
    row = session.get(ApiToken, token_id) if 1 <= token_id <= MAX_ROW_ID else None
    if row is None or not may_manage(actor, row.user):
        raise Refused(404, "not_found", NO_SUCH_TOKEN)
    return row


def tokens(session: Session, owner: User) -> list[ApiToken]:
    return identity.tokens_of(session, owner)


def issue(session: Session, actor: User, name: str, expires_in_days: int | None) -> tuple[ApiToken, str]:
    """A new token for the actor themself: its row and the token, seen only now. AccountError (a
    sentence's worth) when the name or expiry is not acceptable."""
    row, token = identity.issue_token(session, actor, name, expires_in_days)
    data = {**token_data(row), "expires_at": row.expires_at.isoformat() if row.expires_at else None}
    audit_chain.record(session, "api_token_created", tenant_id=actor.tenant_id, actor=actor, data=data)
    session.commit()
    return row, token


def revoke(session: Session, actor: User, token_id: int) -> tuple[ApiToken, bool]:
    """Revoke a token the actor may manage, for good; (the token, whether it was still unrevoked)."""
    row = find_token(session, actor, token_id)
    changed = identity.revoke_token(session, row)
    if changed:
        audit_chain.record(
            session, "api_token_revoked", tenant_id=row.user.tenant_id, actor=actor, data=token_data(row)
        )
        session.commit()
    return row, changed


def record_unlock(session: Session, actor: User, user: User, was_locked: bool) -> None:
    """Put on record that an admin lifted the lock of failed sign-ins from a user's account (the page
    forgets the failures, in the sign-in limits' store); audited whether it was locked or not, so who
    lifted a lock, or tried to, is on record."""
    audit_chain.record(
        session,
        "user_unlocked",
        tenant_id=actor.tenant_id,
        actor=actor,
        data={"user_id": user.id, "email": user.email, "was_locked": was_locked},
    )
    session.commit()


def disable_user(session: Session, admin: User, user: User) -> int | None:
    """Disable the user: they cannot sign in, their sessions end, their API tokens are revoked, and
    every conversation of theirs that is moving or waiting stops (its waiting calls settle as
    cancelled, saying why). None when they were already disabled; else how many conversations stopped.
    AccountError when an admin would disable themself."""
    if not identity.set_active(session, user, False, actor=admin):
        return None
    stopped = conversation_actions.stop_all_of(session, admin, user, f"{user.email}'s account was disabled")
    audit_chain.record(
        session,
        "user_disabled",
        tenant_id=admin.tenant_id,
        actor=admin,
        data={
            "user_id": user.id,
            "email": user.email,
            "conversations_stopped": [conversation.id for conversation, _ in stopped],
        },
    )
    session.commit()
    conversation_actions.after_commit(stopped)
    return len(stopped)


# --- notification channels (the admin page /admin/notifications) -------------------------------


def _channel_data(channel: NotificationChannel) -> dict:
    """What the audit log keeps of a channel: the webhook's host (its address may carry a token), the
    e-mail addresses; never the secret."""
    if channel.kind == "webhook":
        return {"channel_id": channel.id, "kind": "webhook", "host": urlsplit(channel.url or "").hostname}
    return {"channel_id": channel.id, "kind": "email", "recipients": list(channel.recipients or [])}


def _saved(session: Session, actor: User, channel: NotificationChannel, action: str) -> None:
    try:
        session.flush()
        audit_chain.record(session, action, tenant_id=actor.tenant_id, actor=actor, data=_channel_data(channel))
        session.commit()
    except IntegrityError:  # another admin made this channel a moment ago
        session.rollback()
        raise notify.ChannelError(
            "Another admin has just set this channel up; reload the page and try again."
        ) from None


def audit_refused_address(
    session: Session, error: Exception, purpose: str, tenant_id: int | None, actor: User | None, actor_label=None
) -> None:
    """An address refused by the outbound guard (behind `error`) is audited and committed, the rest
    of the attempt rolled back; an error of any other kind is left alone. `purpose`: what the
    address was for ("webhook", "mcp server", "model endpoint")."""
    refusal = outbound.refusal_behind(error)
    if refusal is None:
        return
    session.rollback()
    audit_chain.record(
        session,
        "outbound_refused",
        tenant_id=tenant_id,
        actor=actor,
        actor_label=actor_label,
        outcome="refused",
        data={"for": purpose, **refusal.audit_data()},
    )
    session.commit()


def save_webhook(session: Session, config: Config, actor: User, url: str) -> tuple[NotificationChannel, str | None]:
    """Set the tenant's webhook address; a new webhook gets a signing secret, returned this once
    (None when only the address changed). ChannelError says what is wrong with the address; a
    refused address is audited."""
    try:
        url = notify.webhook_url(url, config.outbound_allow)
    except notify.ChannelError as exc:
        audit_refused_address(session, exc, "webhook", actor.tenant_id, actor)
        raise
    channel = notify.channels(session, actor.tenant_id).get("webhook")
    secret = None
    if channel is None:
        secret = notify.new_secret()
        channel = NotificationChannel(
            tenant_id=actor.tenant_id, kind="webhook", secret_sealed=notify.seal_secret(config, secret)
        )
        channel.created_by_id = actor.id
        session.add(channel)
    channel.url, channel.updated_at = url, utcnow()
    _saved(session, actor, channel, "notification_channel_saved")
    return channel, secret


def rotate_webhook_secret(session: Session, config: Config, actor: User) -> str:
    """A new signing secret for the tenant's webhook, returned this once; the old one stops at once."""
    channel = notify.channels(session, actor.tenant_id).get("webhook")
    if channel is None:
        raise Refused(404, "not_found", "There is no webhook to rotate the secret of; set one up first.")
    secret = notify.new_secret()
    channel.secret_sealed, channel.updated_at = notify.seal_secret(config, secret), utcnow()
    _saved(session, actor, channel, "notification_secret_rotated")
    return secret


def save_email(session: Session, actor: User, addresses: str) -> NotificationChannel:
    """Set the addresses the tenant's reminders are e-mailed to. ChannelError names a bad one."""
    found = notify.recipients(addresses)
    channel = notify.channels(session, actor.tenant_id).get("email")
    if channel is None:
        channel = NotificationChannel(tenant_id=actor.tenant_id, kind="email", created_by_id=actor.id)
        session.add(channel)
    channel.recipients, channel.updated_at = found, utcnow()
    _saved(session, actor, channel, "notification_channel_saved")
    return channel


def remove_channel(session: Session, actor: User, kind: str) -> bool:
    """Stop notifying through this channel; its deliveries stay in the log. False if there was none."""
    channel = notify.channels(session, actor.tenant_id).get(kind)
    if channel is None:
        return False
    session.execute(
        update(NotificationDelivery).where(NotificationDelivery.channel_id == channel.id).values(channel_id=None)
    )
    data = _channel_data(channel)
    session.delete(channel)
    audit_chain.record(session, "notification_channel_removed", tenant_id=actor.tenant_id, actor=actor, data=data)
    session.commit()
    return True


def send_test(session: Session, config: Config, actor: User, kind: str) -> NotificationDelivery:
    """Send a test message through the channel now and log it; the delivery says how it went."""
    channel = notify.channels(session, actor.tenant_id).get(kind)
    if channel is None:
        raise Refused(404, "not_found", "There is no such channel to test; set it up first.")
    outcome = notify.send(session, config, channel, notify.test_notice(config, actor.tenant))
    row = notify.record(session, channel, None, "test", outcome, 1)
    session.commit()
    return row


def set_tenant_models(
    session: Session,
    tenant_slug: str,
    endpoint_name: str | None,
    small_endpoint_name: str | None | object = endpoints.KEEP,
    *,
    allow: bool = False,
    actor: User | None = None,
    actor_label: str | None = None,
) -> TenantModels:
    """Serve the tenant from an endpoint (None: the desk's default model), with a small endpoint that
    routes simple questions to itself (None: no routing; endpoints.KEEP: as it is). A tenant's admin
    may name only endpoints their tenant may use: any other is refused (EndpointNotAllowed) and the
    refused attempt audited on the tenant's chain in a transaction of its own. `allow` is for
    operators: an endpoint named is allowed for the tenant if it was not (audited as such). Audited
    and committed; an EndpointError (nothing changed) says what to fix."""
    try:
        tenant, allowed = endpoints.set_tenant_endpoint(
            session, tenant_slug, endpoint_name, small_endpoint_name, allow=allow
        )
    except endpoints.EndpointNotAllowed as refused:
        session.rollback()  # nothing of the attempt stays; only its record
        audit_chain.record(
            session,
            "tenant_model_refused",
            tenant_id=refused.tenant_id,
            actor=actor,
            actor_label=actor_label,
            outcome="refused",
            data={
                "endpoint": _as_typed(endpoint_name) or "default",
                "small_endpoint": None if small_endpoint_name is endpoints.KEEP else _as_typed(small_endpoint_name),
                "refused": str(refused),
            },
        )
        session.commit()
        raise
    except endpoints.EndpointError:
        session.rollback()
        raise
    for endpoint in allowed:
        change = endpoints.AccessChange(endpoint, allowed=[tenant.slug])
        endpoints.record_access_change(session, change, actor=actor, actor_label=actor_label)
    name, small_name = endpoints.endpoint_names(session, tenant)
    audit_chain.record(
        session,
        "tenant_model_set",
        tenant_id=tenant.id,
        actor=actor,
        actor_label=actor_label,
        data={"endpoint": name, "small_endpoint": small_name},
    )
    session.commit()
    return TenantModels(tenant, name, small_name, [endpoint.name for endpoint in allowed])


class TenantModels(NamedTuple):
    """A tenant's models after a change: its endpoint's name ("default": the configured model), its
    small endpoint's (None: no routing), and the endpoints the change allowed for it."""

    tenant: Tenant
    endpoint: str
    small_endpoint: str | None
    allowed: list[str]


def _as_typed(name: object) -> str | None:
    """A name as a person gave it, cut to what the audit log keeps of it."""
    return None if name is None else str(name)[:120]
