"""The sweeper's client on a single server sends a script call once: a call
that timed out (or lost its reply) may have run, and sent again, its moves
were counted by no one (the --once JSON and the metrics said 0 dead-lettered
for a call that dead-lettered 200; reviewer's reproduction). The loop's own
backoff and the next pass take over."""

from __future__ import annotations

import pytest
import redis

from stalledpolicy import engine
from stalledpolicy.engine import Budgets
from stalledpolicy.sweeper import client
from tests.cluster.test_cluster_sweeper_liveness import EachSwallow
from tests.cluster.test_cluster_sweeper_stop import HangingRelay

pytestmark = pytest.mark.redis


def test_a_script_call_that_timed_out_is_not_sent_again(redis_server, monkeypatch):
    relay = HangingRelay(redis_server.port, b"EVALSHA")
    swallowed: list[int] = []
    relay.hung = EachSwallow(lambda: swallowed.append(1))
    monkeypatch.setattr(client, "SOCKET_TIMEOUT_S", 0.3)
    sweeper_client = client.connect(f"redis://127.0.0.1:{relay.port}/0")
    try:
        assert sweeper_client.ping()  # not a cluster: the plain client
        with pytest.raises(redis.TimeoutError):
            engine.sweep_batch(sweeper_client, "orders", Budgets(1), 10)
        assert len(swallowed) == 1, "the script call was sent again"
    finally:
        sweeper_client.close()
        relay.close()
