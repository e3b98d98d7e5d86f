"""``stalledpolicy.redis_url.connect`` against real servers: a plain one, one whose
ACL refuses INFO, and a three-node cluster."""

from __future__ import annotations

import uuid

import pytest
import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from stalledpolicy.redis_url import connect, unreachable_errors

pytestmark = pytest.mark.redis


def test_a_plain_server_gives_a_plain_client_with_the_options(redis_server):
    retry = Retry(NoBackoff(), 1)
    client = connect(redis_server.url, retry=retry, decode_responses=True, socket_timeout=3.0)
    try:
        assert type(client) is redis.Redis
        kwargs = client.connection_pool.connection_kwargs
        assert kwargs["retry"] is retry and kwargs["socket_timeout"] == 3.0
        client.set("redis-url-probe", "x")
        assert client.get("redis-url-probe") == "x"  # decoded
    finally:
        client.close()


def test_a_user_refused_info_is_taken_for_a_plain_server(redis_server):
    admin = redis_server.client()
    user = f"limited-{uuid.uuid4().hex[:8]}"
    admin.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["*"],
                      commands=["+@all", "-info"])
    try:
        client = connect(f"redis://{user}:pw@127.0.0.1:{redis_server.port}/0", decode_responses=True)
        try:
            with pytest.raises(redis.ResponseError):
                client.info("cluster")  # the probe really was refused
            assert type(client) is redis.Redis and client.ping() is True
        finally:
            client.close()
    finally:
        admin.acl_deluser(user)
        admin.close()


def test_a_cluster_node_gives_a_cluster_client_without_the_plain_retry(redis_cluster):
    retry = Retry(NoBackoff(), 1)
    client = connect(redis_cluster.url, retry=retry, decode_responses=True, socket_timeout=3.0)
    try:
        assert isinstance(client, RedisCluster)
        assert client.retry is not retry  # the cluster keeps its own failover-aware retry
        # keys in every slot range, so all three nodes answer through this one client
        for i in range(30):
            client.set(f"redis-url-probe-{i}", str(i))
        assert [client.get(f"redis-url-probe-{i}") for i in range(30)] == [str(i) for i in range(30)]
        assert len({client.keyslot(f"redis-url-probe-{i}") // 5462 for i in range(30)}) == 3
    finally:
        client.close()


def test_an_unreachable_server_raises_an_unreachable_error(redis_server):
    from stalledpolicy.devenv.ports import free_port

    with pytest.raises(unreachable_errors()):
        connect(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1.0)


def test_a_database_the_server_lacks_is_raised_not_taken_for_a_refused_info(redis_server):
    """SELECT fails as the connection is made, before INFO: that is the URL's
    database, not an ACL refusing INFO (which gives a plain client)."""
    from stalledpolicy.redis_url import is_missing_database, server_databases

    url = redis_server.url.removesuffix("/0") + "/16"
    with pytest.raises(redis.ResponseError) as caught:
        connect(url, decode_responses=True, socket_timeout=3.0)
    assert is_missing_database(caught.value)
    assert server_databases(url, socket_timeout=3.0) == 16
