from __future__ import annotations

import socket

# A Redis Cluster node also listens on its port + 10000 (the cluster bus), so
# ports above this would be refused by cluster nodes. Every caller gets one
# below it; the kernel's ephemeral range mostly is.
_MAX_PORT = 65535 - 10000


def free_port(*, with_bus: bool = False) -> int:
    """A loopback TCP port that was free a moment ago (below 55536); ``with_bus``:
    its cluster bus port (port + 10000) too."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port <= _MAX_PORT and (not with_bus or _free(port + 10000)):
            return port
    raise RuntimeError("no free loopback port below 55536 after 100 tries")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
