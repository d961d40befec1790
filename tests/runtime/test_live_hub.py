"""One Redis subscription per process for its live pages: hundreds of pages share it, each hears
only its channels from the moment it is open, caps answer in words, and a lost Redis ends them."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import redis as redis_lib

from tests.conftest import own_redis_clients
from webapp.runtime.live_hub import INTERRUPTED, LiveHub, TooManyStreams
from webapp.runtime.services import services


def clients(dispatcher) -> int:
    """How many connections Redis has on this test's database (the hub's among them)."""
    return len(own_redis_clients(dispatcher.redis))


def test_hundreds_of_live_pages_share_one_connection_and_each_hears_its_own_channels(app):
    dispatcher = services().dispatcher
    hub = LiveHub(lambda: dispatcher.redis, per_user=1000, per_process=1000)
    before = clients(dispatcher)
    with ThreadPoolExecutor(50) as requests:  # pages opened at once, as a web server's threads would
        listeners = list(
            requests.map(lambda n: hub.listen(n % 7, [f"desk:test:page:{n}", "desk:test:everyone"]), range(300))
        )
    try:
        assert clients(dispatcher) <= before + 2  # one pub/sub connection (and the pool's own), not 300
        assert dispatcher.redis.ping()  # nothing else waits for a connection
        dispatcher.redis.publish("desk:test:page:42", b"for 42")
        dispatcher.redis.publish("desk:test:everyone", b"for all")
        assert listeners[42].get(timeout=5) == b"for 42"
        assert listeners[42].get(timeout=5) == b"for all"
        assert listeners[7].get(timeout=5) == b"for all"  # not 42's message
        assert listeners[7].get(timeout=0.2) is None
    finally:
        for listener in listeners:
            listener.close()
    assert hub.open_streams == 0


def test_a_page_hears_everything_published_after_it_is_open(app):
    # listen() returns once Redis confirmed the subscription: the page fetches its fragment next, and
    # a change published right after that fetch must reach it.
    dispatcher = services().dispatcher
    hub = LiveHub(lambda: dispatcher.redis, per_user=10, per_process=10)
    for n in range(20):
        listener = hub.listen(1, [f"desk:test:fresh:{n}"])
        dispatcher.redis.publish(f"desk:test:fresh:{n}", f"change {n}")
        assert listener.get(timeout=5) == f"change {n}".encode(), n
        listener.close()


def test_caps_per_person_and_per_process_answer_in_words_and_free_up_on_close(app):
    dispatcher = services().dispatcher
    hub = LiveHub(lambda: dispatcher.redis, per_user=2, per_process=3)
    first, second = hub.listen(1, ["desk:test:a"]), hub.listen(1, ["desk:test:b"])
    with pytest.raises(TooManyStreams, match="You have 2 live pages open, the most one person may; close some tabs"):
        hub.listen(1, ["desk:test:c"])
    other = hub.listen(2, ["desk:test:c"])
    with pytest.raises(TooManyStreams, match="This server already follows 3 live pages"):
        hub.listen(3, ["desk:test:d"])
    first.close()
    again = hub.listen(1, ["desk:test:a"])
    dispatcher.redis.publish("desk:test:a", "back")
    assert again.get(timeout=5) == b"back"
    for listener in (second, other, again):
        listener.close()


def test_a_page_that_stops_reading_is_cut_off_without_holding_up_the_others(app, monkeypatch):
    monkeypatch.setattr("webapp.runtime.live_hub.BACKLOG", 5)
    dispatcher = services().dispatcher
    hub = LiveHub(lambda: dispatcher.redis, per_user=10, per_process=10)
    stuck, reading = hub.listen(1, ["desk:test:flood"]), hub.listen(2, ["desk:test:calm"])
    for n in range(20):  # far more than the stuck page's backlog
        dispatcher.redis.publish("desk:test:flood", str(n))
    dispatcher.redis.publish("desk:test:calm", "still here")
    assert reading.get(timeout=5) == b"still here"  # the hub went on past the stuck page
    assert stuck.get(timeout=5) is INTERRUPTED and stuck.closed  # its page ends, the browser reconnects
    assert hub.open_streams == 1
    reading.close()


def test_when_redis_goes_away_open_pages_are_told_and_new_ones_are_refused(app):
    dispatcher = services().dispatcher
    down = redis_lib.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    hub = LiveHub(lambda: down, per_user=10, per_process=10)
    with pytest.raises(redis_lib.ConnectionError):
        hub.listen(1, ["desk:test:x"], wait_seconds=2)
    assert hub.open_streams == 0

    lost = {"redis": dispatcher.redis}
    hub = LiveHub(lambda: lost["redis"], per_user=10, per_process=10)
    listener = hub.listen(1, ["desk:test:y"])
    # Cut the hub's connection, as a Redis restart would: only subscribers on this test's database, as
    # the other test processes share the Redis server (and their live servers subscribe too).
    for client in own_redis_clients(dispatcher.redis):
        if int(client.get("sub", 0)) > 0:
            dispatcher.redis.client_kill_filter(_id=client["id"])
    lost["redis"] = down
    assert listener.get(timeout=5) is INTERRUPTED
