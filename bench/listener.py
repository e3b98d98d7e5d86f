"""A subscriber of a queue's events channel for the benchmarks: ``redis-cli
SUBSCRIBE`` (a C client, so its own CPU use stays small), its output in a file.

    with EventListener(port, channel) as listener:
        ...  # the drain
        listener.wait_for(n)  # every event heard, or RuntimeError
    listener.heard

The sweep sends no event when no one can receive it (scripts/lib/listeners.lua):
with a listener the benchmark measures the drain of a queue someone watches.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import redis

# redis-cli, not on a terminal, prints each item of a reply on its own line:
# "message", the channel, the payload (one line: the events are JSON)
LINES_PER_MESSAGE = 3


class EventListener:
    def __init__(self, port: int, channel: str) -> None:
        self.port, self.channel = port, channel
        self._out = tempfile.NamedTemporaryFile(prefix="bench-events-", suffix=".txt", delete=False)
        self._process: subprocess.Popen | None = None
        self.heard = 0

    def __enter__(self) -> EventListener:
        self._process = subprocess.Popen(["redis-cli", "-p", str(self.port), "SUBSCRIBE", self.channel],
                                         stdout=self._out, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        try:
            deadline = time.monotonic() + 30
            while client.pubsub_numsub(self.channel)[0][1] == 0:
                if time.monotonic() > deadline or self._process.poll() is not None:
                    raise RuntimeError(f"redis-cli never subscribed to {self.channel}")
                time.sleep(0.01)
        finally:
            client.close()
        return self

    def _messages(self) -> int:
        lines = Path(self._out.name).read_bytes().count(b"\n")
        return max(0, lines // LINES_PER_MESSAGE - 1)  # less the subscription's confirmation

    def wait_for(self, expected: int, timeout: float = 120.0) -> None:
        """Until ``expected`` messages were heard (a slow listener drains its
        backlog after the drain); RuntimeError at the timeout."""
        deadline = time.monotonic() + timeout
        while (heard := self._messages()) < expected:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the listener heard {heard:,} of {expected:,} events")
            time.sleep(0.05)
        self.heard = heard

    def __exit__(self, *exc) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(30)
        self._out.close()
        Path(self._out.name).unlink(missing_ok=True)
