"""A small due-time scheduler on a thread pool: each key runs at most once at a time.

``work(key)`` returns the delay before the key's next run (None: do not
reschedule). ``kick(key)`` asks for a run now; a kick during a run makes the
run repeat right after it. This is the status loop of every policy: one
operator watching 1,000 policies runs a bounded number of threads, and one
slow Redis never holds up the others beyond one worker.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)
K = TypeVar("K", bound=Hashable)  # a key (the operator's: a policy's (namespace, name))


class Scheduler(Generic[K]):
    def __init__(self, work: Callable[[K], float | None], workers: int = 4,
                 clock: Callable[[], float] = time.monotonic, name: str = "status",
                 on_lag: Callable[[float], None] | None = None) -> None:
        self._work = work
        # Told how late each run starts after its due time (a metric).
        self._on_lag = on_lag
        self._clock = clock
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, K]] = []
        self._due: dict[K, float] = {}
        self._running: set[K] = set()
        self._rerun: set[K] = set()
        self._cancelled: set[K] = set()
        self._stopped = False
        self._seq = itertools.count()
        self._threads = [threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True)
                         for i in range(max(1, workers))]
        for thread in self._threads:
            thread.start()

    def schedule(self, key: K, delay: float) -> None:
        """Run ``key`` after ``delay`` seconds unless it is already due sooner."""
        with self._cond:
            if self._stopped:
                return
            self._cancelled.discard(key)
            if key in self._running:
                if delay <= 0:
                    self._rerun.add(key)
                return
            due = self._clock() + max(0.0, delay)
            if key in self._due and self._due[key] <= due:
                return
            self._due[key] = due
            heapq.heappush(self._heap, (due, next(self._seq), key))
            self._cond.notify()

    def kick(self, key: K) -> None:
        self.schedule(key, 0.0)

    def remove(self, key: K) -> None:
        with self._cond:
            self._due.pop(key, None)
            self._rerun.discard(key)
            if key in self._running:
                self._cancelled.add(key)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the workers, waiting ``timeout`` seconds in all for runs under way
        (not each: with every worker stuck on a Redis that never answers, one wait
        per worker outlasted kopf's exit timeout and the pod's grace period). A
        run still going then is left to end with the process (daemon threads)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        deadline = self._clock() + timeout
        for thread in self._threads:
            remaining = deadline - self._clock()
            if remaining <= 0:
                break
            thread.join(remaining)

    def _next(self) -> tuple[K, float] | None:
        """The next key due, and how many seconds after its due time it starts."""
        with self._cond:
            while not self._stopped:
                now = self._clock()
                while self._heap:
                    due, _, key = self._heap[0]
                    if self._due.get(key) != due:  # superseded or removed
                        heapq.heappop(self._heap)
                        continue
                    if due > now:
                        break
                    heapq.heappop(self._heap)
                    del self._due[key]
                    self._running.add(key)
                    return key, now - due
                timeout = (self._heap[0][0] - now) if self._heap else None
                self._cond.wait(timeout)
            return None

    def _loop(self) -> None:
        while True:
            picked = self._next()
            if picked is None:
                return
            key, lag = picked
            if self._on_lag is not None:
                self._on_lag(lag)
            delay: float | None
            try:
                delay = self._work(key)
            except Exception:  # noqa: BLE001 - a bug in one policy's run must not kill the worker
                log.exception("status refresh failed", extra={"policy": str(key)})
                delay = 30.0
            with self._cond:
                self._running.discard(key)
                rerun = key in self._rerun
                self._rerun.discard(key)
                cancelled = key in self._cancelled
                self._cancelled.discard(key)
            if cancelled:
                continue
            if rerun:
                self.schedule(key, 0.0)
            elif delay is not None:
                self.schedule(key, delay)
