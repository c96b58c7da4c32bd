"""Which client a request comes from: its network address, as the edge of the site saw it.

Directly, that is the connection's peer. Behind nginx the peer is nginx, which passes the address
it saw in ``X-Forwarded-For`` (and ``X-Real-IP``). Those headers are believed only from a peer in
``CHATSITE_TRUSTED_PROXIES``; anyone else could write any address there. Through a chain of
trusted proxies the client is the right-most address that is not one of them.

Limits per address (new sessions, streams at once, nginx's zones) key on this value.
"""

import functools
import ipaddress
from collections.abc import Sequence
from typing import Any

from django.http import HttpRequest

from assistant import conf

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: The address of a request whose peer is unknown (a test client, a Unix socket).
UNKNOWN = "unknown"


@functools.lru_cache(maxsize=8)
def _networks(trusted: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(item, strict=False) for item in trusted)


def _trusted(address: str, networks: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in networks)


def _normal(address: str) -> str | None:
    """``address`` in one canonical spelling (IPv4-mapped IPv6 as IPv4), None if it is none."""
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


def client_address(peer: str | None, forwarded_for: str | None, real_ip: str | None) -> str:
    """The client's address from the connection's ``peer`` and the proxy headers it sent."""
    trusted = tuple(conf.settings.CHATSITE_CLIENTS["TRUSTED_PROXIES"])
    return _client_address(peer, forwarded_for, real_ip, trusted)


@functools.lru_cache(maxsize=4096)
def _client_address(
    peer: str | None, forwarded_for: str | None, real_ip: str | None, trusted: tuple[str, ...]
) -> str:
    """``client_address``, remembered: the same few proxies and clients ask again and again."""
    address = _normal(peer or "")
    if address is None:
        return UNKNOWN
    networks = _networks(trusted)
    if not _trusted(address, networks):
        return address
    if forwarded_for:
        hops = [hop for hop in forwarded_for.split(",") if hop.strip()]
    elif real_ip:
        hops = [real_ip]
    else:
        return address
    # Right to left: each trusted hop vouches for the one before it. An entry that is no
    # address ends the walk at the proxy that wrote it.
    for hop in reversed(hops):
        found = _normal(hop)
        if found is None:
            return address
        address = found
        if not _trusted(address, networks):
            return address
    return address


def scope_client(scope: Any) -> str:
    """``client_address`` of an ASGI connection scope."""
    client = scope.get("client") or (None, None)
    forwarded_for = real_ip = None
    for key, value in scope.get("headers", ()):
        if key == b"x-forwarded-for":  # several headers read as one list, in order
            hop = value.decode("latin-1")
            forwarded_for = hop if forwarded_for is None else f"{forwarded_for},{hop}"
        elif key == b"x-real-ip":
            real_ip = value.decode("latin-1")
    return client_address(client[0], forwarded_for, real_ip)


def request_client(request: HttpRequest) -> str:
    """``client_address`` of a Django request (ASGI or WSGI)."""
    meta = request.META
    return client_address(
        meta.get("REMOTE_ADDR"), meta.get("HTTP_X_FORWARDED_FOR"), meta.get("HTTP_X_REAL_IP")
    )
