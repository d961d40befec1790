"""Tools from Model Context Protocol servers, behind the same approval gate as the built-in tools.

A tenant's admins register MCP servers at a URL (streamable HTTP); only an operator (the command line,
/ops/mcp) registers a local command the desk starts and talks to over stdio, since whoever sets it runs
a program on the desk's host. Each server's tools join that tenant's registry as `McpTool`s under names
the Messages API accepts (`mcp_<server>__<tool>`). The desk is the MCP client, inside the perimeter:
the model only ever asks for a call, and the call waits for a person like any other.

- The catalogue (`add_server`, `sync_server`, `accept_tool`, `remove_server`) keeps each tool's
  description, input schema and annotations as an admin accepted them, and the server's current
  ones. A tool whose current definition differs is held: not offered to the model, and a call of it
  refused, until an admin accepts the change. A call also compares the server's listing with the
  accepted definition just before it sends anything, so a change between syncs is never run.
- A call of a server at a URL connects from the worker's thread (`anyio.run`), one connection per
  call. A server the desk starts is kept running: one live session per server per process, shared by
  the process's slots, on an event loop of its own (_LiveSessions), started again when it died or
  changed and closed after MCP_IDLE_SECONDS without a call and when the worker stops. Either way a
  call has a timeout; a server that cannot be reached is tried again with backoff (nothing was sent);
  a call lost after it was sent is tried again only when the server marks the tool read-only or
  idempotent (MCP has no idempotency keys). Adding, syncing and the periodic check list a started
  server's tools on a process of their own, which ends with the listing. Results, text and
  structured content alike, go through the registry's fence as external data; an `isError` result
  becomes an error result.
- Annotations are hints from a server the desk does not control: read-only tools run at once by
  default, every other tool waits for one approval (webapp/agent/policies.py `default_policy`).
- The desk's environment is the operator's: a header's $VARIABLE is read only when an operator set it
  or the operator granted that secret to the server's tenant (webapp/secrets/secret_grants.py), checked when
  the header is saved and again at every use (a grant revoked since: nothing is sent, SecretRefused),
  and a started server gets PATH and the variables an operator gave it, nothing else of the desk's.

Nothing here loads Flask, RQ or Redis.
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import json
import logging
import math
import os
import re
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio
import anyio.abc
import httpx2
from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from webapp import audit_chain, outbound
from webapp.config import Config
from webapp.models import McpServer, McpTool, utcnow
from webapp.secrets import sealing, secret_grants
from webapp.tools import presenting
from webapp.tools.described import UNITS, DescribedTool, money_in_cents, schema_problem
from webapp.tools.registry import (
    Fact,
    Record,
    Review,
    ToolContext,
    ToolError,
    wrap_output,
)

if TYPE_CHECKING:  # the SDK is imported where a server is reached: it costs every process a second to load
    from mcp.client.client import Client

SERVER_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
_ENV_REFERENCE = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_]*)$")
_VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NOT_IN_NAMES = re.compile(r"[^a-zA-Z0-9_-]")
NAME_LIMIT = 128  # the Messages API's longest tool name
ERROR_CHARS = 2000  # of a server's error text, fenced, in an error result
_SEALING = "mcp server headers"
_SEALING_ENVIRONMENT = "mcp server environment"
ONLY_OPERATORS_START = (
    "Only the desk's operator can add a server that the desk starts; ask them to run "
    '`flask mcp add NAME --command "..." --tenant SLUG`, or give the URL of a server that is already running.'
)
log = logging.getLogger(__name__)


class McpError(Exception):
    """Something about an MCP server an admin must fix or know; the message says what."""


class SecretRefused(McpError):
    """A header a tenant's admin set reads a variable of the desk's that is not granted to the tenant
    (any more): nothing was sent. `header`, `variable`: their names, never a value."""

    def __init__(self, message: str, server: str, header: str, variable: str) -> None:
        super().__init__(message)
        self.server, self.header, self.variable = server, header, variable

    def audit_data(self, moment: str) -> dict:
        """What the audit log keeps of the refusal: the server, the header and the variable's names."""
        return {"server": self.server, "header": self.header, "secret": self.variable, "moment": moment}


class _SecretRefusedAtCall(ToolError):
    """A call refused because its server's header names a secret not granted to the tenant: nothing
    was sent, and the refusal is audited (`mcp_secret_refused`) though the call's writes are undone."""

    def __init__(self, refused: SecretRefused) -> None:
        super().__init__(str(refused))
        self.refused = refused

    def record(self, context: ToolContext) -> None:
        audit_chain.record(
            context.session,
            "mcp_secret_refused",
            tenant_id=context.tenant_id,
            actor_label="call time",
            tool_call_id=context.tool_call_id,
            data=self.refused.audit_data("call"),
        )


class _Unreachable(Exception):
    """The server could not be reached, or failed before the call was sent: nothing was sent."""


class _Lost(Exception):
    """The call was sent, and then the server stopped answering or ran out of time."""


class _Changed(ToolError):
    """The server's listing no longer matches the accepted definition (found just before a call):
    nothing was sent, and the tool is held at once (no longer offered, its waiting calls not
    approvable) although the call's own writes are undone. `listed`: the tool as listed now."""

    def __init__(self, message: str, tool: McpRemoteTool, listed: dict) -> None:
        super().__init__(message)
        self.tool, self.listed = tool, listed

    def record(self, context: ToolContext) -> None:
        if hold_changed(context.session, context.tenant_id, self.tool.name, self.listed):
            audit_chain.record(
                context.session,
                "mcp_tool_held",
                tenant_id=context.tenant_id,
                actor_label="call time",
                tool_call_id=context.tool_call_id,
                tool_name=self.tool.name,
                data={"server": self.tool.server},
            )


# --- reaching a server ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Access:
    """How to reach one server: its URL or command, its headers and a started server's variables
    (sealed or named variables of the desk's), opened only when a request is made."""

    server: str
    url: str | None
    command: str | None
    # (name, "sealed" | "env", token or variable, set by an operator)
    headers: tuple[tuple[str, str, str, bool], ...] = ()
    environment: tuple[tuple[str, str, str], ...] = ()  # (name, "sealed" | "env", token or variable)
    working_directory: str | None = None
    command_by_operator: bool = False
    granted: frozenset[str] = frozenset()  # the secrets granted to the server's tenant when this was read
    secret_key: str = field(default="", repr=False)
    timeout: float = 30.0
    tries: int = 3
    retry_seconds: float = 0.5
    allow: tuple[str, ...] = ()  # OUTBOUND_ALLOW: the private addresses a URL may reach all the same
    # which row and which version of it: a started server's process is kept per (tenant, name) and
    # started again when the row or its version changes (a sync, an accepted or held change)
    tenant_id: int | None = None
    server_id: int | None = None
    version: int = 0
    idle_seconds: float = 300.0  # MCP_IDLE_SECONDS: how long a started server is kept after its last call

    @classmethod
    def of(cls, server: McpServer, config: Config, granted: Collection[str] | None = None) -> Access:
        """How to reach the server as its row says now. `granted`: the secrets granted to its tenant,
        read from the row's session when not given."""
        if granted is None:
            session = object_session(server)
            granted = secret_grants.granted(session, server.tenant_id) if session is not None else ()
        return cls(
            server=server.name,
            tenant_id=server.tenant_id,
            server_id=server.id,
            version=server.version or 0,
            idle_seconds=config.mcp_idle_seconds,
            url=server.url,
            command=server.command,
            headers=tuple((h["name"], *_source(h), h.get("operator") is True) for h in server.headers),
            environment=tuple((v["name"], *_source(v)) for v in server.environment or ()),
            working_directory=server.working_directory,
            command_by_operator=server.command_by_operator is True,
            granted=frozenset(granted),
            secret_key=config.secret_key,
            timeout=config.mcp_timeout_seconds,
            tries=config.mcp_tries,
            retry_seconds=config.mcp_retry_seconds,
            allow=config.outbound_allow,
        )

    def where(self) -> str:
        return self.url or f"the command {self.command!r}"

    def header_values(self) -> dict[str, str]:
        """The headers' values, opened now. SecretRefused (nothing is sent) when a header a tenant's
        admin set reads a variable not granted to the tenant: one stored before grants existed, or
        whose grant was revoked since."""
        values = {}
        for name, kind, value, by_operator in self.headers:
            if kind == "env" and not by_operator and value not in self.granted:
                raise SecretRefused(
                    f"The {name} header of the MCP server {self.server} reads ${value} from the desk's environment, "
                    f"a secret the desk's operator has not granted to this tenant ({_granted_words(self.granted)}), "
                    f"so nothing was sent. Ask the operator to grant it (flask secret grant {value} --tenant ...), "
                    f"or remove the server and add it again with the {name} header set again.",
                    self.server,
                    name,
                    value,
                )
            values[name] = self._value(f"The {name} header", kind, value, _SEALING, "its headers")
        return values

    def process(self) -> dict:
        """How to start the server (StdioServerParameters' fields): McpError when no operator set its
        command. Its environment is exactly PATH (the desk's) and the variables an operator gave it."""
        if not self.command_by_operator:
            raise McpError(
                f"The MCP server {self.server} starts a command that a tenant's admin set before only the desk's "
                "operator could, so the desk does not start it: an operator must add this server again "
                f"(`flask mcp remove {self.server} --tenant ...`, then `flask mcp add {self.server} --command ...`, "
                "or on the operators' MCP servers page). Nothing was started."
            )
        from mcp.client.stdio import DEFAULT_INHERITED_ENV_VARS

        environment = {"PATH": os.environ.get("PATH", os.defpath)}
        for name, kind, value in self.environment:
            environment[name] = self._value(f"The variable {name}", kind, value, _SEALING_ENVIRONMENT, "its variables")
        # The SDK lays HOME, LOGNAME, SHELL, TERM and USER of the desk under whatever env it is given
        # (mcp.client.stdio.get_default_environment), so the command runs under `env -u` for each of
        # those not given: names only on the command line (anyone on the host can read it), no value.
        unset = [word for name in DEFAULT_INHERITED_ENV_VARS if name not in environment for word in ("-u", name)]
        return {
            "command": "/usr/bin/env" if os.path.exists("/usr/bin/env") else shutil.which("env") or "env",
            "args": [*unset, "--", *shlex.split(self.command or "")],
            "env": environment,
            "cwd": self.working_directory,
        }

    def _value(self, what: str, kind: str, value: str, purpose: str, again: str) -> str:
        if kind == "env":
            found = os.environ.get(value)
            if found is None:
                raise McpError(
                    f"{what} of the MCP server {self.server} reads ${value}, which is not set in the desk's "
                    "environment: set it for the desk's web and worker processes."
                )
            return found
        try:
            return sealing.unseal(self.secret_key, purpose, value)
        except sealing.InvalidToken:
            raise McpError(
                f"{what} of the MCP server {self.server} cannot be read: SECRET_KEY changed since it "
                f"was stored. Remove the server and add it again with {again}."
            ) from None


def _granted_words(granted: Collection[str]) -> str:
    """The secrets granted to a tenant, for a sentence: names only."""
    return f"granted to it: {', '.join(sorted(granted))}" if granted else "no secret is granted to it"


def _source(stored: dict) -> tuple[str, str]:
    """("env", variable) or ("sealed", token) of a stored header or variable."""
    return ("env", stored["env"]) if "env" in stored else ("sealed", stored["sealed"])


@asynccontextmanager
async def _opened(access: Access, refusals: list[int] | None = None):
    """An initialised client session with the server. The HTTP status of each POST the server
    answered with other than 2xx is appended to `refusals` (the SDK turns them into MCP errors)."""
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client

    if access.url:  # through the outbound guard: public addresses only, no redirect, no proxy

        async def noted(response: httpx2.Response) -> None:
            if refusals is not None and response.request.method == "POST" and not response.is_success:
                refusals.append(response.status_code)

        async with outbound.async_client(
            access.allow,
            headers=access.header_values(),
            timeout=httpx2.Timeout(access.timeout),
            event_hooks={"response": [noted]},
        ) as http:
            async with Client(
                streamable_http_client(access.url, http_client=http), cache=None, read_timeout_seconds=access.timeout
            ) as client:
                yield client
        return
    parameters = StdioServerParameters(**access.process())
    # The server's stderr goes to this process's own (a file the subprocess can write to, whatever
    # sys.stderr was swapped for: the SDK's default is bound to sys.stderr when it is first imported).
    transport = stdio_client(parameters, errlog=sys.__stderr__)
    async with Client(transport, cache=None, read_timeout_seconds=access.timeout) as client:
        yield client


def _run(access: Access, work: Callable[[Client, list], Awaitable[Any]], *, live: bool = False) -> Any:
    """Do the work on a session with the server within the timeout. `live`: on this process's live
    session with a started server (see _LiveSessions; unless MCP_IDLE_SECONDS is 0); otherwise connect,
    do the work and disconnect, in this thread. A failure before the work marked the request sent (by
    appending to the list it is given) is _Unreachable, after it _Lost; the work's own ToolError and
    McpError pass through."""
    sent: list = []
    refusals: list[int] = []

    async def main():
        with anyio.fail_after(access.timeout):
            async with _opened(access, refusals) as client:
                return await work(client, sent)

    try:
        if live and access.command and access.idle_seconds > 0:
            parameters = access.process()  # the operator's door and the exact environment, at every call
            return _live_sessions(access.server).run(access, parameters, work, sent)
        return _synchronously(main)
    except Exception as exc:  # whatever the transport raised, said in words
        leaf = _leaf(exc)
        if isinstance(leaf, (ToolError, McpError)):
            raise leaf from None
        if isinstance(leaf, outbound.OutboundError):  # a setting to change: not worth another try
            raise McpError(str(leaf)) from leaf
        raise (_Lost if sent else _Unreachable)(_reason(leaf, access, refusals)) from None


def _synchronously(main: Callable[[], Awaitable[Any]]) -> Any:
    """Run the coroutine function to its end: in this thread (a worker slot's), or in a thread of its
    own when this one already runs an event loop (anyio.run refuses to nest one: a caller driving
    asyncio itself, such as Playwright's sync API in a test process)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(main)
    with ThreadPoolExecutor(1, thread_name_prefix="mcp") as own:
        return own.submit(anyio.run, main).result()


# --- live sessions with the servers the desk starts ---------------------------------------------------
#
# Starting a server costs a process start and an MCP handshake (0.24 to 0.64 s a call with the official
# reference servers, more under npx or uvx; a call on a live session takes milliseconds: python -m
# bench.mcp_calls), so a process keeps one live session per started server and sends every call of its
# slots over it. The SDK's session lives in a task group bound to one event loop, so the sessions live
# on one loop in a thread of their own (anyio's blocking portal) and each slot thread hands its call to
# it; the session carries concurrent requests (JSON-RPC ids), so slots calling one server do not wait
# for each other. Everything about a session is touched on that loop only, so a check-then-start there
# is atomic: one start per server at a time, without a lock.


class _LiveSession:
    """One started server and the MCP session with it, kept while calls come (see _LiveSessions)."""

    def __init__(self, identity: tuple, key: str, parameters: dict, access: Access) -> None:
        self.identity = identity
        self.key = key  # the row, its version and exactly how it is started (values hashed)
        self.parameters: dict | None = parameters  # dropped once started: it holds the variables' values
        self.idle_seconds = access.idle_seconds
        self.start_seconds = access.timeout
        self.client: Client | None = None
        self.failure: BaseException | None = None  # why it could not be started
        self.ready = anyio.Event()  # started, or failed to
        self.ended = anyio.Event()
        self.closing = False  # no new call is given to it; it ends once its calls in flight do
        self.in_flight = 0
        self.last_used = anyio.current_time()
        self.scope: anyio.CancelScope | None = None
        self._nudged = anyio.Event()

    def nudge(self) -> None:
        self._nudged.set()

    async def serve(self) -> None:
        """Return once the session should end: asked to close with no call in flight, or idle for
        idle_seconds."""
        while True:
            wait = math.inf
            if not self.in_flight:
                wait = 0.0 if self.closing else self.last_used + self.idle_seconds - anyio.current_time()
                if wait <= 0:
                    self.closing = True
                    return
            self._nudged = anyio.Event()
            with anyio.move_on_after(wait):
                await self._nudged.wait()


class _LiveSessions:
    """This process's live sessions with the servers it started, one per (tenant, server), on an event
    loop of their own. A session whose key changed (another row of the same name, a new version of it,
    another command, variables or working directory) is closed once its calls end, and a new one
    started; one whose process died is found at the next call, which starts it again; one idle for
    MCP_IDLE_SECONDS is closed. `close()` ends them all (the worker stopping, the process exiting)."""

    def __init__(self) -> None:
        from anyio.from_thread import start_blocking_portal

        self.pid = os.getpid()
        self._portal_context = start_blocking_portal(name="mcp-sessions")
        self._portal = self._portal_context.__enter__()
        self._sessions: dict[tuple, _LiveSession] = {}  # the one each new call of a server gets
        self._running: set[_LiveSession] = set()  # every session not yet ended, those closing included
        self._group: anyio.abc.TaskGroup | None = None
        self._stopped: anyio.Event | None = None
        self._portal.start_task(self._keep)

    async def _keep(self, *, task_status) -> None:
        """The task group the sessions' tasks run in, until close()."""
        self._stopped = anyio.Event()
        async with anyio.create_task_group() as group:
            self._group = group
            task_status.started()
            await self._stopped.wait()
            group.cancel_scope.cancel()

    def run(self, access: Access, parameters: dict, work: Callable[[Client, list], Awaitable[Any]], sent: list) -> Any:
        """The work done on the server's live session, from a slot's thread (see _run); `parameters`:
        how to start the server (Access.process())."""
        identity = (access.tenant_id, access.server)
        stamp = json.dumps([access.server_id, access.version, parameters], sort_keys=True, default=str)
        key = hashlib.sha256(stamp.encode()).hexdigest()
        return self._portal.call(self._run, identity, key, parameters, access, work, sent)

    async def _run(self, identity, key, parameters, access, work, sent) -> Any:
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        live = None
        try:
            with anyio.fail_after(access.timeout):
                for first in (True, False):
                    live, reused = await self._session(identity, key, parameters, access)
                    try:
                        return await work(live.client, sent)
                    except MCPError as exc:
                        if exc.code != CONNECTION_CLOSED:
                            raise
                        self._retire(live, "its process exited or closed its output")
                        # A process that died since its last call (killed, crashed) is started again at
                        # once when nothing was sent yet; a call that was sent is not sent again here.
                        if sent or not reused or not first:
                            raise
                    finally:
                        live.in_flight -= 1
                        live.last_used = anyio.current_time()
                        live.nudge()
        except TimeoutError:
            # A server that did not answer in time may be stuck: the next call starts a fresh one (this
            # one ends once the calls still in flight on it do, so a slow call elsewhere is not cut).
            if live is not None:
                self._retire(live, f"it did not answer within {access.timeout:g} s")
            raise
        raise AssertionError("unreachable")  # the loop returns or raises

    async def _session(self, identity, key, parameters, access) -> tuple[_LiveSession, bool]:
        """The server's live session, started when there is none (or none with this key), with this
        call counted in flight on it from the moment it asks (a start slower than MCP_IDLE_SECONDS
        must not find its session idle); and whether it was up before this call asked for it."""
        live = self._sessions.get(identity)
        if live is not None and live.key != key:
            self._retire(live, "the server or how it is started changed")
            live = None
        reused = live is not None and live.client is not None
        if live is None:
            live = _LiveSession(identity, key, parameters, access)
            self._sessions[identity] = live
            self._running.add(live)
            self._group.start_soon(self._hold, live)
        live.in_flight += 1
        try:
            await live.ready.wait()
            if live.failure is not None:
                raise live.failure
            if live.client is None:  # ended between its start and this call (all sessions closing)
                from mcp.shared.exceptions import MCPError
                from mcp_types import CONNECTION_CLOSED

                raise MCPError(code=CONNECTION_CLOSED, message="Connection closed")
        except BaseException:
            live.in_flight -= 1
            live.nudge()
            raise
        return live, reused

    async def _hold(self, live: _LiveSession) -> None:
        """Start the server, keep its session open while it serves, then close it (the SDK closes the
        server's stdin, then ends its process group if it has not exited within seconds)."""
        from mcp.client.client import Client
        from mcp.client.stdio import StdioServerParameters, stdio_client

        server, tenant = live.identity[1], live.identity[0]
        try:
            with anyio.CancelScope() as scope:
                live.scope = scope
                scope.deadline = anyio.current_time() + live.start_seconds  # the start only
                parameters, live.parameters = StdioServerParameters(**live.parameters), None
                # Its stderr goes to this process's own (see _opened). No response cache: every call
                # lists the tools afresh, to compare them with what an admin accepted.
                async with Client(stdio_client(parameters, errlog=sys.__stderr__), cache=None) as client:
                    scope.deadline = math.inf
                    live.client = client
                    live.last_used = anyio.current_time()
                    live.ready.set()
                    log.info("MCP server %s of tenant %s started for this process", server, tenant)
                    await live.serve()
                    self._forget(live)  # before closing awaits anything: the next call starts a new one
            if live.client is None and live.failure is None:
                live.failure = TimeoutError("the server did not start in time")
        except Exception as exc:  # a start that failed, or a session that broke: never the loop's
            if live.client is None:
                live.failure = exc
            else:
                log.warning("MCP server %s of tenant %s: its session ended with an error", server, tenant, exc_info=exc)
        finally:
            self._forget(live)
            self._running.discard(live)
            live.client = None
            live.ready.set()
            live.ended.set()
            if live.failure is None:
                log.info("MCP server %s of tenant %s closed", server, tenant)

    def _retire(self, live: _LiveSession, why: str) -> None:
        """No new call goes to this session; it closes once its calls in flight end."""
        if not live.closing:
            log.info("MCP server %s of tenant %s: closing its session: %s", live.identity[1], live.identity[0], why)
        live.closing = True
        self._forget(live)
        live.nudge()

    def _forget(self, live: _LiveSession) -> None:
        if self._sessions.get(live.identity) is live:
            del self._sessions[live.identity]

    def count(self) -> int:
        """How many sessions are open now, those closing included."""
        return self._portal.call(lambda: len(self._running))

    def close(self) -> int:
        """End every session now (calls in flight on them fail as lost), wait for their servers to
        stop, and stop the loop; how many there were."""
        closed = self._portal.call(self._close_all)
        self._portal_context.__exit__(None, None, None)
        return closed

    async def _close_all(self) -> int:
        running = list(self._running)
        for live in running:
            live.closing = True
            self._forget(live)
            if live.scope is not None:
                live.scope.cancel()
        for live in running:
            await live.ended.wait()  # the SDK's shutdown is bounded (seconds), shielded from the cancel
        self._stopped.set()
        return len(running)


_live: _LiveSessions | None = None
_live_lock = threading.Lock()
_at_fork_registered = False
_stopping = False  # the worker stops: close_sessions(stopping=True) was called


def _live_sessions(server: str) -> _LiveSessions:
    """This process's live sessions, started at the first call that needs them. A forked process
    starts with none: its parent's loop thread and sessions are not its own. McpError once the process
    stops (a move still running past the worker's stop grace starts no server that would outlive it)."""
    global _live, _at_fork_registered
    with _live_lock:
        if _stopping:
            raise McpError(
                f"This worker process is stopping, so it did not start the MCP server {server} for this call; "
                "nothing was sent. Try again: another worker starts it."
            )
        if _live is None or _live.pid != os.getpid():
            _live = _LiveSessions()
            if not _at_fork_registered:
                os.register_at_fork(after_in_child=_forget_sessions_after_fork)
                atexit.register(close_sessions)
                _at_fork_registered = True
        return _live


def _forget_sessions_after_fork() -> None:
    global _live, _live_lock, _stopping
    _live, _live_lock = None, threading.Lock()  # the lock may have been held by a thread the child lacks
    _stopping = False


def close_sessions(*, stopping: bool = False) -> int:
    """Close this process's live sessions with started servers, waiting for their processes to stop;
    how many were open. `stopping`: the process stops (a worker's shutdown), so no call starts a
    server after this."""
    global _live, _stopping
    with _live_lock:
        live, _live = _live, None
        _stopping = _stopping or stopping
    if live is None or live.pid != os.getpid():
        return 0
    return live.close()


def open_sessions() -> int:
    """How many live sessions with started servers this process holds now."""
    with _live_lock:
        live = _live
    if live is None or live.pid != os.getpid():
        return 0
    return live.count()


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _reason(exc: BaseException, access: Access, refusals: list[int]) -> str:
    """A failure in a few words. A server at a URL is named only by its HTTP status or its MCP error
    code, never by what it sent; every other failure (a closed port, a filtered one, one that speaks
    something else, a timeout) reads the same, so an admin's URL cannot tell one port from another."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

    if isinstance(exc, httpx2.HTTPStatusError):
        return f"it answered HTTP {exc.response.status_code}"
    if isinstance(exc, MCPError) and access.command and exc.code == CONNECTION_CLOSED:
        return "its process exited or closed its output"
    if isinstance(exc, MCPError) and access.command and exc.code == REQUEST_TIMEOUT:
        return "it did not answer in time"
    if isinstance(exc, MCPError):
        return f"it answered HTTP {refusals[-1]}" if refusals else f"it answered with MCP error {exc.code}"
    if access.url and isinstance(exc, outbound.TRANSPORT_FAILURES):
        return outbound.no_answer(access.timeout)
    if access.url:  # a fault of the desk's own: its type for people, the whole of it in the operator's log
        log.error("MCP server %s at %s failed unexpectedly", access.server, access.url, exc_info=exc)
        return f"it failed unexpectedly ({type(exc).__name__}); the desk's log has the details"
    if isinstance(exc, TimeoutError):
        return "it did not answer in time"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _listing(client: Client) -> list:
    tools, cursor = [], None
    for _ in range(100):  # a paginator that never ends cannot hang a sync
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def fetch_tools(access: Access) -> list[dict]:
    """The server's tools as plain dicts (name, description, input_schema, annotations); McpError
    says why there are none."""
    try:
        tools = _run(access, lambda client, _sent: _listing(client))
    except (_Unreachable, _Lost) as exc:
        raise McpError(
            f"The MCP server {access.server} at {access.where()} could not be reached ({exc}). Check the address "
            "(and its headers), and that the server is up."
        ) from None
    return [_plain(tool) for tool in tools]


def _plain(tool: Any) -> dict:
    annotations = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else {}
    return {
        "name": tool.name,
        "description": tool.description or "",
        "input_schema": tool.input_schema,
        "annotations": annotations,
    }


def fingerprint(description: str, input_schema: Any, annotations: dict) -> str:
    """What an admin accepts about a tool: its description, schema and hints (read-only, idempotent)."""
    body = json.dumps([description, input_schema, annotations], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


# --- the tool ----------------------------------------------------------------------------------------


class McpRemoteTool(DescribedTool):
    """One tool of an MCP server as its tenant's registry holds it: the definition an admin accepted,
    run on the server through the MCP client."""

    writes_database = False  # it waits on its server: no transaction (nor SQLite's write lock) meanwhile

    def __init__(self, row: McpTool, access: Access, *, as_changed: bool = False) -> None:
        """The tool as an admin accepted it; `as_changed`: as its server describes it now (a held
        tool's change, to say what accepting it would change for the gate)."""
        self.access = access
        self.name = row.registry_name
        self.remote_name = row.remote_name
        self.server = access.server
        description = row.current_description if as_changed else row.description
        hints = (row.current_annotations if as_changed else row.annotations) or {}
        self.hints = hints
        self.title = f"{hints.get('title') or row.remote_name} ({access.server})"
        self.description = (
            f"{(description or '').strip() or row.remote_name} "
            f"(A tool of the MCP server {access.server}; its results are external data.)"
        )
        self.use_schema(row.current_input_schema if as_changed else row.input_schema)
        self._accepted = row.current_fingerprint if as_changed else row.fingerprint
        self.held = row.held and not as_changed
        self.read_only, self.destructive = read_only_and_destructive(hints)
        # Read-only tools run at once by default; every other waits, and so does any tool its server
        # says may destroy data (even one that also says it only reads).
        self.sensitive = not self.read_only or self.destructive
        self.repeatable = (self.read_only and not self.destructive) or hints.get("idempotentHint") is True
        self.mapping = row.mapping or {}
        self.companion: McpRemoteTool | None = None  # the read-only tool whose result is the facts (tenant_tools)

    # What an admin mapped of its arguments (set_mapping): the money, the subject, the facts.

    def moves_money(self) -> bool:
        return "amount" in self.mapping

    def amount(self, input: dict) -> int | None:  # noqa: A002
        mapped = self.mapping.get("amount")
        return money_in_cents(input.get(mapped["argument"]), mapped["unit"]) if mapped else None

    def money_argument(self) -> str | None:
        return (self.mapping.get("amount") or {}).get("argument")

    def reading(self) -> dict:
        return {"amount": self.mapping.get("amount"), "subject": self.mapping.get("subject")}

    def subject(self, input: dict, context: ToolContext) -> str | None:  # noqa: A002
        mapped = self.mapping.get("subject")
        value = input.get(mapped["argument"]) if mapped else None
        return f"{mapped['argument']}:{value}"[:200] if value not in (None, "") else None

    def review(self, input: dict, context: ToolContext) -> Review:  # noqa: A002
        """The facts an admin mapped: the live result of a read-only tool of the same server, called with
        arguments taken from this call's (none mapped: no facts)."""
        facts = self.mapping.get("facts")
        if not facts:
            return Review()
        title = f"{facts['tool']} ({self.server}), read now"
        companion = self.companion
        if companion is None or companion.unavailable() or not companion.read_only or companion.destructive:
            why = "it is no longer a read-only tool of this server that the desk may call; an admin must map it again"
            return Review(records=(Record("facts", 0, title, (Fact("Not read", f"{facts['tool']}: {why}."),)),))
        arguments = {theirs: input[ours] for theirs, ours in facts["arguments"].items() if ours in input}
        try:
            result = companion.read(arguments)
        except (ToolError, McpError) as exc:
            return Review(records=(Record("facts", 0, title, (Fact("Not read", presenting.shorten(str(exc), 500)),)),))
        return Review(records=(Record("facts", 0, title, tuple(_facts_of(result))),))

    def read(self, arguments: dict) -> Any:
        """Call this read-only tool for a reviewer's facts: once, within a short time, its result as
        data. ToolError or McpError say why not."""
        quick = replace(self.access, timeout=min(self.access.timeout, FACTS_SECONDS), tries=1)
        try:
            result = _run(quick, lambda client, sent: self._call(client, arguments, sent))
        except (_Unreachable, _Lost) as exc:
            raise McpError(f"The MCP server {self.server} could not be read ({exc}).") from None
        return self._output(result)

    def unavailable(self) -> str | None:
        if self.held:
            return (
                f"The tool {self.name} is held: its MCP server ({self.server}) changed what it says it does since "
                "an admin accepted it, and an admin has to look at the change first. It was not called."
            )
        return None

    def execute(self, input: dict, context: ToolContext) -> Any:  # noqa: A002 - the API's word
        tries, wait, last = self.access.tries, self.access.retry_seconds, ""
        for attempt in range(1, tries + 1):
            try:
                result = _run(self.access, lambda client, sent: self._call(client, input, sent), live=True)
            except McpError as exc:
                raise (_SecretRefusedAtCall(exc) if isinstance(exc, SecretRefused) else ToolError(str(exc))) from None
            except _Unreachable as exc:
                last = str(exc)
            except _Lost as exc:
                if not self.repeatable:
                    raise ToolError(
                        f"The MCP server {self.server} stopped answering after {self.remote_name} was sent "
                        f"({exc}), so it may or may not have taken effect. It was not sent again: the server does "
                        "not mark this tool safe to repeat. Check before asking for it again."
                    ) from None
                last = str(exc)
            else:
                return self._output(result)
            if attempt < tries:
                time.sleep(wait)
                wait *= 2
        raise ToolError(
            f"The MCP server {self.server} could not be reached after {tries} tries ({last}); nothing was done. "
            "It may be down: try again later."
        )

    async def _call(self, client: Client, arguments: dict, sent: list) -> Any:
        """Compare the server's listing with the accepted definition, then call (never when it changed)."""
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        listed = next((t for t in await _listing(client) if t.name == self.remote_name), None)
        if listed is None:
            raise ToolError(f"The MCP server {self.server} no longer offers {self.remote_name}; nothing was done.")
        now = _plain(listed)
        if fingerprint(now["description"], now["input_schema"], now["annotations"]) != self._accepted:
            raise _Changed(
                f"The MCP server {self.server} changed {self.remote_name} (its description, schema or hints) since "
                "an admin accepted it, so it was not called, and the tool is held until an admin accepts the "
                "change on the MCP servers page.",
                self,
                now,
            )
        sent.append(True)
        try:
            return await client.call_tool(self.remote_name, arguments)
        except MCPError as exc:
            if exc.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT):  # no answer: the call is lost, not refused
                raise
            # the server refused the request itself (an unknown tool, bad arguments)
            raise ToolError(self._fenced(f"The MCP server {self.server} refused the call:", str(exc))) from None

    def _output(self, result: Any) -> Any:
        text = "\n".join(
            block.text if getattr(block, "type", None) == "text" else f"[{getattr(block, 'type', 'other')} content]"
            for block in result.content
        )
        if result.is_error:
            raise ToolError(self._fenced(f"The MCP server {self.server} reported an error:", text or "(no details)"))
        return result.structured_content if result.structured_content is not None else text

    def _fenced(self, sentence: str, text: str) -> str:
        return f"{sentence}\n{wrap_output(self.name, text, ERROR_CHARS)}"


# --- the catalogue: servers and their tools per tenant ----------------------------------------------


@dataclass
class SyncReport:
    """What a sync (or an add) found, by the tools' registry names."""

    added: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (remote name, why)

    def lines(self) -> list[str]:
        said = []
        for label, names in (
            ("added", self.added),
            ("held (changed since accepted)", self.held),
            ("removed (gone from the server)", self.removed),
            ("unchanged", self.unchanged),
        ):
            if names:
                said.append(f"{label}: {', '.join(names)}")
        said.extend(f"refused {name}: {why}" for name, why in self.refused)
        return said

    def data(self) -> dict:
        return {
            "added": self.added,
            "held": self.held,
            "removed": self.removed,
            "refused": [n for n, _ in self.refused],
        }


def parse_header(text: str) -> tuple[str, str]:
    """("Name", "value") from "Name: value"; McpError says what to type (never repeating a value: a
    line typed without its colon may be all secret)."""
    name, colon, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not colon:
        raise McpError('A header line has no colon: type it as "Name: value", e.g. "Authorization: Bearer abc".')
    if not _HEADER_NAME.match(name):
        raise McpError(f'{name!r} is not a header name: type it as "Name: value", e.g. "Authorization: Bearer abc".')
    if not value:
        raise McpError(f'The header {name} has no value: type it as "Name: value", e.g. "Authorization: Bearer abc".')
    return name, value


def parse_variable(text: str) -> tuple[str, str]:
    """("NAME", "value") from "NAME=value", a started server's variable; McpError says what to type
    (never repeating a value)."""
    name, equals, value = text.partition("=")
    name = name.strip()
    if not equals:
        raise McpError('A variable has no "=": type it as NAME=value, e.g. INVENTORY_TOKEN=abc.')
    if not _VARIABLE_NAME.match(name):
        raise McpError(
            f"{name!r} is not a variable's name: use letters, digits and _, not starting with a digit, "
            "e.g. INVENTORY_TOKEN=abc."
        )
    if not value:
        raise McpError(f"The variable {name} has no value: type it as {name}=value, or leave it out.")
    return name, value


def stored_headers(
    secret_key: str, pairs: list[tuple[str, str]], *, by_operator: bool, granted: Collection[str] = ()
) -> list[dict]:
    """Headers as stored, each marked with whether an operator set it: a value written as $VARIABLE
    is read from the environment at each use (from a tenant's admin only a secret `granted` to the
    tenant; SecretRefused names the header and the granted secrets); any other value is sealed.
    Values are never stored in the clear."""
    stored = []
    for name, value in pairs:
        reference = _ENV_REFERENCE.match(value)
        if reference and not by_operator and reference.group(1) not in granted:
            variable = reference.group(1)
            raise SecretRefused(
                f'"{name}: ${variable}" would send the desk\'s environment variable {variable} to the server, and '
                f"the desk's operator has not granted it to this tenant: a tenant's admin may name only the secrets "
                f"granted to their tenant ({_granted_words(granted)}). Nothing was saved or sent. Name a granted "
                "secret, type the value itself to have it stored encrypted, or ask the desk's operator to grant it.",
                "",
                name,
                variable,
            )
        if reference:
            stored.append({"name": name, "env": reference.group(1), "operator": by_operator})
        else:
            stored.append({"name": name, "sealed": sealing.seal(secret_key, _SEALING, value), "operator": by_operator})
    return stored


def stored_environment(secret_key: str, pairs: list[tuple[str, str]]) -> list[dict]:
    """A started server's variables as stored (only an operator gives them): NAME=$VARIABLE reads the
    desk's variable at each start; any other value is sealed. McpError when a name is given twice."""
    stored, seen = [], set()
    for name, value in pairs:
        if name in seen:
            raise McpError(f"The variable {name} is given twice; give it once.")
        seen.add(name)
        reference = _ENV_REFERENCE.match(value)
        if reference:
            stored.append({"name": name, "env": reference.group(1)})
        else:
            stored.append({"name": name, "sealed": sealing.seal(secret_key, _SEALING_ENVIRONMENT, value)})
    return stored


def header_words(
    server: McpServer, _secret_prefix: str | None = None, granted: Collection[str] | None = None
) -> list[str]:
    """The server's headers for people: names and where the value comes from, never the value; a header
    a tenant's admin set that reads a secret not granted to the tenant says it is not sent. `granted`:
    the tenant's secrets, read from the row's session when not given. (The second argument, the
    MCP_SECRET_PREFIX of before grants, is no longer read.)"""
    if granted is None and any("env" in header for header in server.headers or ()):
        session = object_session(server)
        granted = secret_grants.granted(session, server.tenant_id) if session is not None else ()
    said = []
    for header in server.headers or ():
        if "env" not in header:
            said.append(f"{header['name']} (stored encrypted)")
        elif header.get("operator") is True or header["env"] in granted:
            said.append(f"{header['name']} (from ${header['env']})")
        else:
            said.append(f"{header['name']} (from ${header['env']}, a secret not granted to this tenant: not sent)")
    return said


def environment_words(server: McpServer) -> list[str]:
    """A started server's variables for people: names and where each comes from, never the value."""
    return [
        f"{v['name']} (from ${v['env']})" if "env" in v else f"{v['name']} (stored encrypted)"
        for v in server.environment or ()
    ]


def find_server(session: Session, tenant_id: int, name: str) -> McpServer:
    server = session.scalar(select(McpServer).where(McpServer.tenant_id == tenant_id, McpServer.name == name.strip()))
    if server is None:
        raise McpError(f"There is no MCP server named {name.strip()!r} in this tenant.")
    return server


def add_server(
    session: Session,
    config: Config,
    tenant_id: int,
    name: str,
    *,
    url: str | None = None,
    command: str | None = None,
    headers: list[tuple[str, str]] = (),
    environment: list[tuple[str, str]] = (),
    working_directory: str | None = None,
    reserved: set[str] = frozenset(),
    by_user_id: int | None = None,
    by_operator: bool = False,
) -> tuple[McpServer, SyncReport]:
    """Register a server and take its tools as accepted (the caller commits; on McpError it rolls back).
    `reserved`: the names of the built-in tools. `by_operator`: the command line or an operator, who
    alone may give a command (with its variables and working directory) or name any $VARIABLE."""
    name = name.strip().lower()
    url, command = (url or "").strip() or None, (command or "").strip() or None
    working_directory = (working_directory or "").strip() or None
    if not SERVER_NAME.match(name):
        raise McpError(
            f"{name!r} is not a server name: use up to 40 of a-z, 0-9, - and _, starting with a letter or digit."
        )
    if command and not by_operator:
        raise McpError(ONLY_OPERATORS_START)
    if bool(url) == bool(command):
        raise McpError("Give the server's URL (streamable HTTP) or the command that starts it (stdio), one of the two.")
    if url:
        try:
            parts = urlsplit(url)
        except ValueError:  # e.g. an unclosed [ of an IPv6 address
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            raise McpError(f"{url!r} is not a server URL: give one like https://mcp.example.com/mcp")
    if command:
        try:
            if not shlex.split(command):
                raise ValueError("it is empty")
            if "\x00" in command:
                raise ValueError("it holds a NUL character")
        except ValueError as exc:
            raise McpError(f"{command!r} is not a command ({exc}).") from None
    if headers and not url:
        raise McpError("Headers go with a URL; a command's server gets none.")
    if (environment or working_directory) and not command:
        raise McpError("Variables and a working directory go with a command; a server at a URL gets none.")
    if working_directory and not (os.path.isabs(working_directory) and os.path.isdir(working_directory)):
        raise McpError(
            f"{working_directory!r} is not a working directory here: give the absolute path of a directory on "
            "the desk's host, e.g. /srv/inventory."
        )
    if session.scalar(select(McpServer.id).where(McpServer.tenant_id == tenant_id, McpServer.name == name)):
        raise McpError(f"An MCP server named {name} already exists here; pick another name, or sync it.")
    if url:  # last of the checks, before anything is connected to: a refused address is never reached
        try:
            outbound.check_url(url, config.outbound_allow)
        except outbound.OutboundError as exc:
            raise McpError(str(exc)) from exc
    server = McpServer(
        tenant_id=tenant_id,
        name=name,
        url=url,
        command=command,
        headers=stored_headers(
            config.secret_key, list(headers), by_operator=by_operator, granted=secret_grants.granted(session, tenant_id)
        ),
        environment=stored_environment(config.secret_key, list(environment)),
        working_directory=working_directory,
        command_by_operator=bool(command) and by_operator,
        version=1,
        created_by_id=by_user_id,
    )
    session.add(server)
    session.flush()
    return server, _apply(session, server, fetch_tools(Access.of(server, config)), reserved, by_user_id)


def sync_server(
    session: Session,
    config: Config,
    tenant_id: int,
    name: str,
    *,
    reserved: set[str] = frozenset(),
    by_user_id: int | None = None,
) -> SyncReport:
    """Read the server's tools again: new ones join, gone ones leave, changed ones are held."""
    server = find_server(session, tenant_id, name)
    return _apply(session, server, fetch_tools(Access.of(server, config)), reserved, by_user_id)


def _apply(
    session: Session, server: McpServer, listing: list[dict], reserved: set[str], by_user_id: int | None
) -> SyncReport:
    report = SyncReport()
    known = {tool.remote_name: tool for tool in server.tools}
    taken = set(reserved) | set(
        session.scalars(select(McpTool.registry_name).where(McpTool.tenant_id == server.tenant_id))
    )
    seen = set()
    for remote in listing:
        seen.add(remote["name"])
        current = fingerprint(remote["description"], remote["input_schema"], remote["annotations"])
        problem = schema_problem(remote["input_schema"])
        row = known.get(remote["name"])
        if row is None:
            if problem:
                report.refused.append((remote["name"], problem))
                continue
            # A tool that turns up after the server was added (new, or gone and back) is taken as a writing
            # tool: hints that would let it run at once are a change an admin accepts, and accepting it is
            # a loosening for a second admin (dropping a writing tool and listing it again as read-only
            # reset its gate before). The server's first listing is the admin's to read as they add it.
            accepted = remote["annotations"]
            if server.synced_at is not None and not _waits_by_default(accepted):
                accepted = {}
            row = McpTool(
                server=server,
                tenant_id=server.tenant_id,
                registry_name=registry_name(server.name, remote["name"], taken),
                remote_name=remote["name"],
                description=remote["description"],
                input_schema=remote["input_schema"],
                annotations=accepted,
                fingerprint=fingerprint(remote["description"], remote["input_schema"], accepted),
                accepted_by_id=by_user_id,
                accepted_at=utcnow(),
            )
            session.add(row)
            taken.add(row.registry_name)
            report.added.append(row.registry_name)
        elif problem:
            report.refused.append((remote["name"], problem))
        _record_current(row, remote, current)
        if row.registry_name not in report.added:
            (report.held if row.held else report.unchanged).append(row.registry_name)
    for remote_name, row in known.items():
        if remote_name not in seen:
            report.removed.append(row.registry_name)
            server.tools.remove(row)
    server.synced_at = utcnow()
    server.version += 1
    session.flush()
    return report


def _record_current(row: McpTool, remote: dict, current: str) -> None:
    """What the server says the tool is now; held when that is not what an admin accepted."""
    row.current_description = remote["description"]
    row.current_input_schema = remote["input_schema"]
    row.current_annotations = remote["annotations"]
    row.current_fingerprint = current
    row.held = current != row.fingerprint


def hold_changed(session: Session, tenant_id: int, registry_name: str, listed: dict) -> bool:
    """Hold the tool whose server lists it as `listed`, which no longer matches what an admin accepted
    (found by a call): it is not offered again, and its waiting calls cannot be approved, until an
    admin accepts the change. True when this held it (False: held already, or gone). The caller
    commits."""
    row = session.scalar(select(McpTool).where(McpTool.tenant_id == tenant_id, McpTool.registry_name == registry_name))
    if row is None:
        return False
    session.execute(select(McpServer.id).where(McpServer.id == row.server_id).with_for_update())  # one at a time
    session.refresh(row)
    was_held = row.held
    _record_current(row, listed, fingerprint(listed["description"], listed["input_schema"], listed["annotations"]))
    if row.held and not was_held:
        row.server.version += 1  # the tenant's registries are built again
        session.flush()
        return True
    return False


def _waits_by_default(hints: dict) -> bool:
    read_only, destructive = read_only_and_destructive(hints or {})
    return not read_only or destructive


def read_only_and_destructive(hints: dict) -> tuple[bool, bool]:
    """What a server's hints say of a tool: (it only reads, it may destroy data). The MCP default for
    destructiveHint is true for a tool that does not only read."""
    read_only = hints.get("readOnlyHint") is True
    destructive = hints.get("destructiveHint") is True or (not read_only and hints.get("destructiveHint") is not False)
    return read_only, destructive


def hint_words(hints: dict) -> str:
    """What the tool's server says it does, in words for people."""
    read_only, destructive = read_only_and_destructive(hints or {})
    if read_only and destructive:
        return "Its server says it only reads, and also that it may destroy data."
    if read_only:
        return "Its server says it only reads."
    if destructive:
        return "Its server says it may destroy or overwrite data." + (
            "" if "destructiveHint" in (hints or {}) else " (It does not say otherwise.)"
        )
    return "Its server says it changes things, but destroys nothing."


def hint_changes(before: dict, after: dict) -> list[str]:
    """What a held tool's change does to its hints, in words (empty: the hints are as accepted)."""
    if read_only_and_destructive(before or {}) == read_only_and_destructive(after or {}) and (
        (before or {}).get("idempotentHint") is True
    ) == ((after or {}).get("idempotentHint") is True):
        return []
    return [f"It said: {hint_words(before)}", f"Now: {hint_words(after)}"]


def check_server(session: Session, server: McpServer, listing: list[dict]) -> tuple[list[str], list[str]]:
    """The periodic check of a server's listing against its accepted tools: a tool that changed is held
    at once (not at its next call or sync), and one changed back to what was accepted is released. It
    neither adds nor removes tools (that waits for an admin's sync). Returns (held, released) by
    registry name; the caller commits."""
    listed = {remote["name"]: remote for remote in listing}
    held, released = [], []
    for row in server.tools:
        remote = listed.get(row.remote_name)
        if remote is None:
            continue  # gone: a call says so, and the next sync removes it
        was_held = row.held
        _record_current(row, remote, fingerprint(remote["description"], remote["input_schema"], remote["annotations"]))
        if row.held != was_held:
            (held if row.held else released).append(row.registry_name)
    if held or released:
        server.version += 1  # the tenant's registries are built again
        session.flush()
    return held, released


def registry_name(server: str, remote: str, taken: set[str]) -> str:
    """`mcp_<server>__<tool>`, in the API's characters; cut to 128 with a short hash when too long or
    already taken."""
    name = _NOT_IN_NAMES.sub("_", f"mcp_{server}__{remote}")
    if len(name) <= NAME_LIMIT and name not in taken:
        return name
    digest = hashlib.sha256(f"{server}\0{remote}".encode()).hexdigest()
    for length in (8, 16, 64):
        candidate = f"{name[: NAME_LIMIT - length - 1]}_{digest[:length]}"
        if candidate not in taken:
            return candidate
    raise McpError(f"No free name for {remote} of {server}.")


def accept_tool(session: Session, tenant_id: int, name: str, by_user_id: int | None) -> tuple[dict, dict]:
    """Accept a held tool's current definition; (before, after) for the audit log. McpError when there
    is nothing to accept or the new schema cannot be used."""
    row = session.scalar(select(McpTool).where(McpTool.tenant_id == tenant_id, McpTool.registry_name == name))
    if row is None:
        raise McpError(f"There is no MCP tool named {name!r} in this tenant.")
    if not row.held:
        raise McpError(f"{name} is not held: there is no change to accept.")
    if problem := schema_problem(row.current_input_schema):
        raise McpError(f"{name} cannot be accepted: {problem}. The server has to fix it first.")
    before = {"description": row.description, "input_schema": row.input_schema, "annotations": row.annotations}
    row.description, row.input_schema = row.current_description, row.current_input_schema
    row.annotations, row.fingerprint = row.current_annotations, row.current_fingerprint
    row.held, row.accepted_by_id, row.accepted_at = False, by_user_id, utcnow()
    row.server.version += 1
    session.flush()
    return before, {"description": row.description, "input_schema": row.input_schema, "annotations": row.annotations}


def remove_server(session: Session, tenant_id: int, name: str) -> list[str]:
    """Remove a server and its tools; the tools' registry names."""
    server = find_server(session, tenant_id, name)
    names = [tool.registry_name for tool in server.tools]
    session.delete(server)
    session.flush()
    return names


def tenant_tools(session: Session, config: Config, tenant_id: int) -> list[McpRemoteTool]:
    """The tenant's MCP tools for its registry, held ones included (a call of a held tool is refused
    in words rather than named unknown), each knowing the read-only tool its facts come from."""
    servers = session.scalars(select(McpServer).where(McpServer.tenant_id == tenant_id).order_by(McpServer.name))
    tools = []
    for server in servers:
        access = Access.of(server, config)
        mine = {row.remote_name: McpRemoteTool(row, access) for row in server.tools}
        for tool in mine.values():
            facts = tool.mapping.get("facts")
            tool.companion = mine.get(facts["tool"]) if facts else None
        tools.extend(mine.values())
    return tools


# --- what an admin maps of a tool's arguments ------------------------------------------------------

FACTS_SECONDS = 10.0  # the longest a decision page waits for a tool's facts


def set_mapping(
    session: Session,
    tenant_id: int,
    registry_name: str,
    *,
    amount: str | None = None,
    unit: str = "cents",
    subject: str | None = None,
    facts_tool: str | None = None,
    facts_arguments: dict[str, str] | None = None,
    weighs_money: bool = False,
    weighs_subject: bool = False,
) -> tuple[dict | None, dict | None]:
    """Map which of the tool's arguments is the money it moves (and its unit), which names what it
    acts on, and which read-only tool of the same server gives its facts (with which of this call's
    arguments); None or empty clears each. `weighs_money` / `weighs_subject`: the tool's policy weighs
    the amount (an amount rule, money limits) / the subject (limits per subject), so changing what
    they read is refused (it could let calls wait less). Returns (before, after); the caller commits.
    McpError says what to fix."""
    row = session.scalar(select(McpTool).where(McpTool.tenant_id == tenant_id, McpTool.registry_name == registry_name))
    if row is None:
        raise McpError(f"There is no MCP tool named {registry_name!r} in this tenant.")
    properties = (row.input_schema or {}).get("properties") or {}
    mapping: dict = {}
    if amount:
        if amount not in properties:
            raise McpError(f"{registry_name} has no argument {amount!r}; its arguments: {_names(properties)}.")
        if unit not in UNITS:
            raise McpError(f"The unit must be {' or '.join(UNITS)}.")
        kinds = _kinds(properties[amount])
        wanted = {"integer"} if unit == "cents" else {"integer", "number", "string"}
        if kinds and not kinds & wanted:
            raise McpError(
                f"{amount} is {'/'.join(sorted(kinds))} in {registry_name}'s schema: not an amount in {unit}."
            )
        mapping["amount"] = {"argument": amount, "unit": unit}
    if subject:
        if subject not in properties:
            raise McpError(f"{registry_name} has no argument {subject!r}; its arguments: {_names(properties)}.")
        mapping["subject"] = {"argument": subject}
    if facts_tool:
        companion = next((t for t in row.server.tools if facts_tool in (t.remote_name, t.registry_name)), None)
        if companion is None or companion.id == row.id:
            others = ", ".join(t.remote_name for t in row.server.tools if t.id != row.id) or "none"
            raise McpError(f"{facts_tool!r} is not another tool of the server {row.server.name} (its tools: {others}).")
        read_only, destructive = read_only_and_destructive(companion.annotations or {})
        if not read_only or destructive or companion.held:
            raise McpError(
                f"{companion.remote_name} cannot give facts: the desk calls it whenever a reviewer opens a call, so "
                "it must be a tool its server marks read-only (and not destructive), accepted as it is now."
            )
        theirs = (companion.input_schema or {}).get("properties") or {}
        given = dict(facts_arguments or {})
        for their_name, our_name in given.items():
            if their_name not in theirs:
                raise McpError(
                    f"{companion.remote_name} has no argument {their_name!r}; its arguments: {_names(theirs)}."
                )
            if our_name not in properties:
                raise McpError(f"{registry_name} has no argument {our_name!r}; its arguments: {_names(properties)}.")
        missing = [name for name in (companion.input_schema or {}).get("required", []) if name not in given]
        if missing:
            raise McpError(
                f"{companion.remote_name} needs {', '.join(missing)}: say which of {registry_name}'s arguments "
                f"gives each (its arguments: {_names(properties)})."
            )
        mapping["facts"] = {"tool": companion.remote_name, "arguments": given}
    before = row.mapping or {}
    if weighs_money and before.get("amount") != mapping.get("amount"):
        raise McpError(
            f"{registry_name}'s policy weighs the money its calls move (an amount rule or money limits), so what it "
            "reads as the amount cannot change under it: set the policy to always wait first, then map the amount."
        )
    if weighs_subject and before.get("subject") != mapping.get("subject"):
        raise McpError(
            f"{registry_name}'s policy has limits per subject, so what it reads as the subject cannot change under "
            "it: clear those limits first, then map the subject."
        )
    row.mapping = mapping or None
    row.server.version += 1  # the tenant's registries are built again
    session.flush()
    return before or None, row.mapping


def mapping_words(mapping: dict | None) -> list[str]:
    """A tool's mapping for people."""
    mapping = mapping or {}
    said = []
    if "amount" in mapping:
        said.append(f"Money: {mapping['amount']['argument']} ({mapping['amount']['unit']})")
    if "subject" in mapping:
        said.append(f"Acts on: {mapping['subject']['argument']}")
    if "facts" in mapping:
        given = ", ".join(f"{k} = {v}" for k, v in mapping["facts"]["arguments"].items())
        said.append(f"Facts from: {mapping['facts']['tool']}" + (f" ({given})" if given else ""))
    return said


def _kinds(schema: dict) -> set[str]:
    kind = schema.get("type")
    found = set(kind) if isinstance(kind, list) else ({kind} if kind else set())
    for branch in schema.get("anyOf", []) + schema.get("oneOf", []):
        found |= _kinds(branch)
    return found


def _names(properties: dict) -> str:
    return ", ".join(properties) or "none"


def _facts_of(result: Any) -> list[Fact]:
    """A read-only tool's result as facts for people: a JSON object (or text that is one) key by key,
    anything else whole."""
    if isinstance(result, str):
        try:
            result = json.loads(result) if result.lstrip().startswith("{") else result
        except ValueError:
            pass
    if isinstance(result, dict) and result:
        shown = list(result.items())[:20]
        return [
            Fact(presenting.label(str(k)), presenting.shorten(presenting.value_text(str(k), v), 500)) for k, v in shown
        ]
    text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
    return [Fact("Result", presenting.shorten(text, 2000) or "(empty)")]


def _fact(key: str, value: Any) -> Fact:
    return Fact(presenting.label(key), presenting.shorten(presenting.value_text(key, value), 500))
