"""Open live pages against the real server: they share one Redis subscription, so hundreds of them
leave /healthz and everyone else's pages alone, and past the caps a page is refused in words."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import redis as redis_lib
import requests

from tests.browser.conftest import PASSWORD, LiveServer
from tests.clients import CSRF


def signed_in(server: LiveServer, email: str) -> requests.Session:
    person = requests.Session()
    page = person.get(f"{server.url}/login", timeout=10).text
    token = CSRF.search(page).group(1)
    answer = person.post(
        f"{server.url}/login", data={"csrf_token": token, "email": email, "password": PASSWORD}, timeout=10
    )
    assert answer.ok and "/login" not in answer.url, answer.text[:500]
    return person


def stream(person: requests.Session, server: LiveServer) -> requests.Response:
    """An open live page: the tenant's stream, read as far as its first line."""
    answer = person.get(f"{server.url}/live/tenant", stream=True, timeout=10)
    if answer.status_code == 200:
        assert next(answer.iter_lines()) == b"retry: 3000"
    return answer


def test_hundreds_of_open_streams_share_one_subscription_and_health_stays_green(env, clean, tmp_path):
    server = LiveServer({**env, "LIVE_STREAMS_PER_USER": "300"}, tmp_path / "server.log")
    redis = redis_lib.Redis.from_url(env["REDIS_URL"])
    try:
        server.wait_until_up()
        reviewer = signed_in(server, "reviewer@acme.test")
        with ThreadPoolExecutor(40) as pages:
            open_pages = list(pages.map(lambda _: stream(reviewer, server), range(200)))
        try:
            assert [page.status_code for page in open_pages] == [200] * 200
            tenants = [channel for channel in redis.pubsub_channels() if b":tenant:" in channel]
            assert dict(redis.pubsub_numsub(*tenants)) == {tenants[0]: 1}  # one subscription, not one per page
            assert requests.get(f"{server.url}/healthz", timeout=10).status_code == 200
            other = signed_in(server, "agent@acme.test")
            assert stream(other, server).status_code == 200  # someone else's page still opens
        finally:
            for page in open_pages:
                page.close()
    finally:
        server.stop()


def test_past_the_cap_a_page_is_refused_in_words_and_others_still_open_theirs(env, clean, tmp_path):
    server = LiveServer({**env, "LIVE_STREAMS_PER_USER": "2"}, tmp_path / "server.log")
    try:
        server.wait_until_up()
        agent = signed_in(server, "agent@acme.test")
        open_pages = [stream(agent, server), stream(agent, server)]
        refused = stream(agent, server)
        assert refused.status_code == 429
        assert "You have 2 live pages open, the most one person may; close some tabs" in refused.text
        open_pages.append(stream(signed_in(server, "reviewer@acme.test"), server))  # the cap is per person
        assert [page.status_code for page in open_pages] == [200, 200, 200]
        for page in open_pages:
            page.close()
    finally:
        server.stop()
