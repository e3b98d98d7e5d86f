"""The long-running sweeper when every key its script declares has moved to
the importing node and a row has not: the script's refusal there is worded
apart by Redis ('non local key') and Valkey 8 ('undeclared keys were accessed
during rehashing of the slot'); on both it is the migration, not a script
error: one warning naming it, no outage, nothing moved."""

from __future__ import annotations

import logging

import pytest

from stalledpolicy.sweeper import loop
from stalledpolicy.sweeper.config import SweeperConfig
from stalledpolicy.sweeper.metrics import SweeperMetrics
from tests.cluster.test_cluster import _three_stalled_jobs, slot_migrating

pytestmark = pytest.mark.redis


def test_a_sweeper_pass_redirected_to_the_importing_node_names_the_migration(redis_cluster, caplog):
    queue = "resharding-importing"
    client, keys, ids = _three_stalled_jobs(redis_cluster, queue)
    declared = [keys.active, keys.pending, keys.dead, keys.ring, keys.gactive, keys.glimit, keys.paused,
                keys.wake, keys.metrics_failed, keys.sweeper_totals]
    sweeper = loop.Sweeper(SweeperConfig(redis_url=redis_cluster.url, queue=queue, max_stalled=5),
                           SweeperMetrics(queue, ()))
    try:
        with caplog.at_level(logging.DEBUG, logger="stalledpolicy.sweeper"), \
                slot_migrating(client, queue, [*declared, keys.job("JOB1")]):
            assert sweeper.sweep_pass() is False
        assert not sweeper.redis_down
        ready, reason = sweeper.health.ready()
        assert not ready
        assert f"the slot of queue {queue} is being migrated between Redis Cluster nodes (resharding)" in reason
        warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert warned == [
            f"the slot of queue {queue} is being migrated between Redis Cluster nodes (resharding); "
            "nothing was moved; retrying next interval (logged once until a pass succeeds)"], warned
        assert sweeper.sweep_pass()  # the slot is stable again, every row on its node
        assert (sweeper.last_result.recovered, sweeper.last_result.orphans) == (3, 0)
    finally:
        sweeper.close()
        client.close()
