"""The engine: Python calls over our Lua scripts (semantics in docs/scripts.md).

Every function takes a redis-py ``Redis`` or ``RedisCluster`` client with either
``decode_responses`` setting; every key name comes from :class:`QueueKeys`.
Each script call is bounded; the functions that may touch many jobs loop over
bounded calls so Redis is never blocked for long.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from stalledpolicy.keyspace import QueueKeys
from stalledpolicy.lua import script

#: ids per morgue script call (replay, purge, list pages, stats scans)
MORGUE_BATCH = 500


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _int(value: Any) -> int | None:
    value = _text(value)
    if value is None or value is False:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _check_budget(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}: budget must be an integer >= 0 (0 = never dead-letter), got {value!r}")
    return value


def _check_positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
    return value


# --------------------------------------------------------------------------- sweep


@dataclass(frozen=True)
class Budgets:
    """Stall budgets: dead-letter on the stall that reaches the budget; 0 = never."""

    default: int
    lanes: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_budget("maxStalled", self.default)
        for lane, budget in self.lanes.items():
            if not isinstance(lane, str) or not lane:
                raise ValueError(f"lanes: lane name must be a non-empty string, got {lane!r}")
            _check_budget(f"lanes[{lane}]", budget)

    def for_lane(self, lane: str | None) -> int:
        return self.lanes.get(lane, self.default) if lane else self.default


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

    @property
    def moved(self) -> int:
        return self.recovered + self.dead_lettered + self.orphans + self.quarantined

    def merge(self, other: "SweepResult") -> "SweepResult":
        lanes = {name: LaneCounts(c.recovered, c.dead_lettered) for name, c in self.lanes.items()}
        for name, counts in other.lanes.items():
            mine = lanes.setdefault(name, LaneCounts())
            mine.recovered += counts.recovered
            mine.dead_lettered += counts.dead_lettered
        return SweepResult(
            recovered=self.recovered + other.recovered,
            dead_lettered=self.dead_lettered + other.dead_lettered,
            orphans=self.orphans + other.orphans,
            quarantined=self.quarantined + other.quarantined,
            lanes=lanes,
            more=other.more,
            calls=self.calls + other.calls,
        )


def _sweep_keys(keys: QueueKeys) -> list[str]:
    return [
        keys.active, keys.pending, keys.dead, keys.ring, keys.gactive, keys.glimit,
        keys.paused, keys.wake, keys.metrics_failed, keys.sweeper_totals,
    ]


def sweep_batch(client: Any, queue: str, budgets: Budgets, limit: int) -> SweepResult:
    """One bounded sweep call over at most ``limit`` expired jobs of ``queue``."""
    _check_positive("batch size", limit)
    keys = QueueKeys(queue)
    args: list[Any] = [keys.prefix, limit, budgets.default, keys.events]
    for lane, budget in budgets.lanes.items():
        args += [lane, budget]
    reply = script("sweep")(client, _sweep_keys(keys), args)
    recovered, dead_lettered, orphans, quarantined, more, flat_lanes = reply
    lanes = {
        _text(flat_lanes[i]): LaneCounts(int(flat_lanes[i + 1]), int(flat_lanes[i + 2]))
        for i in range(0, len(flat_lanes), 3)
    }
    return SweepResult(
        recovered=int(recovered),
        dead_lettered=int(dead_lettered),
        orphans=int(orphans),
        quarantined=int(quarantined),
        lanes=lanes,
        more=bool(more),
        calls=1,
    )


def drain(
    client: Any,
    queue: str,
    budgets: Budgets,
    batch_size: int,
    should_stop: Callable[[], bool] = lambda: False,
    on_call: Callable[[SweepResult, float], None] | None = None,
) -> SweepResult:
    """Bounded sweep calls until the expired prefix is empty or ``should_stop()``.

    ``should_stop`` is checked between calls only: a call in flight always
    finishes (each call is atomic, so stopping never loses a job).
    """
    total = SweepResult()
    while not should_stop():
        started = time.perf_counter()
        result = sweep_batch(client, queue, budgets, batch_size)
        if on_call is not None:
            on_call(result, time.perf_counter() - started)
        total = total.merge(result)
        if not result.more:
            break
    return total


# --------------------------------------------------------------------------- snapshot


@dataclass
class LaneSnapshot:
    name: str
    pending: int
    recovered_total: int
    dead_lettered_total: int


@dataclass
class QueueSnapshot:
    dead: int
    pending: int
    active: int
    recovered_total: int
    dead_lettered_total: int
    orphans_total: int
    quarantined_total: int
    lanes: list[LaneSnapshot]


def queue_snapshot(client: Any, queue: str, lanes: Iterable[str] = ()) -> QueueSnapshot:
    """Sizes and sweeper totals of ``queue`` in one non-transactional pipeline."""
    keys = QueueKeys(queue)
    lanes = list(lanes)
    pipe = client.pipeline(transaction=False)
    pipe.zcard(keys.dead)
    pipe.zcard(keys.pending)
    pipe.zcard(keys.active)
    pipe.hgetall(keys.sweeper_totals)
    for lane in lanes:
        pipe.zcard(keys.lane_pending(lane))
    dead, pending, active, raw_totals, *lane_sizes = pipe.execute()
    totals = {_text(k): _int(v) or 0 for k, v in raw_totals.items()}
    return QueueSnapshot(
        dead=int(dead),
        pending=int(pending),
        active=int(active),
        recovered_total=totals.get("recovered", 0),
        dead_lettered_total=totals.get("dead_lettered", 0),
        orphans_total=totals.get("orphans", 0),
        quarantined_total=totals.get("quarantined", 0),
        lanes=[
            LaneSnapshot(
                name=lane,
                pending=int(size),
                recovered_total=totals.get(f"lane:{lane}:recovered", 0),
                dead_lettered_total=totals.get(f"lane:{lane}:dead_lettered", 0),
            )
            for lane, size in zip(lanes, lane_sizes)
        ],
    )
