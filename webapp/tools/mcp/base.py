"""What every part of the MCP package shares: server and tool names, limits, and the errors it raises."""

from __future__ import annotations

import re

SERVER_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
ENV_REFERENCE = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_]*)$")
VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NOT_IN_NAMES = re.compile(r"[^a-zA-Z0-9_-]")
NAME_LIMIT = 128  # the Messages API's longest tool name
ERROR_CHARS = 2000  # of a server's error text, fenced, in an error result
SEALING_HEADERS = "mcp server headers"
SEALING_ENVIRONMENT = "mcp server environment"
ONLY_OPERATORS_START = (
    "Only the desk's operator can add a server that the desk starts; ask them to run "
    '`flask mcp add NAME --command "..." --tenant SLUG`, or give the URL of a server that is already running.'
)


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


class Unreachable(Exception):
    """The server could not be reached, or failed before the call was sent: nothing was sent."""


class Lost(Exception):
    """The call was sent, and then the server stopped answering or ran out of time."""
