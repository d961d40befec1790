"""A tenant's settings from the command line: `flask tenant set-model` (which endpoint serves a
tenant), `policy-change list|approve|reject` (the operator as the second pair of eyes) and `mcp
add|list|sync|map|remove` (a tenant's MCP servers, webapp/tools/mcp/). Their names and arguments are
a contract."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import click
from flask import Flask
from flask.cli import AppGroup
from sqlalchemy import select

from webapp import identity
from webapp.llm import choice, endpoints, grants
from webapp.models import OPERATIONS_SLUG, McpServer, Tenant
from webapp.refusals import Refusal
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.settings import assistant_actions, mcp_actions, policy_actions
from webapp.tools import mcp
from webapp.tools.presenting import plural


def register(app: Flask) -> None:
    _register_tenants(app)
    _register_policy_changes(app)
    _register_mcp(app)


def _register_tenants(app: Flask) -> None:
    """`flask tenant set-model`: which endpoint serves a tenant (webapp/llm/endpoints.py)."""
    tenant_group = AppGroup("tenant", help="Tenants.")

    @tenant_group.command("set-model")
    @click.argument("slug")
    @click.option("--endpoint", "endpoint_name", required=True, help='A registered endpoint, or "default".')
    @click.option(
        "--small-endpoint",
        "small_endpoint_name",
        default=None,
        help='A registered endpoint that classifies each new question, so simple ones run on it; "none": '
        "no routing. Left out: as it is.",
    )
    def tenant_set_model_command(slug: str, endpoint_name: str, small_endpoint_name: str | None) -> None:
        """Serve the tenant's conversations from an endpoint ("default": the configured model), and
        route simple questions to a small endpoint. An endpoint the tenant may not use yet is allowed
        for it (as `flask endpoint allow` would)."""
        chosen = None if endpoint_name.strip().lower() == "default" else endpoint_name
        small = grants.KEEP
        if small_endpoint_name is not None:
            small = None if small_endpoint_name.strip().lower() == "none" else small_endpoint_name
        try:
            now = assistant_actions.set_tenant_models(
                db.session, slug, chosen, small, allow=True, actor_label="command line"
            )
        except endpoints.EndpointError as exc:
            raise click.UsageError(str(exc)) from None
        routing = "; no routing by difficulty"
        if now.small_endpoint:
            routing = f"; simple questions go to {now.small_endpoint}"
        click.echo(
            f"Tenant {now.tenant.slug} is now served by {now.endpoint}{routing}. Running workers follow within "
            f"{choice.CHOICE_SECONDS:g} seconds."
        )
        for name in now.allowed:
            click.echo(f"{now.tenant.slug} may now use {name}: it was not allowed for it before.")

    app.cli.add_command(tenant_group)


def _register_policy_changes(app: Flask) -> None:
    """`flask policy-change list|approve|reject`: the operator as the second pair of eyes."""
    changes_group = AppGroup(
        "policy-change", help="Policy changes that let calls wait less, waiting for a second pair of eyes."
    )

    @changes_group.command("list")
    @click.option("--tenant", "slug", default=None, help="Only this tenant's changes.")
    @click.option(
        "--status",
        type=click.Choice(("pending", "approved", "rejected", "withdrawn", "superseded", "all")),
        default="pending",
        show_default=True,
    )
    def list_changes_command(slug: str | None, status: str) -> None:
        """The policy changes (pending ones unless --status says otherwise), newest first."""
        tenant_id = None
        if slug is not None:
            tenant_id = db.session.scalar(
                select(Tenant.id).where(Tenant.slug == slug.strip().lower(), Tenant.slug != OPERATIONS_SLUG)
            )
            if tenant_id is None:
                raise click.UsageError(f"There is no tenant {slug.strip()!r}.")
        rows = policy_actions.changes(db.session, tenant_id, None if status == "all" else status)
        if not rows:
            click.echo(f"No {'' if status == 'all' else status + ' '}policy changes.")
        slugs = dict(db.session.execute(select(Tenant.id, Tenant.slug)).all())
        for change in rows:
            asked = change.requested_by.email if change.requested_by else "the desk"
            admins = policy_actions.admin_count(db.session, change.tenant_id)
            click.echo(
                f"#{change.id} {slugs.get(change.tenant_id)} {change.tool_name}: {change.status}; asked by {asked} "
                f"{change.requested_at:%Y-%m-%d %H:%M} UTC; the tenant has {plural(admins, 'admin')}"
            )
            click.echo(f"  now: {change.before.get('rule', '')}")
            for sentence in change.loosens:
                click.echo(f"  - {sentence}")

    def decide(change_id: int, decision: str, reason: str | None) -> None:
        try:
            saved = policy_actions.decide(
                db.session, None, change_id, decision, reason, actor_label="command line (operator)"
            )
        except Refusal as exc:
            db.session.rollback()
            raise click.UsageError(exc.message) from None
        if saved.change.status == "approved":
            click.echo(f"Approved #{change_id}: {saved.policy.describe()} (version {saved.policy.version})")
        else:
            click.echo(f"Rejected #{change_id}; the policy of {saved.change.tool_name} stays as it is.")

    @changes_group.command("approve")
    @click.argument("change_id", type=click.IntRange(min=1))
    @click.option("--reason", default=None)
    def approve_change_command(change_id: int, reason: str | None) -> None:
        """Put a waiting change in force (the second pair of eyes, e.g. for a tenant with one admin)."""
        decide(change_id, "approve", reason)

    @changes_group.command("reject")
    @click.argument("change_id", type=click.IntRange(min=1))
    @click.option("--reason", required=True, help="Why; the admin who asked reads it.")
    def reject_change_command(change_id: int, reason: str) -> None:
        """Leave the policy as it is."""
        decide(change_id, "reject", reason)

    app.cli.add_command(changes_group)


mcp_group = AppGroup("mcp", help="MCP servers whose tools join a tenant's assistant, behind the approval gate.")


def _mcp_tenant(slug: str) -> Tenant:
    tenant = identity.tenant_of(db.session, slug)
    if tenant is None:
        raise click.UsageError(f"There is no tenant {slug.strip()!r}; `flask mcp list` shows the tenants' servers.")
    return tenant


T = TypeVar("T")


@contextmanager
def _mcp_refused() -> Iterator[None]:
    """What the MCP server or the desk refused (an McpError) becomes the command's usage error."""
    try:
        yield
    except mcp.McpError as exc:
        raise click.UsageError(str(exc)) from None


def _on_server(slug: str, action: Callable[..., T], name: str) -> tuple[Tenant, T]:
    """The tenant, and what the action (sync or remove) did to its server NAME from the command line."""
    tenant = _mcp_tenant(slug)
    with _mcp_refused():
        return tenant, action(db.session, tenant.id, None, name)


def _tool_lines(server: McpServer) -> list[str]:
    registry = services().tools_for(db.session, server.tenant_id)
    lines = []
    for row in server.tools:
        tool = registry.get(row.registry_name)
        if row.held:
            rule = "HELD: changed since accepted; accept it on the MCP servers page"
        else:
            rule = "runs at once (read-only)" if tool and not tool.sensitive else "waits for one approval"
        mapped = "; ".join(mcp.mapping_words(row.mapping))
        lines.append(f"  {row.registry_name} ({row.remote_name}): {rule}{'; ' + mapped if mapped else ''}")
    return lines


@mcp_group.command("add")
@click.argument("name")
@click.option("--tenant", "slug", required=True, help="The tenant whose assistant gets the tools.")
@click.option("--url", default=None, help="A streamable HTTP server, e.g. https://mcp.example.com/mcp.")
@click.option(
    "--command",
    default=None,
    help='Or: a local server the desk starts, e.g. "python -m inventory"; it gets PATH and the --env variables, '
    "nothing else of the desk's environment.",
)
@click.option(
    "--header",
    "headers",
    multiple=True,
    help='"Name: value", sent with every request; stored encrypted, or "Name: $VARIABLE" to read it from the '
    "environment at each use.",
)
@click.option(
    "--env",
    "environment",
    multiple=True,
    help="NAME=value, a variable of the started server (with --command); stored encrypted and never shown, or "
    "NAME=$VARIABLE to pass the desk's own at each start.",
)
@click.option(
    "--cwd", "working_directory", default=None, help="The started server's working directory (an absolute path)."
)
def add_command(
    name: str,
    slug: str,
    url: str | None,
    command: str | None,
    headers: tuple[str, ...],
    environment: tuple[str, ...],
    working_directory: str | None,
) -> None:
    """Register the MCP server NAME for a tenant, connect to it, and list the tools it offers."""
    try:
        tenant = _mcp_tenant(slug)
    except click.UsageError as exc:
        attempt = {"url": url, "command": command, "headers": list(headers), "environment": list(environment)}
        mcp_actions.refused_add(db.session, None, None, name, exc.message, tenant=slug, **attempt)
        raise
    with _mcp_refused():
        server, report = mcp_actions.add(
            db.session,
            tenant.id,
            None,
            name,
            url=url,
            command=command,
            headers=list(headers),
            environment=list(environment),
            working_directory=working_directory,
        )
    click.echo(f"Added MCP server {server.name} to {tenant.slug}, with {plural(len(server.tools), 'tool')}:")
    for line in _tool_lines(server):
        click.echo(line)
    for remote, why in report.refused:
        click.echo(f"  refused {remote}: {why}")


@mcp_group.command("list")
@click.option("--tenant", "slug", default=None, help="Only this tenant's servers.")
def list_command(slug: str | None) -> None:
    """The MCP servers, their tools and whether any is held (header values are never shown)."""
    query = select(McpServer, Tenant.slug).join(Tenant, Tenant.id == McpServer.tenant_id)
    if slug is not None:
        query = query.where(McpServer.tenant_id == _mcp_tenant(slug).id)
    rows = db.session.execute(query.order_by(Tenant.slug, McpServer.name)).all()
    if not rows:
        click.echo("No MCP servers.")
    prefix = services().config.mcp_secret_prefix
    for server, tenant_slug in rows:
        said = [server.url or f"command: {server.command}"]
        if server.command and not server.command_by_operator:
            said.append("NOT STARTED: a tenant's admin set the command; remove it and add it again")
        if server.working_directory:
            said.append(f"in {server.working_directory}")
        if variables := mcp.environment_words(server):
            said.append(f"variables: {', '.join(variables)}")
        if headers := mcp.header_words(server, prefix):
            said.append(f"headers: {', '.join(headers)}")
        said.append(f"synced {server.synced_at:%Y-%m-%d %H:%M} UTC" if server.synced_at else "never synced")
        click.echo(f"{tenant_slug} {server.name}: {'; '.join(said)}")
        for line in _tool_lines(server):
            click.echo(line)


@mcp_group.command("sync")
@click.argument("name")
@click.option("--tenant", "slug", required=True)
def sync_command(name: str, slug: str) -> None:
    """Read the server's tools again: new ones join, gone ones leave, changed ones are held."""
    tenant, report = _on_server(slug, mcp_actions.sync, name)
    click.echo(f"Synced MCP server {name.strip()} of {tenant.slug}.")
    for line in report.lines():
        click.echo(f"  {line}")


@mcp_group.command("map")
@click.argument("tool")
@click.option("--tenant", "slug", required=True)
@click.option("--amount", default=None, help="The argument that is the money a call moves.")
@click.option("--unit", type=click.Choice(mcp.UNITS), default="cents", show_default=True, help="The amount's unit.")
@click.option("--subject", default=None, help="The argument that names what a call acts on (limits per subject).")
@click.option(
    "--facts", "facts_tool", default=None, help="A read-only tool of the same server: its result is the facts."
)
@click.option(
    "--facts-arg", "facts_args", multiple=True, help="THEIRS=OURS: the facts tool's THEIRS takes this call's OURS."
)
def map_command(
    tool: str, slug: str, amount: str | None, unit: str, subject: str | None, facts_tool: str | None, facts_args
) -> None:
    """Tell the desk what an MCP tool's arguments mean: the money a call moves, what it acts on, and
    which read-only tool of the same server gives a reviewer the facts. Whatever is left out is cleared."""
    tenant = _mcp_tenant(slug)
    pairs = {}
    for pair in facts_args:
        theirs, equals, ours = pair.partition("=")
        if not equals or not theirs.strip() or not ours.strip():
            raise click.UsageError(f"{pair!r} is not THEIRS=OURS, e.g. --facts-arg repo_path=repo_path.")
        pairs[theirs.strip()] = ours.strip()
    with _mcp_refused():
        mapping = mcp_actions.map_tool(
            db.session, tenant.id, None, tool.strip(), amount=amount, unit=unit, subject=subject,
            facts_tool=facts_tool, facts_arguments=pairs,
        )  # fmt: skip
    said = mcp.mapping_words(mapping)
    click.echo(f"Mapped {tool.strip()} of {tenant.slug}: {'; '.join(said) if said else 'nothing (cleared)'}.")


@mcp_group.command("remove")
@click.argument("name")
@click.option("--tenant", "slug", required=True)
def remove_command(name: str, slug: str) -> None:
    """Remove the server; its tools leave the tenant's assistant."""
    tenant, names = _on_server(slug, mcp_actions.remove, name)
    click.echo(f"Removed MCP server {name.strip()} of {tenant.slug} and its tools: {', '.join(names) or 'none'}.")


def _register_mcp(app: Flask) -> None:
    """`flask mcp add|list|sync|map|remove`: a tenant's MCP servers (webapp/tools/mcp/)."""
    app.cli.add_command(mcp_group)
