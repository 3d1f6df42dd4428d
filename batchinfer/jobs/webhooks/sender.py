"""One webhook POST over http.client (which follows no redirects), connected to an address that
webhook_target.resolve has checked; TLS still verifies the certificate for the URL's host name."""
from __future__ import annotations

import http.client
import socket
import ssl
from urllib.parse import urlsplit

from batchinfer.jobs.webhooks.target import resolve


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, timeout: float, address: str):
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, timeout: float, address: str):
        self.tls = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=self.tls)
        self.address = address

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self.tls.wrap_socket(sock, server_hostname=self.host)


def post(url: str, body: bytes, headers: dict[str, str], timeout: float, allow_private: bool) -> int:
    """The receiver's HTTP status. Raises UnsafeTarget for an address inside, OSError, http.client's errors
    or ValueError when no answer came."""
    parts = urlsplit(url)
    https = parts.scheme == "https"
    host, port = parts.hostname or "", parts.port or (443 if https else 80)
    address = resolve(host, port, allow_private)[0]
    conn = (_PinnedHTTPS if https else _PinnedHTTP)(host, port, timeout, address)
    try:
        conn.request("POST", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), body=body,
                     headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()
