"""The guarded transports: httpx2 clients whose every connection goes to an address checked by the rule,
resolved once, and whose peer is checked again once connected; no redirects, no proxy."""

from __future__ import annotations

import functools
import socket
import ssl
import time
from collections.abc import Iterable, Iterator
from typing import Any

import anyio
import anyio.to_thread
import httpcore2
import httpx2

from webapp.outbound.addresses import allowance, check_peer, checked_addresses


def _resolved(host: str, port: int, allowed) -> list:
    """The addresses of host:port that the rule allows; a name that does not resolve is httpcore2's
    ConnectError."""
    try:
        return checked_addresses(host, port, allowed)
    except socket.gaierror as exc:
        raise httpcore2.ConnectError(str(exc)) from None


def _tries(addresses: list, timeout: float | None) -> Iterator[tuple[str, float | None]]:
    """Each address to connect to, as a literal (the socket library does not look the name up again),
    with what is left of the timeout when its turn comes."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for _family, sockaddr in addresses:
        yield str(sockaddr[0]), None if deadline is None else max(0.001, deadline - time.monotonic())


class GuardedBackend(httpcore2.SyncBackend):
    """httpcore2's network backend, connecting only to checked addresses."""

    def __init__(self, allow: Iterable[str]) -> None:
        self.allowance = allowance(tuple(allow))

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.NetworkStream:
        addresses = _resolved(host, port, self.allowance)
        failure: Exception = httpcore2.ConnectError("no address to connect to")
        for address, left in _tries(addresses, timeout):
            try:
                stream = super().connect_tcp(address, port, left, local_address, socket_options)
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                failure = exc
                continue
            try:
                check_peer(stream, host, port, self.allowance)
            except BaseException:
                stream.close()
                raise
            return stream
        raise failure


class AsyncGuardedBackend(httpcore2.AnyIOBackend):
    """The async twin of GuardedBackend (anyio: asyncio or trio)."""

    def __init__(self, allow: Iterable[str]) -> None:
        self.allowance = allowance(tuple(allow))

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        addresses = await anyio.to_thread.run_sync(_resolved, host, port, self.allowance)
        failure: Exception = httpcore2.ConnectError("no address to connect to")
        for address, left in _tries(addresses, timeout):
            try:
                stream = await super().connect_tcp(address, port, left, local_address, socket_options)
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                failure = exc
                continue
            try:
                check_peer(stream, host, port, self.allowance)
            except BaseException:
                await stream.aclose()
                raise
            return stream
        raise failure

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore2.AsyncNetworkStream:
        raise httpcore2.ConnectError("the desk calls no Unix socket on a tenant's behalf")


_LIMITS = httpx2.Limits(max_connections=100, max_keepalive_connections=20)  # httpx2's own defaults


@functools.cache
def _tls() -> ssl.SSLContext:
    """One verifying TLS context per process (as httpx2 makes by default), shared by the transports."""
    return httpx2.create_ssl_context()


def _pool_options(limits: httpx2.Limits) -> dict[str, Any]:
    """What both transports' pools are built with besides their backend: the shared TLS context and
    httpx2's limits."""
    return {
        "ssl_context": _tls(),
        "max_connections": limits.max_connections,
        "max_keepalive_connections": limits.max_keepalive_connections,
        "keepalive_expiry": limits.keepalive_expiry,
    }


class GuardedTransport(httpx2.HTTPTransport):
    """httpx2's transport on a connection pool whose every connection goes through GuardedBackend,
    never through a proxy. TLS keeps the URL's host name for SNI and certificate checks (httpcore2
    hands it to start_tls apart from the address connected to)."""

    def __init__(self, allow: Iterable[str], limits: httpx2.Limits = _LIMITS) -> None:
        # HTTPTransport.__init__ would build its pool on httpcore2's own backend (or a proxy); its
        # methods use nothing but self._pool, so the pool is built here instead.
        self._pool = httpcore2.ConnectionPool(**_pool_options(limits), network_backend=GuardedBackend(allow))


class AsyncGuardedTransport(httpx2.AsyncHTTPTransport):
    """The async twin of GuardedTransport."""

    def __init__(self, allow: Iterable[str], limits: httpx2.Limits = _LIMITS) -> None:
        self._pool = httpcore2.AsyncConnectionPool(**_pool_options(limits), network_backend=AsyncGuardedBackend(allow))


def client(allow: Iterable[str], **options: Any) -> httpx2.Client:
    """An httpx2 client that calls only checked addresses and follows no redirect. `options` are
    httpx2.Client's (timeout, headers); a transport, proxy or redirects cannot be given."""
    return httpx2.Client(transport=GuardedTransport(allow), follow_redirects=False, trust_env=False, **options)


def async_client(allow: Iterable[str], **options: Any) -> httpx2.AsyncClient:
    """The async twin of `client`."""
    return httpx2.AsyncClient(
        transport=AsyncGuardedTransport(allow), follow_redirects=False, trust_env=False, **options
    )
