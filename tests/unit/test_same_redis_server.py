"""One sweeper per queue, with one Redis named two ways: a host name and its IP,
a short and a fully qualified name, localhost and 127.0.0.1, redis:// and
rediss://. A fake DNS (no real lookups): ``HostResolver(lookup=...)``."""

from __future__ import annotations

import copy
import socket
import threading

import pytest

from stalledpolicy.controller.queue_claims import redis_endpoint
from stalledpolicy.controller.reconcile import reconcile
from stalledpolicy.controller.same_redis_server import PENDING, HostResolver, same_server
from tests.unit.test_queue_claims import key_of, newer_state, policy, start, sweeping

SERVICE_IP = "10.96.0.12"


class FakeDns:
    """Names to addresses; a name it does not hold does not resolve. ``asked``:
    the lookups made, in order."""

    def __init__(self, names):
        self.names = dict(names)
        self.asked: list[str] = []

    def __call__(self, host):
        self.asked.append(host)
        if host not in self.names:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.names[host]


DNS = {
    "redis.prod.svc": [SERVICE_IP],
    "redis.prod.svc.cluster.local": [SERVICE_IP],
    "localhost": ["127.0.0.1", "::1"],
    "other.prod.svc": ["10.96.0.99"],
}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def resolver(names=DNS, **kwargs):
    return HostResolver(lookup=FakeDns(names), **kwargs)


def same(url_a, url_b, hosts=None):
    return same_server(redis_endpoint(url_a), redis_endpoint(url_b), hosts or resolver())


NAMED_TWO_WAYS = [
    ("redis://redis.prod.svc:6379/0", f"redis://{SERVICE_IP}:6379/0"),  # a host name and its IP
    ("redis://redis.prod.svc:6379/0", "redis://redis.prod.svc.cluster.local:6379/0"),  # short, FQDN
    ("redis://localhost:6379/0", "redis://127.0.0.1:6379/0"),  # {127.0.0.1, ::1} and 127.0.0.1
    ("redis://localhost:6379/0", "redis://[::1]:6379/0"),
    ("redis://[::ffff:127.0.0.1]:6379", "redis://127.0.0.1:6379/0"),  # one address spelt two ways
    ("rediss://redis.prod.svc.cluster.local:6379/0", f"redis://{SERVICE_IP}:6379/0"),  # and a scheme
]


@pytest.mark.parametrize("mine, theirs", NAMED_TWO_WAYS)
def test_one_server_named_two_ways_is_the_same_server(mine, theirs):
    assert same(mine, theirs) is True
    assert same(theirs, mine) is True


def test_the_scheme_is_no_part_of_the_endpoint():
    """A port speaks TLS or not, never both."""
    assert same("rediss://redis.prod.svc:6379/0", "redis://redis.prod.svc:6379/0") is True


@pytest.mark.parametrize("mine, theirs", [
    ("redis://redis.prod.svc:6379/0", "redis://other.prod.svc:6379/0"),  # other addresses
    ("redis://redis.prod.svc:6379/0", f"redis://{SERVICE_IP}:6380/0"),  # another port
    ("redis://redis.prod.svc:6379/0", f"redis://{SERVICE_IP}:6379/1"),  # another database
    ("redis://nowhere.example:6379/0", f"redis://{SERVICE_IP}:6379/0"),  # a name that does not resolve
    ("redis://nowhere.example:6379/0", "redis://elsewhere.example:6379/0"),  # neither resolves
])
def test_another_server_port_or_database_is_another_redis(mine, theirs):
    assert same(mine, theirs) is False


def test_a_name_that_does_not_resolve_is_compared_as_a_name():
    hosts = resolver()
    assert same("redis://nowhere.example:6379/0", "redis://Nowhere.Example:6379/0", hosts) is True
    assert hosts.lookup.asked == [], "equal names need no lookup"


def test_a_lookup_is_cached_for_its_ttl_and_made_again_after():
    clock = Clock()
    dns = FakeDns(DNS)
    hosts = HostResolver(lookup=dns, ttl=60, clock=clock)
    assert same("redis://redis.prod.svc/0", f"redis://{SERVICE_IP}/0", hosts)
    clock.now += 59
    assert same("redis://redis.prod.svc/0", f"redis://{SERVICE_IP}/0", hosts)
    assert dns.asked == ["redis.prod.svc"], "an IP is never looked up; a name once per ttl"
    # The Service is recreated with another IP: seen once the entry expires.
    dns.names["redis.prod.svc"] = ["10.96.0.13"]
    clock.now += 2
    hosts.addresses("redis.prod.svc")  # starts the lookup again, answers the last addresses meanwhile
    wait_for_lookups(hosts)
    assert dns.asked == ["redis.prod.svc", "redis.prod.svc"]
    assert same("redis://redis.prod.svc/0", f"redis://{SERVICE_IP}/0", hosts) is False
    assert same("redis://redis.prod.svc/0", "redis://10.96.0.13/0", hosts) is True


def test_a_failed_lookup_keeps_the_addresses_known_before():
    """A DNS blip must not end a claim: the newer policy would start a second sweeper."""
    clock = Clock()
    dns = FakeDns(DNS)
    hosts = HostResolver(lookup=dns, ttl=60, clock=clock)
    assert same("redis://redis.prod.svc/0", f"redis://{SERVICE_IP}/0", hosts)
    del dns.names["redis.prod.svc"]
    clock.now += 61
    hosts.addresses("redis.prod.svc")
    wait_for_lookups(hosts)
    assert len(dns.asked) == 2
    assert same("redis://redis.prod.svc/0", f"redis://{SERVICE_IP}/0", hosts) is True


def wait_for_lookups(hosts):
    for entry in list(hosts._entries.values()):
        done = entry.lookup_done
        if done is not None:
            assert done.wait(5)


class SlowDns(FakeDns):
    """Lookups block until ``answer`` is set (a DNS server that does not answer)."""

    def __init__(self, names):
        super().__init__(names)
        self.answer = threading.Event()

    def __call__(self, host):
        assert self.answer.wait(10)
        return super().__call__(host)


def test_a_slow_dns_is_waited_for_only_a_moment_and_then_cannot_be_told():
    dns = SlowDns(DNS)
    hosts = HostResolver(lookup=dns, wait=0.05)
    assert hosts.addresses("redis.prod.svc") is PENDING
    assert same("redis://redis.prod.svc/0", f"redis://{SERVICE_IP}/0", hosts) is None
    dns.answer.set()
    wait_for_lookups(hosts)
    assert same("redis://redis.prod.svc/0", f"redis://{SERVICE_IP}/0", hosts) is True
    assert dns.asked == ["redis.prod.svc"], "one lookup in flight per name"


# -- the claim ---------------------------------------------------------------

def two_policies(older_url, newer_url, dns=None):
    older = policy("emails", "u-1", "2026-12-01T10:00:00Z", {"url": older_url})
    newer = policy("emails-dup", "u-2", "2026-12-01T10:05:00Z", {"url": newer_url}, max_stalled=10)
    apps, ctl = start(older, newer)
    ctl.redis_hosts = HostResolver(lookup=dns or FakeDns(DNS))
    return apps, ctl, older, newer


@pytest.mark.parametrize("older_url, newer_url", NAMED_TWO_WAYS)
def test_the_newer_policy_of_a_queue_on_one_server_named_two_ways_is_claimed(older_url, newer_url):
    apps, ctl, older, newer = two_policies(older_url, newer_url)
    assert sweeping(ctl, older).ok
    outcome = reconcile(ctl, copy.deepcopy(newer))
    assert (outcome.ok, outcome.reason, outcome.claimed_by) == (False, "QueueClaimed", ("ns", "emails"))
    assert "the older StalledPolicy ns/emails" in outcome.message
    assert apps.of("emails-dup-sweeper").stored is None
    ctl.sync(key_of(newer))
    assert newer_state(ctl).reason == "QueueClaimed"


def test_a_name_that_does_not_resolve_is_another_redis_than_an_ip():
    apps, ctl, older, newer = two_policies("redis://nowhere.example:6379/0", f"redis://{SERVICE_IP}:6379/0")
    assert sweeping(ctl, older).ok
    assert reconcile(ctl, copy.deepcopy(newer)).ok


def test_a_name_not_looked_up_yet_starts_no_sweeper_until_it_is():
    dns = SlowDns(DNS)
    apps, ctl, older, newer = two_policies("redis://redis.prod.svc:6379/0", f"redis://{SERVICE_IP}:6379/0", dns)
    ctl.redis_hosts.wait = 0.05
    assert sweeping(ctl, older).ok
    outcome = reconcile(ctl, copy.deepcopy(newer))
    assert (outcome.reason, outcome.claimed_by) == ("QueueClaimed", None)
    assert "a host name not looked up yet" in outcome.message
    assert apps.of("emails-dup-sweeper").stored is None
    dns.answer.set()
    wait_for_lookups(ctl.redis_hosts)
    ctl.sync(key_of(newer))
    assert newer_state(ctl).claimed_by == ("ns", "emails")
    assert apps.of("emails-dup-sweeper").stored is None


# -- a short host name is a Service of the policy's namespace -------------------

SHORT_NAMES = {"redis.team-a.svc": ["10.96.1.1"], "redis.team-b.svc": ["10.96.2.2"],
               "redis.team-a.svc.cluster.local": ["10.96.1.1"]}


def in_namespaces(older_ns, older_url, newer_ns, newer_url, names=SHORT_NAMES):
    older = policy("emails", "u-1", "2026-12-01T10:00:00Z", {"url": older_url}, namespace=older_ns)
    newer = policy("emails-dup", "u-2", "2026-12-01T10:05:00Z", {"url": newer_url}, namespace=newer_ns)
    apps, ctl = start(older, newer)
    ctl.redis_hosts = HostResolver(lookup=FakeDns(names))
    assert sweeping(ctl, older).ok
    return reconcile(ctl, copy.deepcopy(newer))


def test_one_short_host_name_in_two_namespaces_is_two_redis():
    """Each sweeper pod resolves ``redis`` in its own namespace. Before, the equal
    names held the newer policy back from a Redis it does not share."""
    assert in_namespaces("team-a", "redis://redis:6379/0", "team-b", "redis://redis:6379/0").ok


@pytest.mark.parametrize("names", [SHORT_NAMES, {}], ids=["resolved", "no DNS"])
def test_a_short_host_name_is_the_service_of_its_namespace(names):
    outcome = in_namespaces("team-a", "redis://redis:6379/0", "team-a", "redis://redis.team-a.svc:6379/0",
                            names)
    assert (outcome.reason, outcome.claimed_by) == ("QueueClaimed", ("team-a", "emails"))


def test_a_short_host_name_and_its_fully_qualified_name_in_another_namespace_are_one_redis():
    outcome = in_namespaces("team-a", "redis://redis:6379/0",
                            "team-b", "redis://redis.team-a.svc.cluster.local:6379/0")
    assert (outcome.reason, outcome.claimed_by) == ("QueueClaimed", ("team-a", "emails"))


def test_localhost_is_no_service_name():
    outcome = in_namespaces("team-a", "redis://localhost:6379/0", "team-b", "redis://127.0.0.1:6379/0", DNS)
    assert (outcome.reason, outcome.claimed_by) == ("QueueClaimed", ("team-a", "emails"))


class FlakyDns(FakeDns):
    """A DNS that answers ``failure`` (a gaierror code) until ``healed``."""

    def __init__(self, names, failure):
        super().__init__(names)
        self.failure, self.healed = failure, False

    def __call__(self, host):
        if not self.healed:
            self.asked.append(host)
            raise socket.gaierror(self.failure, "Temporary failure in name resolution")
        return super().__call__(host)


def lookups_ended(hosts):
    for entry in list(hosts._entries.values()):
        lookup_done = entry.lookup_done
        if lookup_done is not None:
            lookup_done.wait(5)


def test_a_dns_failure_that_may_pass_is_cannot_be_told_not_another_redis():
    """EAI_AGAIN on a name's first lookup counted as "does not resolve", so the name
    and its IP were two Redis, and a second sweeper of the queue ran until the
    answer expired (60 s)."""
    clock = Clock()
    dns = FlakyDns(DNS, socket.EAI_AGAIN)
    hosts = HostResolver(lookup=dns, clock=clock)
    mine, theirs = redis_endpoint("redis://redis.prod.svc:6379/0"), redis_endpoint(f"redis://{SERVICE_IP}:6379/0")
    assert same_server(mine, theirs, hosts) is None
    lookups_ended(hosts)
    assert same_server(mine, theirs, hosts) is None  # still not known, not asked again at once
    assert dns.asked == ["redis.prod.svc"]
    dns.healed = True
    clock.now += 5  # asked again soon, not after the 60 s an answer is kept
    same_server(mine, theirs, hosts)
    lookups_ended(hosts)
    assert same_server(mine, theirs, hosts) is True


def test_a_name_the_dns_says_does_not_exist_is_compared_as_a_name():
    hosts = HostResolver(lookup=FlakyDns(DNS, socket.EAI_NONAME))
    mine, theirs = redis_endpoint("redis://redis.prod.svc:6379/0"), redis_endpoint(f"redis://{SERVICE_IP}:6379/0")
    same_server(mine, theirs, hosts)
    lookups_ended(hosts)
    assert same_server(mine, theirs, hosts) is False
