"""The benchmark command must keep working: its smallest slices (a few conversations, SQLite, an
embedded Redis, one worker subprocess at a time) run end to end and write the JSON docs/performance.md's
tables come from. Only the shape of the results is checked, never a speed."""

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


def _run(tmp_path, *flags: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "BENCH_POSTGRES_URL")}
    command = [sys.executable, "-m", "bench", "--quick", "--no-postgres", *flags, f"--results={tmp_path}"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    [path] = tmp_path.glob("bench-*.json")
    assert path.with_suffix(".md").read_text().count("|") > 20
    report = json.loads(path.read_text())
    assert report["mode"] == "quick" and report["cpus"] >= 1
    assert list(report["backends"]) == ["sqlite"]
    return report


def test_quick_slice_writes_the_expected_json(tmp_path):
    report = _run(
        tmp_path,
        "--parts=overhead,throughput,approvals,context,pages,waiting",
        "--workers=1",
        "--classes=simple",
        "--approval-classes=simple",
        "--overhead-conversations=2",
        "--conversations=3",
        "--decisions=2",
        "--page-conversations=50",
        "--audit-events=1000",
        "--waiting-sizes=5,30",
        "--repeats=2",
        "--approvals-in-flight=0",
        "--context-turns=8",
    )
    sqlite = report["backends"]["sqlite"]

    overhead = {"all moves", "SDK call within a model move", "orchestration (move minus SDK call)"}
    assert overhead <= set(sqlite["overhead"])
    for row in sqlite["overhead"].values():
        _positive(row, "count", "p50_ms", "p95_ms", "p99_ms")

    [throughput] = sqlite["throughput"]
    assert (throughput["class"], throughput["workers"], throughput["conversations"]) == ("simple", 1, 3)
    assert throughput["moves"] == 9  # three moves per conversation
    _positive(throughput, "seconds", "moves_per_s", "worker_cpu_ms_per_move", "cpu_bound_moves_per_s")

    guarded, whole, before = sqlite["context"].values()
    assert guarded["answered"] == whole["answered"] == 8
    assert guarded["summaries"] >= 1 and guarded["over_window"] == 0 and guarded["fact_kept"]
    assert whole["over_window"] > 0  # the same chat sent whole outgrows the window
    assert before["cache_read_share"] < whole["cache_read_share"]  # the moving breakpoint reads the history

    approvals = sqlite["approvals"]["simple"]
    assert set(approvals) >= {
        "POST /api/approvals/<id> (approve)",
        "decision posted → tool move starts",
        "decision posted → tool move ends",
        "decision posted → next model move ends",
    }
    for row in approvals.values():
        assert row["count"] == 2
        _positive(row, "p50_ms", "p95_ms", "p99_ms")
    assert "approvals_in_flight" not in sqlite

    pages = sqlite["pages"]
    assert pages["data"]["conversations"]["conversations"] == 50
    assert pages["data"]["audit_events"]["events"] == 1000
    assert {"inbox, first page", "chat page (one conversation)", "audit log, first page"} <= set(pages["pages"])
    for row in pages["pages"].values():
        assert row["count"] == 2
        _positive(row, "p50_ms", "p95_ms")

    waiting = sqlite["waiting"]
    assert waiting["sizes"] == [5, 30]
    assert {"decision page, the oldest call", "inbox, first page", "API: one waiting call"} <= set(waiting["pages"])
    for by_size in waiting["pages"].values():
        assert set(by_size) == {"5", "30"}
        for row in by_size.values():
            _positive(row, "count", "p50_ms")


def test_quick_slice_of_the_pool_parts(tmp_path):
    """The app's PoolWorker through moves/s, conversations in flight against a slow model, approvals
    while others are in flight, and the LangGraph comparison (or its skip, without the extra)."""
    report = _run(
        tmp_path,
        "--parts=langgraph,throughput,inflight,approvals",
        "--script-runs=2",
        "--classes=pool",
        "--workers=1",
        "--pool-slots=3",
        "--conversations=3",
        "--inflight=3:0.2:1:3",
        "--approval-classes=pool",
        "--decisions=2",
        "--approvals-in-flight=3:0.2:1:6",
    )
    sqlite = report["backends"]["sqlite"]

    [throughput] = sqlite["throughput"]
    assert (throughput["class"], throughput["workers"], throughput["slots"]) == ("pool", 1, 3)
    assert throughput["moves"] == 9
    _positive(throughput, "seconds", "moves_per_s")

    [inflight] = sqlite["inflight"]
    assert (inflight["conversations"], inflight["reply_seconds"], inflight["workers"], inflight["slots"]) == (
        3,
        0.2,
        1,
        3,
    )
    assert inflight["moves"] == 9
    _positive(inflight, "seconds", "done_over_reply", "rss_idle_mb", "rss_in_flight_mb")
    for key in ("wait_for_model_p50_s", "wait_for_model_p95_s", "mb_per_conversation", "peak_moves_running"):
        assert isinstance(inflight[key], int | float), key

    measures = {
        "POST /api/approvals/<id> (approve)",
        "decision posted → next model move ends",
        "decision posted → next model move ends, minus its model call (the desk's share)",
    }
    assert measures <= set(sqlite["approvals"]["pool"])
    [loaded] = sqlite["approvals_in_flight"]
    assert loaded["settings"]["in_flight"] == 3 and loaded["settings"]["background_completed"] >= 1
    assert 0 < loaded["settings"]["cpu_busy_share"] <= 1
    assert measures | {"new message posted → its answer's first words on the live channel"} <= set(loaded["measures"])
    for row in loaded["measures"].values():
        assert row["count"] == 2

    graph = report["langgraph"]
    if "skipped" in graph:  # without `pip install -e '.[bench]'`: said, not failed
        assert "langgraph" in graph["skipped"] and "script" not in sqlite
        return
    for side in (graph["step"], graph["stream"], sqlite["script"]):
        assert {"model steps", "tool steps", "step that parks for the approval", "all steps"} <= set(side)
        for row in side.values():
            _positive(row, "count", "p50_ms", "p95_ms")
    assert graph["step"]["model steps"]["count"] == 6  # three model steps per run, two runs


def test_where_counts_a_profile_by_the_part_of_a_move_it_is_in():
    from bench.where import RQ, split

    total, parts = split(
        [
            "perform_job (rq/worker/base.py:1);execute (redis/client.py:2) 3",  # RQ's own Redis calls
            "perform (rq/job.py:1);advance_conversation (jobs/moves.py:5);execute (sqlalchemy/orm/session.py:9) 2",
            "perform (rq/job.py:1);advance_conversation (jobs/moves.py:1);step (webapp/agent/loop.py:3) 1",
        ]
    )
    assert total == 6
    assert parts[RQ] == 3
    assert parts["the database (SQLAlchemy, the driver)"] == 2
    assert parts["the desk's own code"] == 1
