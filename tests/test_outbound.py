"""The outbound address guard (webapp/outbound/): which addresses it refuses and in which words,
what OUTBOUND_ALLOW lets through, and that a connection goes only to an address it checked: a name
that answers a public address first and 127.0.0.1 next never reaches a listener on 127.0.0.1."""

from __future__ import annotations

import re
import socket

import anyio
import httpx2
import pytest

from tests.listeners import SECRET, Listener
from tests.loops import in_own_thread
from webapp import outbound

PRIVATE_SPELLINGS = [
    ("127.0.0.1", "127.0.0.1, loopback"),
    ("localhost", "localhost resolves to a loopback address"),
    ("0x7f000001", "127.0.0.1, loopback"),
    ("2130706433", "127.0.0.1, loopback"),
    ("127.1", "127.0.0.1, loopback"),
    ("10.20.30.40", "10.20.30.40, private network"),
    ("172.16.5.4", "172.16.5.4, private network"),
    ("192.168.1.10", "192.168.1.10, private network"),
    ("169.254.169.254", "169.254.169.254, link-local"),
    ("[::1]", "::1, loopback"),
    ("[::ffff:127.0.0.1]", "127.0.0.1, loopback"),
    ("[fc00::1]", "fc00::1, unique-local"),
    ("[fe80::1]", "fe80::1, link-local"),
    ("0.0.0.0", "0.0.0.0, unspecified"),
    ("224.0.0.1", "224.0.0.1, multicast"),
    ("100.64.0.1", "100.64.0.1, carrier-grade NAT"),
    ("[2002:7f00:1::]", "127.0.0.1, loopback"),  # 6to4 around 127.0.0.1
    ("[64:ff9b::a00:1]", "10.0.0.1, private network"),  # NAT64 around 10.0.0.1
]


@pytest.fixture
def lookups(monkeypatch):
    """answers[name] = [first answer, later answers...]: socket.getaddrinfo answers the name with
    each in turn (the last one from then on) and counts the lookups; other names resolve as usual."""
    real = socket.getaddrinfo
    answers: dict[str, list[str]] = {}
    asked: dict[str, int] = {}

    def getaddrinfo(host, port, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host
        if name not in answers:
            return real(host, port, *args, **kwargs)
        turn = asked.get(name, 0)
        asked[name] = turn + 1
        address = answers[name][min(turn, len(answers[name]) - 1)]
        return real(address, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers, asked


@pytest.mark.parametrize(("host", "said"), PRIVATE_SPELLINGS)
def test_every_private_spelling_is_refused_in_words(host, said):
    with pytest.raises(outbound.AddressRefused) as refused:
        outbound.check_url(f"http://{host}:5299/hooks/desk?token=abc", ())
    sentence = str(refused.value)
    assert sentence.startswith(f"The address http://{host}:5299 was refused: private address ({said}).")
    assert "The desk calls only public addresses; an operator can allow this one with OUTBOUND_ALLOW=" in sentence
    assert "token=abc" not in sentence and "/hooks" not in sentence  # the path may carry a secret


@pytest.mark.parametrize("host", ["8.8.8.8", "[2001:4860:4860::8888]", "[64:ff9b::808:808]"])
def test_a_public_address_passes(host):
    outbound.check_url(f"https://{host}/v1", ())  # a literal: nothing is looked up or connected to


def test_an_allowed_entry_lets_that_address_and_port_through_in_any_spelling_and_nothing_else():
    allow = outbound.allow_entries("127.0.0.1:5299, Mcp.Internal:*")
    for url in ("http://127.0.0.1:5299/x", "http://0x7f000001:5299/", "http://localhost:5299/", "http://127.1:5299"):
        outbound.check_url(url, allow)
    for url in ("http://127.0.0.1:5300/", "https://127.0.0.1/", "http://10.0.0.1:5299/"):
        with pytest.raises(outbound.AddressRefused):
            outbound.check_url(url, allow)


def test_an_allowed_name_lets_whatever_it_resolves_to_through_on_any_port_given_by_star(lookups):
    answers, _ = lookups
    answers["mcp.internal"] = ["10.1.2.3"]
    allow = outbound.allow_entries("mcp.internal:*")
    outbound.check_url("https://mcp.internal:8443/mcp", allow)
    with pytest.raises(outbound.AddressRefused) as refused:
        outbound.check_url("https://mcp.internal:8443/mcp", ())
    # what an internal name resolves to is the operator's to know: the sentence names the name only
    assert "private address (mcp.internal resolves to a private network address)" in str(refused.value)
    assert "10.1.2.3" not in str(refused.value) and "OUTBOUND_ALLOW=mcp.internal:8443" in str(refused.value)


@pytest.mark.parametrize(
    ("url", "said"),
    [("http://[::1/x", "cannot be called (Invalid port"), ("http://:80/x", "names no host")],
)
def test_an_address_that_does_not_parse_is_said_so(url, said):
    with pytest.raises(outbound.OutboundError, match=re.escape(said)):
        outbound.check_url(url, ())


def test_a_name_with_no_address_is_said_so_when_saved():
    with pytest.raises(outbound.UnknownHost, match=r"The address https://no-such-host.invalid could not be found"):
        outbound.check_url("https://no-such-host.invalid/hook", ())


def test_a_refused_address_is_refused_at_the_connection_too_and_the_listener_sees_nothing():
    listener = Listener("http")
    try:
        with outbound.client((), timeout=2) as client, pytest.raises(outbound.AddressRefused):
            client.get(listener.url())
        with outbound.client((listener.allowed,), timeout=2) as client:
            answered = client.get(listener.url())
        assert answered.status_code == 200 and listener.connections == 1  # allowed: it is reached
    finally:
        listener.close()


def _get_sync(url: str) -> None:
    with outbound.client((), timeout=1) as client:
        client.get(url)


def _get_async(url: str) -> None:
    async def get() -> None:
        async with outbound.async_client((), timeout=1) as client:
            await client.get(url)

    in_own_thread(anyio.run, get)


@pytest.mark.parametrize("get", [_get_sync, _get_async], ids=["sync", "async"])
def test_a_name_that_turns_to_127_0_0_1_between_the_check_and_the_connection_never_reaches_it(lookups, get):
    """The check saw a public address, the connection would have looked the name up again and found
    127.0.0.1: the guarded connection goes to the address it checked (one lookup), whatever becomes of
    that (here no route, or no answer within the second), and the listener on 127.0.0.1 sees nothing."""
    answers, asked = lookups
    answers["rebind.test"] = ["2001:4860:4860::8888", "127.0.0.1"]
    listener = Listener("http")
    try:
        with pytest.raises(httpx2.HTTPError) as failed:
            get(f"http://rebind.test:{listener.port}/")
        assert listener.connections == 0 and asked["rebind.test"] == 1
        assert SECRET not in str(failed.value)
        # and a name that answers 127.0.0.1 at the connection is refused there, whatever it said before
        with pytest.raises(outbound.AddressRefused):
            get(f"http://rebind.test:{listener.port}/")
        assert listener.connections == 0
    finally:
        listener.close()


def test_no_redirect_is_followed():
    target = Listener("http")
    redirecting = Listener("http", status=302, location=target.url("/inside"))
    try:
        with outbound.client((redirecting.allowed, target.allowed), timeout=2) as client:
            answered = client.get(redirecting.url())
        assert answered.status_code == 302 and target.connections == 0
    finally:
        target.close()
        redirecting.close()


@pytest.mark.parametrize(
    ("text", "entries"),
    [
        ("127.0.0.1:5299", ("127.0.0.1:5299",)),
        (" 127.0.0.1:5299 , [::1]:8080,Mcp.Internal.:*,", ("127.0.0.1:5299", "[::1]:8080", "mcp.internal:*")),
        ("", ()),
    ],
)
def test_outbound_allow_entries_are_read_normalised(text, entries):
    assert outbound.allow_entries(text) == entries


@pytest.mark.parametrize("text", ["nonsense", "127.0.0.1", "http://h:80", "::1:80", "[::1]", "h:0", "h:70000", "a b:1"])
def test_outbound_allow_refuses_what_is_not_host_and_port(text):
    with pytest.raises(ValueError, match=r"^entries are host:port \(or host:\* for any port\), comma-separated"):
        outbound.allow_entries(text)
