"""TCP servers that are not Redis, for the errors a wrong URL meets: each
answers whatever it is sent with one fixed reply, then closes the connection."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def answering(reply: bytes) -> Iterator[int]:
    """A loopback port whose server answers every connection's first bytes with ``reply``."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                conn.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
