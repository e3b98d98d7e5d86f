"""Where an HTTP endpoint listens: one rule for the sweeper's /metrics, /healthz and
/readyz and for the operator's /metrics and liveness endpoint.

``::`` (:data:`EVERY_ADDRESS`, the default of both) means every address: one IPv6
socket that takes IPv4 too (``IPV6_V6ONLY`` off, as ``python -m http.server --bind ::``
does), so the kubelet's probe reaches it whether the pod's IP is IPv4 or IPv6; on a
host without IPv6 (a container with it disabled), every IPv4 address instead. Any other
address is taken as given: ``0.0.0.0`` every IPv4 address only, ``::1`` or ``[::1]``
that IPv6 address only, ``127.0.0.1`` that one.
"""

from __future__ import annotations

import contextlib
import errno
import socket

EVERY_ADDRESS = "::"
_EVERY_IPV4_ADDRESS = "0.0.0.0"
# The refusals of an IPv6 socket on a host without IPv6: no such family, no such address.
_NO_IPV6 = (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL)


def listen_address(address: str) -> tuple[str, bool]:
    """(host to bind, is it IPv6): an address holding ':' is IPv6, with or
    without [brackets]; anything else (IPv4, a host name) binds as IPv4."""
    if address.startswith("[") and address.endswith("]"):
        address = address[1:-1]
    return address, ":" in address


def _listening(host: str, port: int, ipv6: bool, backlog: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ipv6 else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server and asyncio do
        if ipv6:
            with contextlib.suppress(AttributeError, OSError):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((host, port))
        sock.listen(backlog)
        return sock
    except BaseException:
        sock.close()
        raise


def listening_socket(address: str, port: int, backlog: int = 128) -> socket.socket:
    """A TCP socket listening on ``address`` and ``port`` (0: a free port); OSError
    when it cannot, except ``::`` on a host without IPv6, which listens on every
    IPv4 address instead."""
    host, ipv6 = listen_address(address)
    try:
        return _listening(host, port, ipv6, backlog)
    except OSError as exc:
        if host != EVERY_ADDRESS or exc.errno not in _NO_IPV6:
            raise
    return _listening(_EVERY_IPV4_ADDRESS, port, False, backlog)
