"""A queue's figures in one read: pending, active, the morgue's size and each
lane's totals (the operator's status, the sweeper's gauges)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from stalledpolicy.engine.calls import as_counter, as_text
from stalledpolicy.keyspace import QueueKeys


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
    #: lapses a reaper returned while the sweep held them, uncounted (lib/holds.lua)
    uncounted_total: int = 0


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
    totals = {as_text(k): as_counter(v) or 0 for k, v in raw_totals.items()}
    return QueueSnapshot(
        dead=int(dead),
        pending=int(pending),
        active=int(active),
        recovered_total=totals.get("recovered", 0),
        dead_lettered_total=totals.get("dead_lettered", 0),
        orphans_total=totals.get("orphans", 0),
        quarantined_total=totals.get("quarantined", 0),
        uncounted_total=totals.get("uncounted", 0),
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
