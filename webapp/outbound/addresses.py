"""The rule: which addresses the desk may call on a tenant's behalf (public ones, and the operator's
OUTBOUND_ALLOW exceptions), what a refusal says to people, and a destination checked before it is saved."""

from __future__ import annotations

import functools
import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import httpcore2
import httpx2

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
VARIABLE = "OUTBOUND_ALLOW"
ANY_PORT = "*"
_DEFAULT_PORTS = {"http": 80, "https": 443}
_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*$")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
# Ranges Python 3.11's is_global still calls global although no public server lives there.
_ALSO_NOT_PUBLIC = (
    ipaddress.ip_network("192.0.0.0/24"),  # IETF protocol assignments
    ipaddress.ip_network("fec0::/10"),  # IPv6 site-local (deprecated, still routed inside some networks)
    ipaddress.ip_network("64:ff9b:1::/48"),  # local-use NAT64
)


class OutboundError(ValueError):
    """An address the desk will not (or cannot) call; str() is the sentence for people."""


class AddressRefused(OutboundError):
    """The address is not public and OUTBOUND_ALLOW does not name it."""

    def __init__(self, where: str, host: str, port: int, address: IPAddress, kind: str) -> None:
        self.where, self.host, self.port, self.address, self.kind = where, host, port, address, kind
        spelled_as_number = _numeric_host(host) is not None
        # The address itself is named only when the person typed it (in some spelling): what an
        # internal name resolves to is the operator's to know, not a tenant's.
        detail = f"{address}, {kind}" if spelled_as_number else f"{host} resolves to a {kind} address"
        allow = f"{_bracketed(str(address))}:{port}" if spelled_as_number else f"{host}:{port}"
        super().__init__(
            f"The address {where} was refused: private address ({detail}). The desk calls only public "
            f"addresses; an operator can allow this one with {VARIABLE}={allow}."
        )

    def audit_data(self) -> dict:
        """What the audit log keeps of a refusal: never the path of the URL (it may carry a token)."""
        return {"host": self.host, "port": self.port, "refused": self.kind}


class UnknownHost(OutboundError):
    """The name resolves to no address (checked when an address is saved)."""

    def __init__(self, where: str, host: str) -> None:
        self.where, self.host = where, host
        super().__init__(
            f"The address {where} could not be found: the name {host} has no address. Check it for a typo "
            "(or try again if the name is new)."
        )


def refusal_behind(exc: BaseException | None) -> AddressRefused | None:
    """The AddressRefused an error was raised from (a ChannelError, McpError or EndpointError says
    its sentence), for the audit of a refused attempt; None when it was something else."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, AddressRefused):
            return exc
        exc, seen = exc.__cause__, seen + 1
    return None


# What a failure to get an HTTP answer raises, from the socket up (closed, filtered, not HTTP, TLS,
# timed out): every one of them is said with `no_answer`. Anything else is a fault of the desk's own.
TRANSPORT_FAILURES = (
    httpx2.TransportError,
    httpcore2.NetworkError,
    httpcore2.TimeoutException,
    httpcore2.ProtocolError,
    TimeoutError,
    OSError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)


def no_answer(seconds: float) -> str:
    """The words for every failure to get an HTTP answer, whatever it was: a closed port, a filtered
    one, a server that speaks something else, a broken TLS handshake. Identical for all, and never
    anything the peer sent, so an answer tells one port of a network from no other."""
    return f"no HTTP answer within {seconds:g} second{'' if seconds == 1 else 's'}"


def embedded_ipv4(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 address carries (IPv4-mapped, IPv4-compatible, 6to4, NAT64), else
    the address itself: ::ffff:127.0.0.1 is judged as 127.0.0.1."""
    if isinstance(address, ipaddress.IPv4Address):
        return address
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64 or (address in _IPV4_COMPATIBLE and int(address) > 1):  # :: and ::1 are themselves
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def refused_kind(address: IPAddress) -> str | None:
    """Why the desk will not call this address, in a word or two ("loopback"); None when it is a
    public address."""
    address = embedded_ipv4(address)
    checks = (
        (address.is_unspecified, "unspecified"),
        (address.is_loopback, "loopback"),
        (address.is_link_local, "link-local"),
        (address.is_multicast, "multicast"),
        (address in ipaddress.ip_network("100.64.0.0/10"), "carrier-grade NAT"),
        (address in ipaddress.ip_network("fc00::/7"), "unique-local"),
        (address.is_private, "private network"),
        (address.is_reserved, "reserved"),
        (not address.is_global or any(address in network for network in _ALSO_NOT_PUBLIC), "non-public"),
    )
    return next((kind for refused, kind in checks if refused), None)


def allow_entries(text: str) -> tuple[str, ...]:
    """OUTBOUND_ALLOW's entries, each normalised to host:port or host:* (an IPv6 address in
    brackets). ValueError finishes the sentence that begins with the variable's name."""
    entries = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        parsed = _entry(entry)
        if parsed is None:
            raise ValueError(
                "entries are host:port (or host:* for any port), comma-separated, an IPv6 address in brackets, "
                f"e.g. {VARIABLE}=127.0.0.1:5299,mcp.internal:443; got {entry!r}"
            )
        host, port = parsed
        entries.append(f"{_bracketed(host)}:{port}")
    return tuple(dict.fromkeys(entries))


def _entry(entry: str) -> tuple[str, str] | None:
    if entry.startswith("["):
        host, bracket, rest = entry[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            return None
        port = rest[1:]
        try:
            host = str(ipaddress.IPv6Address(host))
        except ValueError:
            return None
    else:
        host, colon, port = entry.rpartition(":")
        host = host.lower().rstrip(".")
        if not colon or ":" in host:
            return None
        try:
            host = str(ipaddress.IPv4Address(host))
        except ValueError:
            if not _NAME.match(host):
                return None
    if port != ANY_PORT and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        return None
    return host, port if port == ANY_PORT else str(int(port))


@dataclass(frozen=True)
class Allowance:
    """OUTBOUND_ALLOW read for matching: an entry names a host as a URL writes it (lowercased) or an
    address the host resolves to, with a port or any port."""

    names: frozenset[tuple[str, str]]
    addresses: frozenset[tuple[IPAddress, str]]

    def allows_name(self, host: str, port: int) -> bool:
        host = host.lower().rstrip(".")
        return (host, str(port)) in self.names or (host, ANY_PORT) in self.names

    def allows_address(self, address: IPAddress, port: int) -> bool:
        address = embedded_ipv4(address)
        return (address, str(port)) in self.addresses or (address, ANY_PORT) in self.addresses


@functools.lru_cache(maxsize=64)
def allowance(entries: tuple[str, ...]) -> Allowance:
    """The Allowance of normalised entries (Config.outbound_allow)."""
    names, addresses = set(), set()
    for entry in entries:
        host, _, port = entry.rpartition(":")
        try:
            addresses.add((embedded_ipv4(ipaddress.ip_address(host.strip("[]"))), port))
        except ValueError:
            names.add((host, port))
    return Allowance(frozenset(names), frozenset(addresses))


def _numeric_host(host: str) -> IPAddress | None:
    """The address a host spells as a number (127.0.0.1, ::1, 0x7f000001, 2130706433, 127.1), if it does."""
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))  # the C library's spellings, as getaddrinfo reads them
    except (OSError, UnicodeError, ValueError):
        return None


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def checked_addresses(host: str, port: int, allow: Allowance, where: str | None = None) -> list[tuple]:
    """The socket addresses (getaddrinfo's family and sockaddr) the host resolves to, every one
    checked: AddressRefused when any of them is refused and OUTBOUND_ALLOW names neither the host nor
    that address. socket.gaierror when the name has no address."""
    where = where or f"{_bracketed(host)}:{port}"
    found = []
    for family, _type, _proto, _name, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        if (family, sockaddr) in found:
            continue
        found.append((family, sockaddr))
    if not allow.allows_name(host, port):
        for _family, sockaddr in found:
            _check_address(sockaddr, host, port, allow, where)
    return found


def _check_address(sockaddr: tuple, host: str, port: int, allow: Allowance, where: str) -> None:
    address = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
    kind = refused_kind(address)
    if kind is not None and not allow.allows_address(address, port):
        raise AddressRefused(where, host, port, embedded_ipv4(address), kind)


def check_url(url: str, allow: Iterable[str]) -> None:
    """Check an http(s) URL when it is saved: AddressRefused when the desk would refuse to call it,
    UnknownHost when its name has no address. The same rule holds again at every connection."""
    try:
        parsed = httpx2.URL(url)
    except httpx2.InvalidURL as exc:
        raise OutboundError(f"The address {url!r} cannot be called ({exc}); check it.") from None
    scheme, host = parsed.scheme, parsed.raw_host.decode("ascii")
    if not host:
        raise OutboundError(f"The address {url!r} names no host; give one like https://hooks.example.com/desk.")
    port = parsed.port or _DEFAULT_PORTS.get(scheme, 80)
    where = f"{scheme}://{_bracketed(host)}" + (f":{parsed.port}" if parsed.port else "")
    try:
        checked_addresses(host, port, allowance(tuple(allow)), where)
    except (socket.gaierror, UnicodeError):
        raise UnknownHost(where, host) from None


def check_peer(stream: Any, host: str, port: int, allow: Allowance) -> None:
    """The address the socket is connected to, checked again (it is the one checked before the
    connect; a proxy or a changed resolver would show here)."""
    peer = stream.get_extra_info("server_addr")
    if peer is None:
        raise httpcore2.ConnectError("the connected socket has no peer address")
    if not allow.allows_name(host, port):
        _check_address(peer, host, port, allow, f"{_bracketed(host)}:{port}")
