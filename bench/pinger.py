"""A second client that PINGs while a recovery runs.

It lives in its own process with its own connection, so what it sees is what
any other application sharing the Redis server would see. Each sample is one
round trip (a PONG or a BUSY error). A BUSY reply is retried; the time until a
PONG finally arrives after the first BUSY is kept as ``longest_without_pong``.

``interval_s``: the next PING goes out that long after the last one was sent
(or at once, when its reply took longer); 0 (the default): a tight loop, which
keeps a core of this 2-core machine busy.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import asdict, dataclass


@dataclass
class PingStats:
    samples: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    busy_errors: int
    longest_without_pong_ms: float

    def as_dict(self) -> dict:
        return asdict(self)


def _percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, int(round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


def _loop(port: int, started, stop, results, nice: int, interval_s: float) -> None:
    import os

    import redis

    if nice:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=None)
    client.ping()
    latencies: list[float] = []
    busy = 0
    busy_since: float | None = None
    longest_without_pong = 0.0
    clock = time.perf_counter
    started.set()
    while not stop.is_set():
        t0 = clock()
        try:
            client.ping()
        except redis.ResponseError as exc:
            if not str(exc).startswith("BUSY"):
                raise
            busy += 1
            if busy_since is None:
                busy_since = t0
            latencies.append(clock() - t0)
            continue
        t1 = clock()
        latencies.append(t1 - t0)
        if busy_since is not None:
            longest_without_pong = max(longest_without_pong, t1 - busy_since)
            busy_since = None
        if interval_s and t1 - t0 < interval_s:
            time.sleep(interval_s - (t1 - t0))
    if busy_since is not None:
        longest_without_pong = max(longest_without_pong, clock() - busy_since)
    latencies.sort()
    results.put(PingStats(
        samples=len(latencies),
        p50_ms=_percentile(latencies, 0.50) * 1000,
        p99_ms=_percentile(latencies, 0.99) * 1000,
        max_ms=(latencies[-1] if latencies else float("nan")) * 1000,
        busy_errors=busy,
        longest_without_pong_ms=longest_without_pong * 1000,
    ).as_dict())


class Pinger:
    """``with Pinger(port) as p: ...`` then ``p.stats``."""

    def __init__(self, port: int, nice: int = 0, interval_s: float = 0.0) -> None:
        ctx = mp.get_context("fork")
        self._started = ctx.Event()
        self._stop = ctx.Event()
        self._results = ctx.Queue()
        self._process = ctx.Process(target=_loop, daemon=True,
                                    args=(port, self._started, self._stop, self._results, nice, interval_s))
        self.stats: PingStats | None = None

    def __enter__(self) -> Pinger:
        self._process.start()
        if not self._started.wait(30):
            raise RuntimeError("pinger did not start")
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        # A PING stuck behind a long script returns when the script ends, so
        # the child always reaches the stop check.
        self.stats = PingStats(**self._results.get(timeout=600))
        self._process.join(30)
