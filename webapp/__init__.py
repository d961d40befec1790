"""The approval desk for AI agents. create_app() is the only wiring point.

Nothing is imported here at module level: `import webapp.agent.loop` must load neither Flask nor RQ
(the layers are drawn in docs/architecture.md and enforced by the import-linter contracts in
pyproject.toml)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flask import Flask

    from webapp.config import Config

ROOT = Path(__file__).resolve().parent.parent


def create_app(config: Config | None = None) -> Flask:
    """A configured app: database, queue, tools and blueprints, from the environment by default."""
    from flask import Flask
    from htmx_flask import Htmx

    from webapp import audit_chain, logs
    from webapp.config import Config, ConfigError
    from webapp.database import engine_options, prepare_engine
    from webapp.llm.choice import transport_factory
    from webapp.runtime import webhook_trigger
    from webapp.runtime.extensions import db, migrate
    from webapp.runtime.queue import Dispatcher
    from webapp.runtime.services import Services
    from webapp.tools.registry import ToolRegistry, load_tools
    from webapp.web import errors, ids, rendering, request_logs, security

    if config is None:
        try:
            config = Config.from_env()
        except ConfigError as exc:  # at boot, a sentence beats a traceback
            raise SystemExit(f"Configuration error: {exc}") from None
    app = Flask(
        __name__,
        instance_path=str(config.instance_path),
        template_folder=str(ROOT / "templates"),
        static_folder=str(ROOT / "static"),
    )
    app.config.update(
        SECRET_KEY=config.secret_key,
        SQLALCHEMY_DATABASE_URI=config.database_url,
        SQLALCHEMY_ENGINE_OPTIONS=engine_options(config.database_url, config.database_pool_size),
        MAX_CONTENT_LENGTH=config.max_request_bytes,
    )
    app.json.sort_keys = False
    app.url_map.converters["int"] = ids.IdConverter  # before any route: an id past BIGINT is a 404
    config.instance_path.mkdir(parents=True, exist_ok=True)
    db.init_app(app)
    migrate.init_app(app, db, directory=str(Path(__file__).parent / "migrations"))
    Htmx(app)
    logs.configure(config)  # JSON lines (LOG_FORMAT) with the ids of what each line is about
    request_logs.init_app(app)
    security.init_app(app, config)
    audit_chain.install()
    webhook_trigger.install()
    with app.app_context():
        prepare_engine(db.engine)

    try:
        tools = ToolRegistry([tool for entry in config.extra_tools for tool in load_tools(entry)])
    except ValueError as exc:
        raise SystemExit(f"Configuration error: EXTRA_TOOLS: {exc}") from None
    if config.model_transport:  # at boot, not at a worker's first model call
        try:
            transport_factory(config.model_transport)
        except ValueError as exc:
            raise SystemExit(f"Configuration error: MODEL_TRANSPORT: {exc}") from None
    app.extensions["desk"] = Services(config=config, dispatcher=Dispatcher(config), tools=tools)

    _register_features(app)
    rendering.register(app)
    errors.register(app)
    return app


def _register_features(app: Flask) -> None:
    """Each feature package's blueprints, the navigation across them, and the command line."""
    from webapp import cli
    from webapp.accounts import sign_in, tokens, users
    from webapp.api import routes as api
    from webapp.approvals import pages as approvals
    from webapp.audit import pages as audit
    from webapp.conversations import live
    from webapp.conversations import pages as conversations
    from webapp.home import navigation
    from webapp.home import pages as home
    from webapp.ops import endpoints as endpoint_pages
    from webapp.ops import health, metrics
    from webapp.ops import mcp_servers as mcp_server_pages
    from webapp.ops import pages as ops
    from webapp.ops import secrets as secret_pages
    from webapp.runs import pages as runs
    from webapp.settings import assistant, mcp_servers, policies, policy_changes
    from webapp.settings import notifications as notification_settings
    from webapp.web import security

    app.register_blueprint(api.bp)
    security.csrf.exempt(api.bp)  # bearer tokens, no cookies: nothing to forge
    for blueprint in (
        health.bp,
        sign_in.bp,
        home.bp,
        conversations.bp,
        runs.bp,
        live.bp,
        approvals.bp,
        audit.bp,
        users.bp,
        tokens.bp,
        policies.bp,
        assistant.bp,
        notification_settings.bp,
        mcp_servers.bp,
        ops.bp,
    ):
        app.register_blueprint(blueprint)
    app.register_blueprint(endpoint_pages.bp)  # the operators' model endpoints
    app.register_blueprint(policy_changes.bp)  # the operators' second pair of eyes on policies
    app.register_blueprint(mcp_server_pages.bp)  # the operators' MCP servers: every tenant's, and commands
    app.register_blueprint(secret_pages.bp)  # the operators' secrets granted to tenants
    metrics.init_app(app)
    app.context_processor(lambda: {"nav_items": navigation.nav_items()})
    cli.register(app, app.extensions["desk"].config.extra_tools)
