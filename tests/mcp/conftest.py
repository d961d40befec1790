"""The MCP tests' parts: the warehouse MCP server (tests/mcp/warehouse.py) in a subprocess on a free port,
over the real streamable HTTP transport (the desk may call that one port of 127.0.0.1, OUTBOUND_ALLOW in
the app's and the workers' settings, and no other private address: the outbound guard stays on); the
warehouse as a stdio server the desk starts, noting each start; the stdio server that tells what it
was started with; reading the audit log, the servers and a tool's calls as the tests need them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from tests.conftest import free_port, wait_until
from webapp.models import AuditEvent, McpServer, Tenant, User
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.tools import mcp
from webapp.tools.registry import ToolContext

SCRIPT = Path(__file__).with_name("warehouse.py")
SURROUNDINGS = Path(__file__).with_name("surroundings.py")  # a stdio server telling what it was started with


def newest_event() -> int:
    """The newest audit event's id (the audit log is kept from test to test)."""
    db.session.remove()
    return db.session.scalar(select(func.max(AuditEvent.id))) or 0


def events(action: str, after: int) -> list[AuditEvent]:
    """The audit events of this action after the one numbered `after`, oldest first."""
    db.session.remove()
    query = select(AuditEvent).where(AuditEvent.action == action, AuditEvent.id > after).order_by(AuditEvent.id)
    return list(db.session.scalars(query))


def acme() -> int:
    """The demo tenant's id."""
    return db.session.scalar(select(Tenant.id).where(Tenant.slug == "acme"))


def person(email: str) -> int:
    return db.session.scalar(select(User.id).where(User.email == email))


def servers() -> list[McpServer]:
    """Every tenant's MCP servers, read afresh."""
    db.session.remove()
    return list(db.session.scalars(select(McpServer).order_by(McpServer.name)))


def context(tenant_id: int) -> ToolContext:
    return ToolContext(db.session, 1, tenant_id, 1, "toolcall-1")


def run(tool_name: str, arguments: dict):
    """A call of the tenant's tool as the loop makes it: its outcome (an error result in words, or not)."""
    tenant_id = acme()
    return services().tools_for(db.session, tenant_id).run(tool_name, arguments, context(tenant_id), 8000)


def surroundings(tool_name: str, *names: str) -> dict:
    """What the started server's process was started with (tests/mcp/surroundings.py), by a call of its tool."""
    tenant_id = acme()
    tool = services().tools_for(db.session, tenant_id).get(tool_name)
    return json.loads(tool.execute({"values_of": list(names)}, context(tenant_id)))


def stdio_command(reservations: Path) -> str:
    """The command that starts the warehouse as a stdio server."""
    return f"{sys.executable} {SCRIPT} --stdio --reservations {reservations}"


class StartedWarehouse:
    """The warehouse as a stdio server the desk starts (acme's `local` unless told), noting each start
    in a file."""

    def __init__(self, folder: Path, linger: float = 0.0) -> None:
        folder.mkdir(exist_ok=True)
        self.reservations = folder / "reservations.jsonl"
        self.hold = folder / "hold"  # while it exists, reserve_stock waits inside the server
        self.started = folder / "pids"
        self.command = (
            f"{sys.executable} {SCRIPT} --stdio --reservations {self.reservations} --hold {self.hold} "
            f"--pids {self.started} --linger {linger}"
        )

    def add(self, cli, name: str = "local", tenant: str = "acme") -> StartedWarehouse:
        added = cli("mcp", "add", name, "--command", self.command, "--tenant", tenant)
        assert added.exit_code == 0, added.output
        return self

    def pids(self) -> list[int]:
        """Every process started from this server's command, in order (adding and syncing list the
        server's tools on a process of their own, which ends with the listing)."""
        return [int(pid) for pid in self.started.read_text().split()] if self.started.exists() else []

    def received(self) -> int:
        received = self.reservations.with_suffix(".received")
        return len(received.read_text().splitlines()) if received.exists() else 0

    def reserved(self) -> list[dict]:
        return [json.loads(line) for line in self.reservations.read_text().splitlines()]


def running(pid: int) -> bool:
    """The process is there and not a zombie (a process that ended but was not yet reaped counts as
    gone: nothing of it runs)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class Warehouse:
    def __init__(self, tmp_path: Path, port: int) -> None:
        self.port = port
        self.reservations = tmp_path / "reservations.jsonl"
        self.hold = tmp_path / "hold"
        self.log = tmp_path / "warehouse.log"
        self.headers = tmp_path / "headers.jsonl"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self, variant: int = 1, token: str | None = None) -> Warehouse:
        env = {"PATH": "/usr/bin:/bin", **({"WAREHOUSE_TOKEN": token} if token else {})}
        args = [sys.executable, str(SCRIPT), "--port", str(self.port), "--reservations", str(self.reservations)]
        args += ["--variant", str(variant), "--hold", str(self.hold), "--headers", str(self.headers)]
        with self.log.open("a") as log:
            self.process = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_until(self._answers, 60, "the warehouse MCP server to listen")
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None

    def _answers(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    def reserved(self) -> list[dict]:
        """The reservations the server carried out."""
        if not self.reservations.exists():
            return []
        return [json.loads(line) for line in self.reservations.read_text().splitlines()]

    def requests_headers(self) -> list[dict]:
        """The headers of every HTTP request the server received, lower-case names."""
        if not self.headers.exists():
            return []
        return [json.loads(line) for line in self.headers.read_text().splitlines()]

    def received(self) -> int:
        """How many reserve_stock calls reached the server."""
        received = self.reservations.with_suffix(".received")
        return len(received.read_text().splitlines()) if received.exists() else 0


@pytest.fixture(autouse=True)
def no_server_outlives_the_test() -> Iterator[None]:
    """The servers this test process started (a tool called in the test's own thread) are stopped
    with the test, as a worker stops its own when it stops."""
    yield
    mcp.close_sessions()


@pytest.fixture
def warehouse_port() -> int:
    """The warehouse's port, known before the app is built: the one private address it may call."""
    return free_port()


@pytest.fixture
def env(env, warehouse_port) -> dict[str, str]:
    return {**env, "OUTBOUND_ALLOW": f"127.0.0.1:{warehouse_port}"}


@pytest.fixture
def warehouse(tmp_path, warehouse_port) -> Iterator[Warehouse]:
    server = Warehouse(tmp_path, warehouse_port).start()
    yield server
    server.stop()
