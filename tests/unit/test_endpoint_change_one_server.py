"""Whether a policy names another Redis (its status figures dropped) is judged as
the one-sweeper-per-queue claims judge it (same_redis_server.same_server): a Secret
that spells its Redis host another way (``redis`` to
``redis.<namespace>.svc.cluster.local``, or the Service's IP) names the same
server, and keeps the figures. A fake DNS (no real lookups)."""

from __future__ import annotations

import socket

import pytest

from stalledpolicy.controller import status_cache
from stalledpolicy.controller.policy_state import PolicyState
from stalledpolicy.controller.queue_figures import endpoint_changed
from stalledpolicy.controller.redis_clients import SecretReader
from stalledpolicy.controller.same_redis_server import HostResolver
from tests.unit.test_operator_parts import b64
from tests.unit.test_redis_endpoint_change import FIGURES, KEY, Cluster
from tests.unit.test_same_redis_server import FakeDns, FlakyDns, SlowDns, wait_for_lookups

SERVICE_IP = "10.96.0.12"
NAMES = {  # the policy's namespace is "ns"
    "redis.ns.svc": [SERVICE_IP],
    "redis.ns.svc.cluster.local": [SERVICE_IP],
    "other.ns.svc": ["10.96.0.99"],
}
SHORT = "redis://redis:6379/0"


@pytest.fixture
def dns():
    return FakeDns(NAMES)


def on_secret(url, dns):
    """A policy reading its Redis URL from a Secret, its controller's host names
    answered by ``dns`` (the cache the claims and the status loop share)."""
    secrets = {("ns", "creds"): {"url": b64(url)}}
    cluster = Cluster({"queue": "emails", "redis": {"secretRef": {"name": "creds", "key": "url"}}}, secrets)
    cluster.ctl.redis_hosts = HostResolver(lookup=dns)
    return cluster, secrets


@pytest.mark.parametrize("new_url", [
    "redis://redis.ns.svc.cluster.local:6379/0",  # the FQDN of the Service
    f"redis://{SERVICE_IP}:6379/0",  # its IP
    "rediss://redis.ns.svc:6379/0",  # the name a pod of the namespace completes it to
])
def test_a_secret_spelling_its_redis_host_another_way_keeps_the_figures(dns, new_url):
    """Before, the names were compared as written: the figures were dropped, and
    the jobs dead-lettered meanwhile raised no DeadLettered (a new baseline)."""
    cluster, secrets = on_secret(SHORT, dns)
    cluster.servers.update({SHORT: 1, new_url: 3})
    cluster.ctl.sync(KEY)
    assert cluster.status["deadLetters"] == 1
    secrets[("ns", "creds")] = {"url": b64(new_url)}
    cluster.ctl.sync(KEY)
    assert cluster.status["deadLetters"] == 3
    assert not [op for op in cluster.patches[-1] if op["op"] == "remove"], cluster.patches[-1]
    assert cluster.dead_lettered() == ["2 jobs dead-lettered in queue emails (morgue now holds 3); "
                                       "inspect with `stalledpolicy morgue list`"]
    assert "redis" not in dns.asked, "a short name is the policy's namespace's Service, not the operator's"


def test_a_secret_naming_another_server_still_drops_the_figures(dns):
    cluster, secrets = on_secret(SHORT, dns)
    cluster.servers[SHORT] = 1
    cluster.ctl.sync(KEY)
    secrets[("ns", "creds")] = {"url": b64("redis://other.ns.svc:6379/0")}  # unreachable: nothing read
    cluster.ctl.sync(KEY)
    assert not any(k in cluster.status for k in FIGURES), cluster.status
    cluster.servers["redis://other.ns.svc:6379/0"] = 50
    cluster.ctl.sync(KEY)
    assert cluster.status["deadLetters"] == 50 and cluster.dead_lettered() == []


# -- endpoint_changed itself ----------------------------------------------------

def judge(hosts):
    """endpoint_changed of one policy (ns/p) whose spec.redis.url is the argument,
    the endpoint it judges remembered as a refresh remembers it."""
    state = PolicyState(KEY, {})
    secrets = SecretReader(lambda ns, name: None, ttl=0)

    def changed(url):
        verdict, endpoint = endpoint_changed(state.status_cache.redis_endpoint, KEY[0], {"redis": {"url": url}},
                                             secrets, hosts)
        status_cache.endpoint_read(state, endpoint, verdict)
        return verdict

    return state, changed


def test_one_server_named_two_ways_is_no_change():
    state, changed = judge(HostResolver(lookup=FakeDns(NAMES)))
    assert changed(SHORT) is False  # the first refresh: nothing to compare with
    assert changed("redis://redis.ns.svc.cluster.local:6379/0") is False
    assert changed(f"redis://{SERVICE_IP}:6379/0") is False
    assert changed("redis://other.ns.svc:6379/0") is True
    assert changed("redis://other.ns.svc:6379/1") is True  # another database
    assert changed("redis://nowhere.example:6379/1") is True  # a name that does not resolve
    assert state.status_cache.redis_endpoint[1] == ("nowhere.example", 6379, 1)


def test_a_name_not_looked_up_yet_is_no_change_until_it_is():
    """"Cannot be told" keeps the figures and the endpoint they came from: the
    refresh after the lookup judges again, and drops them if it is another Redis."""
    dns = SlowDns(NAMES)
    hosts = HostResolver(lookup=dns, wait=0)
    state, changed = judge(hosts)
    assert changed(SHORT) is False
    known = state.status_cache.redis_endpoint
    assert changed("redis://other.ns.svc:6379/0") is False
    assert state.status_cache.redis_endpoint == known
    dns.answer.set()
    wait_for_lookups(hosts)
    assert changed("redis://other.ns.svc:6379/0") is True
    assert state.status_cache.redis_endpoint[1] == ("other.ns.svc", 6379, 0)
    assert changed("redis://other.ns.svc:6379/0") is False


def test_a_name_not_looked_up_yet_that_is_the_same_server_is_no_change_after_either():
    dns = SlowDns(NAMES)
    hosts = HostResolver(lookup=dns, wait=0)
    state, changed = judge(hosts)
    assert changed(SHORT) is False
    assert changed(f"redis://{SERVICE_IP}:6379/0") is False
    dns.answer.set()
    wait_for_lookups(hosts)
    assert changed(f"redis://{SERVICE_IP}:6379/0") is False
    assert state.status_cache.redis_endpoint[1] == (SERVICE_IP, 6379, 0), "the new spelling, compared as written next"


def test_a_dns_failure_that_may_pass_is_no_change():
    dns = FlakyDns(NAMES, socket.EAI_AGAIN)
    state, changed = judge(HostResolver(lookup=dns))
    assert changed(SHORT) is False
    known = state.status_cache.redis_endpoint
    assert changed("redis://other.ns.svc:6379/0") is False
    assert state.status_cache.redis_endpoint == known

