"""Making a thread meet a policy's lock at a chosen moment, with no timing in the
verdict: the thread runs until it ends or has to wait for the lock, whichever
comes first, however slow the machine."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class WatchedLock:
    """A policy's (re-entrant) lock that tells when a thread has to wait for it."""

    def __init__(self, lock) -> None:
        self.lock = lock
        self.waiting = threading.Event()

    def __enter__(self):
        if not self.lock.acquire(blocking=False):
            self.waiting.set()
            self.lock.acquire()
        return self

    def __exit__(self, *exc) -> bool:
        self.lock.release()
        return False


def run_until_done_or_blocked(target: Callable[[], object], lock: WatchedLock,
                              timeout: float = 30.0) -> threading.Thread:
    """``target`` on a thread of its own, returned once it has ended or waits for
    ``lock`` (held by the caller: it goes on when the caller lets the lock go)."""
    lock.waiting.clear()
    thread = threading.Thread(target=target)
    thread.start()
    deadline = time.monotonic() + timeout
    while thread.is_alive() and not lock.waiting.is_set():
        assert time.monotonic() < deadline, "the thread neither ended nor came to the lock"
        thread.join(0.005)
    return thread
