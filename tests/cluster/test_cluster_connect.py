"""How a client for a Redis Cluster is chosen and refused, on the real
three-node cluster: a Redis user the ACL denies INFO (``-@dangerous``), a user
denied HELLO too, and a URL naming a database other than 0."""

from __future__ import annotations

import contextlib
import json
import uuid

import pytest
import redis
from redis.cluster import RedisCluster

from stalledpolicy.devenv.echomq import EchoMQ, read_state
from stalledpolicy.redis_url.connecting import connect
from tests.cluster.test_cluster import _cli, queues_on_every_node

pytestmark = pytest.mark.redis


@contextlib.contextmanager
def acl_user(redis_cluster, queue: str, *rules: str):
    """A user allowed the keys and the events channel of ``queue`` and every
    command but ``rules`` take away, on every node (ACLs are per node)."""
    user = f"sw-{uuid.uuid4().hex[:8]}"
    for node in redis_cluster.nodes:
        admin = node.client()
        admin.execute_command("ACL", "SETUSER", user, "on", ">pw", f"~emq:{{{queue}}}:*",
                              f"&emq:{{{queue}}}:events", "+@all", *rules)
        admin.close()
    try:
        yield user
    finally:
        for node in redis_cluster.nodes:
            admin = node.client()
            admin.execute_command("ACL", "DELUSER", user)
            admin.close()


def _queue_elsewhere(redis_cluster):
    """(admin client, entry node, a queue whose slot is on another node than the entry)."""
    client = redis_cluster.client(decode_responses=True)
    client.flushall()
    entry = redis_cluster.nodes[0]
    queue = next(names[0] for port, names in queues_on_every_node(client).items() if port != entry.port)
    return client, entry, queue


def test_a_user_denied_info_still_gets_a_cluster_client(redis_cluster):
    """INFO is in @dangerous: HELLO (allowed) tells the cluster, and the queue
    on another node is read and swept through the entry node."""
    client, entry, queue = _queue_elsewhere(redis_cluster)
    mq = EchoMQ(client, queue)
    seeded = mq.seed_stalled(40, budget=2, at_budget_fraction=0.25)
    with acl_user(redis_cluster, queue, "-@dangerous") as user:
        url = f"redis://{user}:pw@127.0.0.1:{entry.port}/0"
        limited = redis.Redis(host="127.0.0.1", port=entry.port, username=user, password="pw")
        with pytest.raises(redis.exceptions.NoPermissionError):
            limited.info("cluster")  # the probe really is refused
        limited.close()

        probe = connect(url, decode_responses=True)
        try:
            assert isinstance(probe, RedisCluster)
            assert probe.zcard(f"emq:{{{queue}}}:active") == 40  # on another node: no MOVED
        finally:
            probe.close()

        stats = _cli("morgue", "stats", "--redis-url", url, "--queue", queue, "-o", "json")
        assert stats.returncode == 0, stats.stderr
        assert json.loads(stats.stdout)["size"] == 0
        swept = _cli("sweep", "--once", "--redis-url", url, "--queue", queue, "--max-stalled", "2")
        assert swept.returncode == 0, swept.stderr
        assert json.loads(swept.stdout)["dead_lettered"] == len(seeded.at_budget)
        assert json.loads(swept.stdout)["error"] is None
        assert set(read_state(client, queue).dead) == seeded.at_budget
    client.close()


CLUSTER_DB_FIX = ("names database 1, but the server is a Redis Cluster node and a Redis Cluster has only "
                  "database 0; write /0 after the host (or no path)")


def test_a_cluster_url_with_a_database_is_a_usage_error_naming_the_fix(redis_cluster):
    """A cluster has only database 0: /1 is the URL's fault (exit 2 in both
    CLIs, InvalidRedisURL in the operator), not a failed call."""
    from stalledpolicy.controller.redis_clients import RedisConfigError
    from stalledpolicy.controller.redis_clients import connect as operator_connect

    client, entry, queue = _queue_elsewhere(redis_cluster)
    client.close()
    url = f"redis://127.0.0.1:{entry.port}/1"
    stats = _cli("morgue", "stats", "--redis-url", url, "--queue", queue)
    assert stats.returncode == 2, stats.stderr
    assert f"--redis-url {url}: {CLUSTER_DB_FIX}" in stats.stderr
    swept = _cli("sweep", "--once", "--redis-url", url, "--queue", queue)
    assert swept.returncode == 2, swept.stderr
    assert f"--redis-url (STALLEDPOLICY_REDIS_URL) {url}: {CLUSTER_DB_FIX}" in swept.stderr
    assert swept.stdout == ""
    with pytest.raises(RedisConfigError) as refused:
        operator_connect(url, 2.0)
    assert refused.value.reason == "InvalidRedisURL"
    assert refused.value.message == f"spec.redis: {CLUSTER_DB_FIX}"
    # with /0 (or no path) all is well
    for good in (f"redis://127.0.0.1:{entry.port}/0", f"redis://127.0.0.1:{entry.port}"):
        assert _cli("morgue", "stats", "--redis-url", good, "--queue", queue).returncode == 0
