"""queue_snapshot: sizes and sweeper totals in one pipelined round trip."""

from __future__ import annotations

import pytest

from stalledpolicy import engine
from stalledpolicy.engine import Budgets, LaneSnapshot, QueueSnapshot
from tests.redis.engine_rows import put_active, put_dead, server_ms

pytestmark = pytest.mark.redis


class OnlyPipelines:
    """A client that refuses direct commands and counts pipeline round trips."""

    def __init__(self, client):
        self._client = client
        self.round_trips = 0
        self.transactions = []

    def pipeline(self, transaction=True, **kwargs):
        self.transactions.append(transaction)
        pipe = self._client.pipeline(transaction=transaction, **kwargs)
        execute = pipe.execute

        def counted_execute(*args, **kw):
            self.round_trips += 1
            return execute(*args, **kw)

        pipe.execute = counted_execute
        return pipe

    def __getattr__(self, name):
        raise AssertionError(f"queue_snapshot called {name} outside the pipeline")


def test_snapshot_of_an_empty_queue(r, keys):
    assert engine.queue_snapshot(r, keys.queue, ["a"]) == QueueSnapshot(
        dead=0, pending=0, active=0, recovered_total=0, dead_lettered_total=0, orphans_total=0,
        quarantined_total=0, lanes=[LaneSnapshot("a", 0, 0, 0)],
    )


def test_snapshot_reports_sizes_and_totals_after_a_sweep(r, keys):
    put_active(r, keys, "JOB1")
    put_active(r, keys, "JOB2", stalled=1)
    put_active(r, keys, "JOB3", group="a")
    put_active(r, keys, "JOB4", group="a", stalled=1)
    put_active(r, keys, "JOB5", group="b")
    put_active(r, keys, "JOB6", stalled="bad")
    put_active(r, keys, "JOB7", score=server_ms(r) + 60_000)
    r.zadd(keys.active, {"JOBgone": 1})
    put_dead(r, keys, "JOBold")
    r.zadd(keys.pending, {"JOBwaiting": 0})
    engine.sweep_batch(r, keys.queue, Budgets(2), 100)
    snap = engine.queue_snapshot(r, keys.queue, ["a", "b", "c"])
    assert snap == QueueSnapshot(
        dead=4, pending=2, active=1, recovered_total=3, dead_lettered_total=2, orphans_total=1,
        quarantined_total=1,
        lanes=[LaneSnapshot("a", 1, 1, 1), LaneSnapshot("b", 1, 1, 0), LaneSnapshot("c", 0, 0, 0)],
    )


def test_snapshot_is_one_non_transactional_round_trip(r, keys):
    put_dead(r, keys, "JOB1")
    client = OnlyPipelines(r)
    snap = engine.queue_snapshot(client, keys.queue, ["a", "b"])
    assert snap.dead == 1
    assert client.round_trips == 1 and client.transactions == [False]


def test_snapshot_with_a_bytes_client(r_bytes, keys):
    r_bytes.hset(keys.sweeper_totals, mapping={"recovered": 5, "lane:x:dead_lettered": 2})
    r_bytes.zadd(keys.lane_pending("x"), {"JOB1": 0})
    snap = engine.queue_snapshot(r_bytes, keys.queue, ["x"])
    assert snap.recovered_total == 5 and snap.lanes == [LaneSnapshot("x", 1, 0, 2)]
