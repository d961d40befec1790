"""Reaching an MCP server: what the desk needs to reach it (Access), one connection, and a failure in words."""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import shutil
import sys
from collections.abc import Awaitable, Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import httpx2
from sqlalchemy.orm import object_session

from webapp import outbound
from webapp.config import Config
from webapp.models import McpServer
from webapp.secrets import sealing, secret_grants
from webapp.tools.mcp.base import SEALING_ENVIRONMENT, SEALING_HEADERS, McpError, SecretRefused

log = logging.getLogger(__name__)


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
                    f"a secret the desk's operator has not granted to this tenant ({granted_words(self.granted)}), "
                    f"so nothing was sent. Ask the operator to grant it (flask secret grant {value} --tenant ...), "
                    f"or remove the server and add it again with the {name} header set again.",
                    self.server,
                    name,
                    value,
                )
            values[name] = self._value(f"The {name} header", kind, value, SEALING_HEADERS, "its headers")
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
            environment[name] = self._value(f"The variable {name}", kind, value, SEALING_ENVIRONMENT, "its variables")
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


def granted_words(granted: Collection[str]) -> str:
    """The secrets granted to a tenant, for a sentence: names only."""
    return f"granted to it: {', '.join(sorted(granted))}" if granted else "no secret is granted to it"


def _source(stored: dict) -> tuple[str, str]:
    """("env", variable) or ("sealed", token) of a stored header or variable."""
    return ("env", stored["env"]) if "env" in stored else ("sealed", stored["sealed"])


@asynccontextmanager
async def open_session(access: Access, refusals: list[int] | None = None):
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


def synchronously(main: Callable[[], Awaitable[Any]]) -> Any:
    """Run the coroutine function to its end: in this thread (a worker slot's), or in a thread of its
    own when this one already runs an event loop (anyio.run refuses to nest one: a caller driving
    asyncio itself, such as Playwright's sync API in a test process)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(main)
    with ThreadPoolExecutor(1, thread_name_prefix="mcp") as own:
        return own.submit(anyio.run, main).result()


def innermost(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def failure_words(exc: BaseException, access: Access, refusals: list[int]) -> str:
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
