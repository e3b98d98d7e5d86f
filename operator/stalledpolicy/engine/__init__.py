"""The engine: Python calls over our Lua scripts (semantics in docs/scripts.md).

Every function takes a redis-py ``Redis`` or ``RedisCluster`` client with either
``decode_responses`` setting; every key name comes from :class:`QueueKeys`.
Each script call is bounded; the functions that may touch many jobs loop over
bounded calls so Redis is never blocked for long.

``sweep`` (the counted mark/recover/dead-letter walk), ``morgue`` (stats, list,
a page), ``morgue_change`` (replay, purge), ``snapshot`` (a queue's figures for
status and gauges) and ``calls`` (how a script is called and its reply read).
Callers use the names below through this package (``engine.drain``), so tests
can replace them here.
"""

from stalledpolicy.engine.calls import AclRefused, is_acl_refusal
from stalledpolicy.engine.morgue import (
                                         MORGUE_BATCH,
                                         DeadJob,
                                         MorguePage,
                                         MorgueStats,
                                         lane_of,
                                         morgue_list,
                                         morgue_page,
                                         morgue_stats,
)
from stalledpolicy.engine.morgue_change import PurgeResult, ReplayResult, morgue_purge, morgue_replay
from stalledpolicy.engine.sizing import CallSizer
from stalledpolicy.engine.snapshot import LaneSnapshot, QueueSnapshot, queue_snapshot
from stalledpolicy.engine.sweep import (
                                         NO_HOLDS,
                                         Budgets,
                                         Holds,
                                         LaneCounts,
                                         SweepResult,
                                         drain,
                                         lease_due_sooner,
                                         sweep_batch,
)

__all__ = [
    "AclRefused", "is_acl_refusal",
    "MORGUE_BATCH", "DeadJob", "MorguePage", "MorgueStats", "PurgeResult", "ReplayResult", "lane_of",
    "morgue_list", "morgue_page", "morgue_purge", "morgue_replay", "morgue_stats",
    "LaneSnapshot", "QueueSnapshot", "queue_snapshot", "CallSizer",
    "NO_HOLDS", "Budgets", "Holds", "LaneCounts", "SweepResult", "drain", "lease_due_sooner", "sweep_batch",
]
