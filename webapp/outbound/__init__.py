"""The outbound address guard: every URL the desk calls on a tenant's behalf (a webhook, an MCP
server, a registered model endpoint) reaches only public addresses, unless the operator allows an
exception with OUTBOUND_ALLOW.

Two checks, one rule:
- `check_url` when an address is saved (a form, the command line), so a person hears of a refusal
  at once;
- the guarded transports (`client`, `async_client`, `transport`) at every connection: the host is
  resolved once, every address it resolves to is checked, the connection goes to a checked address
  itself (no second lookup between the check and the connect, so a name that answers a public
  address to the check and 127.0.0.1 to the connect gets nowhere), and the peer of the connected
  socket is checked again. Clients never follow redirects and never use a proxy from the
  environment (a proxy would connect on our behalf, past the guard).

The rule (`refused_kind`): an IPv4 address embedded in an IPv6 one (IPv4-mapped, IPv4-compatible,
6to4, NAT64) is judged as that IPv4 address; then anything not globally routable is refused:
loopback, private, link-local, unique-local, carrier-grade NAT (shared), multicast, reserved and
unspecified. Numeric spellings (0x7f000001, 2130706433, 127.1) resolve to the address they spell,
so checking what a name resolves to catches them.

What people read: a refusal says "refused: private address" and how an operator allows it; every
failure to get an HTTP answer (a closed port, a filtered one, a server that speaks something else,
a TLS failure) says the same words (`no_answer`), and nothing the peer sent is ever repeated, so the
desk cannot be used to tell one port of the operator's network from another.

No Flask, RQ or Redis here; the layer sits below config (which checks OUTBOUND_ALLOW at boot).
"""

from webapp.outbound.addresses import (
    ANY_PORT,
    TRANSPORT_FAILURES,
    VARIABLE,
    AddressRefused,
    Allowance,
    IPAddress,
    OutboundError,
    UnknownHost,
    allow_entries,
    allowance,
    check_peer,
    check_url,
    checked_addresses,
    embedded_ipv4,
    no_answer,
    refusal_behind,
    refused_kind,
)
from webapp.outbound.transports import (
    AsyncGuardedBackend,
    AsyncGuardedTransport,
    GuardedBackend,
    GuardedTransport,
    async_client,
    client,
)

__all__ = [
    "IPAddress",
    "VARIABLE",
    "ANY_PORT",
    "OutboundError",
    "AddressRefused",
    "UnknownHost",
    "refusal_behind",
    "TRANSPORT_FAILURES",
    "no_answer",
    "embedded_ipv4",
    "refused_kind",
    "allow_entries",
    "Allowance",
    "allowance",
    "checked_addresses",
    "check_url",
    "check_peer",
    "GuardedBackend",
    "AsyncGuardedBackend",
    "GuardedTransport",
    "AsyncGuardedTransport",
    "client",
    "async_client",
]
