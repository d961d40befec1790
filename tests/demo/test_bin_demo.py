"""bin/demo as a service manager stops it: SIGTERM to the script (not Ctrl-C to its terminal) stops
the web server, the workers and the embedded Redis it started."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port, wait_until

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _started_by(session_id: int, instance: Path) -> list[str]:
    """The processes of the demo's session, and its embedded Redis (a daemon in a session of its own,
    named by the pid file in the instance folder)."""
    redis_pid = (instance / "redis.pid").read_text().strip() if (instance / "redis.pid").exists() else ""
    found = []
    for line in subprocess.run(["ps", "-eo", "pid=,sid=,args="], capture_output=True, text=True).stdout.splitlines():
        pid, sid, *_ = line.split(None, 2)
        if int(sid) == session_id or pid == redis_pid:
            found.append(line.strip())
    return found


def test_sigterm_to_bin_demo_leaves_none_of_its_processes_within_10_seconds(tmp_path):
    instance, port = tmp_path / "instance", free_port()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "INSTANCE_PATH": str(instance),  # its own SQLite file and embedded Redis, nobody else's
        "PORT": str(port),
        "WORKERS": "1",
    }
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        demo = subprocess.Popen(
            ["bash", "bin/demo"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_until(lambda: _answers(f"http://127.0.0.1:{port}/healthz") or demo.poll() is not None, 300, "the demo")
        assert demo.poll() is None, log.read_text()[-3000:]
        running = " ".join(_started_by(demo.pid, instance))
        for part in ("bin/demo", "flask worker", "flask run", "redis"):  # the script, a worker, the web, Redis
            assert part in running, running

        demo.send_signal(signal.SIGTERM)  # to the script alone, as `kill <pid>` does
        demo.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _started_by(demo.pid, instance) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _started_by(demo.pid, instance) == [], log.read_text()[-3000:]
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
        for line in _started_by(demo.pid, instance):
            os.kill(int(line.split()[0]), signal.SIGKILL)
