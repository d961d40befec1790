"""The live streams (server-sent events) as a client reads them from the real server over HTTP,
parsed as the HTML standard says a browser parses them; and many open pages at once, which share one
Redis subscription, so hundreds of them leave /healthz and everyone else's pages alone, and past the
caps a page is refused in words."""

from __future__ import annotations

import codecs
import contextlib
import html
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis as redis_lib
import requests
from sqlalchemy import select

from tests.browser.conftest import PASSWORD, LiveServer
from tests.clients import CSRF
from tests.conftest import own_redis_clients
from tests.model_server import Reply
from tests.replies import reply, text
from webapp.config import Config
from webapp.conversations.live import CHECK_SECONDS
from webapp.models import User
from webapp.runtime.live_events import LiveEvents

LINE_END = re.compile(r"\r\n|\r(?!\Z)|\n")  # a CR last in what has arrived may be the start of a CRLF


def signed_in(server_url: str, email: str) -> requests.Session:
    """A session signed in through the real /login form."""
    http = requests.Session()
    token = CSRF.search(http.get(f"{server_url}/login", timeout=10).text).group(1)
    data = {"csrf_token": token, "email": email, "password": PASSWORD}
    answer = http.post(f"{server_url}/login", data=data, allow_redirects=False, timeout=10)
    assert answer.status_code == 302, answer.text
    return http


def post_form(http: requests.Session, page: str, url: str, data: dict) -> requests.Response:
    """A form of `page` sent to `url`, with the page's CSRF token, as a browser would."""
    token = CSRF.search(http.get(page, timeout=10).text).group(1)
    return http.post(url, data={"csrf_token": token, **data}, allow_redirects=False, timeout=10)


def sse_events(response: requests.Response) -> Iterator[tuple[str, str]]:
    """(event name, data) of each event of a text/event-stream, as EventSource dispatches them: lines
    end at CRLF, LF or CR; data lines are joined with LF; a blank line dispatches. A retry field is
    yielded as ("retry", value) when it is read (the stream sends it once it listens)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    pending, name, data = "", "message", []
    for chunk in response.iter_content(chunk_size=None):
        *lines, pending = LINE_END.split(pending + decoder.decode(chunk))
        for line in lines:
            if not line:
                if data:
                    yield name, "\n".join(data)
                name, data = "message", []
                continue
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "retry":
                yield "retry", value
            elif field == "event":
                name = value
            elif field == "data":
                data.append(value)


def open_stream(http: requests.Session, url: str) -> tuple[requests.Response, Iterator[tuple[str, str]]]:
    """The stream at `url`, once it listens (its first line, the retry interval, comes after it subscribed)."""
    response = http.get(url, stream=True, timeout=(10, 30), headers={"Accept": "text/event-stream"})
    assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(response)
    assert next(events) == ("retry", "3000")
    return response, events


# CRLF, LF and lone CRs, each followed by what would be an event's fields if it started a line.
FORGED = (
    "Refund issued.\r\nevent: tool_start\r\ndata: x\r\n\r\n"
    "Next\revent: tool_start\rdata: x\r\rlines\n\nevent: changed\n\nEnd."
)


def test_model_text_with_line_breaks_reaches_the_page_as_text_never_as_events(live_server, workers, model):
    """A CR in the model's words used to end an SSE line: the text after it was read as fields,
    and a forged tool_start ("calling x…") reached the page."""
    model.enqueue(Reply.message(reply(text(FORGED))))
    agent = signed_in(live_server.url, "agent@acme.test")
    conversations = f"{live_server.url}/conversations"
    started = post_form(agent, conversations, conversations, {"message": "Refund order 4471"})
    conversation_id = int(started.headers["Location"].rstrip("/").rsplit("/", 1)[1])
    response, events = open_stream(agent, f"{live_server.url}/live/conversations/{conversation_id}")
    workers()  # the answer streams only now that the page listens
    seen, words = [], ""
    for name, data in events:
        seen.append(name)
        if name == "text":
            words += html.unescape(data)  # what the page's text becomes once htmx puts the HTML in
        elif name == "changed" and "text" in seen:  # the answer is in: the page reloads the transcript
            break
    response.close()
    assert {name for name in seen if name != "changed"} == {"text"}  # text events only, no forged one
    assert words == FORGED


def ends_within(events: Iterator[tuple[str, str]], seconds: float) -> bool:
    """Whether the stream ends (the server closes it) within `seconds`, whatever it sends meanwhile."""
    ended = threading.Event()

    def read() -> None:
        with contextlib.suppress(Exception):  # the test closed the stream under it: not an end
            for _ in events:
                pass
            ended.set()

    threading.Thread(target=read, daemon=True).start()
    return ended.wait(seconds)


@pytest.mark.parametrize(
    "change, form",
    [("disable", {}), ("password", {"password": "a-new-password-2026"})],
)
def test_an_open_stream_ends_within_seconds_once_its_person_may_no_longer_sign_in(live_server, engine, change, form):
    """Disabling a person or resetting their password ends their sessions; their open pages' live
    streams used to go on delivering the tenant's events for up to five minutes."""
    agent, reviewer = signed_in(live_server.url, "agent@acme.test"), signed_in(live_server.url, "reviewer@acme.test")
    agents_stream, agents_events = open_stream(agent, f"{live_server.url}/live/tenant")
    reviewers_stream, reviewers_events = open_stream(reviewer, f"{live_server.url}/live/tenant")
    admin = signed_in(live_server.url, "admin@acme.test")
    users = f"{live_server.url}/admin/users"
    with engine.connect() as connection:
        agent_id = connection.scalar(select(User.id).where(User.email == "agent@acme.test"))
    answer = post_form(admin, users, f"{users}/{agent_id}/{change}", form)
    assert answer.status_code in (200, 302, 303), answer.text
    try:
        assert ends_within(agents_events, 8), "the stream still delivers 8 s after its person lost their sessions"
        assert not ends_within(reviewers_events, 1)  # everyone else's goes on
        assert agent.get(f"{live_server.url}/live/tenant", allow_redirects=False).status_code == 302  # to sign in
    finally:
        agents_stream.close()
        reviewers_stream.close()
        post_form(admin, users, f"{users}/{agent_id}/password", {"password": PASSWORD})  # as seeded, for later tests


def test_a_stream_goes_on_delivering_past_its_sign_in_checks(live_server, engine, env):
    """The check runs outside any request: it once needed the request's session, failed at its first
    run, and every page's stream stopped delivering after 3 s (the export card's live progress)."""
    reviewer = signed_in(live_server.url, "reviewer@acme.test")
    stream, events = open_stream(reviewer, f"{live_server.url}/live/tenant")
    with engine.connect() as connection:
        tenant_id = connection.scalar(select(User.tenant_id).where(User.email == "reviewer@acme.test"))
    heard = threading.Event()

    def listen() -> None:
        with contextlib.suppress(Exception):
            for name, _ in events:
                if name == "approvals-changed":
                    heard.set()
                    return

    threading.Thread(target=listen, daemon=True).start()
    try:
        time.sleep(2 * CHECK_SECONDS + 1)  # past two checks
        LiveEvents(Config.from_env(env)).changed(tenant_id)
        assert heard.wait(10), "the stream stopped delivering once its sign-in check ran"
    finally:
        stream.close()


# --- many open pages ------------------------------------------------------------------------------


def first_line(http: requests.Session, server_url: str) -> requests.Response:
    """An open live page: the tenant's stream, read as far as its first line (a refusal is not)."""
    answer = http.get(f"{server_url}/live/tenant", stream=True, timeout=10)
    if answer.status_code == 200:
        assert next(answer.iter_lines()) == b"retry: 3000"
    return answer


def subscribers(redis) -> int:
    """How many connections on this test's Redis database are subscribed to something (other test
    processes share the server, each on a database of its own)."""
    return sum(1 for client in own_redis_clients(redis) if int(client.get("sub", 0)) > 0)


def test_hundreds_of_open_streams_share_one_subscription_and_health_stays_green(env, clean, zygote, tmp_path):
    """Each stream used to hold a Redis connection of its own: a hundred open pages emptied the pool,
    and /healthz answered 503."""
    server = LiveServer({**env, "LIVE_STREAMS_PER_USER": "300"}, tmp_path / "server.log", zygote)
    redis = redis_lib.Redis.from_url(env["REDIS_URL"])
    try:
        server.wait_until_up()
        reviewer = signed_in(server.url, "reviewer@acme.test")
        before = subscribers(redis)
        with ThreadPoolExecutor(40) as pages:
            open_pages = list(pages.map(lambda _: first_line(reviewer, server.url), range(200)))
        try:
            assert [page.status_code for page in open_pages] == [200] * 200
            assert subscribers(redis) <= before + 1  # one connection for them all, not one per page
            assert requests.get(f"{server.url}/healthz", timeout=10).status_code == 200
            other = signed_in(server.url, "agent@acme.test")
            assert first_line(other, server.url).status_code == 200  # someone else's page still opens
        finally:
            for page in open_pages:
                page.close()
    finally:
        server.stop()


def test_past_the_cap_a_page_is_refused_in_words_and_others_still_open_theirs(env, clean, zygote, tmp_path):
    server = LiveServer({**env, "LIVE_STREAMS_PER_USER": "2"}, tmp_path / "server.log", zygote)
    try:
        server.wait_until_up()
        agent = signed_in(server.url, "agent@acme.test")
        open_pages = [first_line(agent, server.url), first_line(agent, server.url)]
        refused = first_line(agent, server.url)
        assert refused.status_code == 429
        assert "You have 2 live pages open, the most one person may; close some tabs" in refused.text
        open_pages.append(first_line(signed_in(server.url, "reviewer@acme.test"), server.url))  # per person
        assert [page.status_code for page in open_pages] == [200, 200, 200]
        for page in open_pages:
            page.close()
    finally:
        server.stop()
