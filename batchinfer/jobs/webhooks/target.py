"""Where a webhook may go: an http(s) URL with no spaces or control characters, to public addresses only
unless BATCHINFER_WEBHOOK_ALLOW_PRIVATE is set. Checked when the URL is given (its form, and an IP literal in
any notation: 127.0.0.1, 0x7f000001, 2130706433, 0177.0.0.1, [::1]) and again at send time on every address
its name resolves to; the POST then connects to an address that was checked (webhook_http.py), so a DNS
answer cannot change between the check and the connection."""
from __future__ import annotations

import ipaddress
import socket
from urllib.parse import SplitResult, urlsplit

from batchinfer.errors import InvalidRequest
from batchinfer.jobs.user_text import has_control

MAX_URL = 2048
_LOCAL_NAMES = ("localhost", ".localhost", ".local", ".internal")
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class UnsafeTarget(ValueError):
    """The receiver's address is loopback, private, link-local, multicast or reserved."""


def check_url(url: str, allow_private: bool = False) -> str:
    """The URL if a webhook may be sent to it, else InvalidRequest naming the problem."""
    shown = url[:100].encode("unicode_escape").decode()
    if len(url) > MAX_URL or not url.isascii() or has_control(url) or any(c.isspace() for c in url):
        raise InvalidRequest(f"invalid webhook URL {shown!r}: at most {MAX_URL} characters, with no spaces or "
                             "control characters")
    parts = _split(url)
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest(f"invalid webhook URL {shown!r}: use an http:// or https:// URL with a host")
    if not allow_private and _names_inside(parts.hostname):
        raise InvalidRequest(f"invalid webhook URL {shown!r}: its host is not a public address "
                             "(BATCHINFER_WEBHOOK_ALLOW_PRIVATE allows it)")
    return url


def _split(url: str) -> SplitResult | None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError:
        return None
    return parts


def _names_inside(host: str) -> bool:
    """True for a local name or an IP literal that is not public (without resolving anything)."""
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(_LOCAL_NAMES):
        return True
    literal = _literal(host)
    return literal is not None and not is_public(literal)


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:  # the forms inet_aton takes, as the resolver does: hex, octal, decimal, short (127.1)
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def is_public(ip: IPAddress) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast
                                 or ip.is_reserved or ip.is_unspecified)


def resolve(host: str, port: int, allow_private: bool = False) -> list[str]:
    """Every address `host` resolves to (OSError when it does not), or UnsafeTarget if one of them is inside."""
    addresses = list(dict.fromkeys(str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)))
    if not allow_private:
        inside = [a for a in addresses if not is_public(ipaddress.ip_address(a.split("%", 1)[0]))]
        if inside:
            raise UnsafeTarget(f"the receiver's host resolves to a non-public address ({inside[0]})")
    return addresses
