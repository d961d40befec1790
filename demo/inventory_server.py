"""The demo's inventory: a small MCP server, built with the `mcp` SDK, that `bin/demo` registers for
the acme tenant (`flask mcp add inventory --command "... -m demo.inventory_server --state ..."`), so
the desk shows a tool of a server of its own behind the same approval gate as the billing tools:

- `lookup` (read-only, `readOnlyHint`): an item by its SKU, its name and how many are in stock. The
  desk runs it at once.
- `restock` (writes, but destroys nothing: `readOnlyHint=False`, `destructiveHint=False`): adds units
  of an item to its stock. The desk has it wait for a person's approval.

    python -m demo.inventory_server --state instance/inventory.json

It speaks MCP over stdio (the desk starts it for each use) and keeps the stock in the JSON file given
with --state, created with a few items when missing. It is a program of its own, as a company's
server would be: it imports nothing of the desk.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

STARTING_STOCK = {
    "A-1": {"name": "Blue mug", "in_stock": 12},
    "A-2": {"name": "Red teapot", "in_stock": 0},
    "B-7": {"name": "Linen tea towel", "in_stock": 40},
}
MAX_RESTOCK = 1000  # one delivery; a larger number is more likely a typo than a truck
_SKU = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,31}$")


class InventoryError(ToolError):
    """A request the inventory refuses; its message says why and what would work. The SDK sends the
    message of a ToolError back as the call's error result (any other exception's text stays here)."""


class Inventory:
    """The stock in a JSON file. Every change holds an exclusive lock on a file beside it, because
    the desk may start one server process per call and two calls may run at once."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.lock_path = state.with_name(state.name + ".lock")

    def lookup(self, sku: str) -> dict:
        with self._locked() as items:
            key = self._known(items, sku)
            return {"sku": key, "name": items[key]["name"], "in_stock": items[key]["in_stock"]}

    def restock(self, sku: str, quantity: int) -> dict:
        if quantity < 1 or quantity > MAX_RESTOCK:
            raise InventoryError(f"The quantity must be between 1 and {MAX_RESTOCK}; {quantity} was asked.")
        with self._locked(write=True) as items:
            key = self._known(items, sku)
            items[key]["in_stock"] += quantity
            return {"sku": key, "name": items[key]["name"], "added": quantity, "in_stock": items[key]["in_stock"]}

    @staticmethod
    def _known(items: dict, sku: str) -> str:
        if not _SKU.match(sku.strip()):
            raise InventoryError(f"{sku!r} is not a SKU: SKUs look like A-1.")
        by_upper = {key.upper(): key for key in items}
        key = by_upper.get(sku.strip().upper())
        if key is None:
            raise InventoryError(
                f"There is no item with the SKU {sku.strip()}; the inventory holds {', '.join(items)}."
            )
        return key

    @contextmanager
    def _locked(self, write: bool = False) -> Iterator[dict]:
        self.state.parent.mkdir(parents=True, exist_ok=True)
        with self.lock_path.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            items = self._read()
            yield items
            if write:  # a whole new file, renamed over the old: a crash never leaves half a file
                temporary = self.state.with_name(self.state.name + ".tmp")
                temporary.write_text(json.dumps(items, indent=2, sort_keys=True) + "\n")
                os.replace(temporary, self.state)

    def _read(self) -> dict:
        if not self.state.exists():
            return {key: dict(item) for key, item in STARTING_STOCK.items()}
        try:
            items = json.loads(self.state.read_text())
        except ValueError:
            items = None
        if not isinstance(items, dict):
            raise InventoryError(f"The inventory file {self.state} cannot be read; remove it to start afresh.")
        return items


def build(state: Path) -> MCPServer:
    """The MCP server over the inventory kept in `state`."""
    inventory = Inventory(state)
    server = MCPServer("inventory", instructions="The demo shop's inventory: look items up by SKU, restock them.")

    @server.tool(annotations=ToolAnnotations(title="Look up an item", read_only_hint=True))
    def lookup(sku: str) -> dict:
        """Look up an item in the inventory by its SKU (such as A-1): its name and how many are in stock."""
        return inventory.lookup(sku)

    @server.tool(
        annotations=ToolAnnotations(
            title="Restock an item", read_only_hint=False, destructive_hint=False, idempotent_hint=False
        )
    )
    def restock(sku: str, quantity: int) -> dict:
        """Add units of an item to the inventory's stock, e.g. when a delivery arrives."""
        return inventory.restock(sku, quantity)

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m demo.inventory_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", type=Path, required=True, help="The JSON file that keeps the stock.")
    args = parser.parse_args(argv)
    build(args.state.resolve()).run("stdio")


if __name__ == "__main__":
    main()
