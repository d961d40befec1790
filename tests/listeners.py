"""Plain TCP listeners on 127.0.0.1 for the outbound guard's tests: each counts the connections it
accepted and does one thing with them, as the ports of a private network would (a service that is
not HTTP, one that never answers, an internal HTTP page with a secret in its body, a redirect); and
the local HTTP server the webhook tests' receivers stand on."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = "INTERNAL-ONLY: db_password=hunter2"


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that keeps the test's output free of its access log."""

    def log_message(self, *args) -> None:
        pass


class HookReceiver:
    """An HTTP server on a free port of 127.0.0.1 that a webhook test's receiver stands on: `serve`
    starts it with the receiver's handler; `close`, or the end of a `with`, stops it."""

    def serve(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hooks/desk"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on (it was free a moment ago)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def closing_all(listeners: dict[str, Listener]) -> Iterator[dict[str, Listener]]:
    """The listeners of a test, each closed when it ends."""
    try:
        yield listeners
    finally:
        for each in listeners.values():
            each.close()


class Listener:
    """Accepts connections on a free port of 127.0.0.1 and, by `behaviour`:
    - "close": closes each at once;
    - "garbage": reads, writes a line that is not HTTP (with SECRET in it) and closes;
    - "silent": holds it open and never writes;
    - "http": answers an HTTP `status` (with `location`, if given) whose body is SECRET."""

    def __init__(self, behaviour: str, status: int = 200, location: str | None = None) -> None:
        self.behaviour, self.status, self.location = behaviour, status, location
        self.connections = 0
        self.held: list[socket.socket] = []
        self.socket = socket.socket()
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(16)
        self.port = self.socket.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def allowed(self) -> str:
        """Its OUTBOUND_ALLOW entry."""
        return f"127.0.0.1:{self.port}"

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._handle, args=(connection,), daemon=True).start()

    def _handle(self, connection: socket.socket) -> None:
        if self.behaviour == "silent":
            self.held.append(connection)
            return
        with connection:
            if self.behaviour == "close":
                return
            connection.settimeout(5)
            try:
                connection.recv(65536)
                if self.behaviour == "garbage":
                    connection.sendall(f"SSH-2.0-OpenSSH_9.2 {SECRET}\r\n".encode())
                    return
                body = SECRET.encode()
                head = f"HTTP/1.1 {self.status} Whatever\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                if self.location:
                    head += f"Location: {self.location}\r\n"
                connection.sendall(head.encode() + b"Connection: close\r\n\r\n" + body)
            except OSError:
                pass

    def close(self) -> None:
        self.socket.close()
        for connection in self.held:
            connection.close()
