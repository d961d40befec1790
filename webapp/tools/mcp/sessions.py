"""Calls on a server's session: one connection per call, or this process's live session with a server
the desk starts (on an event loop of its own); and listing a server's tools."""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import math
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from webapp import outbound
from webapp.tools.mcp.base import Lost, McpError, Unreachable
from webapp.tools.mcp.transport import Access, failure_words, innermost, open_session, synchronously
from webapp.tools.registry import ToolError

if TYPE_CHECKING:  # the SDK is imported where a server is reached: it costs every process a second to load
    from mcp.client.client import Client

log = logging.getLogger(__name__)


def run_on_server(access: Access, work: Callable[[Client, list], Awaitable[Any]], *, live: bool = False) -> Any:
    """Do the work on a session with the server within the timeout. `live`: on this process's live
    session with a started server (see _LiveSessions; unless MCP_IDLE_SECONDS is 0); otherwise connect,
    do the work and disconnect, in this thread. A failure before the work marked the request sent (by
    appending to the list it is given) is Unreachable, after it Lost; the work's own ToolError and
    McpError pass through."""
    sent: list = []
    refusals: list[int] = []

    async def main():
        with anyio.fail_after(access.timeout):
            async with open_session(access, refusals) as client:
                return await work(client, sent)

    try:
        if live and access.command and access.idle_seconds > 0:
            parameters = access.process()  # the operator's door and the exact environment, at every call
            return _live_sessions(access.server).run(access, parameters, work, sent)
        return synchronously(main)
    except Exception as exc:  # whatever the transport raised, said in words
        leaf = innermost(exc)
        if isinstance(leaf, (ToolError, McpError)):
            raise leaf from None
        if isinstance(leaf, outbound.OutboundError):  # a setting to change: not worth another try
            raise McpError(str(leaf)) from leaf
        raise (Lost if sent else Unreachable)(failure_words(leaf, access, refusals)) from None


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
        """The work done on the server's live session, from a slot's thread (see run_on_server); `parameters`:
        how to start the server (Access.process())."""
        identity = (access.tenant_id, access.server)
        stamp = json.dumps([access.server_id, access.version, parameters], sort_keys=True, default=str)
        key = hashlib.sha256(stamp.encode()).hexdigest()
        return self._portal.call(self.run_on_server, identity, key, parameters, access, work, sent)

    async def run_on_server(self, identity, key, parameters, access, work, sent) -> Any:
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
                # Its stderr goes to this process's own (see open_session). No response cache: every call
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


async def list_all_tools(client: Client) -> list:
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
        tools = run_on_server(access, lambda client, _sent: list_all_tools(client))
    except (Unreachable, Lost) as exc:
        raise McpError(
            f"The MCP server {access.server} at {access.where()} could not be reached ({exc}). Check the address "
            "(and its headers), and that the server is up."
        ) from None
    return [plain_tool(tool) for tool in tools]


def plain_tool(tool: Any) -> dict:
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
