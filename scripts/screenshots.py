"""Screenshots of the main pages for docs/pages.md, from seeded demo data.

    .venv/bin/python scripts/screenshots.py [docs/screenshots]

Everything runs in a temporary INSTANCE_PATH (its own SQLite file and embedded Redis), so the
checkout's demo database is left alone: migrate, seed the demo tenants, start a worker and the web
server, then drive Debian's Chromium (/usr/bin/chromium) through Playwright as the demo people:
the agent asks for refunds, an email and a lookup; a reviewer approves one; then each page is shot
at 1400x900 and at 390x844 (a phone): home, the inbox, a conversation, the decision page, the
dashboard. The PNGs are what the window shows (not the whole page), so they stay small.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import Page, expect, sync_playwright

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
PASSWORD = "demo-password"
SIZES = {"wide": {"width": 1400, "height": 900}, "phone": {"width": 390, "height": 844}}
REQUESTS = (
    "Refund $75 on invoice 4471, the delivery was late",
    'Email customer 4471 saying "Your refund is on its way"',
    "Close the account of customer 4470",
    "Refund $60 on invoice 4471 because the parcel arrived damaged and the customer wrote twice",
    "Show invoices for customer 4471",
)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="desk-shots-") as instance:
        env = {**os.environ, "INSTANCE_PATH": instance, "FLASK_APP": "webapp", "EXTRA_TOOLS": "demo.billing:TOOLS"}
        for name in ("DATABASE_URL", "REDIS_URL"):
            env.pop(name, None)  # the temporary instance's own SQLite file and embedded Redis
        flask = [sys.executable, "-m", "flask", "--app", "webapp"]
        for command in (["db", "upgrade"], ["desk", "redis", "start"], ["seed-demo"]):
            subprocess.run(flask + command, cwd=ROOT, env=env, check=True, capture_output=True)
        port = _free_port()
        log = open(Path(instance) / "processes.log", "wb")  # noqa: SIM115 - closed below
        commands = (["worker"], ["run", "--port", str(port), "--with-threads", "--no-reload"])
        processes = [subprocess.Popen(flask + c, cwd=ROOT, env=env, stdout=log, stderr=log) for c in commands]
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_for(url + "/healthz")
            _shoot(url, out)
        except Exception:
            log.flush()
            print((Path(instance) / "processes.log").read_text(errors="replace")[-4000:], file=sys.stderr)
            raise
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(30)  # a worker finishes the job in hand first
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)
            log.close()
            subprocess.run(flask + ["desk", "redis", "stop"], cwd=ROOT, env=env, capture_output=True)
    for path in sorted(out.glob("*.png")):
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}  {path.stat().st_size // 1024} KiB")


def _shoot(url: str, out: Path) -> None:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--headless=new", "--no-sandbox"])

        def signed_in(email: str, size: str) -> Page:
            phone = size == "phone"
            context = browser.new_context(
                base_url=url, viewport=SIZES[size], has_touch=phone, is_mobile=phone, timezone_id="Europe/Berlin"
            )
            context.set_default_timeout(30_000)
            page = context.new_page()
            page.goto("/login")
            page.get_by_label("Email").fill(email)
            page.get_by_label("Password").fill(PASSWORD)
            page.get_by_role("button", name="Sign in").click()
            expect(page).to_have_url(re.compile(r"/$"))
            return page

        agent = signed_in("agent@acme.test", "wide")
        conversations = []
        for request in REQUESTS:
            agent.goto("/conversations")
            agent.get_by_label("Ask the assistant").fill(request)
            agent.get_by_role("button", name="Start conversation").click()
            expect(agent).to_have_url(re.compile(r"/conversations/\d+$"))
            conversations.append(agent.url)
            _settled(agent)
        reviewer = signed_in("reviewer@acme.test", "wide")
        reviewer.goto("/approvals")
        reviewer.locator("#approval-list a").first.click()
        expect(reviewer.locator("#approve-button")).to_be_visible()
        reviewer.wait_for_load_state("load")
        reviewer.keyboard.press("a")
        expect(reviewer.locator("#approve-confirm")).to_be_visible()  # $75.00 is above the $50.00 rule
        reviewer.keyboard.press("a")
        expect(reviewer).to_have_url(re.compile(r"/approvals/\d+$|/approvals$"))
        time.sleep(3)  # the approved refund runs and the assistant answers

        for size in SIZES:
            shots = {
                "home": ("reviewer@acme.test", "/"),
                "inbox": ("reviewer@acme.test", "/approvals"),
                "conversation": ("agent@acme.test", conversations[0]),
                "decision": ("reviewer@acme.test", None),
                "dashboard": ("auditor@acme.test", "/audit/dashboard"),
            }
            pages: dict[str, Page] = {}
            for name, (email, path) in shots.items():
                page = pages.get(email) or signed_in(email, size)
                pages[email] = page
                if path is None:
                    page.goto("/approvals")
                    page.locator("#approval-list a").first.click()
                    expect(page.locator("#decision-panel")).to_be_visible()
                else:
                    page.goto(path)
                page.wait_for_load_state("load")
                page.wait_for_function("Array.from(document.images).every(image => image.complete)")
                time.sleep(0.5)
                page.screenshot(path=out / f"{name}-{size}.png")
        browser.close()


def _settled(page: Page, timeout: float = 60.0) -> None:
    """Reload the chat page until the assistant has stopped moving (waiting, done or failed)."""
    deadline = time.monotonic() + timeout
    while page.locator("#conversation").get_attribute("data-status") in ("queued", "running"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{page.url} still moving after {timeout} s")
        time.sleep(1)
        page.reload()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for(url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "screenshots")
