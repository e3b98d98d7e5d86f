"""One sweeper per queue: two policies of the same queue on the same Redis (host,
port, database) are not both swept; the older keeps the queue, the newer is
QueueClaimed (Ready=False, a Warning, no sweeper) until the older goes away."""

from __future__ import annotations

import copy

import pytest

from stalledpolicy.controller.queue_claims import redis_endpoint
from stalledpolicy.controller.reconcile import reconcile
from stalledpolicy.controller.status import condition_of
from tests.unit.test_operator_parts import FakeApps, b64, fake_controller


class ManyApps:
    """A FakeApps per Deployment name (FakeApps itself holds one Deployment)."""

    def __init__(self):
        self.by_name: dict[str, FakeApps] = {}

    def of(self, name) -> FakeApps:
        return self.by_name.setdefault(name, FakeApps())

    def read_namespaced_deployment(self, name, namespace, **kwargs):
        return self.of(name).read_namespaced_deployment(name, namespace, **kwargs)

    def patch_namespaced_deployment(self, name, namespace, body, **kwargs):
        return self.of(name).patch_namespaced_deployment(name, namespace, body, **kwargs)


def policy(name, uid, created, redis, queue="emails", max_stalled=3, namespace="ns"):
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": 1,
                         "resourceVersion": "1", "creationTimestamp": created},
            "spec": {"queue": queue, "maxStalled": max_stalled, "redis": redis}}


SECRETS = {("ns", "creds"): {"url": b64("redis://:s3cret@Redis.Example:6379/0")}}
OLDER = policy("emails", "u-1", "2026-12-01T10:00:00Z", {"url": "redis://redis.example:6379/0"})
# The same Redis through a Secret: another spelling of the host, a password.
NEWER = policy("emails-dup", "u-2", "2026-12-01T10:05:00Z", {"secretRef": {"name": "creds", "key": "url"}},
               max_stalled=10)


def start(*bodies):
    apps = ManyApps()
    ctl = fake_controller(apps, dict(SECRETS))
    for body in bodies:
        ctl.observe_policy(copy.deepcopy(body), "ADDED")
    return apps, ctl


def test_redis_endpoint_is_host_port_and_database():
    assert redis_endpoint("redis://Redis.Example/0") == ("redis.example", 6379, 0)
    assert redis_endpoint("rediss://u:p@10.0.0.1:6380/2") == ("10.0.0.1", 6380, 2)
    assert redis_endpoint("redis://h:6379?db=3") == ("h", 6379, 3)
    assert redis_endpoint("redis://[::1]:7000") == ("::1", 7000, 0)


def test_the_newer_policy_of_a_claimed_queue_gets_no_sweeper_and_says_why():
    apps, ctl = start(OLDER, NEWER)
    assert reconcile(ctl, copy.deepcopy(OLDER)).ok
    outcome = reconcile(ctl, copy.deepcopy(NEWER))
    assert (outcome.ok, outcome.reason) == (False, "QueueClaimed")
    assert "ns/emails" in outcome.message and "older" in outcome.message
    assert apps.of("emails-dup-sweeper").stored is None, "no sweeper for the newer policy"
    assert apps.of("emails-sweeper").stored["spec"]["replicas"] == 1
    [warning] = [e for e in ctl.recorder.events if e[2] == "QueueClaimed"]
    assert warning[0] == "emails-dup" and warning[1] == "Warning"

    ctl.refresh(("ns", "emails-dup"))
    status = ctl.policies[("ns", "emails-dup")].status
    ready, sweeper = condition_of(status, "Ready"), condition_of(status, "SweeperAvailable")
    assert (ready["status"], ready["reason"]) == ("False", "QueueClaimed")
    assert (sweeper["status"], sweeper["reason"]) == ("False", "QueueClaimed")
    assert ctl.metrics.value("stalledpolicy_operator_reconciles_total", result="queue_claimed") == 1
    # Refreshes while the claim holds apply nothing.
    ctl.refresh(("ns", "emails-dup"))
    assert apps.of("emails-dup-sweeper").stored is None


def test_the_newer_policy_takes_the_queue_over_when_the_older_is_deleted():
    apps, ctl = start(OLDER, NEWER)
    reconcile(ctl, copy.deepcopy(OLDER))
    reconcile(ctl, copy.deepcopy(NEWER))
    ctl.observe_policy(copy.deepcopy(OLDER), "DELETED")
    ctl.refresh(("ns", "emails-dup"))
    outcome = ctl.policies[("ns", "emails-dup")].outcome
    assert outcome.ok, outcome
    stored = apps.of("emails-dup-sweeper").stored
    assert stored is not None and stored["spec"]["replicas"] == 1


def test_the_newer_policy_takes_the_queue_over_when_the_older_moves_to_another_redis():
    apps, ctl = start(OLDER, NEWER)
    reconcile(ctl, copy.deepcopy(OLDER))
    reconcile(ctl, copy.deepcopy(NEWER))
    moved = copy.deepcopy(OLDER)
    moved["spec"]["redis"] = {"url": "redis://redis.example:6379/1"}
    moved["metadata"].update(generation=2, resourceVersion="2")
    ctl.observe_policy(moved, "MODIFIED")
    ctl.refresh(("ns", "emails-dup"))
    assert ctl.policies[("ns", "emails-dup")].outcome.ok
    assert apps.of("emails-dup-sweeper").stored is not None


def test_a_sweeper_running_before_the_older_policy_was_seen_is_scaled_to_zero():
    """An operator start sees the policies in any order: the newer one may be applied
    first. Its status loop finds the claim and scales its sweeper to 0 (kept)."""
    apps, ctl = start(NEWER)
    assert reconcile(ctl, copy.deepcopy(NEWER)).ok
    assert apps.of("emails-dup-sweeper").stored["spec"]["replicas"] == 1
    ctl.observe_policy(copy.deepcopy(OLDER), "ADDED")
    reconcile(ctl, copy.deepcopy(OLDER))
    ctl.refresh(("ns", "emails-dup"))
    outcome = ctl.policies[("ns", "emails-dup")].outcome
    assert outcome.reason == "QueueClaimed" and "scaled to 0" in outcome.message
    assert apps.of("emails-dup-sweeper").stored["spec"]["replicas"] == 0
    # Scaled up by hand while the claim holds: back to 0.
    apps.of("emails-dup-sweeper").scale_by_hand(2)
    ctl.observe_deployment(copy.deepcopy(apps.of("emails-dup-sweeper").stored), "MODIFIED")
    ctl.refresh(("ns", "emails-dup"))
    assert apps.of("emails-dup-sweeper").stored["spec"]["replicas"] == 0
    # The claim ends: the policy's spec comes back whole.
    ctl.observe_policy(copy.deepcopy(OLDER), "DELETED")
    ctl.refresh(("ns", "emails-dup"))
    assert ctl.policies[("ns", "emails-dup")].outcome.ok
    assert apps.of("emails-dup-sweeper").stored["spec"]["replicas"] == 1


@pytest.mark.parametrize("other", [
    {"url": "redis://redis.example:6379/1"},  # another database
    {"url": "redis://redis.example:6380/0"},  # another port
    {"url": "redis://other.example:6379/0"},  # another host
])
def test_another_database_port_or_host_is_another_queue(other):
    newer = copy.deepcopy(NEWER)
    newer["spec"]["redis"] = other
    apps, ctl = start(OLDER, newer)
    assert reconcile(ctl, copy.deepcopy(OLDER)).ok
    assert reconcile(ctl, copy.deepcopy(newer)).ok


def test_another_queue_on_the_same_redis_and_a_tie_broken_by_name():
    other_queue = policy("b", "u-3", "2026-12-01T10:05:00Z", OLDER["spec"]["redis"], queue="orders")
    apps, ctl = start(OLDER, other_queue)
    assert reconcile(ctl, copy.deepcopy(other_queue)).ok
    # Created in the same second: the name decides (a before b).
    a = policy("a", "u-4", "2026-12-01T10:00:00Z", OLDER["spec"]["redis"], queue="orders")
    b = copy.deepcopy(other_queue)
    b["metadata"]["creationTimestamp"] = a["metadata"]["creationTimestamp"]
    apps, ctl = start(a, b)
    assert reconcile(ctl, copy.deepcopy(a)).ok
    assert reconcile(ctl, copy.deepcopy(b)).reason == "QueueClaimed"


def test_a_policy_in_another_namespace_claims_the_queue_too():
    newer = copy.deepcopy(NEWER)
    newer["metadata"]["namespace"] = "team-b"
    newer["spec"]["redis"] = {"url": "redis://redis.example/0"}
    apps, ctl = start(OLDER, newer)
    reconcile(ctl, copy.deepcopy(OLDER))
    outcome = reconcile(ctl, copy.deepcopy(newer))
    assert outcome.reason == "QueueClaimed" and "ns/emails" in outcome.message
