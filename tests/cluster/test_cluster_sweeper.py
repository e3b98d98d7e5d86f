"""The long-running sweeper on the real three-node cluster while its queue's
slot is being migrated (a resharding): no outage, a warning naming the
migration, /readyz's reason naming it, redis_up kept at 1, and a pass that
recovers everything once the slot has moved."""

from __future__ import annotations

import logging

import pytest

from stalledpolicy.sweeper import loop
from stalledpolicy.sweeper.config import SweeperConfig
from stalledpolicy.sweeper.metrics import SweeperMetrics

from tests.cluster.test_cluster import _three_stalled_jobs, slot_migrating

pytestmark = pytest.mark.redis


def _redis_up(metrics: SweeperMetrics, queue: str) -> float:
    return metrics.registry.get_sample_value("stalledpolicy_redis_up", {"queue": queue})


@pytest.mark.parametrize("moved", ["row", "active"])
def test_a_sweeper_pass_during_a_resharding_is_no_outage(redis_cluster, caplog, moved):
    queue = f"resharding-{moved}"
    client, keys, ids = _three_stalled_jobs(redis_cluster, queue)
    config = SweeperConfig(redis_url=redis_cluster.url, queue=queue, max_stalled=5)
    metrics = SweeperMetrics(queue, ())
    sweeper = loop.Sweeper(config, metrics)
    try:
        assert sweeper.sweep_pass()  # a first pass: Redis is up
        for job_id in ids:  # stalled again
            client.zadd(keys.active, {job_id: 1})
            client.hset(keys.job(job_id), "state", "active")
        client.zrem(keys.pending, *ids)
        caplog.clear()
        key = keys.job("JOB2") if moved == "row" else keys.active
        with caplog.at_level(logging.DEBUG, logger="stalledpolicy.sweeper"), \
                slot_migrating(client, queue, [key]):
            assert sweeper.sweep_pass() is False
            assert sweeper.sweep_pass() is False  # logged once
        assert _redis_up(metrics, queue) == 1.0
        assert not sweeper.redis_down  # no outage backoff
        ready, reason = sweeper.health.ready()
        assert not ready
        assert f"the slot of queue {queue} is being migrated between Redis Cluster nodes (resharding)" in reason
        warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warned) == 1, [r.getMessage() for r in warned]
        assert warned[0].getMessage() == (
            f"the slot of queue {queue} is being migrated between Redis Cluster nodes (resharding); "
            "nothing was moved; retrying next interval (logged once until a pass succeeds)")
        assert sweeper.sweep_pass()  # the slot is stable again
        assert sweeper.health.ready() == (True, "ok")
        assert sweeper.last_result.recovered == 3
    finally:
        sweeper.close()
        client.close()
