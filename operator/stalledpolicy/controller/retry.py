"""The one retry policy of the operator (docs/architecture.md, "One retry policy").

An apply gives up for good until the spec changes (``InvalidPolicy``) or for now
(``RetryLater``, its ``reason`` naming the first delay). ``Retries`` counts a key's
failures in a row: the next try waits ``backoff(failures - 1, first, max_backoff)``;
a success resets it. Its users: ``sync``'s applies, and the status refresh while
the queue cannot be read (its first delay the status interval).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable

from stalledpolicy.controller import events
from stalledpolicy.controller.config import backoff

# The first delay by the reason of the failure; each retry after it doubles, up to max_backoff.
FIRST_RETRY = {
    events.NAME_CONFLICT: 5.0,  # someone else's Deployment: a person fixes it
    events.OLD_SWEEPER_DELETING: 1.0,  # the garbage collector is quick (its deletion also enqueues the key)
}
DEFAULT_FIRST_RETRY = 5.0  # ApplyFailed, an unreadable policy, a refused image not scaled down yet


class InvalidPolicy(Exception):
    """A spec the operator can never run: nothing is retried until the policy changes."""


class RetryLater(Exception):
    """A state that may fix itself: recorded as the policy's condition; ``sync`` tries again."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason  # the condition reason recorded (NameConflict, ApplyFailed, ...)

    @property
    def first_delay(self) -> float:
        return FIRST_RETRY.get(self.reason or "", DEFAULT_FIRST_RETRY)


class Retries:
    """Per key: the failures in a row and when the next try is due."""

    def __init__(self, max_backoff: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._max_backoff = max_backoff
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: dict[Hashable, tuple[int, float]] = {}  # key -> (failures, due)

    def failed(self, key: Hashable, first_delay: float) -> float:
        """Count a failure of ``key``; the delay before its next try."""
        with self._lock:
            failures = self._failures.get(key, (0, 0.0))[0] + 1
            delay = backoff(failures - 1, first_delay, self._max_backoff)
            self._failures[key] = (failures, self._clock() + delay)
            return delay

    def succeeded(self, key: Hashable) -> None:
        with self._lock:
            self._failures.pop(key, None)

    forget = succeeded

    def failures(self, key: Hashable) -> int:
        with self._lock:
            return self._failures.get(key, (0, 0.0))[0]

    def wait(self, key: Hashable) -> float:
        """Seconds until ``key``'s retry is due (0: due, or no failure)."""
        with self._lock:
            entry = self._failures.get(key)
        return 0.0 if entry is None else max(0.0, entry[1] - self._clock())
