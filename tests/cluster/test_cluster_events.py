"""On a cluster the sweep always sends its events: the cluster bus carries a
PUBLISH to every node, so a subscriber on any node may be listening
(scripts/lib/listeners.lua)."""

from __future__ import annotations

import pytest
import redis

from stalledpolicy import engine
from stalledpolicy.engine import Budgets
from stalledpolicy.keyspace import QueueKeys
from tests.kube.operator_harness import wait_for
from tests.redis.engine_rows import assert_each_event_kind_moved, put_each_event_kind, received

pytestmark = pytest.mark.redis


def test_on_a_cluster_a_subscriber_on_another_node_gets_every_event(redis_cluster):
    client = redis_cluster.client(decode_responses=True)
    client.flushall()
    keys = QueueKeys("events-across")
    home = client.get_node_from_key(keys.active).port
    other = next(node.port for node in client.get_primaries() if node.port != home)
    elsewhere = redis.Redis(host="127.0.0.1", port=other, decode_responses=True)
    subscriber = elsewhere.pubsub(ignore_subscribe_messages=True)
    try:
        subscriber.subscribe(keys.events)
        wait_for(lambda: elsewhere.pubsub_numsub(keys.events)[0][1] == 1, "the subscription on the other node")
        put_each_event_kind(client, keys)
        result = engine.sweep_batch(client, keys.queue, Budgets(2), 10)
        heard = [message["channel"] for message in received(subscriber, 3)]
        assert_each_event_kind_moved(client, keys, result)
        assert heard == [keys.events] * 3
    finally:
        subscriber.close()
        elsewhere.close()
        client.close()
