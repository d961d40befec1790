"""The benchmark command must keep working: its smallest slice (a few conversations, SQLite, an
embedded Redis, one SimpleWorker subprocess) runs end to end and writes the JSON the README's
tables come from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def _positive(row: dict, *keys: str) -> None:
    for key in keys:
        assert isinstance(row[key], int | float) and row[key] > 0, (key, row)


def test_quick_slice_writes_the_expected_json(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "BENCH_POSTGRES_URL")}
    command = [
        sys.executable,
        "-m",
        "bench",
        "--quick",
        "--no-postgres",
        "--workers=1",
        "--classes=simple",
        "--approval-classes=simple",
        "--overhead-conversations=2",
        "--conversations=3",
        "--decisions=2",
        "--page-conversations=50",
        "--audit-events=1000",
        "--repeats=2",
        f"--results={tmp_path}",
    ]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    [path] = tmp_path.glob("bench-*.json")
    assert path.with_suffix(".md").read_text().count("|") > 20
    report = json.loads(path.read_text())
    assert report["mode"] == "quick" and report["cpus"] >= 1
    assert list(report["backends"]) == ["sqlite"]
    sqlite = report["backends"]["sqlite"]

    overhead = {"all moves", "SDK call within a model move", "orchestration (move minus SDK call)"}
    assert overhead <= set(sqlite["overhead"])
    for row in sqlite["overhead"].values():
        _positive(row, "count", "p50_ms", "p95_ms", "p99_ms")

    [throughput] = sqlite["throughput"]
    assert (throughput["class"], throughput["workers"], throughput["conversations"]) == ("simple", 1, 3)
    assert throughput["moves"] == 9  # three moves per conversation
    _positive(throughput, "seconds", "moves_per_s")

    approvals = sqlite["approvals"]["simple"]
    assert set(approvals) == {
        "POST /api/approvals/<id> (approve)",
        "decision posted → tool move starts",
        "decision posted → tool move ends",
        "decision posted → next model move ends",
    }
    for row in approvals.values():
        assert row["count"] == 2
        _positive(row, "p50_ms", "p95_ms", "p99_ms")

    pages = sqlite["pages"]
    assert pages["data"]["conversations"]["conversations"] == 50
    assert pages["data"]["audit_events"]["events"] == 1000
    assert {"inbox, first page", "chat page (one conversation)", "audit log, first page"} <= set(pages["pages"])
    for row in pages["pages"].values():
        assert row["count"] == 2
        _positive(row, "p50_ms", "p95_ms")
