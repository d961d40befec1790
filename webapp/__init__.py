"""The approval desk for AI agents. create_app() is the only wiring point."""

from __future__ import annotations

from pathlib import Path

from flask import Flask
from htmx_flask import Htmx

from webapp import audit, logs, security
from webapp.config import Config, ConfigError
from webapp.database import engine_options, prepare_engine
from webapp.extensions import db, migrate
from webapp.queue import Dispatcher
from webapp.services import Services

ROOT = Path(__file__).resolve().parent.parent


def create_app(config: Config | None = None) -> Flask:
    """A configured app: database, queue, tools and blueprints, from the environment by default."""
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
        SQLALCHEMY_ENGINE_OPTIONS=engine_options(config.database_url),
        MAX_CONTENT_LENGTH=config.max_request_bytes,
    )
    app.json.sort_keys = False
    config.instance_path.mkdir(parents=True, exist_ok=True)
    db.init_app(app)
    migrate.init_app(app, db, directory=str(Path(__file__).parent / "migrations"))
    Htmx(app)
    logs.configure(config)  # JSON lines (LOG_FORMAT) with the ids of what each line is about
    logs.init_app(app)
    security.init_app(app, config)
    audit.install()
    with app.app_context():
        prepare_engine(db.engine)

    from webapp.tools.billing import demo_tools
    from webapp.tools.registry import ToolRegistry, load_tool

    try:
        tools = ToolRegistry([*demo_tools(), *(load_tool(entry) for entry in config.extra_tools)])
    except ValueError as exc:
        raise SystemExit(f"Configuration error: EXTRA_TOOLS: {exc}") from None
    app.extensions["desk"] = Services(config=config, dispatcher=Dispatcher(config), tools=tools)

    from webapp import admin, api, audit_log, auth, chat, cli, errors, health, inbox, live, pages, rendering
    from webapp.navigation import nav_items

    app.register_blueprint(api.bp)
    security.csrf.exempt(api.bp)  # bearer tokens, no cookies: nothing to forge
    app.register_blueprint(health.bp)
    app.register_blueprint(auth.bp)
    app.register_blueprint(pages.bp)
    app.register_blueprint(chat.bp)
    app.register_blueprint(admin.bp)
    app.register_blueprint(inbox.bp)
    app.register_blueprint(live.bp)
    app.register_blueprint(audit_log.bp)
    from webapp import metrics, ops

    metrics.init_app(app)
    app.register_blueprint(ops.bp)
    rendering.register(app)
    app.context_processor(lambda: {"nav_items": nav_items()})
    cli.register(app)
    errors.register(app)
    return app
