"""How many jobs the next sweep call may take: sized by time, within batchSize.

A call is atomic, so Redis serves no other client while it runs. A fixed count
is either slow on a mass stall (small) or long per call (large). The sizer
aims each call at ``target_s`` of Redis server time (the script measures its
own; on Valkey, whose script clock stands still, the call's wall time, which
bounds it), learning the cost of a job from the calls before, and never exceeds
the user's ``batchSize`` (``cap``) nor goes below ``floor``.

The cost of a job is the median of the last ``WINDOW`` calls' (their time over
their jobs): on a shared host one call now and then is stretched by the
scheduler, not by its size, and shrinking the next call for it only slowed the
drain (docs/architecture.md, "Sizing a call"); two slow calls in a row do
shrink the next one.
"""

from __future__ import annotations

from collections import deque
from statistics import median

#: the server time a full call aims at
CALL_TARGET_S = 0.001
#: calls are never sized below this many jobs (or the cap, when smaller)
CALL_FLOOR = 25
#: a call grows at most this many times over the one before
GROWTH = 2
#: the calls whose median cost of a job sizes the next call
WINDOW = 3


class CallSizer:
    """``size`` is the limit of the next call; ``observe`` takes what a call did."""

    def __init__(self, cap: int, *, target_s: float = CALL_TARGET_S, floor: int = CALL_FLOOR) -> None:
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ValueError(f"batch size: must be a whole number >= 1, got {cap!r}")
        if not target_s > 0:
            raise ValueError(f"call target: must be > 0 seconds, got {target_s!r}")
        self.cap = cap
        self.target_s = target_s
        self.floor = max(1, min(floor, cap))
        self.size = self.floor
        self._costs: deque[float] = deque(maxlen=WINDOW)

    def observe(self, taken: int, seconds: float) -> None:
        """A call of limit ``size`` took ``taken`` jobs in ``seconds`` of server time."""
        if taken <= 0 or seconds <= 0:
            return
        if taken < self.size and seconds <= self.target_s:
            return  # the work ran out before the limit: nothing learnt about a larger call
        self._costs.append(seconds / taken)
        ideal = self.target_s / median(self._costs)
        self.size = max(self.floor, min(self.cap, int(ideal), GROWTH * self.size))

    def __repr__(self) -> str:
        return f"CallSizer(size={self.size}, cap={self.cap}, target_s={self.target_s})"
