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


def test_sweep_once_failing_part_way_prints_the_error_and_the_counts_so_far(redis_cluster):
    """Batch size 1: the first call recovers JOB1, the second meets JOB2's row
    already on the importing node. Exit 1 with the one JSON line (for `| jq`):
    the error naming the migration and the job the first call moved."""
    import json

    from tests.cluster.test_cluster import _cli

    queue = "resharding-once"
    client, keys, ids = _three_stalled_jobs(redis_cluster, queue)
    try:
        with slot_migrating(client, queue, [keys.job("JOB2")]):
            swept = _cli("sweep", "--once", "--redis-url", redis_cluster.url, "--queue", queue,
                         "--max-stalled", "5", "--batch-size", "1")
        assert swept.returncode == 1, swept.stderr
        lines = swept.stdout.splitlines()
        assert len(lines) == 1, swept.stdout
        summary = json.loads(lines[0])
        assert summary["error"].startswith(f"last pass failed: the slot of queue {queue} is being migrated")
        assert "the 1 script call(s) before it were applied (1 recovered, 0 dead-lettered)" in summary["error"]
        assert (summary["recovered"], summary["dead_lettered"], summary["calls"]) == (1, 0, 1)
        assert summary["lanes"] == {"": {"recovered": 1, "dead_lettered": 0}}
        assert summary["stopped_early"] is False
        assert "metrics_port" not in swept.stderr  # --once serves no metrics
        assert client.zrange(keys.pending, 0, -1) == ["JOB-waiting", "JOB1"]
    finally:
        client.close()
