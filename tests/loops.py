"""Running an event loop from a test: in a thread of its own, since a browser test earlier in the same
test process leaves Playwright's (session-wide) event loop running in the main thread, where
asyncio.run and anyio.run refuse to start another."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor


def in_own_thread(function, *args):
    """function(*args) (e.g. anyio.run, work) in a fresh thread; what it returns, or what it raises."""
    with ThreadPoolExecutor(1) as own:
        return own.submit(function, *args).result()
