"""Which addresses a webhook may reach: public ones, plus networks the settings allow explicitly.

A URL is checked by resolving its host (every address it resolves to must pass) when an endpoint
is saved and again right before each attempt, because DNS can change between the two. The worker
then connects to the address it checked, not to a second resolution.

Refused unless allowed: loopback, private (RFC 1918, ULA), link-local, the cloud metadata
services (169.254.169.254, fd00:ec2::254), CGNAT, multicast, reserved and unspecified addresses,
including IPv4 addresses written as IPv4-mapped IPv6.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[IPAddress]]

METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254"))


class UnsafeTarget(ValueError):
    """The URL cannot be used as a webhook target; the message says why."""


def refusal(address: IPAddress, allowed: Sequence[IPNetwork]) -> str | None:
    """What kind of address `address` is when it must not be contacted ("a private address"), else None."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if any(address in network for network in allowed):
        return None
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    # Most specific first: 0.0.0.0 and 169.254.0.0/16 also count as "private" to the ipaddress module.
    for kind in ("unspecified", "loopback", "link_local", "multicast", "private", "reserved"):
        if getattr(address, f"is_{kind}"):
            return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind.replace('_', '-')} address"
    if not address.is_global:
        return "not a public address"
    return None


def resolve(host: str, port: int) -> list[IPAddress]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise UnsafeTarget(f"host {host!r} does not resolve ({exc})") from exc
    # sockaddr[0] may carry an IPv6 zone ("fe80::1%eth0"): the zone is not part of the address.
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos))


def check_url(url: str, *, allowed: Sequence[IPNetwork], resolver: Resolver = resolve) -> list[IPAddress]:
    """The addresses `url` resolves to, all of them permitted; raises UnsafeTarget otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UnsafeTarget("only http and https URLs with a host can receive webhooks")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise UnsafeTarget(f"invalid port in {url!r}") from exc
    try:
        addresses = [ipaddress.ip_address(parts.hostname)]
    except ValueError:
        addresses = resolver(parts.hostname, port)
    if not addresses:
        raise UnsafeTarget(f"host {parts.hostname!r} has no address")
    for address in addresses:
        reason = refusal(address, allowed)
        if reason:
            where = (
                str(address)
                if parts.hostname.strip("[]") == str(address)
                else f"{parts.hostname} resolves to {address}"
            )
            raise UnsafeTarget(f"{where}: {reason}, which webhooks may not reach")
    return addresses
