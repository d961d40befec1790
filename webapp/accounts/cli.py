"""The people's commands: `flask create-user`, `create-operator`, `create-token`, `revoke-token` and
`role-change list|approve|reject` (the operator as the second pair of eyes). Their names and
arguments are a contract.

The command line is the operator's, who holds the host: `create-user --role admin` gives the role at
once and `create-token` keys nobody (accounts/four_eyes.py records only what a person did)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import click
from flask import Flask
from flask.cli import AppGroup, with_appcontext
from sqlalchemy import select

from webapp import audit_chain, identity
from webapp.accounts import actions as account_actions
from webapp.accounts import four_eyes
from webapp.identity import (
    MAX_TOKEN_DAYS,
    AccountError,
    create_operator,
    create_user,
    find_token,
    get_or_create_tenant,
    issue_token,
    revoke_token,
)
from webapp.models import ROLES, Tenant, User
from webapp.refusals import Refusal
from webapp.runtime.extensions import db


def register(app: Flask) -> None:
    _register_people(app)
    _register_role_changes(app)


@contextmanager
def _refused() -> Iterator[None]:
    """What the desk refused (an AccountError) is rolled back and becomes the command's usage error."""
    try:
        yield
    except AccountError as exc:
        db.session.rollback()
        raise click.UsageError(str(exc)) from None


def _record(action: str, tenant_id: int | None, data: dict) -> None:
    """Write what the command line did to the audit log, and commit it."""
    audit_chain.record(db.session, action, tenant_id=tenant_id, actor_label="command line", data=data)
    db.session.commit()


@click.command("create-user")
@click.argument("email")
@click.option(
    "--role",
    "roles",
    multiple=True,
    required=True,
    type=click.Choice(ROLES),
    help="Repeat for several roles.",
)
@click.option("--tenant", "tenant_slug", required=True, help="Tenant slug; created if missing.")
@click.option("--password", required=True, help="At least 8 characters.")
@click.option("--name", "display_name", default="", help="Display name.")
@with_appcontext
def create_user_command(email, roles, tenant_slug, password, display_name):
    """Create a user with one or more roles in a tenant."""
    with _refused():
        tenant = get_or_create_tenant(db.session, tenant_slug)
        user = create_user(db.session, email, password, list(roles), tenant, display_name)
    db.session.commit()
    click.echo(f"Created {user.email} ({', '.join(user.roles)}) in tenant {tenant.slug}.")


@click.command("create-operator")
@click.argument("email")
@click.option(
    "--password",
    prompt=True,
    hide_input=True,
    confirmation_prompt=True,
    help="At least 8 characters (asked for when not given).",
)
@click.option("--name", "display_name", default="", help="Display name.")
@with_appcontext
def create_operator_command(email, password, display_name):
    """Create an operator: a person of no tenant who sees the whole fleet on /ops and /metrics and
    nothing of any tenant (no conversations, approvals, audit log or admin pages)."""
    with _refused():
        user = create_operator(db.session, email, password, display_name)
    _record("operator_created", user.tenant_id, {"user_id": user.id, "email": user.email})
    click.echo(
        f"Created operator {user.email}: signs in to see every worker, queue and failed job on /ops and the "
        "fleet's figures on /metrics, and no tenant's pages."
    )


@click.command("create-token")
@click.argument("email")
@click.option("--name", default="", help="What the token is for (shown on the tokens page).")
@click.option(
    "--expires-days",
    type=click.IntRange(1, MAX_TOKEN_DAYS),
    default=None,
    help="Days until it stops working by itself (default: until revoked).",
)
@with_appcontext
def create_token_command(email, name, expires_days):
    """Issue an API token for a user; the token is the last line printed."""
    user = db.session.scalar(select(User).where(User.email == email.strip().lower()))
    if user is None or not user.active:
        raise click.UsageError(f"No active user {email}; create one with create-user.")
    if user.is_operator:
        raise click.UsageError(
            f"{user.email} is an operator, and the API is for tenants' people: operators sign in to /ops and "
            "/metrics in a browser, and Prometheus scrapes /metrics with METRICS_TOKEN."
        )
    with _refused():
        row, token = issue_token(db.session, user, name, expires_days)
    data = {"token_id": row.id, "name": row.name, "prefix": row.prefix, "user_id": user.id, "email": user.email}
    _record("api_token_created", user.tenant_id, data)
    click.echo(f"API token #{row.id} for {user.email} (shown once, store it now):")
    click.echo(token)


@click.command("revoke-token")
@click.argument("token")
@with_appcontext
def revoke_token_command(token):
    """Revoke an API token for good, by its number or its first characters (as the tokens page shows them)."""
    try:
        row = find_token(db.session, token)
    except AccountError as exc:
        raise click.UsageError(str(exc)) from None
    label = f"#{row.id}{' ' + row.prefix if row.prefix else ''}{' (' + row.name + ')' if row.name else ''}"
    if not revoke_token(db.session, row):
        click.echo(f"API token {label} of {row.user.email} was already revoked.")
        return
    data = {"token_id": row.id, "name": row.name, "prefix": row.prefix, "user_id": row.user_id, "email": row.user.email}
    _record("api_token_revoked", row.user.tenant_id, data)
    click.echo(f"Revoked API token {label} of {row.user.email}; programs using it are refused from now on.")


def _register_people(app: Flask) -> None:
    """`flask create-user|create-operator|create-token|revoke-token`."""
    app.cli.add_command(create_user_command)
    app.cli.add_command(create_operator_command)
    app.cli.add_command(create_token_command)
    app.cli.add_command(revoke_token_command)


def _register_role_changes(app: Flask) -> None:
    """`flask role-change list|approve|reject`: the admin role asked for a person, decided by the
    operator as the second pair of eyes (e.g. for a tenant with one admin)."""
    group = AppGroup("role-change", help="The admin role asked for a person, waiting for a second pair of eyes.")

    @group.command("list")
    @click.option("--tenant", "slug", default=None, help="Only this tenant's changes.")
    @click.option(
        "--status",
        type=click.Choice(("pending", "approved", "rejected", "withdrawn", "all")),
        default="pending",
        show_default=True,
    )
    def list_command(slug: str | None, status: str) -> None:
        """The role changes (pending ones unless --status says otherwise), newest first."""
        tenant_id = None
        if slug is not None:
            tenant = identity.tenant_of(db.session, slug)
            if tenant is None:
                raise click.UsageError(f"There is no tenant {slug.strip()!r}.")
            tenant_id = tenant.id
        rows = account_actions.role_changes(db.session, tenant_id, None if status == "all" else status)
        if not rows:
            click.echo(f"No {'' if status == 'all' else status + ' '}role changes.")
        slugs = dict(db.session.execute(select(Tenant.id, Tenant.slug)).all())
        for change in rows:
            asked = change.requested_by.email if change.requested_by else "the command line"
            deciders = four_eyes.deciders(db.session, change.tenant_id, change.requested_by_id)
            who = ", ".join(person.email for person in deciders) or "only the operator"
            click.echo(
                f"#{change.id} {slugs.get(change.tenant_id)} {change.role} for {change.user.email}: {change.status}; "
                f"asked by {asked} {change.requested_at:%Y-%m-%d %H:%M} UTC; may decide: {who}"
            )
            click.echo(f"  {account_actions.role_change_why(change)}")

    def decide(change_id: int, decision: str, reason: str | None) -> None:
        try:
            change = account_actions.decide_role_change(
                db.session, None, change_id, decision, reason, actor_label="command line"
            )
        except Refusal as exc:
            db.session.rollback()
            raise click.UsageError(exc.message) from None
        if change.status == "approved":
            click.echo(f"Approved #{change_id}: {change.user.email} has the roles {', '.join(change.user.roles)}.")
        else:
            click.echo(f"Rejected #{change_id}; {change.user.email} stays without the {change.role} role.")

    @group.command("approve")
    @click.argument("change_id", type=click.IntRange(min=1))
    @click.option("--reason", default=None)
    def approve_command(change_id: int, reason: str | None) -> None:
        """Give the role (the second pair of eyes, e.g. for a tenant with one admin)."""
        decide(change_id, "approve", reason)

    @group.command("reject")
    @click.argument("change_id", type=click.IntRange(min=1))
    @click.option("--reason", required=True, help="Why; the admin who asked reads it.")
    def reject_command(change_id: int, reason: str) -> None:
        """Leave the person without the role."""
        decide(change_id, "reject", reason)

    app.cli.add_command(group)
