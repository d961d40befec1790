"""The layers hold: the loop's rules load neither Flask nor RQ, and the import contracts are kept."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_importing_the_loop_loads_neither_flask_nor_rq():
    probe = (
        "import sys, webapp.agent.loop, webapp.agent.decisions, webapp.agent.moves, webapp.agent.sweeper;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('flask', 'rq', 'redis', 'flask_sqlalchemy')))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout


def test_every_import_contract_is_kept():
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "BROKEN" not in result.stdout and "0 broken" in result.stdout


def test_the_product_names_no_tool_and_no_argument_of_the_billing_demo():
    """All of webapp/ and templates/ (the migrations aside, which keep what they once wrote) read what a
    tool declares (webapp.tools.Tool) and name no tool of their own: the demo's are demo/billing's."""
    from demo.billing.tools import demo_registry

    registry = demo_registry()
    tools = set(registry.names())
    arguments = {
        name
        for tool in tools
        for name in registry.get(tool).argument_names()
        if name.endswith(("_id", "_cents"))  # the billing demo's own arguments (invoice_id, amount_cents, ...)
    }
    assert {"issue_refund", "send_email"} <= tools and {"amount_cents", "invoice_id", "customer_id"} <= arguments
    words = re.compile(r"\b(" + "|".join(sorted(tools | arguments)) + r")\b")
    found = [
        f"{path.relative_to(ROOT)}:{number}: {match.group(1)}"
        for place in (ROOT / "webapp", ROOT / "templates")
        for path in sorted(place.rglob("*"))
        if path.suffix in (".py", ".html") and "migrations" not in path.parts
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        for match in words.finditer(line)
    ]
    assert found == [], "the product names billing tools or arguments:\n" + "\n".join(found)
