"""``stalledpolicy sweep`` on a real three-node Redis Cluster whose queue's node
stops answering, then SIGTERM: the script call in flight ends at its timeout and
no new attempt is made (RedisCluster's own loop used to send it again, up to 10
times, each waiting its timeout), then the process ends as on a single server
(tests/redis/test_sweeper_settings_signals_and_lanes.py).

The hanging node is a TCP relay the cluster announces as the queue's node
(``cluster-announce-port``): it passes everything on until the sweep script's
EVALSHA, which it swallows, and it counts the connections made to that node, so
a new attempt shows as a new connection (the one that timed out is dropped)."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest
from redis.crc import key_slot

from stalledpolicy.devenv.redis_server import RedisServer, start_cluster
from stalledpolicy.keyspace import QueueKeys
from tests.redis.test_sweeper_settings_signals_and_lanes import SWEEP, clean_env

pytestmark = pytest.mark.redis

QUEUE = "stop-on-a-hung-node"


class HangingRelay:
    """A loopback port relaying to a node's port, except that a connection which
    sends ``hang_on`` is answered nothing from then on (the node never sees it)."""

    def __init__(self, node_port: int, hang_on: bytes):
        self.node_port = node_port
        self.hang_on = hang_on
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.hung = threading.Event()  # a connection sent ``hang_on``
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            node = socket.create_connection(("127.0.0.1", self.node_port))
            self._open += [client, node]
            threading.Thread(target=self._to_node, args=(client, node), daemon=True).start()
            threading.Thread(target=self._pipe, args=(node, client), daemon=True).start()

    def _to_node(self, client: socket.socket, node: socket.socket) -> None:
        seen = b""
        try:
            while data := client.recv(65536):
                # the tail kept: a command name split between two reads is still seen
                seen = seen[-len(self.hang_on):] + data
                if self.hang_on in seen:
                    self.hung.set()
                    while client.recv(65536):
                        pass  # swallowed: no reply ever comes
                    return
                node.sendall(data)
        except OSError:
            pass

    @staticmethod
    def _pipe(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
        for conn in self._open:
            conn.close()


@pytest.fixture
def hung_queue_node(server_binaries):
    """A cluster of its own (the session's must not be re-announced), whose node
    owning QUEUE's slot is announced at a relay that hangs on EVALSHA; yields the
    relay and the URL of another node (the sweeper's startup node)."""
    cluster = start_cluster(3, binaries=server_binaries)
    relay = None
    try:
        slot = key_slot(QueueKeys(QUEUE).active.encode())
        owner_port = _owner_port(cluster.nodes[0], slot)
        owner = next(n for n in cluster.nodes if n.port == owner_port)
        other = next(n for n in cluster.nodes if n is not owner)
        relay = HangingRelay(owner.port, b"EVALSHA")
        owner.client().config_set("cluster-announce-port", relay.port)
        deadline = time.monotonic() + 30
        while not all(_owner_port(n, slot) == relay.port for n in cluster.nodes):
            assert time.monotonic() < deadline, "the relay's port never reached every node's slot table"
            time.sleep(0.05)
        yield relay, other.url
    finally:
        if relay is not None:
            relay.close()
        cluster.stop()
        for node in cluster.nodes:
            shutil.rmtree(node.workdir, ignore_errors=True)


def _owner_port(node: RedisServer, slot: int) -> int:
    """The port ``node`` gives clients for the primary of ``slot``."""
    client = node.client()
    try:
        return next(int(primary[1]) for first, last, primary, *_ in client.execute_command("CLUSTER SLOTS")
                    if int(first) <= slot <= int(last))
    finally:
        client.close()


def _sigterm_once_the_script_call_hangs(relay: HangingRelay, *args: str) -> tuple[subprocess.Popen, int, str, str]:
    """Run the sweeper, SIGTERM it while its script call hangs; the connections the
    relay had then, and the output. A sweeper still running after 4 socket timeouts
    (20 s; it needs 1) is killed, so a regression fails on the count, not the clock."""
    process = subprocess.Popen([*SWEEP, "--queue", QUEUE, *args], env=clean_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert relay.hung.wait(30), "the sweeper never sent its script call"
        connections_at_signal = relay.connections
        process.send_signal(signal.SIGTERM)
        try:
            out, err = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process, connections_at_signal, out, err


def test_once_on_a_cluster_makes_no_new_attempt_after_sigterm(hung_queue_node):
    """Before: RedisCluster sent the script again after the timeout, on a new
    connection, 10 times (~55 s). Now: exit 143 after the one timeout, the JSON
    line and the log as a single server's."""
    relay, url = hung_queue_node
    process, connections_at_signal, out, err = _sigterm_once_the_script_call_hangs(
        relay, "--once", "--redis-url", url)
    assert relay.connections == connections_at_signal, (
        f"{relay.connections - connections_at_signal} new attempt(s) on the hung node after the signal")
    assert process.returncode == 143, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["stopped_early"] is True
    assert summary["error"] and "Timeout" in summary["error"]
    assert "stopped by a signal before the pass finished" in err and "signal=SIGTERM" in err
    assert "exits 1" not in err


def test_the_long_running_sweeper_on_a_cluster_makes_no_new_attempt_after_sigterm(hung_queue_node):
    relay, url = hung_queue_node
    process, connections_at_signal, _, err = _sigterm_once_the_script_call_hangs(
        relay, "--metrics-port", "0", "--redis-url", url)
    assert relay.connections == connections_at_signal, (
        f"{relay.connections - connections_at_signal} new attempt(s) on the hung node after the signal")
    assert process.returncode == 0, err
    assert "sweeper stopped" in err and "signal=SIGTERM" in err
