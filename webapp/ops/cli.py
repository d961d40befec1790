"""The operators' commands: `flask endpoint add|update|allow|disallow|list` (the fleet's model
endpoints and which tenants may use each), `flask ceiling set|list` (the most one call may move
with no person, per tool, for every tenant), `flask secret grant|revoke|list` (the environment
variables a tenant's admins may name in an MCP server's header) and `flask policy-defaults
list|accept` (a release's looser default policy for a pack's tool, held until accepted). Their names and arguments are a
contract."""

from __future__ import annotations

import click
from flask import Flask
from flask.cli import AppGroup
from sqlalchemy import select

from webapp import identity
from webapp.agent import gate, policies
from webapp.llm import endpoints, grants
from webapp.models import OPERATIONS_SLUG, ModelEndpoint, Tenant
from webapp.ops import actions as ops_actions
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.secrets import secret_grants


def register(app: Flask) -> None:
    _register_endpoints(app)
    _register_ceilings(app)
    _register_secrets(app)
    _register_defaults(app)


endpoint_group = AppGroup(
    "endpoint",
    help="Model endpoints: Anthropic-compatible servers a tenant can be served by, once allowed for it.",
)


_tenant_option = click.option(
    "--tenant",
    "tenant_slugs",
    multiple=True,
    metavar="SLUG",
    help="A tenant (its slug) that may use the endpoint; repeat for more.",
)


def _echo_access(change: grants.AccessChange) -> None:
    for sentence in change.sentences(services().config.model):
        click.echo(sentence)


@endpoint_group.command("add")
@click.argument("name")
@click.option("--base-url", required=True, help="The server, e.g. http://127.0.0.1:11434 (Ollama).")
@click.option("--model", required=True, help="The model to ask there, e.g. qwen3:8b.")
@click.option("--api-key", default=None, help="Stored encrypted; local servers need none.")
@click.option(
    "--api-key-env", default=None, help="Or: the environment variable that holds the key, named MODEL_KEY_..."
)
@click.option(
    "--protocol",
    type=click.Choice(endpoints.PROTOCOLS),
    default="tools",
    show_default=True,
    help="tools: native tool use; react: tools as text, for models without tool use.",
)
@click.option(
    "--context-window", type=click.IntRange(min=1), default=None, help="Tokens (default: CONTEXT_WINDOW_TOKENS)."
)
@_tenant_option
def endpoint_add_command(name, base_url, model, api_key, api_key_env, protocol, context_window, tenant_slugs):
    """Register an endpoint NAME (a-z, 0-9, - and _), allowed for the tenants given with --tenant."""
    try:
        endpoint = ops_actions.add_endpoint(
            db.session,
            services().config,
            name,
            tenants=tenant_slugs,
            actor_label="command line",
            base_url=base_url,
            model=model,
            api_key=api_key,
            api_key_env=api_key_env,
            protocol=protocol,
            context_window=context_window,
        )
    except endpoints.EndpointError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"Added {endpoints.describe(endpoint)}")
    click.echo(grants.who_may_use(db.session, endpoint))


@endpoint_group.command("update")
@click.argument("name")
@click.option("--base-url", default=None, help="The server. Left out: as it is.")
@click.option("--model", default=None, help="The model to ask there. Left out: as it is.")
@click.option("--api-key", default=None, help="A new key, stored encrypted.")
@click.option("--api-key-env", default=None, help="Or: the variable that holds the key, named MODEL_KEY_...")
@click.option("--forget-key", is_flag=True, help="Drop the key (a local server that needs none).")
@click.option("--protocol", type=click.Choice(endpoints.PROTOCOLS), default=None, help="Left out: as it is.")
@click.option(
    "--context-window",
    type=click.IntRange(min=0),
    default=None,
    help="Tokens; 0: the desk's CONTEXT_WINDOW_TOKENS. Left out: as it is.",
)
def endpoint_update_command(name, base_url, model, api_key, api_key_env, forget_key, protocol, context_window):
    """Change the endpoint NAME: only what is given changes (the key stays unless replaced or dropped)."""
    try:
        endpoint = endpoints.endpoint_named(db.session, name)
        key_given = api_key or api_key_env or forget_key
        ops_actions.change_endpoint(
            db.session,
            services().config,
            endpoint,
            actor_label="command line",
            base_url=endpoint.base_url if base_url is None else base_url,
            model=endpoint.model if model is None else model,
            protocol=protocol or endpoint.protocol,
            context_window=endpoint.context_window if context_window is None else (context_window or None),
            api_key=api_key,
            # (left out: the variable named now, checked again like a new one)
            api_key_env=api_key_env if key_given else endpoint.api_key_env,
            forget_key=forget_key,
        )
    except endpoints.EndpointError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"Changed {endpoints.describe(endpoint)}. Running workers use it from their next model call.")


@endpoint_group.command("allow")
@click.argument("name")
@_tenant_option
def endpoint_allow_command(name: str, tenant_slugs: tuple[str, ...]) -> None:
    """Let the tenants given with --tenant use the endpoint NAME: their admins may then choose it."""
    _change_access(name, tenant_slugs, allow=tenant_slugs)


@endpoint_group.command("disallow")
@click.argument("name")
@_tenant_option
def endpoint_disallow_command(name: str, tenant_slugs: tuple[str, ...]) -> None:
    """Withdraw the endpoint NAME from the tenants given with --tenant. A tenant it serves goes back to
    the default model; one that routes simple questions to it stops routing."""
    _change_access(name, tenant_slugs, disallow=tenant_slugs)


def _change_access(name: str, tenant_slugs: tuple[str, ...], **change: tuple[str, ...]) -> None:
    """Allow or disallow (`change`) the endpoint NAME for the tenants given, and say what changed."""
    if not tenant_slugs:
        raise click.UsageError("Name a tenant with --tenant SLUG (repeat it for more).")
    try:
        endpoint = endpoints.endpoint_named(db.session, name)
        done = ops_actions.change_access(db.session, endpoint, **change, actor_label="command line")
    except endpoints.EndpointError as exc:
        raise click.UsageError(str(exc)) from None
    _echo_access(done)


@endpoint_group.command("list")
def endpoint_list_command() -> None:
    """The registered endpoints, the tenants that may use each and those each serves (keys are never shown)."""
    served: dict[int | None, list[str]] = {}
    classifies: dict[int | None, list[str]] = {}
    tenants = select(Tenant.slug, Tenant.endpoint_id, Tenant.small_endpoint_id).where(
        Tenant.slug != OPERATIONS_SLUG
    )  # (operators talk to no model)
    for slug, endpoint_id, small_id in db.session.execute(tenants.order_by(Tenant.slug)):
        served.setdefault(endpoint_id, []).append(slug)
        classifies.setdefault(small_id, []).append(slug)
    may_use = grants.allowed_tenants(db.session)
    click.echo(
        f"default: {services().config.model} (configured); serves {', '.join(served.get(None, [])) or 'no tenant'}"
    )
    for endpoint in db.session.scalars(select(ModelEndpoint).order_by(ModelEndpoint.name)):
        small = f"; small endpoint of {', '.join(classifies[endpoint.id])}" if endpoint.id in classifies else ""
        allowed = ", ".join(may_use.get(endpoint.id, [])) or "no tenant"
        click.echo(
            f"{endpoints.describe(endpoint)}; may be used by {allowed}; "
            f"serves {', '.join(served.get(endpoint.id, [])) or 'no tenant'}{small}"
        )


def _register_endpoints(app: Flask) -> None:
    """`flask endpoint ...`: Anthropic-compatible servers, and the tenants each may serve."""
    app.cli.add_command(endpoint_group)


def _register_ceilings(app: Flask) -> None:
    """`flask ceiling set|list`."""
    ceiling_group = AppGroup(
        "ceiling", help="The most one call of a tool may move with no person, whatever a tenant's policy says."
    )

    @ceiling_group.command("set")
    @click.argument("tool")
    @click.argument("amount")
    def set_ceiling_command(tool: str, amount: str) -> None:
        """Above AMOUNT dollars (e.g. 500 or 250.50), every call of TOOL waits for a person, in every
        tenant; "none" lifts the ceiling, "default" gives the tool's own back."""
        try:
            cents = policies.ceiling_cents(amount)
            found = services().tools.get(tool.strip())
            ceiling = ops_actions.set_ceiling(db.session, found, tool.strip(), cents, actor_label="command line")
        except policies.PolicyError as exc:
            raise click.UsageError(str(exc)) from None
        click.echo(f"{tool.strip()}: {policies.ceiling_words(ceiling)}")

    @ceiling_group.command("list")
    def list_ceilings_command() -> None:
        """Every tool with an amount and its ceiling."""
        registry = services().tools
        for tool in (registry.get(name) for name in sorted(registry.names())):
            if policies.has_amount(tool):
                click.echo(f"{tool.name}: {policies.ceiling_words(policies.ceiling_for(db.session, tool))}")

    app.cli.add_command(ceiling_group)


def _register_secrets(app: Flask) -> None:
    """`flask secret grant|revoke|list`: secrets belong to a tenant (webapp/secrets/secret_grants.py)."""
    secret_group = AppGroup(
        "secret",
        help="Secrets granted to tenants: the desk's environment variables a tenant's admins may name in an MCP "
        "server's header ($NAME). Names only: values stay in the environment.",
    )

    def tenant_of(slug: str) -> Tenant:
        tenant = identity.tenant_of(db.session, slug)
        if tenant is None:
            raise click.UsageError(
                f"There is no tenant {slug.strip()!r}; `flask secret list` shows the tenants' secrets."
            )
        return tenant

    @secret_group.command("grant")
    @click.argument("name")
    @click.option("--tenant", "slug", required=True, help="The tenant whose admins may name it.")
    def grant_command(name: str, slug: str) -> None:
        """Let the admins of a tenant name the environment variable NAME (it must start with
        MCP_SECRET_PREFIX) in an MCP server's header, e.g. "X-Key: $NAME"; audited on its chain."""
        tenant = tenant_of(slug)
        try:
            added = secret_grants.grant(
                db.session, tenant, name, prefix=services().config.mcp_secret_prefix, actor_label="command line"
            )
        except secret_grants.SecretGrantError as exc:
            raise click.UsageError(str(exc)) from None
        db.session.commit()
        name = name.strip()
        click.echo(f"Granted {name} to {tenant.slug}." if added else f"{name} is granted to {tenant.slug} already.")
        if warning := secret_grants.unset_here(name):
            click.echo(f"Warning: {warning}", err=True)

    @secret_group.command("revoke")
    @click.argument("name")
    @click.option("--tenant", "slug", required=True, help="The tenant that may no longer name it.")
    def revoke_command(name: str, slug: str) -> None:
        """Take the secret NAME back from a tenant: its MCP servers' headers that name it are not sent
        from now on (their sync and calls fail in words); audited on its chain."""
        tenant = tenant_of(slug)
        try:
            naming = secret_grants.revoke(db.session, tenant, name, actor_label="command line")
        except secret_grants.SecretGrantError as exc:
            raise click.UsageError(str(exc)) from None
        db.session.commit()
        click.echo(f"Revoked {name.strip()} from {tenant.slug}.")
        if naming:
            click.echo(
                f"Its MCP servers {', '.join(naming)} name it in a header: they are not sent it any more, so their "
                "sync and calls fail until it is granted again or an admin adds them again with another value."
            )

    @secret_group.command("list")
    @click.option("--tenant", "slug", default=None, help="Only this tenant's secrets.")
    def list_command(slug: str | None) -> None:
        """The secrets granted to each tenant (names only, never a value), and headers an admin set that
        name one not granted (not sent)."""
        tenant_id = tenant_of(slug).id if slug is not None else None
        rows = secret_grants.grants(db.session, tenant_id)
        if not rows:
            click.echo("No secrets granted.")
        for row in rows:
            by = row.granted_by or "the command line"
            unset = "" if secret_grants.unset_here(row.name) is None else "; NOT SET in this environment"
            click.echo(f"{row.tenant} {row.name}: granted by {by} on {row.granted_at:%Y-%m-%d %H:%M} UTC{unset}")
        for line in secret_grants.not_granted(db.session, tenant_id):
            click.echo(line)

    app.cli.add_command(secret_group)


def _register_defaults(app: Flask) -> None:
    """`flask policy-defaults list|accept`."""
    defaults_group = AppGroup(
        "policy-defaults",
        help="The packs' default policies: a release whose default is looser waits until you accept it.",
    )

    @defaults_group.command("list")
    def list_defaults_command() -> None:
        """Each pack tool's default policy in force, and the release's own where it is held."""
        registry = services().tools
        held = set(gate.record_defaults(db.session, registry))
        db.session.commit()
        gate.pin_defaults(db.session, registry)
        for name in sorted(registry.names()):
            tool = registry.get(name)
            in_force = policies.default_policy(tool).describe()
            if name in held:
                release = policies.release_default(tool)
                loosens = " ".join(gate.loosenings(policies.default_policy(tool), release))
                click.echo(
                    f"{name}: {in_force} HELD: this release says: {release.describe()} ({loosens}) "
                    f"Accept it with: flask policy-defaults accept {name}"
                )
            else:
                click.echo(f"{name}: {in_force}")

    @defaults_group.command("accept")
    @click.argument("tool")
    def accept_default_command(tool: str) -> None:
        """Put this release's default policy for TOOL in force, for every tenant that has not set one."""
        registry = services().tools
        gate.record_defaults(db.session, registry)
        try:
            loosens = gate.accept_default(db.session, registry, tool.strip(), "command line")
        except ValueError as exc:
            db.session.rollback()
            raise click.UsageError(str(exc)) from None
        db.session.commit()
        click.echo(f"{tool.strip()}: this release's default is in force. {' '.join(loosens)}")

    app.cli.add_command(defaults_group)
