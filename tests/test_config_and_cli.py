"""Configuration checked at boot, and the command-line contract scripts rely on."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from sqlalchemy import func, select

from tests.conftest import ROOT
from webapp.config import Config, ConfigError
from webapp.models import User


def test_defaults_need_no_setup_and_postgres_urls_get_the_driver(tmp_path):
    config = Config.from_env({"INSTANCE_PATH": str(tmp_path)})
    assert config.database_url == f"sqlite:///{tmp_path / 'app.db'}"
    assert config.redis_url is None and config.anthropic_api_key is None
    assert config.move_budget == 25
    assert (tmp_path / "secret_key").exists()
    pg = Config.from_env({"INSTANCE_PATH": str(tmp_path), "DATABASE_URL": "postgres://u@h/db"})
    assert pg.database_url == "postgresql+psycopg://u@h/db"


def test_the_cli_reports_a_bad_setting_in_one_sentence(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "webapp", "sweep"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "INSTANCE_PATH": str(tmp_path), "MOVE_BUDGET": "lots"},
        timeout=60,
    )
    assert result.returncode != 0
    assert "Configuration error: MOVE_BUDGET must be a whole number" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("EXTRA_TOOLS", "tests.no_such_module:Tool", "EXTRA_TOOLS: cannot import 'tests.no_such_module'"),
        (
            "EXTRA_TOOLS",
            "tests.task_tools:Nothing",
            "EXTRA_TOOLS: 'tests.task_tools:Nothing' is not a Tool class, nor a list of them",
        ),
        (
            "EXTRA_TOOLS",
            "demo.billing:TOOLS,demo.billing.tools:SendEmail",
            "EXTRA_TOOLS: tool 'send_email' is registered twice",
        ),
        ("MODEL_TRANSPORT", "tests.no_such_module:transport", "MODEL_TRANSPORT: cannot import 'tests.no_such_module'"),
        (
            "MODEL_TRANSPORT",
            "demo.model:no_such_factory",
            "MODEL_TRANSPORT: 'demo.model:no_such_factory' is not a function of the Config",
        ),
    ],
)
def test_extra_tools_or_a_model_transport_that_cannot_load_stop_the_app_with_a_sentence(tmp_path, name, value, says):
    from webapp import create_app

    with pytest.raises(SystemExit, match=re.escape(says)):
        create_app(Config.from_env({"INSTANCE_PATH": str(tmp_path), name: value}))


def test_the_laptop_gets_the_offline_model_with_no_setting_and_a_key_gets_the_sdks_own(tmp_path):
    assert Config.from_env({"INSTANCE_PATH": str(tmp_path)}).model_transport == "demo.model:transport"
    assert Config.from_env({"INSTANCE_PATH": str(tmp_path), "ANTHROPIC_API_KEY": "sk-x"}).model_transport is None
    named = {"INSTANCE_PATH": str(tmp_path), "ANTHROPIC_API_KEY": "sk-x", "MODEL_TRANSPORT": "tests.x:proxy"}
    assert Config.from_env(named).model_transport == "tests.x:proxy"
    with pytest.raises(ConfigError, match="MODEL_TRANSPORT must be package.module:factory"):
        Config.from_env({"INSTANCE_PATH": str(tmp_path), "MODEL_TRANSPORT": "demo.model"})


def test_extra_tools_join_the_billing_tools(tmp_path):
    from webapp import create_app

    app = create_app(
        Config.from_env(
            {"INSTANCE_PATH": str(tmp_path), "EXTRA_TOOLS": "demo.billing:TOOLS,tests.task_tools:Countdown"}
        )
    )
    tools = app.extensions["desk"].tools
    assert tools.names()[-1] == "countdown" and "export_customer_data" in tools.names()


def test_create_user_and_create_token(app, cli):
    created = cli(
        "create-user",
        "Pat@Example.com",
        "--role",
        "agent",
        "--role",
        "reviewer",
        "--tenant",
        "initech",
        "--password",
        "long-enough",
    )
    assert created.exit_code == 0, created.output
    assert "Created pat@example.com (agent, reviewer) in tenant initech" in created.output
    token = cli("create-token", "pat@example.com")
    assert token.exit_code == 0
    bearer = token.output.strip().splitlines()[-1]
    response = app.test_client().post(
        "/api/conversations", json={"message": "hi"}, headers={"Authorization": f"Bearer {bearer}"}
    )
    assert response.status_code == 201


def create_user(email: str, role: str = "agent", tenant: str = "acme", password: str = "long-enough") -> list[str]:
    """The arguments of `flask create-user` for one person."""
    return ["create-user", email, "--role", role, "--tenant", tenant, "--password", password]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (create_user("x@example.com", role="wizard"), "'wizard' is not one of"),
        (create_user("agent@acme.test"), "already exists"),
        (create_user("not-an-email"), "is not an email address"),
        (create_user("y@example.com", tenant="Bad Slug"), "tenant slug"),
        (create_user("y@example.com", password="short"), "at least 8 characters"),
        (["create-token", "nobody@example.com"], "No active user nobody@example.com"),
    ],
)
def test_cli_mistakes_get_a_message_and_write_nothing(cli, read, args, says):
    before = read(lambda s: s.scalar(select(func.count(User.id))))
    result = cli(*args)
    assert result.exit_code == 2
    assert says in result.output
    assert read(lambda s: s.scalar(select(func.count(User.id)))) == before


def test_seed_demo_is_idempotent_and_prints_the_logins(cli, read):
    first = cli("seed-demo")
    second = cli("seed-demo")
    assert first.exit_code == second.exit_code == 0
    assert "agent@acme.test" in first.output and "reviewer@acme.test" in first.output
    assert first.output == second.output
    printed = set(re.findall(r"^\s+(\S+@\S+)", first.output, re.MULTILINE))
    assert len(printed) == 9
    assert read(lambda s: s.scalar(select(func.count(User.id)).where(User.email.in_(printed)))) == 9


def test_outbox_shows_the_newest_emails_with_their_bodies(cli, session):
    from demo.billing.models import Customer, OutgoingEmail
    from webapp.models import User

    agent = session.scalar(select(User).where(User.email == "agent@acme.test"))
    customer = session.get(Customer, 4471)
    for n in (1, 2):
        session.add(
            OutgoingEmail(
                tenant_id=agent.tenant_id,
                customer_id=customer.id,
                to_address=customer.email,
                subject=f"Code {n}",
                body=f"Hello,\nYour verification code is 00000{n}.",
                idempotency_key=f"outbox-test-{n}",
                created_by_id=agent.id,
            )
        )
    session.commit()
    result = cli("outbox", "--last", "1")
    assert result.exit_code == 0, result.output
    assert "Code 2" in result.output and "Your verification code is 000002." in result.output
    assert "Code 1" not in result.output
    assert cli("outbox", "--last", "0").exit_code == 2  # out of range: a usage error, not a crash
