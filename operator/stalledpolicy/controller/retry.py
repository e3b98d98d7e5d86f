"""How a reconcile gives up: for good until the spec changes (``InvalidPolicy``,
kopf's permanent error), or for now with a growing delay (``RetryLater``), and
the first delay of each kind of wait."""

from __future__ import annotations

NAME_CONFLICT_FIRST_RETRY = 5.0
OLD_SWEEPER_FIRST_RETRY = 1.0
APPLY_FAILED_FIRST_RETRY = 5.0


class InvalidPolicy(Exception):
    pass


class RetryLater(Exception):
    def __init__(self, message: str, delay: float, reason: str | None = None) -> None:
        super().__init__(message)
        self.delay = delay
        self.reason = reason  # the condition reason recorded (NameConflict, ApplyFailed, ...)
