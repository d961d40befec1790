"""Command-line entry points (`flask --app webapp ...`). Their names and arguments are a contract.

Each feature registers its own commands (`<package>/cli.py`); this is the list of them, and the
billing demo's commands, which load the pack only when they run (the desk's packages know none of it)."""

from __future__ import annotations

import click
from flask import Flask
from sqlalchemy import select

from webapp.accounts import cli as accounts
from webapp.audit import cli as audit
from webapp.ops import cli as ops
from webapp.runs import cli as runs
from webapp.runtime import cli as runtime
from webapp.runtime.extensions import db
from webapp.settings import cli as settings


def register(app: Flask) -> None:
    accounts.register(app)  # create-user, create-operator, create-token, revoke-token, role-change
    audit.register(app)  # audit verify, audit anchor
    ops.register(app)  # endpoint, ceiling, secret
    runs.register(app)  # run-batch
    runtime.register(app)  # worker, desk scheduler, desk redis, sweep
    settings.register(app)  # tenant set-model, policy-change, mcp
    _register_demo(app)  # seed-demo, outbox, audit generate


def _register_demo(app: Flask) -> None:
    """The billing demo's commands (demo/billing): its tenants, people and records, the emails its
    tools sent, and synthetic audit events for performance tests."""

    @app.cli.command("seed-demo")
    def seed_demo_command():
        """Create the demo tenants, billing data and one login per role (idempotent)."""
        from demo.billing.seed import seed_demo

        logins = seed_demo(db.session)
        db.session.commit()
        click.echo("Demo logins (password for all: see below):")
        for login in logins:
            click.echo(
                f"  {login['email']:<24} {','.join(login['roles']):<10} tenant={login['tenant']}  "
                f"password={login['password']}"
            )

    @app.cli.command("outbox")
    @click.option("--last", default=5, type=click.IntRange(1, 100), help="How many emails, newest first.")
    def outbox_command(last):
        """Show the newest emails the tools sent (the demo sends no real mail: a verification code the
        customer would read out is here)."""
        from demo.billing.models import OutgoingEmail

        emails = db.session.scalars(select(OutgoingEmail).order_by(OutgoingEmail.id.desc()).limit(last)).all()
        if not emails:
            click.echo("No emails sent yet.")
        for email in emails:
            click.echo(f"#{email.id} {email.created_at:%Y-%m-%d %H:%M} to {email.to_address}: {email.subject}")
            click.echo("    " + email.body.replace("\n", "\n    "))

    audit_group = app.cli.commands["audit"]  # webapp/audit/cli.py

    @audit_group.command("generate")
    @click.argument("count", type=click.IntRange(min=1))
    @click.option("--tenant", "tenant_slug", default=None, help="Tenant slug (default: the first tenant).")
    @click.option("--days", type=click.IntRange(min=1), default=90, show_default=True, help="Spread over N days.")
    def audit_generate_command(count: int, tenant_slug: str | None, days: int) -> None:
        """Append COUNT synthetic, valid, hash-chained events to a tenant's chain (for performance tests)."""
        import time

        from demo.billing.synthetic import generate_events, tenant_for

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
