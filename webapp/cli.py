"""Command-line entry points (`flask --app webapp ...`). Their names and arguments are a contract."""

from __future__ import annotations

import json
from pathlib import Path

import click
from flask import Flask, current_app
from flask.cli import AppGroup
from sqlalchemy import select

from webapp import audit_anchor, audit_chain
from webapp.accounts import actions as account_actions
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
from webapp.llm import endpoints
from webapp.models import ROLES, User
from webapp.ops import actions as ops_actions
from webapp.runtime import embedded_redis
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.tools.presenting import plural


def register(app: Flask) -> None:
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

    @app.cli.command("create-user")
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
    def create_user_command(email, roles, tenant_slug, password, display_name):
        """Create a user with one or more roles in a tenant."""
        try:
            tenant = get_or_create_tenant(db.session, tenant_slug)
            user = create_user(db.session, email, password, list(roles), tenant, display_name)
        except AccountError as exc:
            db.session.rollback()
            raise click.UsageError(str(exc)) from None
        db.session.commit()
        click.echo(f"Created {user.email} ({', '.join(user.roles)}) in tenant {tenant.slug}.")

    @app.cli.command("create-operator")
    @click.argument("email")
    @click.option(
        "--password",
        prompt=True,
        hide_input=True,
        confirmation_prompt=True,
        help="At least 8 characters (asked for when not given).",
    )
    @click.option("--name", "display_name", default="", help="Display name.")
    def create_operator_command(email, password, display_name):
        """Create an operator: a person of no tenant who sees the whole fleet on /ops and /metrics and
        nothing of any tenant (no conversations, approvals, audit log or admin pages)."""
        try:
            user = create_operator(db.session, email, password, display_name)
        except AccountError as exc:
            db.session.rollback()
            raise click.UsageError(str(exc)) from None
        audit_chain.record(
            db.session,
            "operator_created",
            tenant_id=user.tenant_id,
            actor_label="command line",
            data={"user_id": user.id, "email": user.email},
        )
        db.session.commit()
        click.echo(
            f"Created operator {user.email}: signs in to see every worker, queue and failed job on /ops and the "
            "fleet's figures on /metrics, and no tenant's pages."
        )

    @app.cli.command("create-token")
    @click.argument("email")
    @click.option("--name", default="", help="What the token is for (shown on the tokens page).")
    @click.option(
        "--expires-days",
        type=click.IntRange(1, MAX_TOKEN_DAYS),
        default=None,
        help="Days until it stops working by itself (default: until revoked).",
    )
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
        try:
            row, token = issue_token(db.session, user, name, expires_days)
        except AccountError as exc:
            db.session.rollback()
            raise click.UsageError(str(exc)) from None
        audit_chain.record(
            db.session,
            "api_token_created",
            tenant_id=user.tenant_id,
            actor_label="command line",
            data={"token_id": row.id, "name": row.name, "prefix": row.prefix, "user_id": user.id, "email": user.email},
        )
        db.session.commit()
        click.echo(f"API token #{row.id} for {user.email} (shown once, store it now):")
        click.echo(token)

    @app.cli.command("revoke-token")
    @click.argument("token")
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
        audit_chain.record(
            db.session,
            "api_token_revoked",
            tenant_id=row.user.tenant_id,
            actor_label="command line",
            data={
                "token_id": row.id,
                "name": row.name,
                "prefix": row.prefix,
                "user_id": row.user_id,
                "email": row.user.email,
            },
        )
        db.session.commit()
        click.echo(f"Revoked API token {label} of {row.user.email}; programs using it are refused from now on.")

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

    @app.cli.command("worker")
    @click.option("--burst", is_flag=True, help="Exit when the queue is empty.")
    @click.option("--name", default=None, help="Worker name (default: RQ's).")
    @click.option(
        "--concurrency",
        type=click.IntRange(min=1, max=2000),
        default=None,
        help="Jobs run at once, each in a slot of its own (default: WORKER_CONCURRENCY, 20).",
    )
    @click.option(
        "--people-only",
        is_flag=True,
        help="Take only the moves that follow a person's act (a process of its own beside the pool workers).",
    )
    def worker_command(burst, name, concurrency, people_only):
        """Run a worker: moves, retries and the periodic sweeper, several moves at once."""
        from webapp.runtime.worker import run_worker

        run_worker(app, burst=burst, name=name, concurrency=concurrency, people_only=people_only)

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
                checkpoint = audit_anchor.read(
                    against.read(), audit_anchor.load_key(config.audit_anchor_key_file, False)
                )
            except (audit_anchor.AnchorError, UnicodeDecodeError) as exc:
                click.echo(f"Checkpoint refused: {exc}", err=True)
                raise click.exceptions.Exit(1) from None
            result = audit_anchor.verify_against(db.session, checkpoint)
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
            key = audit_anchor.load_key(config.audit_anchor_key_file, create=True)
        except (audit_anchor.AnchorError, OSError) as exc:
            raise click.UsageError(f"No key to sign with: {exc}") from None
        signed = json.dumps(audit_anchor.make(db.session, key), indent=2) + "\n"
        if out is None:
            click.echo(signed, nl=False)
            return
        Path(out).write_text(signed)
        checkpoint = json.loads(signed)
        click.echo(
            f"Checkpoint of {checkpoint['checkpoint']['events']} events in {len(checkpoint['checkpoint']['chains'])} "
            f"chains written to {out}, signed by {checkpoint['fingerprint']}. Keep it outside this server."
        )

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

    app.cli.add_command(audit_group)

    endpoint_group = AppGroup(
        "endpoint",
        help="Model endpoints: Anthropic-compatible servers a tenant can be served by, once allowed for it.",
    )
    tenant_option = click.option(
        "--tenant",
        "tenant_slugs",
        multiple=True,
        metavar="SLUG",
        help="A tenant (its slug) that may use the endpoint; repeat for more.",
    )

    def echo_access(change: endpoints.AccessChange) -> None:
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
    @tenant_option
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
        click.echo(endpoints.who_may_use(db.session, endpoint))

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
    @tenant_option
    def endpoint_allow_command(name: str, tenant_slugs: tuple[str, ...]) -> None:
        """Let the tenants given with --tenant use the endpoint NAME: their admins may then choose it."""
        if not tenant_slugs:
            raise click.UsageError("Name a tenant with --tenant SLUG (repeat it for more).")
        try:
            endpoint = endpoints.endpoint_named(db.session, name)
            change = ops_actions.change_access(db.session, endpoint, allow=tenant_slugs, actor_label="command line")
        except endpoints.EndpointError as exc:
            raise click.UsageError(str(exc)) from None
        echo_access(change)

    @endpoint_group.command("disallow")
    @click.argument("name")
    @tenant_option
    def endpoint_disallow_command(name: str, tenant_slugs: tuple[str, ...]) -> None:
        """Withdraw the endpoint NAME from the tenants given with --tenant. A tenant it serves goes back to
        the default model; one that routes simple questions to it stops routing."""
        if not tenant_slugs:
            raise click.UsageError("Name a tenant with --tenant SLUG (repeat it for more).")
        try:
            endpoint = endpoints.endpoint_named(db.session, name)
            change = ops_actions.change_access(db.session, endpoint, disallow=tenant_slugs, actor_label="command line")
        except endpoints.EndpointError as exc:
            raise click.UsageError(str(exc)) from None
        echo_access(change)

    @endpoint_group.command("list")
    def endpoint_list_command() -> None:
        """The registered endpoints, the tenants that may use each and those each serves (keys are never shown)."""
        from webapp.models import OPERATIONS_SLUG, ModelEndpoint, Tenant

        served: dict[int | None, list[str]] = {}
        classifies: dict[int | None, list[str]] = {}
        tenants = select(Tenant.slug, Tenant.endpoint_id, Tenant.small_endpoint_id).where(
            Tenant.slug != OPERATIONS_SLUG
        )  # (operators talk to no model)
        for slug, endpoint_id, small_id in db.session.execute(tenants.order_by(Tenant.slug)):
            served.setdefault(endpoint_id, []).append(slug)
            classifies.setdefault(small_id, []).append(slug)
        may_use = endpoints.allowed_tenants(db.session)
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

    app.cli.add_command(endpoint_group)

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
        small = endpoints.KEEP
        if small_endpoint_name is not None:
            small = None if small_endpoint_name.strip().lower() == "none" else small_endpoint_name
        try:
            now = account_actions.set_tenant_models(
                db.session, slug, chosen, small, allow=True, actor_label="command line"
            )
        except endpoints.EndpointError as exc:
            raise click.UsageError(str(exc)) from None
        routing = "; no routing by difficulty"
        if now.small_endpoint:
            routing = f"; simple questions go to {now.small_endpoint}"
        click.echo(
            f"Tenant {now.tenant.slug} is now served by {now.endpoint}{routing}. Running workers follow within "
            f"{endpoints.CHOICE_SECONDS:g} seconds."
        )
        for name in now.allowed:
            click.echo(f"{now.tenant.slug} may now use {name}: it was not allowed for it before.")

    app.cli.add_command(tenant_group)

    desk_group = AppGroup("desk", help="Running the desk in production.")

    @desk_group.command("scheduler")
    @click.option("--once", is_flag=True, help="Enqueue the retries that are due and one sweep, then exit.")
    def scheduler_command(once: bool) -> None:
        """Run RQ's scheduler for the move queues (retries after their backoff) and the sweep ticker,
        without working jobs. One per fleet is enough; more are harmless (RQ's scheduler takes a lock,
        the sweep job's id is unique per interval)."""
        import threading
        import time

        import redis
        from rq.scheduler import RQScheduler

        from webapp.runtime.services import services
        from webapp.runtime.worker import start_sweep_ticker

        desk = services()
        queues = desk.dispatcher.move_queues
        try:
            desk.dispatcher.redis.ping()
            scheduler = RQScheduler(queues, connection=desk.dispatcher.redis, interval=1, logging_level="WARNING")
            if once:
                scheduler.acquire_locks()
                due = 0
                if scheduler.acquired_locks:
                    now = int(time.time())
                    due = sum(len(queue.scheduled_job_registry.get_jobs_to_schedule(now)) for queue in queues)
                    try:
                        scheduler.register_birth()
                        scheduler.enqueue_scheduled_jobs()
                    finally:
                        scheduler.release_locks()
                        scheduler.register_death()
                    message = f"Enqueued {plural(due, 'due job')}"
                else:
                    message = "Another scheduler holds the lock of these queues; it enqueues the due jobs"
                desk.dispatcher.enqueue_sweep(int(time.time() // desk.config.sweep_interval_seconds))
                click.echo(f"{message}, and a sweep.")
                return
        except (redis.RedisError, OSError) as exc:
            raise click.ClickException(f"Redis is unreachable ({type(exc).__name__}); check REDIS_URL.") from None
        click.echo(
            f"Scheduler for queues {', '.join(queue.name for queue in queues)}: retries and a sweep every "
            f"{desk.config.sweep_interval_seconds:g} s."
        )
        stop = threading.Event()
        start_sweep_ticker(app, stop)
        try:
            scheduler.work()  # until SIGTERM or SIGINT
        finally:
            stop.set()

    redis_group = AppGroup("redis", help="The embedded Redis of this checkout (used when REDIS_URL is unset).")

    @redis_group.command("start")
    def redis_start_command() -> None:
        """Start the embedded Redis, unless a process of this checkout already did."""
        config = app.extensions["desk"].config
        if config.redis_url:
            raise click.ClickException("REDIS_URL is set, so there is no embedded Redis to start.")
        try:
            url = embedded_redis.ensure_running(config.instance_path)
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"Embedded Redis answering on {url}")

    @redis_group.command("stop")
    def redis_stop_command() -> None:
        """Stop the embedded Redis (every process of this checkout loses its queue until one starts it)."""
        config = app.extensions["desk"].config
        stopped = not config.redis_url and embedded_redis.stop(config.instance_path)
        click.echo("Embedded Redis stopped." if stopped else "No embedded Redis was running.")

    desk_group.add_command(redis_group)
    app.cli.add_command(desk_group)

    @app.cli.command("sweep")
    def sweep_command():
        """Re-enqueue conversations that should be moving but have no live move."""
        from webapp.runtime.work import sweep

        click.echo(f"Re-enqueued {plural(sweep(), 'conversation')}.")

    _register_policies(app)
    _register_mcp(app)


def _register_policies(app: Flask) -> None:
    """`flask policy-change list|approve|reject` (the operator as the second pair of eyes) and `flask
    ceiling set|list` (the most one call may move with no person, per tool, for every tenant)."""
    from webapp.accounts import policy_actions
    from webapp.agent import policies
    from webapp.models import OPERATIONS_SLUG, Tenant
    from webapp.web.errors import Refused

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
        except Refused as exc:
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


def _register_mcp(app: Flask) -> None:
    """`flask mcp add|list|sync|remove`: a tenant's MCP servers (webapp/tools/mcp.py)."""
    from webapp.accounts import mcp_actions
    from webapp.models import OPERATIONS_SLUG, McpServer, Tenant
    from webapp.tools import mcp

    group = AppGroup("mcp", help="MCP servers whose tools join a tenant's assistant, behind the approval gate.")

    def tenant_of(slug: str) -> Tenant:
        tenant = db.session.scalar(select(Tenant).where(Tenant.slug == slug.strip(), Tenant.slug != OPERATIONS_SLUG))
        if tenant is None:
            raise click.UsageError(f"There is no tenant {slug.strip()!r}; `flask mcp list` shows the tenants' servers.")
        return tenant

    def tool_lines(server: McpServer) -> list[str]:
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

    @group.command("add")
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
            tenant = tenant_of(slug)
        except click.UsageError as exc:
            attempt = {"url": url, "command": command, "headers": list(headers), "environment": list(environment)}
            mcp_actions.refused_add(db.session, None, None, name, exc.message, tenant=slug, **attempt)
            raise
        try:
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
        except mcp.McpError as exc:
            raise click.UsageError(str(exc)) from None
        click.echo(f"Added MCP server {server.name} to {tenant.slug}, with {plural(len(server.tools), 'tool')}:")
        for line in tool_lines(server):
            click.echo(line)
        for remote, why in report.refused:
            click.echo(f"  refused {remote}: {why}")

    @group.command("list")
    @click.option("--tenant", "slug", default=None, help="Only this tenant's servers.")
    def list_command(slug: str | None) -> None:
        """The MCP servers, their tools and whether any is held (header values are never shown)."""
        query = select(McpServer, Tenant.slug).join(Tenant, Tenant.id == McpServer.tenant_id)
        if slug is not None:
            query = query.where(McpServer.tenant_id == tenant_of(slug).id)
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
            for line in tool_lines(server):
                click.echo(line)

    @group.command("sync")
    @click.argument("name")
    @click.option("--tenant", "slug", required=True)
    def sync_command(name: str, slug: str) -> None:
        """Read the server's tools again: new ones join, gone ones leave, changed ones are held."""
        tenant = tenant_of(slug)
        try:
            report = mcp_actions.sync(db.session, tenant.id, None, name)
        except mcp.McpError as exc:
            raise click.UsageError(str(exc)) from None
        click.echo(f"Synced MCP server {name.strip()} of {tenant.slug}.")
        for line in report.lines():
            click.echo(f"  {line}")

    @group.command("map")
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
        tenant = tenant_of(slug)
        pairs = {}
        for pair in facts_args:
            theirs, equals, ours = pair.partition("=")
            if not equals or not theirs.strip() or not ours.strip():
                raise click.UsageError(f"{pair!r} is not THEIRS=OURS, e.g. --facts-arg repo_path=repo_path.")
            pairs[theirs.strip()] = ours.strip()
        try:
            mapping = mcp_actions.map_tool(
                db.session, tenant.id, None, tool.strip(), amount=amount, unit=unit, subject=subject,
                facts_tool=facts_tool, facts_arguments=pairs,
            )  # fmt: skip
        except mcp.McpError as exc:
            raise click.UsageError(str(exc)) from None
        said = mcp.mapping_words(mapping)
        click.echo(f"Mapped {tool.strip()} of {tenant.slug}: {'; '.join(said) if said else 'nothing (cleared)'}.")

    @group.command("remove")
    @click.argument("name")
    @click.option("--tenant", "slug", required=True)
    def remove_command(name: str, slug: str) -> None:
        """Remove the server; its tools leave the tenant's assistant."""
        tenant = tenant_of(slug)
        try:
            names = mcp_actions.remove(db.session, tenant.id, None, name)
        except mcp.McpError as exc:
            raise click.UsageError(str(exc)) from None
        click.echo(f"Removed MCP server {name.strip()} of {tenant.slug} and its tools: {', '.join(names) or 'none'}.")

    app.cli.add_command(group)
