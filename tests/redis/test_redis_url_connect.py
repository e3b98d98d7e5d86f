"""``stalledpolicy.redis_url.connecting.connect`` against real servers: a plain one, one whose
ACL refuses INFO, and a three-node cluster."""

from __future__ import annotations

import uuid

import pytest
import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from stalledpolicy.redis_url.connecting import connect
from stalledpolicy.redis_url.errors import unreachable_errors

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
    from stalledpolicy.redis_url.connecting import server_databases
    from stalledpolicy.redis_url.errors import is_missing_database

    url = redis_server.url.removesuffix("/0") + "/16"
    with pytest.raises(redis.ResponseError) as caught:
        connect(url, decode_responses=True, socket_timeout=3.0)
    assert is_missing_database(caught.value)
    assert server_databases(url, socket_timeout=3.0) == 16


def test_a_server_answering_neither_info_nor_hello_is_refused_naming_info(tmp_path, server_binaries):
    """No INFO and no HELLO (renamed away here; a proxy may serve neither):
    whether it is a cluster cannot be told, so the client is refused with
    EMQNOPERM naming INFO instead of being taken for a single server (a
    cluster taken so fails with MOVED on every queue of another node)."""
    import subprocess
    import sys
    import time

    from stalledpolicy.devenv.ports import free_port
    from stalledpolicy.devenv.redis_server import _spawn

    # redis-py sends HELLO as it connects unless the URL asks for RESP2
    port = free_port()
    process = _spawn(server_binaries.server, port, tmp_path, ["--rename-command", "INFO", "info-hidden",
                                                              "--rename-command", "HELLO", "hello-hidden"])
    try:
        url = f"redis://127.0.0.1:{port}/0?protocol=2"
        probe = redis.Redis.from_url(url, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 15
        while True:
            try:
                assert probe.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.05)
        probe.close()
        with pytest.raises(redis.exceptions.NoPermissionError, match="^EMQNOPERM .*INFO"):
            connect(url)
        stats = subprocess.run([sys.executable, "-m", "stalledpolicy", "morgue", "stats", "--redis-url", url,
                                "--queue", "emails"], capture_output=True, text=True, timeout=60,
                               stdin=subprocess.DEVNULL)
        assert stats.returncode == 3, stats.stderr
        assert "EMQNOPERM" in stats.stderr and "INFO" in stats.stderr
    finally:
        process.terminate()
        process.wait(10)


def test_sweep_once_with_a_database_the_server_lacks_exits_2(redis_server):
    """A bad setting, as for the morgue CLI: exit 2 naming the database."""
    import subprocess
    import sys

    url = redis_server.url.removesuffix("/0") + "/16"
    swept = subprocess.run([sys.executable, "-m", "stalledpolicy", "sweep", "--once", "--redis-url", url,
                            "--queue", "emails"], capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL)
    assert swept.returncode == 2, swept.stderr
    assert "the database 16 does not exist on this server" in swept.stderr
