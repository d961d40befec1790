"""The billing demo's commands, brought by the pack (`demo.billing.COMMANDS`, registered by the desk's
command line for a pack loaded with EXTRA_TOOLS): its tenants, people and records, the emails its
tools sent, and synthetic audit events for performance tests. Each runs in the app's context."""

from __future__ import annotations

import time

import click
from sqlalchemy import select

from demo.billing.models import OutgoingEmail
from demo.billing.seed import seed_demo
from demo.billing.synthetic import generate_events, tenant_for
from webapp.runtime.extensions import db


@click.command("seed-demo")
def seed_demo_command() -> None:
    """Create the demo tenants, billing data and one login per role (idempotent)."""
    logins = seed_demo(db.session)
    db.session.commit()
    click.echo("Demo logins (password for all: see below):")
    for login in logins:
        click.echo(
            f"  {login['email']:<24} {','.join(login['roles']):<10} tenant={login['tenant']}  "
            f"password={login['password']}"
        )


@click.command("outbox")
@click.option("--last", default=5, type=click.IntRange(1, 100), help="How many emails, newest first.")
def outbox_command(last: int) -> None:
    """Show the newest emails the tools sent (the demo sends no real mail: a verification code the
    customer would read out is here)."""
    emails = db.session.scalars(select(OutgoingEmail).order_by(OutgoingEmail.id.desc()).limit(last)).all()
    if not emails:
        click.echo("No emails sent yet.")
    for email in emails:
        click.echo(f"#{email.id} {email.created_at:%Y-%m-%d %H:%M} to {email.to_address}: {email.subject}")
        click.echo("    " + email.body.replace("\n", "\n    "))


@click.command("generate")
@click.argument("count", type=click.IntRange(min=1))
@click.option("--tenant", "tenant_slug", default=None, help="Tenant slug (default: the first tenant).")
@click.option("--days", type=click.IntRange(min=1), default=90, show_default=True, help="Spread over N days.")
def audit_generate_command(count: int, tenant_slug: str | None, days: int) -> None:
    """Append COUNT synthetic, valid, hash-chained events to a tenant's chain (for performance tests)."""
    tenant = tenant_for(tenant_slug)
    if tenant is None:
        raise click.UsageError(f"No tenant {tenant_slug!r}; create one with create-user or seed-demo.")
    tenant_id, slug = tenant.id, tenant.slug
    db.session.remove()  # the generator writes on its own connections; on SQLite ours would hold the lock
    started = time.perf_counter()

    def progress(done: int) -> None:
        if done % 100_000 == 0 and done < count:
            click.echo(f"  {done:,} of {count:,}", err=True)

    generate_events(db.engine, tenant_id, count, days=days, progress=progress)
    elapsed = time.perf_counter() - started
    click.echo(f"Generated {count:,} events on the chain of {slug} in {elapsed:.1f} s ({count / elapsed:,.0f}/s).")


# By the command group each joins ("": `flask` itself; "audit": `flask audit`).
COMMANDS = {"": (seed_demo_command, outbox_command), "audit": (audit_generate_command,)}
