"""Browser tests: the real app served over HTTP by a threaded server, driven by Debian's Chromium
through Playwright.

Playwright never downloads a browser here: it launches /usr/bin/chromium (bin/setup installs it as
root). Without it the tests are skipped, except under CI, where it must be there.
"""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Page, expect, sync_playwright

from tests.conftest import Zygote, free_port, process_alive

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LAPTOP = {"width": 1400, "height": 900}  # the screen people tried the pages on
TIMEOUT_MS = 20_000  # a shared two-core machine runs the server, a worker, the database and Chromium
PASSWORD = "demo-password"
CSP_VIOLATION = re.compile(r"Content Security Policy|Refused", re.IGNORECASE)
# Chromium asks for /favicon.ico on its own; the app has no icon (yet), and no page asked for one.
NOT_A_PAGE_ERROR = re.compile(r"^error \S+/favicon\.ico: Failed to load resource")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test item, so fixtures can tell at teardown that it failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def _failed(request: pytest.FixtureRequest) -> bool:
    return any(getattr(getattr(request.node, f"report_{when}", None), "failed", False) for when in ("setup", "call"))


# --- the app over HTTP ----------------------------------------------------------------------------


class LiveServer:
    """The app served with one thread per request (so an open server-sent-event stream does not hold
    up other requests), as `flask --app webapp run --with-threads` serves it: forked from the session's
    zygote, which paid for the app's imports once."""

    def __init__(self, env: dict[str, str], log_path: Path, zygote: Zygote) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.pid = zygote.fork(log_path, env, port=self.port)

    def wait_until_up(self, timeout: float = 60.0) -> None:
        """Poll GET /healthz until it answers 200; fail with the server's log otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            if not process_alive(self.pid):
                pytest.fail(f"the live server exited:\n{self.output()}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the live server did not answer /healthz within {timeout}s:\n{self.output()}")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it is still there after 10 s."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not process_alive(self.pid):
                return
            os.killpg(self.pid, sig)
            deadline = time.monotonic() + 10
            while process_alive(self.pid) and time.monotonic() < deadline:
                time.sleep(0.05)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture
def live_server(env, clean, zygote, tmp_path) -> Iterator[LiveServer]:
    """The real app on 127.0.0.1 over HTTP, on the test database, Redis and model server; `.url`.

    Per test, like `env` (whose model server is per test) and `clean`."""
    server = LiveServer(env, tmp_path / "live-server.log", zygote)
    try:
        server.wait_until_up()
        yield server
    finally:
        server.stop()
        print(f"--- {server.log_path.name} ---\n{server.output()[-6000:]}")  # shown when a test fails


# --- the browser ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's Chromium: skipped without it, but under CI (which installs it as root) a failure."""
    if not os.access(CHROMIUM, os.X_OK):
        message = f"{CHROMIUM} is missing: run bin/setup as root (it installs Debian's chromium)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser tests, but {message}", pytrace=False)
        pytest.skip(f"browser tests need Chromium; {message}")
    return CHROMIUM


@pytest.fixture(scope="session")
def browser(chromium) -> Iterator[Browser]:
    """One headless Chromium for the session; launch() gives it a fresh temporary profile."""
    expect.set_options(timeout=TIMEOUT_MS)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@dataclass
class ConsoleLog:
    """What the pages of one test wrote to the browser console (messages, page errors, CSP reports)."""

    entries: list[str] = field(default_factory=list)

    def record(self, page: Page) -> None:
        page.on("console", lambda message: self._add(page, message))
        page.on("pageerror", lambda error: self.entries.append(f"pageerror {page.url}: {error}"))

    def _add(self, page: Page, message: ConsoleMessage) -> None:
        source = message.location.get("url") or page.url
        self.entries.append(f"{message.type} {source}: {message.text}")

    def errors(self) -> list[str]:
        return [
            entry
            for entry in self.entries
            if entry.startswith(("error ", "pageerror ")) and not NOT_A_PAGE_ERROR.match(entry)
        ]

    def csp_violations(self) -> list[str]:
        return [entry for entry in self.errors() if CSP_VIOLATION.search(entry)]

    def clear(self) -> None:
        self.entries.clear()


@pytest.fixture
def console() -> Iterator[ConsoleLog]:
    """The console of every page the test opens. A CSP violation fails any browser test at teardown
    (a test that provokes one on purpose clears the log after checking it)."""
    log = ConsoleLog()
    yield log
    violations = log.csp_violations()
    if violations:
        pytest.fail("Content Security Policy violations in the browser:\n" + "\n".join(violations), pytrace=False)


@pytest.fixture
def new_page(browser, live_server, console, request, tmp_path) -> Iterator[Callable[[], Page]]:
    """new_page(**context options): a page in a NEW browser context (its own cookies), signed out, on
    the live server (`viewport=LAPTOP`, say).

    If the test fails, every open page is saved as a screenshot under tmp_path."""
    contexts: list[BrowserContext] = []

    def open_page(**options) -> Page:
        context = browser.new_context(base_url=live_server.url, **options)
        context.set_default_timeout(TIMEOUT_MS)
        contexts.append(context)
        page = context.new_page()
        console.record(page)
        return page

    yield open_page
    if _failed(request):
        for number, context in enumerate(contexts):
            for index, page in enumerate(context.pages):
                path = tmp_path / f"page-{number}-{index}.png"
                try:
                    page.screenshot(path=path, full_page=True)
                    print(f"screenshot of {page.url}: {path}")
                except Exception as exc:  # a crashed page must not hide the test's own failure
                    print(f"no screenshot of {page.url}: {exc}")
        if console.entries:
            print("--- browser console ---\n" + "\n".join(console.entries))
    for context in contexts:
        context.close()


@pytest.fixture
def page_for(new_page) -> Callable[[str], Page]:
    """page_for(email, **context options): a new browser context signed in through the real /login form
    as that demo user; returns its page, on the home page."""

    def sign_in(email: str, **options) -> Page:
        page = new_page(**options)
        page.goto("/login")
        page.get_by_label("Email").fill(email)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        expect(page).to_have_url(re.compile(r"/$"))
        page.wait_for_load_state()  # deferred scripts (htmx) have run
        return page

    return sign_in
