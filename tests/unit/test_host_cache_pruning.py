"""The host name cache of same_redis_server is bounded: a name not asked about for
``forget_after`` seconds (ten TTLs by default) is dropped, so the names of URLs
since edited and of policies since deleted do not stay for the life of the
operator. A fake DNS and an injected clock (no real lookups, no sleeps)."""

from __future__ import annotations

from stalledpolicy.controller.same_redis_server import PENDING, HostResolver
from tests.unit.test_same_redis_server import DNS, SERVICE_IP, Clock, FakeDns, SlowDns, wait_for_lookups


def ask(hosts, *names):
    answers = [hosts.addresses(name) for name in names]
    wait_for_lookups(hosts)
    return answers


def test_a_name_no_longer_asked_about_is_dropped_after_ten_ttls():
    clock, dns = Clock(), FakeDns(DNS)
    hosts = HostResolver(lookup=dns, ttl=60, clock=clock)
    ask(hosts, "redis.prod.svc", "other.prod.svc")
    for _ in range(10):  # only redis.prod.svc asked about for 600 s (ten TTLs)
        clock.now += 60
        ask(hosts, "redis.prod.svc")
    assert set(hosts._entries) == {"redis.prod.svc", "other.prod.svc"}, "kept for forget_after"
    clock.now += 60
    ask(hosts, "redis.prod.svc")
    assert set(hosts._entries) == {"redis.prod.svc"}
    # Asked about again: looked up again, with the same answer as before.
    assert ask(hosts, "other.prod.svc") == [frozenset({"10.96.0.99"})]
    assert dns.asked.count("other.prod.svc") == 2


def test_the_cache_holds_only_the_names_asked_about_lately():
    clock = Clock()
    hosts = HostResolver(lookup=FakeDns(DNS), ttl=60, clock=clock)
    for i in range(100):  # a name per minute, each asked about once (URLs edited over and over)
        clock.now += 60
        ask(hosts, f"redis-{i}.prod.svc", "redis.prod.svc")
    assert len(hosts._entries) <= 12  # the last ten TTLs' names (and one more), redis.prod.svc
    assert "redis.prod.svc" in hosts._entries and "redis-99.prod.svc" in hosts._entries
    assert "redis-0.prod.svc" not in hosts._entries


def test_an_entry_whose_lookup_is_in_flight_is_kept():
    """Its lookup thread writes the answer into it."""
    clock, dns = Clock(), SlowDns(DNS)
    hosts = HostResolver(lookup=dns, ttl=60, wait=0, clock=clock)
    assert hosts.addresses("redis.prod.svc") is PENDING
    clock.now += 10_000
    hosts.addresses("other.prod.svc")
    assert "redis.prod.svc" in hosts._entries
    dns.answer.set()
    wait_for_lookups(hosts)
    assert hosts._entries["redis.prod.svc"].addresses == frozenset({SERVICE_IP})
    clock.now += 10_000
    hosts.addresses("other.prod.svc")
    assert set(hosts._entries) == {"other.prod.svc"}


def test_forget_after_may_be_given():
    clock = Clock()
    hosts = HostResolver(lookup=FakeDns(DNS), ttl=60, clock=clock, forget_after=120)
    ask(hosts, "redis.prod.svc", "other.prod.svc")
    clock.now += 121
    ask(hosts, "redis.prod.svc")
    assert set(hosts._entries) == {"redis.prod.svc"}
