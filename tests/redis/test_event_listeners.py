"""The sweep's events go out when someone can receive them (scripts/lib/listeners.lua):
a subscriber of the channel or of a pattern here, a replica's subscriber
(through the replication stream), or, on a cluster, any node's. With none of
them no PUBLISH is sent, and the jobs move the same."""

from __future__ import annotations

import pytest

from stalledpolicy import engine
from stalledpolicy.devenv.redis_server import start_redis
from stalledpolicy.engine import Budgets
from stalledpolicy.keyspace import QueueKeys
from tests.kube.operator_harness import wait_for
from tests.redis.engine_rows import (
    EventTap,
    assert_each_event_kind_moved,
    put_active,
    put_each_event_kind,
    received,
    restricted_user,
)

pytestmark = pytest.mark.redis



def publishes(client) -> int:
    """PUBLISH commands the server ran so far (the scripts' included)."""
    return int(client.info("commandstats").get("cmdstat_publish", {}).get("calls", 0))


def no_pattern_subscribers(r) -> None:
    """Another test's pattern subscriber may still be closing: wait for it to go."""
    wait_for(lambda: r.pubsub_numpat() == 0, "another test's pattern subscriber to leave")


def test_with_no_one_listening_no_event_is_sent_and_every_job_moves(r, keys):
    no_pattern_subscribers(r)
    put_each_event_kind(r, keys)
    before = publishes(r)
    result = engine.sweep_batch(r, keys.queue, Budgets(2), 10)
    assert_each_event_kind_moved(r, keys, result)
    assert publishes(r) == before


def test_a_subscriber_of_the_channel_gets_every_event(r, keys):
    put_each_event_kind(r, keys)
    tap = EventTap(r, keys)
    try:
        result = engine.sweep_batch(r, keys.queue, Budgets(2), 10)
        events = tap.collect(3)
    finally:
        tap.close()
    assert_each_event_kind_moved(r, keys, result)
    assert [(e["event"], e["job"], e.get("reason", "")[:9]) for e in events] == [
        ("stalled", "JOB1", ""), ("failed", "JOB2", "stalled"), ("failed", "JOB3", "malformed")]


def test_a_pattern_subscriber_gets_every_event(r, keys):
    put_each_event_kind(r, keys)
    subscriber = r.pubsub(ignore_subscribe_messages=True)
    subscriber.psubscribe("emq:*")
    wait_for(lambda: r.pubsub_numpat() > 0, "the pattern subscription")
    try:
        result = engine.sweep_batch(r, keys.queue, Budgets(2), 10)
        heard = [message["channel"] for message in received(subscriber, 3)]
    finally:
        subscriber.close()
    assert_each_event_kind_moved(r, keys, result)
    assert heard == [keys.events] * 3


def test_a_user_who_may_not_ask_who_listens_still_sends_the_events(redis_server, r, keys):
    no_pattern_subscribers(r)
    put_each_event_kind(r, keys)
    before = publishes(r)
    with restricted_user(redis_server, r, "no-pubsub", "-pubsub", "-info") as client:
        result = engine.sweep_batch(client, keys.queue, Budgets(2), 10)
    assert_each_event_kind_moved(r, keys, result)
    assert publishes(r) == before + 3


@pytest.fixture
def primary(server_binaries):
    """A server of its own: a replica changes what every later sweep on it sees."""
    server = start_redis(binaries=server_binaries)
    client = server.client(decode_responses=True)
    yield server, client
    client.close()
    server.stop()


def test_a_subscriber_on_a_replica_gets_every_event_and_so_does_a_backlog(primary, server_binaries, keys):
    server, r = primary
    replica_server = start_redis(binaries=server_binaries)
    replica = replica_server.client(decode_responses=True)
    subscriber = replica.pubsub(ignore_subscribe_messages=True)
    try:
        replica.execute_command("REPLICAOF", "127.0.0.1", str(server.port))
        wait_for(lambda: replica.info("replication").get("master_link_status") == "up", "the replica's sync")
        subscriber.subscribe(keys.events)
        wait_for(lambda: replica.pubsub_numsub(keys.events)[0][1] == 1, "the subscription on the replica")
        assert r.pubsub_numsub(keys.events) == [(keys.events, 0)]  # no one here: the replica's subscriber only
        put_each_event_kind(r, keys)
        result = engine.sweep_batch(r, keys.queue, Budgets(2), 10)
        heard = [message["channel"] for message in received(subscriber, 3)]
        assert_each_event_kind_moved(r, keys, result)
        assert heard == [keys.events] * 3

        # the replica gone, its backlog stays (it may come back and resume from
        # it): the events still go into the stream
        replica.execute_command("REPLICAOF", "NO", "ONE")
        wait_for(lambda: r.info("replication")["connected_slaves"] == 0, "the primary to see the replica go")
        assert r.info("replication")["repl_backlog_active"] == 1
        later = QueueKeys(keys.queue + "-later")
        put_active(r, later, "JOB4")
        before = publishes(r)
        assert engine.sweep_batch(r, later.queue, Budgets(2), 10).recovered == 1
        assert publishes(r) == before + 1
    finally:
        subscriber.close()
        replica.close()
        replica_server.stop()
