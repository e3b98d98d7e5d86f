"""The operator's liveness endpoint (``--liveness http://ADDRESS:PORT/PATH``).

Served from kopf's event loop, as kopf's own endpoint is, but on a socket from
:mod:`stalledpolicy.listen`, so it listens where the sweeper's server and the
operator's metrics would (docs/architecture.md, "``::`` is IPv6 only").

It answers 503 with ``{"ready": false, "reason": ...}`` until the operator's
startup has built and started the controller, then 200 with ``{}`` while kopf's
loop runs (what kopf's own endpoint answers for an operator without
``@kopf.on.probe`` handlers; kopf starts its own only once every startup handler
succeeded). Served from the first startup handler, before that: a startup that
keeps failing or hangs is a failing probe, and the kubelet restarts the pod.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from stalledpolicy.listen import listening_socket

# kopf's own defaults for a URL without them.
_DEFAULT_HOST = "localhost"
_DEFAULT_PORT = 80


def parse_endpoint(url: str) -> tuple[str, int, str]:
    """(address, port, path) of a liveness URL; ValueError saying what is wrong."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"{url!r}: give an http:// URL, e.g. http://[::]:8080/healthz")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{url!r}: the port must be a number from 0 to 65535") from None
    host = parts.hostname or _DEFAULT_HOST  # without [brackets]: '::' for http://[::]:8080/
    return host, _DEFAULT_PORT if port is None else port, parts.path or "/"


class LivenessServer:
    """``await LivenessServer(url).start()`` in kopf's loop; ``await stop()`` at cleanup."""

    def __init__(self, url: str, not_ready: Callable[[], str | None] = lambda: None) -> None:
        """``not_ready()``: why the operator is not live yet (a 503 with it), or None (200)."""
        self._not_ready = not_ready
        self.address, requested_port, self.path = parse_endpoint(url)
        self._socket = listening_socket(self.address, requested_port)  # OSError: cannot listen
        self.port = self._socket.getsockname()[1]
        self._runner: Any = None  # an aiohttp AppRunner once started (aiohttp is imported then)

    async def start(self) -> LivenessServer:
        import aiohttp.web  # deferred: only a liveness endpoint needs aiohttp

        async def healthy(_request: Any) -> Any:  # an aiohttp request and response
            reason = self._not_ready()
            if reason is not None:
                return aiohttp.web.json_response({"ready": False, "reason": reason}, status=503)
            return aiohttp.web.json_response({})

        app = aiohttp.web.Application()
        app.add_routes([aiohttp.web.get(self.path, healthy)])
        runner = aiohttp.web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        await aiohttp.web.SockSite(runner, self._socket).start()
        self._runner = runner
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()  # closes the socket too
            self._runner = None
        else:
            self._socket.close()
