"""Without REDIS_URL, every process of a checkout shares one embedded Redis: the first to need it
starts it, the others find it, and it stops when asked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_until
from webapp.runtime import embedded_redis

# What each web or worker process does first: connect to the checkout's Redis (and say which server).
PROBE = """
import sys
from pathlib import Path
from webapp.config import Config
from webapp.runtime.queue import redis_connection
connection = redis_connection(Config.from_env({"INSTANCE_PATH": sys.argv[1]}))
connection.incr("desk:probes")
print(connection.info("server")["run_id"], connection.info("server")["process_id"])
"""


def redis_servers(instance: Path) -> list[str]:
    found = subprocess.run(["pgrep", "-f", f"unixsocket:{instance}"], capture_output=True, text=True)
    return found.stdout.split()


@pytest.fixture
def instance(tmp_path):
    yield tmp_path
    embedded_redis.stop(tmp_path)


def test_processes_starting_at_once_share_one_server(instance):
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    probes = [
        subprocess.Popen(
            [sys.executable, "-c", PROBE, str(instance)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(6)
    ]
    answers = {probe.communicate(timeout=60)[0].strip() for probe in probes}
    assert all(probe.returncode == 0 for probe in probes)
    assert len(answers) == 1  # one run id, one pid: every process talked to the same server
    assert len(redis_servers(instance)) == 1
    connection = embedded_redis.redis.Redis.from_url(embedded_redis.url(instance))
    assert int(connection.get("desk:probes")) == 6

    assert embedded_redis.stop(instance)
    assert redis_servers(instance) == [] and not embedded_redis.running(instance)
    assert not embedded_redis.stop(instance)  # stopping twice says there was nothing to stop


def test_a_server_that_died_is_started_afresh(instance):
    embedded_redis.ensure_running(instance)
    (pid,) = redis_servers(instance)
    os.kill(int(pid), signal.SIGKILL)  # its socket file stays behind
    wait_until(lambda: not embedded_redis.running(instance), 10, "the server to die")
    url = embedded_redis.ensure_running(instance)
    assert embedded_redis.redis.Redis.from_url(url).ping()
    assert len(redis_servers(instance)) == 1


def test_a_deep_instance_folder_gets_a_short_socket_path(tmp_path):
    deep = tmp_path / ("nested-folder-" * 8)
    assert len(str(deep / "redis.sock")) > embedded_redis.MAX_SOCKET_PATH
    socket = embedded_redis.socket_path(deep)
    assert len(str(socket)) <= embedded_redis.MAX_SOCKET_PATH
    assert socket == embedded_redis.socket_path(deep)  # the same folder always gets the same socket


def test_the_cli_starts_and_stops_it_and_says_when_redis_url_makes_it_moot(instance):
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    env.update(INSTANCE_PATH=str(instance), SECRET_KEY="test")

    def flask(*args: str, **more: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "flask", "--app", "webapp", "desk", "redis", *args]
        return subprocess.run(command, cwd=ROOT, env={**env, **more}, capture_output=True, text=True, timeout=60)

    started = flask("start")
    assert started.returncode == 0 and f"answering on unix://{instance}/redis.sock" in started.stdout
    assert embedded_redis.running(instance)
    assert flask("stop").stdout.strip() == "Embedded Redis stopped."
    assert not embedded_redis.running(instance)
    refused = flask("start", REDIS_URL="redis://127.0.0.1:1/0")
    assert refused.returncode != 0 and "REDIS_URL is set" in refused.stderr
