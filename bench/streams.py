"""Benchmark: how long a streamed word takes from the model endpoint to a reader of the page's live
stream, and how many open live streams one web process holds while still answering other requests.

    .venv/bin/python -m bench.streams [--streams 50,200,500]

Runs the real parts: a local Messages API endpoint streaming one numbered word per event, one worker,
the web server (`flask run --with-threads`, as `bin/demo` does), an embedded Redis, SQLite. A word's
latency is its arrival on /live/conversations/<id> minus the moment the endpoint wrote it (one clock:
both ends live in this process); it includes the worker's 50 ms batching of deltas. The browser's own
swap of the text adds a few milliseconds on top. Prints tables and writes JSON (and the tables as
Markdown) to bench/results/.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
from urllib.parse import urlsplit

import httpx2

from bench.common import ROOT, Table, backend, make_app, new_report, prepare, save, stats
from tests.model_server import ModelServer

WORDS = 300


class TimedModelServer(ModelServer):
    """The test endpoint, noting when each numbered word leaves it."""

    def __init__(self) -> None:
        super().__init__(responder=self.answer, chunk_delay=0.01)
        self.sent: dict[str, float] = {}

    @staticmethod
    def answer(body: dict) -> dict:
        text = " ".join(f"w{n:04d}" for n in range(WORDS))
        return {
            "id": "msg_bench",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": WORDS},
        }

    def _stream(self, http, message, step, headers) -> None:
        write = http.write_chunk

        def timed(data: bytes) -> None:
            write(data)
            now = time.monotonic()
            for word in re.findall(rb"w\d{4}", data):
                self.sent.setdefault(word.decode(), now)

        http.write_chunk = timed
        super()._stream(http, message, step, headers)


def start_web(env: dict, port: int) -> subprocess.Popen:
    web = subprocess.Popen(
        [sys.executable, "-m", "flask", "--app", "webapp", "run", "--with-threads", "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx2.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return web
        except httpx2.HTTPError:
            time.sleep(0.2)
    raise RuntimeError("the web server did not start")


def signed_in(base: str, email: str) -> httpx2.Client:
    client = httpx2.Client(base_url=base, timeout=30)
    page = client.get("/login").text
    token = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', page).group(1)
    client.post("/login", data={"email": email, "password": "demo-password", "csrf_token": token})
    return client


def measure_latency(base: str, model: TimedModelServer) -> dict:
    agent = signed_in(base, "agent@acme.test")
    page = agent.get("/conversations").text
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    created = agent.post("/conversations", data={"message": "stream please", "csrf_token": token})
    conversation_id = int(created.url.path.rsplit("/", 1)[1]) if created.url.path[-1].isdigit() else None
    if conversation_id is None:
        conversation_id = int(re.search(r"/conversations/(\d+)", created.headers.get("location", "")).group(1))
    arrived: dict[str, float] = {}
    with agent.stream("GET", f"/live/conversations/{conversation_id}", timeout=60) as stream:
        for line in stream.iter_lines():
            now = time.monotonic()
            for word in re.findall(r"w\d{4}", line):
                arrived.setdefault(word, now)
            if len(arrived) >= WORDS:
                break
    latencies = [(arrived[w] - model.sent[w]) * 1000 for w in arrived if w in model.sent]
    return stats(latencies, 1)


def open_streams(base: str, cookie: str, count: int) -> list[socket.socket]:
    host, port = urlsplit(base).hostname, urlsplit(base).port
    streams = []
    for _ in range(count):
        sock = socket.create_connection((host, port), timeout=10)
        sock.sendall(
            f"GET /live/tenant HTTP/1.1\r\nHost: {host}\r\nCookie: {cookie}\r\n"
            f"Accept: text/event-stream\r\n\r\n".encode()
        )
        if b"200" not in sock.recv(200):
            raise RuntimeError("a live stream was refused")
        streams.append(sock)
    return streams


def measure_capacity(base: str, counts: list[int]) -> list[dict]:
    reviewer = signed_in(base, "reviewer@acme.test")
    cookie = "; ".join(f"{k}={v}" for k, v in reviewer.cookies.items())
    rows, held = [], []
    try:
        for count in counts:
            held += open_streams(base, cookie, count - len(held))
            times = []
            for _ in range(20):
                started = time.perf_counter()
                assert reviewer.get("/approvals/badge").status_code == 200
                times.append((time.perf_counter() - started) * 1000)
            figures = stats(times, 1)
            rows.append(
                {
                    "open_streams": count,
                    "other_request_p50_ms": figures["p50_ms"],
                    "other_request_p95_ms": figures["p95_ms"],
                }
            )
    finally:
        for sock in held:
            sock.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", default="50,200,500", help="open live streams to try (default 50,200,500)")
    args = parser.parse_args()
    try:
        counts = sorted(int(n) for n in args.streams.split(","))
    except ValueError:
        parser.error("--streams takes comma-separated whole numbers, e.g. 50,200")
    with TimedModelServer() as model, backend("sqlite") as env:
        env = {**env, **model.env()}
        app = make_app(env)
        prepare(app)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        web = start_web(env, port)
        worker = subprocess.Popen(
            [sys.executable, "-m", "flask", "--app", "webapp", "worker"],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            latency = measure_latency(base, model)
            capacity = measure_capacity(base, counts)
        finally:
            for process in (worker, web):
                process.terminate()
                process.wait(10)
    report = {**new_report(), "delta_latency": latency, "capacity": capacity}
    del report["backends"]
    word = Table("A streamed word, model endpoint to live-stream reader (ms)", ["words", "p50", "p95", "p99"])
    word.add(latency["count"], latency["p50_ms"], latency["p95_ms"], latency["p99_ms"])
    held = Table("Open live streams on one web process, another request meanwhile (ms)", ["open streams", "p50", "p95"])
    for row in capacity:
        held.add(row["open_streams"], row["other_request_p50_ms"], row["other_request_p95_ms"])
    save("streams", report, [word, held])


if __name__ == "__main__":
    main()
