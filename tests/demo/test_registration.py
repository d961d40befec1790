"""bin/demo registers the demo's inventory MCP server for acme with the operator's command line
(scripts/register-demo-inventory) on every start: the first start adds it, every later one finds it
and carries on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import select

from webapp.models import McpServer
from webapp.runtime.extensions import db

ROOT = Path(__file__).resolve().parents[2]
REGISTER = ROOT / "scripts" / "register-demo-inventory"


def registered() -> list[tuple[str, str, bool]]:
    """Every tenant's MCP servers: (name, command, started by an operator's say-so), read afresh."""
    db.session.remove()
    rows = db.session.scalars(select(McpServer).order_by(McpServer.name))
    found = [(row.name, row.command, row.command_by_operator) for row in rows]
    db.session.remove()
    return found


def test_the_operators_add_a_second_time_says_the_server_is_there_and_adds_nothing(cli, tmp_path):
    add = ["mcp", "add", "inventory", "--tenant", "acme"]
    add += ["--command", f"{sys.executable} -m demo.inventory_server --state {tmp_path / 'inventory.json'}"]

    first = cli(*add)
    assert first.exit_code == 0, first.output
    assert "Added MCP server inventory to acme, with 2 tools:" in first.output
    assert "mcp_inventory__lookup (lookup): runs at once (read-only)" in first.output
    assert "mcp_inventory__restock (restock): waits for one approval" in first.output

    second = cli(*add)
    assert second.exit_code == 2
    assert "An MCP server named inventory already exists here; pick another name, or sync it." in second.output
    assert [name for name, _, _ in registered()] == ["inventory"]


def test_the_demos_registration_adds_the_server_the_first_time_and_finds_it_the_second(app, env):
    def register() -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(REGISTER)], env={**os.environ, **env}, capture_output=True, text=True, timeout=180
        )

    first = register()
    assert first.returncode == 0, first.stdout + first.stderr
    assert "Added MCP server inventory to acme, with 2 tools:" in first.stdout
    state = Path(env["INSTANCE_PATH"]) / "inventory.json"
    assert registered() == [("inventory", f"{ROOT}/.venv/bin/python -m demo.inventory_server --state {state}", True)]

    second = register()
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.stdout.strip() == (
        "The demo's inventory MCP server is registered for acme already (flask --app webapp mcp list --tenant acme)."
    )
    assert len(registered()) == 1
