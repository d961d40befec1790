"""Settings from the environment: the values a process ends up with, and the sentences that stop it
at boot when a value is bad (for the app and for gunicorn.conf.py)."""

from __future__ import annotations

import runpy
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from webapp.config import Config, ConfigError


def refusal(tmp_path, **env: str) -> str:
    with pytest.raises(ConfigError) as refused:
        Config.from_env({"INSTANCE_PATH": str(tmp_path), **env})
    return str(refused.value)


@pytest.mark.parametrize(
    ("name", "value", "sentence"),
    [
        ("MOVE_BUDGET", "abc", "MOVE_BUDGET must be a whole number of at least 1, got 'abc'; e.g. MOVE_BUDGET=25"),
        ("MOVE_BUDGET", "2.5", "MOVE_BUDGET must be a whole number of at least 1, got '2.5'; e.g. MOVE_BUDGET=25"),
        ("MOVE_BUDGET", "lots", "MOVE_BUDGET must be a whole number of at least 1, got 'lots'; e.g. MOVE_BUDGET=25"),
        ("MOVE_BUDGET", "0", "MOVE_BUDGET must be at least 1, got 0; e.g. MOVE_BUDGET=25"),
        ("TOKEN_BUDGET", "-5", "TOKEN_BUDGET must be at least 0, got -5; e.g. TOKEN_BUDGET=0"),
        (
            "MODEL_TIMEOUT_SECONDS",
            "soon",
            "MODEL_TIMEOUT_SECONDS must be a number of seconds, got 'soon'; e.g. MODEL_TIMEOUT_SECONDS=60",
        ),
        ("EXPORT_STEP_SECONDS", "-1", "EXPORT_STEP_SECONDS must be at least 0, got -1; e.g. EXPORT_STEP_SECONDS=1"),
        ("TOOL_OUTPUT_LIMIT", "100", "TOOL_OUTPUT_LIMIT must be at least 200, got 100; e.g. TOOL_OUTPUT_LIMIT=8000"),
        (
            "STALE_APPROVAL_HOURS",
            "soon",
            "STALE_APPROVAL_HOURS must be a number of hours, got 'soon'; e.g. STALE_APPROVAL_HOURS=4",
        ),
        (
            "MOVE_RETRY_INTERVALS",
            "5,,120",
            "MOVE_RETRY_INTERVALS must be comma-separated seconds (whole, 0 or more), got '5,,120';"
            " e.g. MOVE_RETRY_INTERVALS=5,30,120",
        ),
        (
            "MOVE_RETRY_INTERVALS",
            "5,-30",
            "MOVE_RETRY_INTERVALS must be comma-separated seconds (whole, 0 or more), got '5,-30';"
            " e.g. MOVE_RETRY_INTERVALS=5,30,120",
        ),
        (
            "MOVE_RETRY_INTERVALS",
            "5,x",
            "MOVE_RETRY_INTERVALS must be comma-separated seconds (whole, 0 or more), got '5,x';"
            " e.g. MOVE_RETRY_INTERVALS=5,30,120",
        ),
        (
            "LOG_LEVEL",
            "chatty",
            "LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, got 'chatty'; e.g. LOG_LEVEL=INFO",
        ),
        ("SECURE_COOKIES", "maybe", "SECURE_COOKIES must be 1 or 0, got 'maybe'; e.g. SECURE_COOKIES=1"),
        (
            "DATABASE_URL",
            "mysql://me:pw@db/x",
            "DATABASE_URL must be a sqlite:/// path or a postgresql:// URL, got mysql:...",
        ),
        (
            "DATABASE_URL",
            "mysql://db/x",
            "DATABASE_URL must be a sqlite:/// path or a postgresql:// URL, got mysql:...",
        ),
        (
            "EXTRA_TOOLS",
            "tests.task_tools",
            "EXTRA_TOOLS entries are package.module:ToolClass, comma-separated; got 'tests.task_tools'",
        ),
        (
            "METRICS_TOKEN",
            "too-short",
            "METRICS_TOKEN must be at least 16 characters; e.g. METRICS_TOKEN=$(openssl rand -hex 24)",
        ),
        (
            "OUTBOUND_ALLOW",
            "nonsense",
            "OUTBOUND_ALLOW entries are host:port (or host:* for any port), comma-separated, an IPv6 address in "
            "brackets, e.g. OUTBOUND_ALLOW=127.0.0.1:5299,mcp.internal:443; got 'nonsense'",
        ),
    ],
)
def test_a_bad_value_is_refused_in_one_sentence_saying_what_would_do(tmp_path, name, value, sentence):
    assert refusal(tmp_path, **{name: value}) == sentence


@pytest.mark.parametrize(
    ("value", "sentence"),
    [
        (
            "",
            "MCP_SECRET_PREFIX must not be empty: every variable's name starts with an empty prefix, so a tenant's "
            "admin could send any of the desk's variables (SECRET_KEY, DATABASE_URL, ...) to their MCP server; leave "
            "it unset for MCP_SECRET_, or e.g. MCP_SECRET_PREFIX=TENANT_SECRET_",
        ),
        (
            "MCP-SECRET",
            "MCP_SECRET_PREFIX must be the start of a variable's name (letters, digits and _, not starting with a "
            "digit), got 'MCP-SECRET'; e.g. MCP_SECRET_PREFIX=MCP_SECRET_",
        ),
        (
            "SECRET",
            "MCP_SECRET_PREFIX 'SECRET' would let a tenant's admin send the desk's own SECRET_KEY to their MCP server; "
            "choose a prefix none of the desk's variables starts with, e.g. MCP_SECRET_PREFIX=MCP_SECRET_",
        ),
        (
            "A",
            "MCP_SECRET_PREFIX 'A' would let a tenant's admin send the desk's own ANTHROPIC_API_KEY, "
            "ANTHROPIC_BASE_URL, ANTHROPIC_MODEL ... to their MCP server; choose a prefix none of the desk's variables "
            "starts with, e.g. MCP_SECRET_PREFIX=MCP_SECRET_",
        ),
    ],
)
def test_the_prefix_of_variables_tenant_admins_may_name_never_opens_the_desks_own(tmp_path, value, sentence):
    assert refusal(tmp_path, MCP_SECRET_PREFIX=value) == sentence


def test_the_prefix_of_variables_tenant_admins_may_name(tmp_path):
    assert Config.from_env({"INSTANCE_PATH": str(tmp_path)}).mcp_secret_prefix == "MCP_SECRET_"
    chosen = Config.from_env({"INSTANCE_PATH": str(tmp_path), "MCP_SECRET_PREFIX": " TENANT_SECRET_ "})
    assert chosen.mcp_secret_prefix == "TENANT_SECRET_"


def test_every_bad_value_is_named_at_once_one_a_line(tmp_path):
    said = refusal(tmp_path, MOVE_BUDGET="lots", LOG_FORMAT="yaml", MOVE_RETRY_INTERVALS="5,x,y", QUEUE_NAME="fine")
    assert said.splitlines() == [
        "LOG_FORMAT must be one of json, text, got 'yaml'; e.g. LOG_FORMAT=json",
        "MOVE_RETRY_INTERVALS must be comma-separated seconds (whole, 0 or more), got '5,x,y';"
        " e.g. MOVE_RETRY_INTERVALS=5,30,120",
        "MOVE_BUDGET must be a whole number of at least 1, got 'lots'; e.g. MOVE_BUDGET=25",
    ]


def test_create_app_stops_with_the_sentences_and_nothing_of_pydantic(tmp_path, monkeypatch):
    from webapp import create_app

    monkeypatch.setenv("INSTANCE_PATH", str(tmp_path))
    monkeypatch.setenv("MOVE_BUDGET", "lots")
    monkeypatch.setenv("SESSION_IDLE_MINUTES", "0")
    with pytest.raises(SystemExit) as stopped:
        create_app()
    said = str(stopped.value.code)
    assert said.startswith("Configuration error: MOVE_BUDGET must be a whole number of at least 1, got 'lots'")
    assert "SESSION_IDLE_MINUTES must be at least 1, got 0" in said
    assert "validation error" not in said.lower() and "pydantic" not in said and "input_value" not in said


def test_values_are_read_as_people_write_them(tmp_path):
    config = Config.from_env(
        {
            "INSTANCE_PATH": str(tmp_path),
            "SECURE_COOKIES": " On ",
            "LOG_LEVEL": "debug",
            "LOG_FORMAT": " TEXT",
            "MOVE_RETRY_INTERVALS": "1, 2 ,3",
            "MODEL_TIMEOUT_SECONDS": "2.5",
            "MOVE_BUDGET": " ",  # blank counts as unset
            "TOKEN_BUDGET": "",
            "EXTRA_TOOLS": " tests.task_tools:Countdown, ",
            "METRICS_TOKEN": "  0123456789abcdef  ",
            "ANTHROPIC_MODEL": "claude-other",
            "OUTBOUND_ALLOW": " 127.0.0.1:5299 ,Mcp.Internal:*, [::1]:8080",
        }
    )
    assert config.secure_cookies is True
    assert (config.log_level, config.log_format) == ("DEBUG", "text")
    assert config.move_retry_intervals == (1, 2, 3)
    assert config.model_timeout_seconds == 2.5
    assert (config.move_budget, config.token_budget) == (25, 0)
    assert config.extra_tools == ("tests.task_tools:Countdown",)
    assert config.metrics_token == "0123456789abcdef"
    assert config.model == "claude-other"
    assert config.outbound_allow == ("127.0.0.1:5299", "mcp.internal:*", "[::1]:8080")
    assert Config.from_env({"INSTANCE_PATH": str(tmp_path)}).outbound_allow == ()  # by default: public addresses only


def test_paths_and_the_secret_key_live_under_the_instance_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = Config.from_env({"EXPORT_DIR": "shared/exports"})
    instance = tmp_path / "instance"
    assert config.instance_path == instance.resolve()
    assert config.database_url == f"sqlite:///{instance.resolve() / 'app.db'}"
    assert config.export_dir == (tmp_path / "shared" / "exports").resolve()
    key_file = instance / "secret_key"
    assert config.secret_key == key_file.read_text() and len(config.secret_key) == 64
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert Config.from_env({}).secret_key == config.secret_key  # generated once, then kept
    assert Config.from_env({"SECRET_KEY": "set-by-hand"}).secret_key == "set-by-hand"
    other = tmp_path / "other"
    assert Config.from_env({}, instance_path=other).export_dir == other / "exports"
    assert Config.from_env({"INSTANCE_PATH": str(instance)}, instance_path=other).instance_path == instance.resolve()


def test_only_the_given_mapping_is_read_and_other_variables_are_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("MOVE_BUDGET", "7")
    given = {"INSTANCE_PATH": str(tmp_path), "move_budget": "3", "MOVE_BUDGETS": "oops", "PATH": "/bin"}
    assert Config.from_env(given).move_budget == 25
    monkeypatch.setenv("INSTANCE_PATH", str(tmp_path))
    assert Config.from_env().move_budget == 7


def gunicorn_settings(monkeypatch, **env: str) -> dict:
    for name in ("PORT", "WEB_CONCURRENCY", "WEB_THREADS", "WEB_TIMEOUT", "FORWARDED_ALLOW_IPS", "LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(ROOT / "gunicorn.conf.py"))


def test_gunicorn_settings_come_from_the_environment(monkeypatch):
    defaults = gunicorn_settings(monkeypatch)
    assert defaults["bind"] == "0.0.0.0:8000"
    assert (defaults["workers"], defaults["threads"], defaults["timeout"]) == (2, 200, 30)
    assert defaults["forwarded_allow_ips"] == "127.0.0.1"
    assert defaults["logconfig_dict"]["root"]["level"] == "INFO"
    chosen = gunicorn_settings(
        monkeypatch, PORT="9000", WEB_CONCURRENCY="3", WEB_THREADS="800", WEB_TIMEOUT="60", LOG_LEVEL="warning"
    )
    assert chosen["bind"] == "0.0.0.0:9000"
    assert (chosen["workers"], chosen["threads"], chosen["timeout"]) == (3, 800, 60)
    assert chosen["worker_connections"] == 1600
    assert chosen["logconfig_dict"]["root"]["level"] == "WARNING"
    # set but empty, FORWARDED_ALLOW_IPS trusts no proxy (it does not fall back to the default)
    assert gunicorn_settings(monkeypatch, FORWARDED_ALLOW_IPS="")["forwarded_allow_ips"] == ""
    assert gunicorn_settings(monkeypatch, FORWARDED_ALLOW_IPS="10.0.0.2")["forwarded_allow_ips"] == "10.0.0.2"


def test_gunicorn_refuses_bad_settings_in_sentences_before_it_starts(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "webapp:create_app()"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "INSTANCE_PATH": str(tmp_path), "WEB_THREADS": "lots", "PORT": "0"},
        timeout=60,
    )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "Configuration error: PORT must be at least 1, got 0; e.g. PORT=8000",
        "WEB_THREADS must be a whole number of at least 1, got 'lots'; e.g. WEB_THREADS=200",
    ]
