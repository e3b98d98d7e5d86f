"""The long-running sweeper on a real Redis Cluster whose queue's node stops
answering: /healthz keeps answering 200 while the cluster client makes its
attempts (up to 11, each a socket timeout and a slot-table refresh, ~55-110 s),
and /readyz answers 503, "redis unreachable" once the call gives up. Before, the
loop beat only after the call, so /healthz went stale after HEALTH_FLOOR_S and
the liveness probe restarted a sweeper that was only waiting for Redis: a crash
loop caused by Redis. The second test makes the refresh between two attempts
wait on four nodes that never answer, past HEALTH_FLOOR_S on its own: a beat per
attempt is not enough, the client beats per round trip.

The hung nodes are test_cluster_sweeper_stop's relays. Time is counted in round
trips, not seconds: the sweeper runs in process on a clock that moves on by the
product's socket timeout each time a relay swallows a command, so the socket
timeout itself can be short, and the test too."""

from __future__ import annotations

import functools
import shutil
import threading
import time
import urllib.error
import urllib.request

import pytest
from redis.crc import key_slot

from stalledpolicy.devenv.redis_server import start_cluster
from stalledpolicy.keyspace import QueueKeys
from stalledpolicy.sweeper import client, loop
from stalledpolicy.sweeper.config import SweeperConfig
from stalledpolicy.sweeper.metrics import StatusServer, SweeperMetrics
from tests.cluster.test_cluster_sweeper_stop import QUEUE, HangingRelay, _owner_port, hung_queue_node  # noqa: F401 (hung_queue_node: a fixture)

pytestmark = pytest.mark.redis

#: what one round trip to a node that never answers costs the product
PRODUCT_ROUND_TRIP_S = client.SOCKET_TIMEOUT_S
#: what it costs here (the clock still counts PRODUCT_ROUND_TRIP_S)
TEST_SOCKET_TIMEOUT_S = 0.3


class RoundTripClock:
    """The sweeper's clock: still, except that each command a relay swallows
    moves it on by one product socket timeout."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def round_trip_swallowed(self) -> None:
        self.now += PRODUCT_ROUND_TRIP_S


class EachSwallow(threading.Event):
    """Put in place of the relay's ``hung``, which it sets at each command it
    swallows: ``on_swallow()`` runs then, on the relay's thread, while the
    sweeper waits for the reply that never comes."""

    def __init__(self, on_swallow):
        super().__init__()
        self._on_swallow = on_swallow

    def set(self) -> None:
        self._on_swallow()
        super().set()


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as answer:
        return answer.code, answer.read().decode()


def _in_process_sweeper(url: str, monkeypatch):
    """The long-running sweeper of QUEUE in this process, on a RoundTripClock,
    with its /healthz and /readyz served; a short socket timeout (real seconds)."""
    monkeypatch.setattr(client, "SOCKET_TIMEOUT_S", TEST_SOCKET_TIMEOUT_S)
    clock = RoundTripClock()
    # an interval short enough that the floor is the limit /healthz goes stale at
    config = SweeperConfig(redis_url=url, queue=QUEUE, interval=1)
    sweeper = loop.Sweeper(config, SweeperMetrics(QUEUE, ()), clock=clock)
    assert sweeper.health.stale_after_s == loop.HEALTH_FLOOR_S
    server = StatusServer("127.0.0.1", 0, sweeper.metrics, sweeper.health).start()
    return sweeper, clock, server


def test_healthz_stays_fresh_while_the_cluster_client_retries_a_hung_node(hung_queue_node, monkeypatch):  # noqa: F811
    relay, url = hung_queue_node
    sweeper, clock, server = _in_process_sweeper(url, monkeypatch)
    # (attempt, /healthz, /readyz) as each attempt waits on the hung node
    probes: list[tuple[int, tuple[int, str], tuple[int, str]]] = []

    def round_trip_swallowed() -> None:
        clock.round_trip_swallowed()
        probes.append((len(probes) + 1, _get(server.port, "/healthz"), _get(server.port, "/readyz")))

    relay.hung = EachSwallow(round_trip_swallowed)
    runner = threading.Thread(target=sweeper.run_forever, daemon=True)
    runner.start()
    try:
        # the first pass fails once the client gives up; the still clock then
        # keeps the loop in its outage wait (no second pass)
        deadline = time.monotonic() + 120
        while not sweeper.redis_down:
            assert runner.is_alive(), "the sweeper's loop ended"
            assert time.monotonic() < deadline, f"the pass never failed; attempts so far: {len(probes)}"
            time.sleep(0.05)
        # enough attempts that the old heartbeat (beaten before the call only) went stale
        assert len(probes) * PRODUCT_ROUND_TRIP_S > loop.HEALTH_FLOOR_S, probes
        stale = [(attempt, healthz) for attempt, healthz, _ in probes if healthz[0] != 200]
        assert not stale, f"/healthz failed while the client was still making attempts: {stale}"
        assert all(readyz[0] == 503 for _, _, readyz in probes), probes
        healthz = _get(server.port, "/healthz")
        assert healthz[0] == 200, healthz
        status, body = _get(server.port, "/readyz")
        assert status == 503 and "redis unreachable" in body, body
    finally:
        sweeper.stop.set()
        runner.join(30)
        server.stop()
    assert not runner.is_alive()


@pytest.fixture
def refresh_meets_hung_nodes(server_binaries):
    """A five-node cluster whose queue's node is announced at a relay that hangs
    on EVALSHA and every other node at one that hangs on CLUSTER SLOTS: after the
    script call's timeout, the slot-table refresh asks the four others, which
    never answer, before the queue's node, which does (redis-py asks the node that
    failed last). Yields the relays and the URL of the queue node's relay (where
    the client's first slot table comes from: every node the client knows is a
    relay, so the refresh meets the four hung ones whatever order it asks in)."""
    cluster = start_cluster(5, binaries=server_binaries)
    relays: list[HangingRelay] = []
    try:
        slot = key_slot(QueueKeys(QUEUE).active.encode())
        owner_port = _owner_port(cluster.nodes[0], slot)
        for node in cluster.nodes:
            relay = HangingRelay(node.port, b"EVALSHA" if node.port == owner_port else b"SLOTS")
            relays.append(relay)
            client = node.client()
            client.config_set("cluster-announce-port", relay.port)
            client.close()
        relay_ports = {relay.port for relay in relays}
        deadline = time.monotonic() + 30
        while not all(_primary_ports(node) <= relay_ports for node in cluster.nodes):
            assert time.monotonic() < deadline, "the relays' ports never reached every node's slot table"
            time.sleep(0.05)
        owner_relay = next(relay for relay in relays if relay.node_port == owner_port)
        yield relays, f"redis://127.0.0.1:{owner_relay.port}/0"
    finally:
        for relay in relays:
            relay.close()
        cluster.stop()
        for node in cluster.nodes:
            shutil.rmtree(node.workdir, ignore_errors=True)


def _primary_ports(node) -> set[int]:
    client = node.client()
    try:
        return {int(primary[1]) for _, _, primary, *_ in client.execute_command("CLUSTER SLOTS")}
    finally:
        client.close()


def test_healthz_stays_fresh_through_a_slot_table_refresh_that_meets_hung_nodes(refresh_meets_hung_nodes,
                                                                                 monkeypatch):
    """Between two attempts of the script call, the refresh waits on four nodes
    in turn (25 product seconds with the attempt, past HEALTH_FLOOR_S): a beat
    before each attempt only would let /healthz go stale in the refresh; the
    client beats before each node it asks. (redis-py 8.1 refreshes right after
    the first timeout; 8.2 at most once a second, so the script call may be
    tried again before the refresh: the refresh is waited for either way.)"""
    relays, url = refresh_meets_hung_nodes
    sweeper, clock, server = _in_process_sweeper(url, monkeypatch)
    # (what the relay swallowed, /healthz) at each round trip that hangs
    probes: list[tuple[bytes, tuple[int, str]]] = []
    attempt_after_refresh = threading.Event()
    refresh_then_attempt = [b"SLOTS"] * 4 + [b"EVALSHA"]
    until_then: list[bytes] = []  # what was swallowed up to that attempt

    def swallowed(relay: HangingRelay) -> None:
        clock.round_trip_swallowed()
        probes.append((relay.hang_on, _get(server.port, "/healthz")))
        in_turn = [hung_on for hung_on, _ in probes]
        if not attempt_after_refresh.is_set() and in_turn[-5:] == refresh_then_attempt:
            until_then.extend(in_turn)
            attempt_after_refresh.set()

    for relay in relays:
        relay.hung = EachSwallow(functools.partial(swallowed, relay))
    runner = threading.Thread(target=sweeper.run_forever, daemon=True)
    runner.start()
    try:
        assert attempt_after_refresh.wait(60), (
            f"no refresh asking the four hung nodes, then the script call again; swallowed: {probes}")
    finally:
        sweeper.stop.set()
        runner.join(30)
        server.stop()
    assert not runner.is_alive()
    # the script call first, then (maybe after more attempts) the refresh that asked
    # the four nodes that never answer, then the script call again
    assert until_then[0] == b"EVALSHA" and b"SLOTS" not in until_then[:-5], until_then
    stale = [(hung_on, healthz) for hung_on, healthz in probes if healthz[0] != 200]
    assert not stale, f"/healthz failed while the client was still making attempts: {stale}"
