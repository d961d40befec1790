"""`flask run-batch FILE --tenant SLUG --as EMAIL`: a bulk run from a file, as the API and the page
start one (webapp/runs/actions.py). Its name and arguments are a contract."""

from __future__ import annotations

from pathlib import Path

import click
from flask import Flask
from sqlalchemy import select

from webapp import identity
from webapp.models import User
from webapp.refusals import Refusal
from webapp.runs import actions
from webapp.runtime.extensions import db


def register(app: Flask) -> None:
    @app.cli.command("run-batch")
    @click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
    @click.option("--tenant", "slug", required=True, help="The tenant the run belongs to.")
    @click.option("--as", "email", required=True, help="The agent who starts it and owns its conversations.")
    @click.option(
        "--batch/--interactive",
        default=True,
        show_default=True,
        help="Send the model moves by Message Batch (half price, answers within hours) or one by one.",
    )
    @click.option("--title", default="", help="A name for the run; left out: the file's name.")
    def run_batch_command(file: Path, slug: str, email: str, batch: bool, title: str) -> None:
        """Start a bulk run of FILE's items (CSV with a `message` column, or JSON Lines of {"message": ...}):
        each becomes a conversation of the agent's."""
        tenant = identity.tenant_of(db.session, slug)
        if tenant is None:
            raise click.UsageError(f"There is no tenant {slug.strip()!r}.")
        user = db.session.scalar(
            select(User).where(User.tenant_id == tenant.id, User.email == email.strip().lower(), User.active)
        )
        if user is None:
            raise click.UsageError(f"{tenant.slug} has no active person {email.strip()!r}.")
        if not user.has_role("agent"):
            raise click.UsageError(f"{user.email} is no agent; only agents start runs.")
        try:
            messages = actions.read_items(file.name, file.read_bytes())
            run = actions.create(db.session, user, messages, batch=batch, title=title or file.name)
        except Refusal as refusal:
            raise click.UsageError(refusal.message) from None
        way = "by Message Batch" if batch else "one by one"
        click.echo(f"Run {run.id} started: {run.items:,} item(s) of {user.email}, model moves {way}.")
        click.echo(f"Watch it at /runs/{run.id}, or GET /api/runs/{run.id}.")
