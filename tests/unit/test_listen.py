"""stalledpolicy.listen: where the sweeper's and the operator's HTTP endpoints listen.
Real sockets on the loopback addresses, probed over IPv4 and IPv6."""

from __future__ import annotations

import errno
import socket

import pytest

from stalledpolicy import listen


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


needs_ipv6 = pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback on this host")


def connects(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:  # refused, or no such family here
        return False


def ipv4_only(monkeypatch, refusal: int = errno.EAFNOSUPPORT) -> None:
    """As on a host without IPv6 (a container with it disabled): every IPv6 socket refused."""
    real = listen._listening

    def refuse_ipv6(host, port, ipv6, backlog):
        if ipv6:
            raise OSError(refusal, "no IPv6 here")
        return real(host, port, ipv6, backlog)

    monkeypatch.setattr(listen, "_listening", refuse_ipv6)


@needs_ipv6
def test_every_address_takes_ipv6_and_ipv4_probes():
    """The kubelet probes the pod's IP: IPv6 in an IPv6-only cluster, IPv4 elsewhere."""
    if not socket.has_dualstack_ipv6():
        pytest.skip("this host cannot take IPv4 on an IPv6 socket")
    with listen.listening_socket(listen.EVERY_ADDRESS, 0) as sock:
        port = sock.getsockname()[1]
        assert sock.family == socket.AF_INET6
        assert connects("::1", port) and connects("127.0.0.1", port)


def test_every_address_falls_back_to_every_ipv4_address_without_ipv6(monkeypatch):
    for refusal in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
        ipv4_only(monkeypatch, refusal)
        with listen.listening_socket("::", 0) as sock:
            assert sock.family == socket.AF_INET and sock.getsockname()[0] == "0.0.0.0"
            assert connects("127.0.0.1", sock.getsockname()[1])
    # one IPv6 address is not "every address": its failure stays an error
    with pytest.raises(OSError):
        listen.listening_socket("::1", 0)


@needs_ipv6
@pytest.mark.parametrize("address", ["::1", "[::1]"])
def test_an_ipv6_address_listens_there_only(address):
    with listen.listening_socket(address, 0) as sock:
        port = sock.getsockname()[1]
        assert connects("::1", port) and not connects("127.0.0.1", port)


def test_an_ipv4_address_listens_on_ipv4_only():
    with listen.listening_socket("0.0.0.0", 0) as sock:
        port = sock.getsockname()[1]
        assert sock.family == socket.AF_INET and connects("127.0.0.1", port)
        if has_ipv6_loopback():
            assert not connects("::1", port)
    with listen.listening_socket("127.0.0.1", 0) as sock:
        assert sock.getsockname()[0] == "127.0.0.1"


def test_a_port_in_use_is_an_error_even_on_every_address():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError) as refused:
            listen.listening_socket("127.0.0.1", taken.getsockname()[1])
        assert refused.value.errno == errno.EADDRINUSE


@pytest.mark.parametrize("address, expected", [
    ("::", ("::", True)), ("[::]", ("::", True)), ("[::1]", ("::1", True)),
    ("0.0.0.0", ("0.0.0.0", False)), ("localhost", ("localhost", False)),
])
def test_listen_address(address, expected):
    assert listen.listen_address(address) == expected
