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

The package, one module per job (nothing outside it imports the `mcp` SDK; an import contract says so):
base (names, limits and the errors every part raises), transport (reaching a server: Access, headers
and variables read at use, one connection per call), sessions (live sessions with started servers on
their own event loop, and listing a server's tools), headers (parsing and storing headers and
variables, and their words for people), catalogue (servers and their tools per tenant: add, sync,
remove), guard (holding a changed tool until an admin accepts it), mapping (what an admin maps of a
tool's arguments: amount, subject, facts), adapter (an MCP tool as a desk `Tool`).
This module is the public face the rest of the desk calls. Nothing here loads Flask, RQ or Redis.
"""

from webapp.tools.described import UNITS, money_in_cents, schema_problem
from webapp.tools.mcp.adapter import McpRemoteTool
from webapp.tools.mcp.base import (
    ERROR_CHARS,
    NAME_LIMIT,
    ONLY_OPERATORS_START,
    SERVER_NAME,
    McpError,
    SecretRefused,
)
from webapp.tools.mcp.catalogue import (
    SyncReport,
    add_server,
    find_server,
    registry_name,
    remove_server,
    sync_server,
    tenant_tools,
)
from webapp.tools.mcp.guard import (
    accept_tool,
    check_server,
    hint_changes,
    hint_words,
    hold_changed,
    read_only_and_destructive,
)
from webapp.tools.mcp.headers import (
    environment_words,
    header_words,
    parse_header,
    parse_variable,
    stored_environment,
    stored_headers,
)
from webapp.tools.mcp.mapping import FACTS_SECONDS, mapping_words, set_mapping
from webapp.tools.mcp.sessions import close_sessions, fetch_tools, fingerprint, open_sessions
from webapp.tools.mcp.transport import Access

__all__ = [
    "UNITS",
    "money_in_cents",
    "schema_problem",
    "SERVER_NAME",
    "NAME_LIMIT",
    "ERROR_CHARS",
    "ONLY_OPERATORS_START",
    "McpError",
    "SecretRefused",
    "Access",
    "close_sessions",
    "open_sessions",
    "fetch_tools",
    "fingerprint",
    "McpRemoteTool",
    "SyncReport",
    "find_server",
    "add_server",
    "sync_server",
    "registry_name",
    "remove_server",
    "tenant_tools",
    "parse_header",
    "parse_variable",
    "stored_headers",
    "stored_environment",
    "header_words",
    "environment_words",
    "hold_changed",
    "read_only_and_destructive",
    "hint_words",
    "hint_changes",
    "check_server",
    "accept_tool",
    "FACTS_SECONDS",
    "set_mapping",
    "mapping_words",
]
