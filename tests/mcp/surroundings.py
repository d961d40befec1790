"""A stdio MCP server for the tests, built with the `mcp` SDK, whose one read-only tool says what the
process was started with: the names of its environment variables, the values of the ones asked
for, and its working directory.

    python tests/mcp/surroundings.py

The names are read from /proc/self/environ, the environment the process was started with: Python's
own start adds LC_CTYPE to os.environ when the locale is plain C (PEP 538), which is not the desk's
doing."""

from __future__ import annotations

import os
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations


def started_with() -> dict[str, str]:
    entries = Path("/proc/self/environ").read_bytes().split(b"\0")
    return dict(entry.decode().partition("=")[::2] for entry in entries if entry)


def build() -> MCPServer:
    server = MCPServer("surroundings")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def surroundings(values_of: list[str]) -> dict:
        """The names of this process's environment variables, the values of those asked for, and its
        working directory."""
        environment = started_with()
        return {
            "names": sorted(environment),
            "values": {name: environment.get(name) for name in values_of},
            "working_directory": os.getcwd(),
        }

    return server


if __name__ == "__main__":
    build().run("stdio")
