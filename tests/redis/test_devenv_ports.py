"""The test servers' ports: a port taken between free_port() and the server's bind
(or a cluster node's bus port, port + 10000, taken) is another port, not an error
(a cluster fixture failed once in a full run: redis-server exited with 1)."""

from __future__ import annotations

import socket

import pytest

from stalledpolicy.devenv import redis_server
from stalledpolicy.devenv.ports import free_port

pytestmark = pytest.mark.redis

@pytest.mark.parametrize("busy_offset", [0, 10000], ids=["port", "cluster-bus-port"])
def test_a_port_taken_before_the_server_binds_it_is_replaced(monkeypatch, busy_offset):
    taken_port = free_port(with_bus=True)
    holder = socket.socket()
    holder.bind(("127.0.0.1", taken_port + busy_offset))

    offered = iter([taken_port])

    def first_the_taken_one(**kwargs):
        return next(offered, None) or free_port(**kwargs)

    monkeypatch.setattr(redis_server, "free_port", first_the_taken_one)
    try:
        server = redis_server.start_redis(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"])
        try:
            assert server.port != taken_port and server.client().ping()
        finally:
            server.stop()
    finally:
        holder.close()

def test_free_port_with_bus_skips_a_port_whose_bus_port_is_taken(monkeypatch):
    import stalledpolicy.devenv.ports as ports

    taken = free_port()
    holder = socket.socket()
    holder.bind(("127.0.0.1", taken + 10000))
    try:
        assert not ports._free(taken + 10000) and ports._free(taken)
    finally:
        holder.close()

def test_a_cluster_node_that_fails_to_start_stops_the_nodes_started_before_it(monkeypatch):
    started = []
    real_start = redis_server.start_redis

    def third_fails(*args, **kwargs):
        if len(started) == 2:
            raise RuntimeError("redis-server exited with 1")
        started.append(real_start(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(redis_server, "start_redis", third_fails)
    with pytest.raises(RuntimeError, match="exited with 1"):
        redis_server.start_cluster(3)
    assert len(started) == 2
    for node in started:
        node.process.wait(timeout=10)
        assert node.process.returncode is not None
