"""One Redis subscription per process for every live page it serves.

A live page (server-sent events) follows one or two pub/sub channels for minutes. Given a Redis
connection each, a few hundred open pages would empty the process's pool, and then health checks,
enqueues and everyone else's pages wait or fail. Here one thread per process holds one pub/sub
connection, subscribed to the union of the channels its open pages follow, and hands each message
to the pages that follow its channel. Open pages are capped per person and per process, and a page
past a cap is told so in words.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

import redis

log = logging.getLogger(__name__)

# What a listener receives when the hub lost Redis or the listener fell too far behind: its page ends
# its stream (the browser reconnects and fetches what it missed).
INTERRUPTED = object()
IDLE_SECONDS = 60.0  # the thread and its connection end after this long with no listener
POLL_SECONDS = 0.05  # how often the thread looks at new or closed listeners while Redis is quiet
BACKLOG = 1000  # messages a listener may fall behind before it is cut off


class TooManyStreams(Exception):
    """A cap on open live pages was reached; the message says which and what to do."""


class Listener:
    """One live page's share of the hub: the messages of its channels, in order."""

    def __init__(self, hub: LiveHub, user_id: int, channels: tuple[str, ...]) -> None:
        self.hub, self.user_id, self.channels = hub, user_id, channels
        self.messages: queue.Queue = queue.Queue(BACKLOG)
        self.subscribed = threading.Event()
        self.closed = False

    def get(self, timeout: float) -> object | None:
        """The next message (bytes, or INTERRUPTED), or None after `timeout` seconds of quiet."""
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        self.hub.remove(self)


class LiveHub:
    def __init__(self, connect: Callable[[], redis.Redis], per_user: int, per_process: int) -> None:
        self._connect = connect
        self.per_user, self.per_process = per_user, per_process
        self._lock = threading.Lock()
        self._listeners: set[Listener] = set()
        self._thread: threading.Thread | None = None
        self._changed = threading.Event()

    @property
    def open_streams(self) -> int:
        return len(self._listeners)

    def listen(self, user_id: int, channels: list[str], wait_seconds: float = 5.0) -> Listener:
        """A listener of these channels, once Redis has confirmed the subscription (so nothing
        published after this returns is missed). Raises TooManyStreams, or redis.ConnectionError when
        Redis did not confirm in time."""
        listener = Listener(self, user_id, tuple(channels))
        with self._lock:
            if len(self._listeners) >= self.per_process:
                raise TooManyStreams(
                    f"This server already follows {self.per_process} live pages, its most; this page will not "
                    "update by itself. Reload it later."
                )
            if sum(1 for other in self._listeners if other.user_id == user_id) >= self.per_user:
                raise TooManyStreams(
                    f"You have {self.per_user} live pages open, the most one person may; close some tabs "
                    "and reload this one to follow it live."
                )
            self._listeners.add(listener)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="live-hub", daemon=True)
                self._thread.start()
        self._changed.set()
        deadline = time.monotonic() + wait_seconds
        while not listener.subscribed.wait(POLL_SECONDS):
            if listener.closed or time.monotonic() > deadline:  # closed: the hub lost Redis meanwhile
                self.remove(listener)
                raise redis.ConnectionError("Redis did not confirm the live subscription in time")
        return listener

    def remove(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.discard(listener)
            listener.closed = True
        self._changed.set()

    # --- the thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        pubsub = None
        subscribed: set[str] = set()  # channels asked for
        acknowledged: set[str] = set()  # of those, the ones Redis has confirmed
        idle_since = None
        while True:
            with self._lock:
                listeners = list(self._listeners)
                if listeners:
                    idle_since = None
                elif time.monotonic() - (idle_since := idle_since or time.monotonic()) > IDLE_SECONDS:
                    self._thread = None
                    _close(pubsub)
                    return
            wanted = {channel for listener in listeners for channel in listener.channels}
            try:
                if not wanted:  # nobody listens: give the connection back until someone does
                    pubsub, subscribed, acknowledged = _close(pubsub), set(), set()
                    self._changed.wait(POLL_SECONDS)
                    self._changed.clear()
                    continue
                if pubsub is None:
                    pubsub = self._connect().pubsub()
                if gone := subscribed - wanted:
                    pubsub.unsubscribe(*gone)
                    subscribed -= gone
                    acknowledged -= gone
                if new := wanted - subscribed:
                    pubsub.subscribe(*new)
                    subscribed |= new
                message = pubsub.get_message(timeout=POLL_SECONDS)
                while message is not None:
                    channel = _text(message["channel"])
                    if message["type"] == "subscribe" and channel in subscribed:
                        acknowledged.add(channel)
                    elif message["type"] == "message":
                        for listener in listeners:
                            if channel in listener.channels and not listener.closed:
                                self._hand(listener, message["data"])
                    message = pubsub.get_message(timeout=0)
                for listener in listeners:
                    if not listener.subscribed.is_set() and set(listener.channels) <= acknowledged:
                        listener.subscribed.set()
            except (redis.RedisError, OSError) as exc:
                log.warning("live updates lost Redis (%s); the open pages are told and reconnect", exc)
                self._interrupt_all()
                pubsub, subscribed, acknowledged = _close(pubsub), set(), set()
                time.sleep(POLL_SECONDS * 10)

    def _hand(self, listener: Listener, data: bytes) -> None:
        try:
            listener.messages.put_nowait(data)
        except queue.Full:  # a page that stopped reading: cut it off rather than hold everything for it
            self.remove(listener)
            _interrupt(listener)

    def _interrupt_all(self) -> None:
        with self._lock:
            listeners, self._listeners = list(self._listeners), set()
        for listener in listeners:
            listener.closed = True
            _interrupt(listener)


def _interrupt(listener: Listener) -> None:
    try:
        while True:
            listener.messages.get_nowait()
    except queue.Empty:
        listener.messages.put_nowait(INTERRUPTED)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _close(pubsub) -> None:
    if pubsub is not None:
        try:
            pubsub.close()
        except (redis.RedisError, OSError):
            pass
