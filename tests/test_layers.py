"""The layers hold: the loop's rules load neither Flask nor RQ, and the import contracts are kept."""

from __future__ import annotations

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
