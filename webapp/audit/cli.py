"""`flask audit verify|anchor`: the audit log's hash chains checked, and signed checkpoints of them
kept outside the database. (`audit generate`, the billing demo's synthetic events, joins the group in
webapp/cli.py with the demo's other commands.) Their names and arguments are a contract."""

from __future__ import annotations

import json
from pathlib import Path

import click
from flask import Flask, current_app
from flask.cli import AppGroup

from webapp import audit_chain
from webapp.audit_chain import anchors
from webapp.runtime.extensions import db


def register(app: Flask) -> None:
    audit_group = AppGroup("audit", help="The audit log.")

    @audit_group.command("verify")
    @click.option("--chain", default=None, help='Only this chain: a tenant id, or "global".')
    @click.option(
        "--against",
        type=click.File("r"),
        default=None,
        help="A checkpoint from `audit anchor`: also prove nothing up to it was rewritten.",
    )
    def audit_verify_command(chain: str | None, against) -> None:
        """Check the audit log's hash chains; exit 1 naming the first broken link."""
        if against is not None and chain is not None:
            raise click.UsageError("--against checks every chain of the checkpoint; leave out --chain.")
        if against is not None:
            config = current_app.extensions["desk"].config
            try:
                checkpoint = anchors.read(against.read(), anchors.load_key(config.audit_anchor_key_file, False))
            except (anchors.AnchorError, UnicodeDecodeError) as exc:
                click.echo(f"Checkpoint refused: {exc}", err=True)
                raise click.exceptions.Exit(1) from None
            result = anchors.verify_against(db.session, checkpoint)
        else:
            result = audit_chain.verify(db.session, chain)
        if not result.ok:
            click.echo(f"Audit log broken: {result.problem}", err=True)
            raise click.exceptions.Exit(1)
        since = f"; unchanged up to the checkpoint of {checkpoint['made_at']}" if against is not None else ""
        click.echo(f"Audit log intact: {result.checked} events in {result.chains} chains{since}.")

    @audit_group.command("anchor")
    @click.option(
        "--out", type=click.Path(dir_okay=False, writable=True), default=None, help="A file (default: stdout)."
    )
    def audit_anchor_command(out: str | None) -> None:
        """Write a signed checkpoint of every chain's head, to keep outside the database."""
        config = current_app.extensions["desk"].config
        try:
            key = anchors.load_key(config.audit_anchor_key_file, create=True)
        except (anchors.AnchorError, OSError) as exc:
            raise click.UsageError(f"No key to sign with: {exc}") from None
        signed = json.dumps(anchors.make(db.session, key), indent=2) + "\n"
        if out is None:
            click.echo(signed, nl=False)
            return
        Path(out).write_text(signed)
        checkpoint = json.loads(signed)
        click.echo(
            f"Checkpoint of {checkpoint['checkpoint']['events']} events in {len(checkpoint['checkpoint']['chains'])} "
            f"chains written to {out}, signed by {checkpoint['fingerprint']}. Keep it outside this server."
        )

    app.cli.add_command(audit_group)
