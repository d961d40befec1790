"""The demo's inventory MCP server (demo/inventory_server.py), started over stdio as the desk starts
it and spoken to with the `mcp` SDK's own client: what it says of its tools, what they do, and the
file that keeps its stock."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.loops import in_own_thread


def session_with(state: Path, work):
    """work(session) against a freshly started server keeping its stock in `state`; what it returns."""

    async def run():
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "demo.inventory_server", "--state", str(state)],
            env={"PATH": "/usr/bin:/bin"},
        )
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await work(session)

    return in_own_thread(anyio.run, run)


def call(state: Path, tool: str, arguments: dict) -> tuple[bool, str]:
    async def work(session):
        result = await session.call_tool(tool, arguments)
        return result.is_error, "\n".join(block.text for block in result.content)

    return session_with(state, work)


def test_the_lookup_only_reads_and_the_restock_writes_without_destroying(tmp_path):
    async def listing(session):
        return {tool.name: tool for tool in (await session.list_tools()).tools}

    tools = session_with(tmp_path / "inventory.json", listing)

    assert sorted(tools) == ["lookup", "restock"]
    assert tools["lookup"].annotations.read_only_hint is True
    assert (tools["restock"].annotations.read_only_hint, tools["restock"].annotations.destructive_hint) == (
        False,
        False,
    )
    assert tools["lookup"].input_schema["required"] == ["sku"]
    assert tools["restock"].input_schema["required"] == ["sku", "quantity"]
    assert tools["restock"].input_schema["properties"]["quantity"]["type"] == "integer"


def test_a_restock_is_kept_in_the_state_file_and_seen_by_the_next_process(tmp_path):
    state = tmp_path / "instance" / "inventory.json"
    assert call(state, "lookup", {"sku": "A-1"}) == (
        False,
        json.dumps({"sku": "A-1", "name": "Blue mug", "in_stock": 12}, indent=2),
    )
    assert not state.exists()  # reading writes nothing

    failed, said = call(state, "restock", {"sku": "a-1", "quantity": 5})
    assert not failed and json.loads(said) == {"sku": "A-1", "name": "Blue mug", "added": 5, "in_stock": 17}
    assert json.loads(state.read_text())["A-1"] == {"name": "Blue mug", "in_stock": 17}
    assert json.loads(call(state, "lookup", {"sku": "A-1"})[1]) == {"sku": "A-1", "name": "Blue mug", "in_stock": 17}


def test_what_the_inventory_refuses_is_said_in_words(tmp_path):
    state = tmp_path / "inventory.json"
    assert call(state, "lookup", {"sku": "Z-9"}) == (
        True,
        "Error executing tool lookup: There is no item with the SKU Z-9; the inventory holds A-1, A-2, B-7.",
    )
    assert call(state, "restock", {"sku": "A-1", "quantity": 0}) == (
        True,
        "Error executing tool restock: The quantity must be between 1 and 1000; 0 was asked.",
    )
    assert call(state, "lookup", {"sku": "../etc"}) == (
        True,
        "Error executing tool lookup: '../etc' is not a SKU: SKUs look like A-1.",
    )
    state.write_text("not json")
    assert call(state, "lookup", {"sku": "A-1"}) == (
        True,
        f"Error executing tool lookup: The inventory file {state} cannot be read; remove it to start afresh.",
    )
