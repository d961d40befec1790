"""Test fixtures on real parts: the database (SQLite by default, PostgreSQL when DATABASE_URL is set),
Redis (an embedded server by default, the machine's when REDIS_URL is set), the model behind a real
HTTP endpoint, and RQ workers as subprocesses."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis as redis_lib
from flask import Flask, has_app_context
from flask.testing import FlaskClient
from rq import Worker
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.orm import Session

from tests.listeners import closed_port
from tests.migrations import blank_database  # noqa: F401 - a fixture: an empty database for migration tests
from tests.model_server import ModelServer
from webapp.config import Config
from webapp.database import engine_options, prepare_engine
from webapp.models import Base

ROOT = Path(__file__).resolve().parent.parent
BILLING = "demo.billing:TOOLS"  # EXTRA_TOOLS of the billing demo; a test adding tools keeps it first
# Tables a test may fill; the accounts and tenants of the demo seed stay for the whole session.
RUNTIME_TABLES = [
    "batch_requests",
    "run_items",
    "webhook_deliveries",
    "webhook_subscriptions",
    "notification_deliveries",
    "notification_channels",
    "external_calls",
    "external_tools",
    "mcp_tools",
    "mcp_servers",
    "secret_grants",
    "tool_defaults",
    "user_sessions",
    "model_calls",
    "summaries",
    "assistant_settings",
    "decisions",
    "policy_changes",
    "role_changes",
    "user_keyings",
    "tool_ceilings",
    "tool_policies",
    "tool_access",
    "tool_calls",
    "messages",
    "conversations",
    "runs",
    "refunds",
    "outgoing_emails",
    "subscriptions",
    "invoices",
    "customers",
]


@pytest.fixture
def closed() -> int:
    """A port of 127.0.0.1 nothing listens on, for a test of what calling one looks like."""
    return closed_port()


_ports = itertools.count()


def free_port() -> int:
    """A port for a server a test starts that no other server of the suite can take meanwhile, even
    while it restarts: below the kernel's ephemeral range (which every bind to port 0 draws from), in
    this test process's own share of 500 ports, the next free one in turn."""
    ranges = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ranges.read_text().split()[0]) if ranges.exists() else 32768
    share = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    first = low - 500 * (share + 1)
    for _ in range(500 if first >= 1024 else 0):
        port = first + next(_ports) % 500
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as probe:  # no room below the ephemeral range: any free port
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(predicate: Callable[[], object], timeout: float = 20.0, message: str = "condition") -> object:
    """Poll until predicate() is truthy; its value. Fails the test with `message` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {message}")
        time.sleep(0.05)


# Under pytest-xdist (bin/test runs several test processes) each process gets its own database and
# Redis database, derived from the ones given: gw0 uses test_gw0 and db 15, gw1 test_gw1 and db 14...
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def own_postgres_database(url: str) -> str:
    """This test process's database beside the one DATABASE_URL names, created when missing."""
    if not XDIST_WORKER:
        return url
    given = make_url(url)
    name = f"{given.database}_{XDIST_WORKER}"
    admin = create_engine(given, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        if not connection.scalar(text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": name}):
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return given.set(database=name).render_as_string(hide_password=False)


def own_redis_database(url: str) -> str:
    """This test process's Redis database number, counting down from the one REDIS_URL names."""
    if not XDIST_WORKER:
        return url
    parts = urlsplit(url)
    given = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{(given - int(XDIST_WORKER.removeprefix('gw'))) % 16}"))


@pytest.fixture(scope="session")
def database_url(tmp_path_factory) -> str:
    url = os.environ.get("DATABASE_URL")
    if not url:
        return f"sqlite:///{tmp_path_factory.mktemp('db') / 'test.db'}"
    url = Config.from_env({"DATABASE_URL": url, "SECRET_KEY": "x"}, instance_path=Path("/tmp")).database_url
    url = own_postgres_database(url)
    import demo.billing.models  # noqa: F401 - the pack's tables are on Base.metadata too: they go first

    engine = create_engine(url)
    with engine.begin() as connection:  # a clean schema: the migrations below build it
        Base.metadata.drop_all(connection)
        connection.execute(text("DROP TABLE IF EXISTS alembic_version"))
    engine.dispose()
    return url


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> Iterator[str]:
    url = os.environ.get("REDIS_URL")
    if url:
        yield own_redis_database(url)
        return
    from webapp.runtime import embedded_redis

    folder = tmp_path_factory.mktemp("redis")
    yield embedded_redis.ensure_running(folder)  # what the app does without REDIS_URL
    embedded_redis.stop(folder)


@pytest.fixture(scope="session")
def base_env(database_url, redis_url, tmp_path_factory) -> dict[str, str]:
    """Settings shared by the test process and its worker subprocesses."""
    return {
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "INSTANCE_PATH": str(tmp_path_factory.mktemp("instance")),
        "SECRET_KEY": "test-secret",
        "QUEUE_NAME": "test-moves",
        "MODEL_MAX_RETRIES": "0",
        "MODEL_TIMEOUT_SECONDS": "5",
        "MOVE_RETRIES": "2",
        "MOVE_RETRY_INTERVALS": "0",
        "MOVE_LEASE_SECONDS": "3",
        "SWEEP_INTERVAL_SECONDS": "1",
        "WORKER_STOP_GRACE_SECONDS": "2",
        "MCP_CHECK_SECONDS": "0",  # a test that wants the periodic check of MCP servers sets it
        "EXTRA_TOOLS": BILLING,  # the billing demo, loaded like any team's pack
    }


@pytest.fixture(scope="session")
def migrated(base_env) -> str:
    """Build the schema with the real migrations (flask db upgrade), once per session."""
    from flask_migrate import upgrade

    from webapp import create_app

    app = create_app(Config.from_env(base_env))
    with app.app_context():
        upgrade()
        from demo.billing.seed import seed_demo
        from webapp.runtime.extensions import db

        seed_demo(db.session)
        db.session.commit()
        db.engine.dispose()
    return base_env["DATABASE_URL"]


@pytest.fixture
def model() -> Iterator[ModelServer]:
    """The model behind a real local HTTP endpoint; every request the app sent must have been valid."""
    with ModelServer() as server:
        yield server
    assert not server.invalid_requests, f"the app sent invalid Messages API requests: {server.invalid_requests}"


@pytest.fixture
def env(base_env, model, migrated) -> dict[str, str]:
    return {**base_env, **model.env()}


@pytest.fixture
def engine(migrated):
    engine = prepare_engine(create_engine(migrated, **engine_options(migrated)))
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def seeded(migrated) -> list[tuple[object, list[dict]]]:
    """The billing rows seed_demo wrote for the session (customers, subscriptions, invoices: parents
    first), read once, so that each test gets them back in one statement a table rather than by seeding
    anew row by row."""
    from demo.billing.models import Customer, Invoice, Subscription

    engine = create_engine(migrated, **engine_options(migrated))
    with engine.connect() as connection:
        tables = [model.__table__ for model in (Customer, Subscription, Invoice)]
        rows = [(table, [dict(row._mapping) for row in connection.execute(table.select())]) for table in tables]
    engine.dispose()
    return rows


@pytest.fixture
def clean(engine, base_env, seeded):
    """Empty the runtime tables, put the billing data back as seeded and empty Redis before a test."""
    empty_runtime_tables(engine, base_env["REDIS_URL"], seeded)


def empty_runtime_tables(engine, redis_url: str, seeded) -> None:
    """What `clean` does before each test; a test that runs many examples (tests/gate) calls it before
    each example."""
    postgres = engine.dialect.name == "postgresql"
    with engine.begin() as connection:
        connection.execute(text("UPDATE tenants SET endpoint_id = NULL, small_endpoint_id = NULL"))  # endpoints go
        connection.execute(text("DELETE FROM endpoint_tenants"))
        connection.execute(text("DELETE FROM model_endpoints"))
        if postgres:
            connection.execute(text(f"TRUNCATE {', '.join(RUNTIME_TABLES)} RESTART IDENTITY CASCADE"))
        else:
            for table in RUNTIME_TABLES:
                connection.execute(text(f"DELETE FROM {table}"))
        for table, rows in seeded:
            connection.execute(table.insert(), rows)
            if postgres:  # the next row a test adds gets the next id
                name = table.name
                connection.execute(
                    text(f"SELECT setval(pg_get_serial_sequence('{name}', 'id'), (SELECT MAX(id) FROM {name}))")
                )
        # demo logins back as seeded, whatever a test did to them
        connection.execute(
            text("UPDATE users SET active = true WHERE email LIKE '%@acme.test' OR email LIKE '%@globex.test'")
        )
    redis_lib.Redis.from_url(redis_url).flushdb()


@pytest.fixture
def read(engine, clean) -> Callable:
    """read(lambda s: s.scalar(...)): a query in its own short session, so no lock outlives it."""

    def run(query: Callable[[Session], object]):
        with Session(engine, expire_on_commit=False) as short:
            return query(short)

    return run


@pytest.fixture
def session(engine, clean) -> Iterator[Session]:
    """A plain SQLAlchemy session (no Flask) on the test database."""
    with Session(engine, expire_on_commit=False) as session:
        yield session


class WebClient(FlaskClient):
    """A test client of the app's web twin (see the `app` fixture): each of its requests runs in an
    app context of its own, as in production, so no `g` (signed-in user, CSRF token) or database
    session is shared between requests or with the test."""

    def __init__(self, application, *args, **kwargs) -> None:
        super().__init__(application.config.get("WEB_TWIN", application), *args, **kwargs)

    def open(self, *args, **kwargs):
        from webapp.runtime.extensions import db

        if has_app_context():
            db.session.remove()  # end the test's own transaction: on SQLite it would hold the write lock
        return super().open(*args, **kwargs)


def desk_app(env: dict[str, str]) -> Flask:
    """create_app() for a test. Its test clients talk to a twin built from the same configuration,
    as a browser talks to a web process: Flask reuses a pushed app context only for the app it
    belongs to, so each request of a client gets a fresh one while the test holds the app's context
    for its own queries (Flask-SQLAlchemy's testing pattern)."""
    from webapp import create_app

    config = Config.from_env(env)
    app = create_app(config)
    twin = create_app(config)
    twin.config = app.config  # what a test sets on the app (CSRF off, a session lifetime) holds for requests
    twin.extensions["desk"] = app.extensions["desk"]  # one set of services: config, queue, tools
    app.config["WEB_TWIN"] = twin
    app.test_client_class = twin.test_client_class = WebClient
    return app


@contextmanager
def pushed(app: Flask) -> Iterator[Flask]:
    """The app with its context pushed for the test's own queries; both twins' engines are closed
    afterwards."""
    from webapp.runtime.extensions import db

    with app.app_context():
        yield app
        db.session.remove()
    for each in (app.config.get("WEB_TWIN"), app):
        if each is not None:
            with each.app_context():
                db.engine.dispose()


@pytest.fixture
def app(env, clean):
    with pushed(desk_app(env)) as app:
        yield app


@pytest.fixture
def cli(app) -> Callable:
    """cli("seed-demo", ...) runs a command as `flask --app webapp ...` would; its session ends with it."""
    from webapp.runtime.extensions import db

    def invoke(*args: str):
        result = app.test_cli_runner().invoke(args=list(args))
        db.session.remove()
        return result

    return invoke


@pytest.fixture
def api(app):
    """A test client that speaks as a demo user: api.as_("agent@acme.test").post(...)."""
    return ApiClient(app)


class ApiClient:
    def __init__(self, app) -> None:
        self.app = app
        self.client = app.test_client()
        self.tokens: dict[str, str] = {}

    def token(self, email: str) -> str:
        from sqlalchemy import select

        from webapp.identity import create_token
        from webapp.models import User
        from webapp.runtime.extensions import db

        if email not in self.tokens:
            user = db.session.scalar(select(User).where(User.email == email))
            self.tokens[email] = create_token(db.session, user)
            db.session.commit()
        return self.tokens[email]

    def as_(self, email: str) -> _AsUser:
        return _AsUser(self.client, self.token(email))


class _AsUser:
    def __init__(self, client, token: str) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {token}"}

    def get(self, url, **kw):
        return self._done(self.client.get(url, headers=self.headers, **kw))

    def post(self, url, **kw):
        return self._done(self.client.post(url, headers=self.headers, **kw))

    def put(self, url, **kw):
        return self._done(self.client.put(url, headers=self.headers, **kw))

    def delete(self, url, **kw):
        return self._done(self.client.delete(url, headers=self.headers, **kw))

    @staticmethod
    def _done(response):
        return response


class WorkerProcess:
    """A real RQ worker in its own process, doing what `flask --app webapp worker` does: forked from the
    session's zygote (milliseconds: the app's imports are paid once), or with via_cli that command."""

    def __init__(self, env: dict[str, str], log_path: Path, zygote: Zygote | None, args: tuple[str, ...] = ()) -> None:
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        if zygote is not None:
            self.pid = zygote.fork(log_path, env)
            return
        self.log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "flask", "--app", "webapp", "worker", *args],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None if self.process is not None else process_alive(self.pid)

    def kill(self) -> None:
        """SIGKILL: the worker dies without a chance to clean up, as in a crash."""
        if self.alive():
            os.killpg(self.pid, signal.SIGKILL)
        self._gone(10)

    def terminate(self) -> None:
        """SIGTERM, as a process manager stops a worker: it finishes or lets go of its moves."""
        os.killpg(self.pid, signal.SIGTERM)

    def wait_gone(self, timeout: float) -> bool:
        return self._gone(timeout)

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.pid, signal.SIGTERM)
            if not self._gone(10):
                self.kill()
        if self.process is not None:
            self.log.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True


class Zygote:
    """tests/zygote.py as a subprocess: forks workers in milliseconds instead of seconds."""

    def __init__(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.zygote"],
            cwd=ROOT,
            env={**os.environ, **env},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lock = threading.Lock()
        ready = self.process.stdout.readline()
        if not ready:
            pytest.fail(f"the worker zygote exited with {self.process.wait(10)}")

    def fork(self, log_path: Path, env: dict[str, str], port: int | None = None) -> int:
        """A worker (or, given a port, a web server on it) in a new process; its pid."""
        order = {"log": str(log_path), "env": env, **({"port": port} if port is not None else {})}
        with self.lock:
            self.process.stdin.write(json.dumps(order) + "\n")
            self.process.stdin.flush()
            return json.loads(self.process.stdout.readline())["pid"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self.process.stdout.close()


def own_redis_clients(redis) -> list[dict]:
    """The connections Redis has on this test process's database. Other test processes share the
    server (each on a database of its own) and open and close theirs meanwhile."""
    ours = str(redis.connection_pool.connection_kwargs.get("db", 0))
    return [client for client in redis.client_list() if client.get("db") == ours]


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="session")
def zygote(base_env, migrated) -> Iterator[Zygote]:
    """One process that imported the app, forking workers and web servers for the whole session."""
    parent = Zygote(base_env)
    yield parent
    parent.stop()


@pytest.fixture
def workers(env, tmp_path, zygote) -> Iterator[Callable[..., WorkerProcess]]:
    """Start workers: workers(**settings) starts one and waits until it has registered; with
    via_cli=True it runs `flask --app webapp worker` itself (with `args`, its options)."""
    started: list[WorkerProcess] = []
    connection = redis_lib.Redis.from_url(env["REDIS_URL"])

    def start(via_cli: bool = False, args: tuple[str, ...] = (), **overrides: str) -> WorkerProcess:
        before = Worker.count(connection=connection)
        log = tmp_path / f"worker-{len(started)}.log"
        worker = WorkerProcess({**env, **overrides}, log, None if via_cli or args else zygote, args)
        started.append(worker)
        wait_until(
            lambda: Worker.count(connection=connection) > before or not worker.alive(),
            30,
            "a worker to register",
        )
        assert worker.alive(), worker.output()
        return worker

    yield start
    for worker in started:
        worker.stop()
        print(f"--- {worker.log_path.name} ---\n{worker.output()[-4000:]}")  # shown when a test fails
