"""The sweep: bounded mark/recover/dead-letter calls over a queue's expired
``active`` prefix, and ``drain``, which loops over them (docs/scripts.md, sweep)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, cast

from stalledpolicy.engine.calls import (
    as_text,
    check_budget,
    check_positive,
    merged_problems,
    run_script,
    script_calls,
)
from stalledpolicy.engine.sizing import CallSizer
from stalledpolicy.keyspace import QueueKeys


@dataclass(frozen=True)
class Budgets:
    """Stall budgets: dead-letter on the stall that reaches the budget; 0 = never."""

    default: int
    lanes: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_budget("maxStalled", self.default)
        for lane, budget in self.lanes.items():
            if not isinstance(lane, str) or not lane:
                raise ValueError(f"lanes: lane name must be a non-empty string, got {lane!r}")
            check_budget(f"lanes[{lane}]", budget)

    def for_lane(self, lane: str | None) -> int:
        return self.lanes.get(lane, self.default) if lane else self.default


@dataclass(frozen=True)
class Holds:
    """How the sweep holds a lease in its last moments (scripts/lib/holds.lua):
    a lease due within ``lead_ms`` is kept out of EchoMQ's reapers' sight for
    ``hold_ms`` more, so the sweep counts its lapse first. ``lead_ms`` 0 holds
    nothing (leases already held are still settled)."""

    lead_ms: int = 250
    hold_ms: int = 1_000

    def __post_init__(self) -> None:
        if isinstance(self.lead_ms, bool) or not isinstance(self.lead_ms, int) or self.lead_ms < 0:
            raise ValueError(f"hold lead: must be an integer of milliseconds >= 0, got {self.lead_ms!r}")
        if isinstance(self.hold_ms, bool) or not isinstance(self.hold_ms, int) or self.hold_ms <= self.lead_ms:
            raise ValueError(f"hold: must be an integer of milliseconds above the lead ({self.lead_ms}), "
                             f"got {self.hold_ms!r}")


NO_HOLDS = Holds(lead_ms=0)


@dataclass
class LaneCounts:
    recovered: int = 0
    dead_lettered: int = 0


@dataclass
class SweepResult:
    recovered: int = 0
    dead_lettered: int = 0
    orphans: int = 0
    quarantined: int = 0
    lanes: dict[str, LaneCounts] = field(default_factory=dict)
    more: bool = False
    calls: int = 0
    #: shared keys of the wrong type met after the moves (every job is in its
    #: set; the bookkeeping named was skipped): one line each, naming the key
    problems: list[str] = field(default_factory=list)
    #: leases the calls took hold of
    held: int = 0
    #: holds a reaper ended before the sweep could count the lapse (lapses lost)
    uncounted: int = 0
    #: the last call's server time (ms), and when (server ms) the next lease is
    #: due to be held or counted (None: no lease in ``active``)
    server_now_ms: int | None = None
    next_at_ms: int | None = None
    #: the server time the calls took (µs)
    server_us: int = 0

    @property
    def moved(self) -> int:
        return self.recovered + self.dead_lettered + self.orphans + self.quarantined

    def merge(self, other: SweepResult) -> SweepResult:
        """This result and ``other``'s together, as a new result (neither changes)."""
        both = replace(self, lanes={name: LaneCounts(c.recovered, c.dead_lettered) for name, c in self.lanes.items()},
                       problems=list(self.problems))
        both.add(other)
        return both

    def add(self, other: SweepResult) -> None:
        """Count ``other`` (a later call) into this result, in place: a drain adds
        each call's result to its total without copying the total."""
        for name, counts in other.lanes.items():
            mine = self.lanes.get(name)
            if mine is None:
                self.lanes[name] = LaneCounts(counts.recovered, counts.dead_lettered)
            else:
                mine.recovered += counts.recovered
                mine.dead_lettered += counts.dead_lettered
        self.recovered += other.recovered
        self.dead_lettered += other.dead_lettered
        self.orphans += other.orphans
        self.quarantined += other.quarantined
        self.more = other.more
        self.calls += other.calls
        if other.problems:
            self.problems = merged_problems(self.problems, other.problems)
        self.held += other.held
        self.uncounted += other.uncounted
        if other.calls:
            self.server_now_ms, self.next_at_ms = other.server_now_ms, other.next_at_ms
        self.server_us += other.server_us

    def seconds_to_next(self) -> float | None:
        """Seconds from the last call to the next lease to hold or count (0 when
        work is left; None when no call was made or ``active`` is empty)."""
        if self.more:
            return 0.0
        if self.server_now_ms is None or self.next_at_ms is None:
            return None
        return max(0.0, (self.next_at_ms - self.server_now_ms) / 1000)


def lease_due_sooner(client: Any, queue: str, after: SweepResult, holds: Holds) -> bool:
    """True when ``active`` holds a lease, claimed or extended since ``after``'s
    last call, whose deadline is before that call's next event plus the hold
    lead: it must be held or counted before the pass that call planned, so the
    caller sweeps now. One ZCOUNT, O(log n), a read; False when
    ``after`` named no server time (no call was made)."""
    if after.server_now_ms is None:
        return False
    # Every lease in active after that call is due at or after its next event
    # plus the lead (held ones later still), or was due then and is left to the
    # pass that answered `more`; a later deadline below that bound is new.
    upper = "+inf" if after.next_at_ms is None else f"({after.next_at_ms + holds.lead_ms}"
    return int(client.zcount(QueueKeys(queue).active, f"({after.server_now_ms}", upper)) > 0


def sweep_call(keys: QueueKeys, limit: int, budgets: Budgets, holds: Holds = Holds()) -> tuple[list[str], list[Any]]:
    """The KEYS and ARGV of one sweep call (scripts/sweep.lua's header)."""
    key_names = [
        keys.active, keys.pending, keys.dead, keys.ring, keys.gactive, keys.glimit,
        keys.paused, keys.wake, keys.metrics_failed, keys.sweeper_totals, keys.sweeper_holds,
        keys.sweeper_hold_tokens,
    ]
    args: list[Any] = [keys.prefix, limit, budgets.default, keys.events, holds.lead_ms, holds.hold_ms]
    for lane, budget in budgets.lanes.items():
        args += [lane, budget]
    return key_names, args


def lane_counts(text: str | bytes) -> dict[str, LaneCounts]:
    """The reply's lanes (``<#group>:<group><recovered>,<dead_lettered>;`` each,
    #group in bytes) by name, decoded as the client decodes: a client that
    decodes replies (the sweeper's keeps a byte that is not UTF-8 as a lone
    surrogate) hands over text, and each name stays as it gave it; bytes are
    shown decoded, a byte that is not UTF-8 as U+FFFD, so two distinct lanes
    can end up under one name: their counts add up rather than one lane's
    replacing the other's (the totals must match the jobs moved)."""
    decoded = isinstance(text, str)
    # lengths count the script's bytes: text goes back to them (surrogateescape:
    # the bytes such a client kept undecoded)
    blob = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    lanes: dict[str, LaneCounts] = {}
    at = 0
    while at < len(blob):
        colon = blob.index(b":", at)
        start = colon + 1
        end = start + int(blob[at:colon])
        semicolon = blob.index(b";", end)
        recovered, dead_lettered = blob[end:semicolon].split(b",")
        name = blob[start:end].decode("utf-8", "surrogateescape") if decoded else as_text(blob[start:end])
        counts = lanes.setdefault(name, LaneCounts())
        counts.recovered += int(recovered)
        counts.dead_lettered += int(dead_lettered)
        at = semicolon + 1
    return lanes


class SweepCall:
    """The sweep calls of one queue and its budgets: KEYS and ARGV built once,
    each :meth:`run` sends them with its own limit (one bounded sweep call)."""

    def __init__(self, queue: str, budgets: Budgets, holds: Holds = Holds()) -> None:
        self.keys = QueueKeys(queue)
        self.key_names, self._args = sweep_call(self.keys, 1, budgets, holds)

    def args(self, limit: int) -> list[Any]:
        """ARGV of a call over at most ``limit`` expired jobs."""
        check_positive("batch size", limit)
        args = list(self._args)
        args[1] = limit
        return args

    def run(self, client: Any, limit: int) -> SweepResult:
        """One call over at most ``limit`` expired jobs (and at most ``limit``
        leases held, and as many settled)."""
        return self.result(run_script("sweep", client, self.keys, self.key_names, self.args(limit)))

    @staticmethod
    def head(reply: Any) -> tuple[int, bool, int]:
        """What decides the next call, read before the rest of the reply: the
        jobs the call moved, whether more are expired, its server time (µs)."""
        return int(reply[0]) + int(reply[1]) + int(reply[2]) + int(reply[3]), bool(reply[4]), int(reply[11])

    @staticmethod
    def result(reply: Any) -> SweepResult:
        """A call's reply, read (its layout: scripts/sweep.lua's header)."""
        (recovered, dead_lettered, orphans, quarantined, more, lanes, problems, held, uncounted, next_at, now,
         took_us) = reply
        return SweepResult(
            recovered=int(recovered),
            dead_lettered=int(dead_lettered),
            orphans=int(orphans),
            quarantined=int(quarantined),
            lanes=lane_counts(lanes) if lanes else {},
            more=bool(more),
            calls=1,
            problems=[as_text(p) for p in problems],
            held=int(held),
            uncounted=int(uncounted),
            server_now_ms=int(now),
            next_at_ms=None if int(next_at) < 0 else int(next_at),
            server_us=int(took_us),
        )


def sweep_batch(client: Any, queue: str, budgets: Budgets, limit: int, holds: Holds = Holds()) -> SweepResult:
    """One bounded sweep call over at most ``limit`` expired jobs of ``queue``
    (and at most ``limit`` leases held, and as many settled)."""
    return SweepCall(queue, budgets, holds).run(client, limit)


def drain(
    client: Any,
    queue: str,
    budgets: Budgets,
    batch_size: int | CallSizer,
    should_stop: Callable[[], bool] = lambda: False,
    on_call: Callable[[SweepResult, float], None] | None = None,
    holds: Holds = Holds(),
) -> SweepResult:
    """Bounded sweep calls until the expired prefix is empty or ``should_stop()``.

    ``batch_size``: each call's limit, or a :class:`CallSizer` that sizes each
    call by the server time the ones before took (within its cap). ``should_stop`` is
    checked between calls only: a call in flight always finishes (each call is
    atomic, so stopping never loses a job). The next call is sent as soon as the
    last one's reply says there is more, before ``on_call`` is told of the last
    one (engine.calls.ScriptCalls): a stop that ``on_call`` asks for ends the
    drain after that next call. Every call that came back is counted and told
    to ``on_call``, also when sending the next one failed.
    """
    sizer = batch_size if isinstance(batch_size, CallSizer) else None
    call = SweepCall(queue, budgets, holds)
    total = SweepResult()
    if should_stop():
        return total

    def next_args() -> list[Any]:
        return call.args(sizer.size if sizer else int(cast(int, batch_size)))

    first = next_args()
    calls = script_calls("sweep", client, call.keys, call.key_names)
    try:
        calls.send(first)
        while True:
            reply = calls.receive()
            seconds = time.perf_counter() - calls.sent_at
            # What sizes and decides the next call is read first: the next call
            # is on its way while this one's reply is read and counted.
            moved, more, took_us = call.head(reply)
            if sizer is not None:
                # Valkey freezes TIME within a script (took_us 0): the wall time then
                sizer.observe(moved, took_us / 1e6 if took_us > 0 else seconds)
            next_sent = more and not should_stop()
            failed: BaseException | None = None
            if next_sent:
                try:
                    calls.send(next_args())
                except BaseException as exc:  # noqa: BLE001 (raised below, once this call is counted)
                    failed = exc
            result = call.result(reply)
            if on_call is not None:
                on_call(result, seconds)
            total.add(result)
            if failed is not None:
                raise failed
            if not next_sent:
                return total
    finally:
        calls.close()
