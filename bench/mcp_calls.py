"""The time of one call of a tool of an MCP server the desk starts (stdio), as a worker slot makes it:
the accepted definition compared with the server's listing, then the call.

    .venv/bin/python -m bench.mcp_calls                                 # the tests' warehouse server
    .venv/bin/python -m bench.mcp_calls --command "/tmp/ref/bin/mcp-server-time" \
        --tool get_current_time --arguments '{"timezone": "Europe/Paris"}' --calls 20
    .venv/bin/python -m bench.mcp_calls --idle-seconds 0                # a server started per call

Prints the first call (which starts the server) and the median and slowest of the calls after it.
No database, Redis or app: the tool is built from the server's own listing, as `flask mcp add`
accepts it. `--idle-seconds` is MCP_IDLE_SECONDS: 0 starts the server for every call, as the desk did
before it kept servers running."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from webapp.models import McpTool
from webapp.tools import mcp
from webapp.tools.registry import ToolContext

WAREHOUSE = Path(__file__).resolve().parent.parent / "tests" / "mcp" / "warehouse.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    scratch = Path(tempfile.mkdtemp(prefix="mcp-bench-"))
    parser.add_argument("--command", default=f"{sys.executable} {WAREHOUSE} --stdio --reservations {scratch / 'r'}")
    parser.add_argument("--tool", default="lookup_stock")
    parser.add_argument("--arguments", default='{"sku": "SKU-1"}', help="the call's arguments, as JSON")
    parser.add_argument("--calls", type=int, default=10, help="calls after the first (default 10)")
    parser.add_argument("--idle-seconds", type=float, default=300.0, help="MCP_IDLE_SECONDS (default 300)")
    args = parser.parse_args()

    access = mcp.Access(
        server="bench",
        url=None,
        command=args.command,
        command_by_operator=True,
        timeout=60,
        idle_seconds=args.idle_seconds,
    )
    listed = next((tool for tool in mcp.fetch_tools(access) if tool["name"] == args.tool), None)
    if listed is None:
        sys.exit(f"The server does not offer {args.tool}.")
    accepted = mcp.fingerprint(listed["description"], listed["input_schema"], listed["annotations"])
    row = McpTool(
        registry_name=f"mcp_bench__{args.tool}",
        remote_name=args.tool,
        description=listed["description"],
        input_schema=listed["input_schema"],
        annotations=listed["annotations"],
        fingerprint=accepted,
        current_fingerprint=accepted,
        held=False,
    )
    tool = mcp.McpRemoteTool(row, access)
    arguments = json.loads(args.arguments)
    context = ToolContext(None, 0, 0, 0, "bench")
    seconds = []
    for _ in range(args.calls + 1):
        started = time.perf_counter()
        tool.execute(arguments, context)
        seconds.append(time.perf_counter() - started)
    after = seconds[1:]
    print(f"command: {args.command}")
    print(f"first call: {seconds[0] * 1000:.0f} ms")
    if after:
        print(f"next {len(after)}: median {statistics.median(after) * 1000:.1f} ms, slowest {max(after) * 1000:.1f} ms")
    mcp.close_sessions()


if __name__ == "__main__":
    main()
