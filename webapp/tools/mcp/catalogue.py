"""The catalogue: a tenant's MCP servers and their tools, added, synced and removed."""

from __future__ import annotations

import hashlib
import os
import shlex
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from sqlalchemy import select
from sqlalchemy.orm import Session

from webapp import outbound
from webapp.config import Config
from webapp.models import McpServer, McpTool, utcnow
from webapp.secrets import secret_grants
from webapp.tools.described import schema_problem
from webapp.tools.mcp.adapter import McpRemoteTool
from webapp.tools.mcp.base import NAME_LIMIT, NOT_IN_NAMES, ONLY_OPERATORS_START, SERVER_NAME, McpError
from webapp.tools.mcp.guard import record_current, waits_by_default
from webapp.tools.mcp.headers import stored_environment, stored_headers
from webapp.tools.mcp.sessions import fetch_tools, fingerprint
from webapp.tools.mcp.transport import Access


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
            if server.synced_at is not None and not waits_by_default(accepted):
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
        record_current(row, remote, current)
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


def registry_name(server: str, remote: str, taken: set[str]) -> str:
    """`mcp_<server>__<tool>`, in the API's characters; cut to 128 with a short hash when too long or
    already taken."""
    name = NOT_IN_NAMES.sub("_", f"mcp_{server}__{remote}")
    if len(name) <= NAME_LIMIT and name not in taken:
        return name
    digest = hashlib.sha256(f"{server}\0{remote}".encode()).hexdigest()
    for length in (8, 16, 64):
        candidate = f"{name[: NAME_LIMIT - length - 1]}_{digest[:length]}"
        if candidate not in taken:
            return candidate
    raise McpError(f"No free name for {remote} of {server}.")


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
