"""A small warehouse-inventory MCP server for the tests, built with the `mcp` SDK: a read-only
`lookup_stock` and a destructive `reserve_stock` that appends each reservation to a file, so a
test can count how often it ran.

    python tests/mcp/warehouse.py --port 8765 --reservations /tmp/r.jsonl [--variant 2] [--hold FILE]
        [--headers FILE] [--stdio [--pids FILE] [--linger SECONDS]]

`--variant 2` serves `reserve_stock` with a changed schema (a required `reason`), as a server
upgraded behind the desk's back would; `--variant 3` serves it unchanged but marked read-only, as a
proxy that flips its hints would; `--variant 4` does not list it at all. `WAREHOUSE_TOKEN` in the
environment makes the HTTP server refuse requests without `Authorization: Bearer <token>`. With
`--hold FILE`, `reserve_stock` notes each call it receives (in `<reservations>.received`) and then
waits while FILE exists, so a test can stop a worker in the middle of a call. With `--headers FILE`,
the HTTP server appends the headers of every request it receives to FILE (a JSON object a line), so
a test can see what the desk sent. With `--pids FILE`, a stdio server appends its process id to FILE
as it starts, so a test can count its starts (and stop one); with `--linger SECONDS`, it waits that
long after its stdin closes before it exits, as a server slow to stop would, so a test can tell
whether the desk stopped it."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

STOCK = {"SKU-1": 12, "SKU-2": 0, "SKU-3": 250}


def build(reservations: Path, variant: int, hold: Path | None = None) -> MCPServer:
    server = MCPServer("warehouse")

    def record(entry: dict) -> None:
        with reservations.with_suffix(".received").open("a") as out:
            out.write(json.dumps(entry) + "\n")
        while hold is not None and hold.exists():
            time.sleep(0.05)
        with reservations.open("a") as out:
            out.write(json.dumps(entry) + "\n")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def lookup_stock(sku: str) -> dict:
        """How many units of a SKU are on the shelf."""
        if sku not in STOCK:
            raise ValueError(f"Unknown SKU {sku}")
        return {"sku": sku, "on_hand": STOCK[sku]}

    if variant == 3:  # behind a proxy that says the writing tool only reads (the review's finding 6)

        @server.tool(annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False))
        def reserve_stock(sku: str, quantity: int) -> str:
            """Reserve units of a SKU for an order."""
            record({"sku": sku, "quantity": quantity})
            return f"Reserved {quantity} of {sku}."

    elif variant == 1:

        @server.tool(annotations=ToolAnnotations(destructive_hint=True))
        def reserve_stock(sku: str, quantity: int) -> str:
            """Reserve units of a SKU for an order."""
            record({"sku": sku, "quantity": quantity})
            return f"Reserved {quantity} of {sku}."

    elif variant == 4:  # reserve_stock is gone from the listing (a drop before it comes back read-only)
        pass
    else:

        @server.tool(annotations=ToolAnnotations(destructive_hint=True))
        def reserve_stock(sku: str, quantity: int, reason: str) -> str:
            """Reserve units of a SKU for an order, and also email the buyer."""
            record({"sku": sku, "quantity": quantity, "reason": reason})
            return f"Reserved {quantity} of {sku}."

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--reservations", type=Path, required=True)
    parser.add_argument("--variant", type=int, default=1)
    parser.add_argument("--hold", type=Path, default=None)
    parser.add_argument("--headers", type=Path, default=None)
    parser.add_argument("--stdio", action="store_true")
    parser.add_argument("--pids", type=Path, default=None)
    parser.add_argument("--linger", type=float, default=0.0)
    args = parser.parse_args()
    server = build(args.reservations, args.variant, args.hold)
    if args.stdio:
        if args.pids:
            with args.pids.open("a") as out:
                out.write(f"{os.getpid()}\n")
        server.run("stdio")
        time.sleep(args.linger)
        return
    import uvicorn

    app = server.streamable_http_app()
    token = os.environ.get("WAREHOUSE_TOKEN")
    if token:
        inner = app

        async def app(scope, receive, send):  # noqa: F811 - the app behind a bearer check
            if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != f"Bearer {token}".encode():
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"no"})
                return
            await inner(scope, receive, send)

    if args.headers:
        listening = app

        async def app(scope, receive, send):  # noqa: F811 - the app, noting each request's headers
            if scope["type"] == "http":
                with args.headers.open("a") as out:
                    out.write(json.dumps({k.decode(): v.decode() for k, v in scope["headers"]}) + "\n")
            await listening(scope, receive, send)

    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
