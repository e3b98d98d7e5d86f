"""What the triggers ask of ``sync``: an ``ApplyRequest`` per reason, pending per policy
key until the policy's next sync applies them (docs/architecture.md, the trigger table).

A trigger never applies: it adds a request and enqueues the key. A request of a
``kind`` replaces the pending one of that kind (the newest event wins, and one
drift revert is counted once). A request sync could not apply (``RetryLater``) is
put back and waits for the key's backoff; a new trigger's request is due at once.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stalledpolicy.controller.status import ReconcileOutcome


@dataclass(frozen=True)
class ApplyRequest:
    why: str
    kind: str | None = None  # one pending request per kind and key (None: no replacing)
    body: Mapping[str, Any] | None = None  # the policy to apply; None: the newest body seen
    # the policy generation this request is for: nothing to do once it is applied (kopf's handlers)
    generation: int | None = None
    resume: bool = False  # an operator start (kopf's resume handler): reconcile's ``resume``
    # Run by sync before the apply: the body to apply,
    # or None when the request has nothing left to do (it may raise RetryLater).
    check: Callable[[], Mapping[str, Any] | None] | None = None
    # Run by sync after a successful apply, with its outcome.
    done: Callable[[ReconcileOutcome | None], None] | None = None
    quiet: bool = False  # logged by its trigger already (or not worth a line)
    # Set once a sync has taken the request (applied, failed or found nothing to do),
    # or it was replaced or dropped: what kopf's handlers wait for (back-pressure).
    taken: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)


class PendingApplies:
    """The pending requests of each key, and whether a new trigger's is among them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[Hashable, list[ApplyRequest]] = {}
        self._fresh: set[Hashable] = set()  # keys with a request no apply has failed yet

    def add(self, key: Hashable, request: ApplyRequest, *, fresh: bool = True) -> None:
        with self._lock:
            pending = self._requests.setdefault(key, [])
            if request.kind is not None:
                for index, old in enumerate(pending):
                    if old.kind == request.kind:
                        if old.resume and not request.resume:
                            request = dataclasses.replace(request, resume=True, taken=request.taken)
                        del pending[index]
                        old.taken.set()
                        break
            pending.append(request)
            if fresh:
                self._fresh.add(key)

    def put_back(self, key: Hashable, requests: list[ApplyRequest]) -> None:
        """Requests an apply failed on: pending again, behind any newer of their kind."""
        with self._lock:
            pending = self._requests.setdefault(key, [])
            kinds = {r.kind for r in pending if r.kind is not None}
            pending[:0] = [r for r in requests if r.kind is None or r.kind not in kinds]

    def take(self, key: Hashable) -> list[ApplyRequest]:
        with self._lock:
            self._fresh.discard(key)
            return self._requests.pop(key, [])

    def pending(self, key: Hashable) -> bool:
        with self._lock:
            return bool(self._requests.get(key))

    def fresh(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._fresh

    def release_all(self) -> None:
        """Let every handler waiting on a pending request go (the operator stops)."""
        with self._lock:
            for requests in self._requests.values():
                for request in requests:
                    request.taken.set()

    def forget(self, key: Hashable) -> None:
        with self._lock:
            for request in self._requests.pop(key, []):
                request.taken.set()
            self._fresh.discard(key)
