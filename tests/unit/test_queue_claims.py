"""One sweeper per queue: two policies of the same queue on the same Redis (host,
port, database) are not both swept; the older keeps the queue, the newer is
QueueClaimed (Ready=False, a Warning, no sweeper) until the older goes away."""

from __future__ import annotations

import copy
import socket

import pytest
import redis

from stalledpolicy.controller.queue_claims import redis_endpoint
from stalledpolicy.controller.reconcile import reconcile
from stalledpolicy.controller.same_redis_server import HostResolver
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


class Secrets(dict):
    """The Secrets the API server holds; ``down``: the names whose read fails (the
    API server down or refusing)."""

    down: set = set()

    def get(self, key, default=None):
        if key[1] in self.down or "*" in self.down:
            raise ConnectionError("API server unreachable")
        return super().get(key, default)


def no_dns(host):
    """No real DNS in unit tests: every name other than an IP does not resolve
    (compared as a name); test_same_redis_server.py resolves names."""
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


def start(*bodies):
    apps = ManyApps()
    ctl = fake_controller(apps, Secrets(SECRETS))
    ctl.redis_hosts = HostResolver(lookup=no_dns)
    ctl.store = ctl.secrets._read.__closure__[0].cell_contents  # the Secrets fake_controller reads
    for body in bodies:
        ctl.observe_policy(copy.deepcopy(body), "ADDED")
    return apps, ctl


def sweeping(ctl, body):
    """Reconcile ``body`` and read its queue once: a policy that sweeps, as far as
    the operator can tell (its Redis read by a refresh of this process)."""
    outcome = reconcile(ctl, copy.deepcopy(body))
    ctl.sync(key_of(body))
    return outcome


def refresh_rounds(ctl, *bodies, rounds):
    """``rounds`` status refreshes of each policy of ``bodies``, in that order."""
    for _ in range(rounds):
        for body in bodies:
            ctl.sync(key_of(body))


def key_of(body):
    return body["metadata"]["namespace"], body["metadata"]["name"]


def newer_state(ctl):
    return ctl.policies[key_of(NEWER)].outcome


def test_redis_endpoint_is_host_port_and_database():
    assert redis_endpoint("redis://Redis.Example/0") == ("redis.example", 6379, 0)
    assert redis_endpoint("rediss://u:p@10.0.0.1:6380/2") == ("10.0.0.1", 6380, 2)
    assert redis_endpoint("redis://h:6379?db=3") == ("h", 6379, 3)
    assert redis_endpoint("redis://[::1]:7000") == ("::1", 7000, 0)


def test_the_database_of_an_endpoint_is_the_one_redis_py_connects_to():
    """redis-py takes ``?db=`` over the path: /0?db=3 is database 3, the same
    queue as /3 (two sweepers raced on it with two budgets), and not the queue
    of /0 (held back, it was swept by no one)."""
    for url in ("redis://h/0?db=3", "redis://h/3", "redis://h?db=3", "redis://h/?db=3"):
        connected = redis.Redis.from_url(url).connection_pool.connection_kwargs["db"]
        assert redis_endpoint(url) == ("h", 6379, connected) == ("h", 6379, 3), url
    assert redis_endpoint("redis://h/0?db=x") is None


def test_the_newer_policy_of_a_claimed_queue_gets_no_sweeper_and_says_why():
    apps, ctl = start(OLDER, NEWER)
    assert sweeping(ctl, OLDER).ok
    outcome = reconcile(ctl, copy.deepcopy(NEWER))
    assert (outcome.ok, outcome.reason) == (False, "QueueClaimed")
    assert "ns/emails" in outcome.message and "older" in outcome.message
    assert apps.of("emails-dup-sweeper").stored is None, "no sweeper for the newer policy"
    assert apps.of("emails-sweeper").stored["spec"]["replicas"] == 1
    [warning] = [e for e in ctl.recorder.events if e[2] == "QueueClaimed"]
    assert warning[0] == "emails-dup" and warning[1] == "Warning"

    ctl.sync(("ns", "emails-dup"))
    status = ctl.policies[("ns", "emails-dup")].status
    ready, sweeper = condition_of(status, "Ready"), condition_of(status, "SweeperAvailable")
    assert (ready["status"], ready["reason"]) == ("False", "QueueClaimed")
    assert (sweeper["status"], sweeper["reason"]) == ("False", "QueueClaimed")
    assert ctl.metrics.value("stalledpolicy_operator_reconciles_total", result="queue_claimed") == 1
    # Refreshes while the claim holds apply nothing.
    ctl.sync(("ns", "emails-dup"))
    assert apps.of("emails-dup-sweeper").stored is None


def test_the_newer_policy_takes_the_queue_over_when_the_older_is_deleted():
    apps, ctl = start(OLDER, NEWER)
    sweeping(ctl, OLDER)
    reconcile(ctl, copy.deepcopy(NEWER))
    ctl.observe_policy(copy.deepcopy(OLDER), "DELETED")
    ctl.sync(("ns", "emails-dup"))
    outcome = ctl.policies[("ns", "emails-dup")].outcome
    assert outcome.ok, outcome
    stored = apps.of("emails-dup-sweeper").stored
    assert stored is not None and stored["spec"]["replicas"] == 1
    # the QueueClaimed Warning is followed by news that it ended
    kinds = [(e[1], e[2]) for e in ctl.recorder.events if e[0] == "emails-dup"]
    assert kinds[-2:] == [("Warning", "QueueClaimed"), ("Normal", "QueueReleased")], kinds
    [released] = [e[3] for e in ctl.recorder.events if e[2] == "QueueReleased"]
    assert released == "queue emails is no longer claimed by ns/emails: this policy's sweeper Deployment is applied"


def test_when_the_owner_goes_only_the_oldest_waiting_policy_takes_the_queue_over():
    """Three policies of one queue: the owner deleted, both held-back ones took
    the queue over at once, and the youngest's sweeper ran a pass beside the
    other's before it was scaled to 0 again (reviewer's reproduction)."""
    youngest = policy("emails-third", "u-3", "2026-12-01T10:09:00Z", {"url": "redis://redis.example:6379/0"})
    apps, ctl = start(OLDER, NEWER, youngest)
    sweeping(ctl, OLDER)
    for body in (NEWER, youngest):
        reconcile(ctl, copy.deepcopy(body))
        ctl.sync(key_of(body))
    ctl.observe_policy(copy.deepcopy(OLDER), "DELETED")
    # the youngest is checked first: it must wait for the one older than it
    ctl.sync(key_of(youngest))
    ctl.sync(key_of(NEWER))
    assert apps.of("emails-third-sweeper").stored is None, "the youngest started a sweeper too"
    assert ctl.policies[key_of(youngest)].outcome.reason == "QueueClaimed"
    assert newer_state(ctl).ok and apps.of("emails-dup-sweeper").stored["spec"]["replicas"] == 1
    refresh_rounds(ctl, youngest, NEWER, rounds=2)
    outcome = ctl.policies[key_of(youngest)].outcome
    assert (outcome.reason, outcome.claimed_by) == ("QueueClaimed", key_of(NEWER))
    assert apps.of("emails-third-sweeper").stored is None


def test_an_operator_restart_posts_no_new_warning_for_a_policy_still_held_back():
    """After a restart the claim cannot be told until the older policy is
    refreshed: each held-back policy got a Warning saying so, then a second one
    when the claim was known again; nothing had changed."""
    _, first = start(OLDER, NEWER)
    sweeping(first, OLDER)
    reconcile(first, copy.deepcopy(NEWER))
    first.sync(key_of(NEWER))
    status = first.policies[key_of(NEWER)].status
    recorded = condition_of(status, "Ready")
    assert recorded["reason"] == "QueueClaimed"

    older_as_stored = {**copy.deepcopy(OLDER), "status": first.policies[key_of(OLDER)].status}
    newer_as_stored = {**copy.deepcopy(NEWER), "status": status}
    apps, ctl = start(older_as_stored, newer_as_stored)  # the restarted operator
    # the older policy's sweeper still runs
    apps.of("emails-sweeper").stored = copy.deepcopy(first.apps.of("emails-sweeper").stored)
    outcome = reconcile(ctl, copy.deepcopy(newer_as_stored))  # before the older policy's first refresh
    assert (outcome.reason, outcome.message) == ("QueueClaimed", recorded["message"])
    sweeping(ctl, older_as_stored)
    refresh_rounds(ctl, newer_as_stored, rounds=2)
    assert newer_state(ctl).claimed_by == key_of(OLDER)
    assert condition_of(ctl.policies[key_of(NEWER)].status, "Ready")["message"] == recorded["message"]
    assert [e for e in ctl.recorder.events if e[2] == "QueueClaimed"] == []
    assert apps.of("emails-dup-sweeper").stored is None


def test_many_held_back_policies_are_each_judged_once(monkeypatch):
    """Each held-back rival's own claim was judged again for every newer policy
    asking: 2^(N-1) judgements, seconds at 20 policies of one queue."""
    from stalledpolicy.controller import queue_claims

    waiting = [policy(f"q{i:02d}", f"u-w{i}", f"2026-12-01T11:{i:02d}:00Z", {"url": "redis://redis.example:6379/0"})
               for i in range(16)]
    apps, ctl = start(OLDER, *waiting)
    sweeping(ctl, OLDER)
    for body in waiting:
        reconcile(ctl, copy.deepcopy(body))
        ctl.sync(key_of(body))
    ctl.observe_policy(copy.deepcopy(OLDER), "DELETED")
    calls = []
    real = queue_claims.claim_of
    monkeypatch.setattr(queue_claims, "claim_of", lambda *a, **k: calls.append(1) or real(*a, **k))
    claim = queue_claims.claim_of(ctl, ctl.policies[key_of(waiting[-1])].body)
    assert claim.verdict == queue_claims.UNKNOWN and claim.owner == key_of(waiting[0])
    assert len(calls) <= len(waiting) + 1


def test_the_newer_policy_takes_the_queue_over_when_the_older_moves_to_another_redis():
    apps, ctl = start(OLDER, NEWER)
    sweeping(ctl, OLDER)
    reconcile(ctl, copy.deepcopy(NEWER))
    moved = copy.deepcopy(OLDER)
    moved["spec"]["redis"] = {"url": "redis://redis.example:6379/1"}
    moved["metadata"].update(generation=2, resourceVersion="2")
    ctl.observe_policy(moved, "MODIFIED")
    ctl.sync(("ns", "emails-dup"))
    assert ctl.policies[("ns", "emails-dup")].outcome.ok
    assert apps.of("emails-dup-sweeper").stored is not None


def test_a_sweeper_running_before_the_older_policy_was_seen_is_scaled_to_zero():
    """An operator start sees the policies in any order: the newer one may be applied
    first. Its status loop finds the claim and scales its sweeper to 0 (kept)."""
    apps, ctl = start(NEWER)
    assert reconcile(ctl, copy.deepcopy(NEWER)).ok
    assert apps.of("emails-dup-sweeper").stored["spec"]["replicas"] == 1
    ctl.observe_policy(copy.deepcopy(OLDER), "ADDED")
    sweeping(ctl, OLDER)
    ctl.sync(("ns", "emails-dup"))
    outcome = ctl.policies[("ns", "emails-dup")].outcome
    assert outcome.reason == "QueueClaimed" and "scaled to 0" in outcome.message
    assert apps.of("emails-dup-sweeper").stored["spec"]["replicas"] == 0
    # Scaled up by hand while the claim holds: back to 0.
    apps.of("emails-dup-sweeper").scale_by_hand(2)
    ctl.observe_deployment(copy.deepcopy(apps.of("emails-dup-sweeper").stored), "MODIFIED")
    ctl.sync(("ns", "emails-dup"))
    assert apps.of("emails-dup-sweeper").stored["spec"]["replicas"] == 0
    # The claim ends: the policy's spec comes back whole.
    ctl.observe_policy(copy.deepcopy(OLDER), "DELETED")
    ctl.sync(("ns", "emails-dup"))
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
    assert sweeping(ctl, a).ok
    assert reconcile(ctl, copy.deepcopy(b)).reason == "QueueClaimed"


def test_a_policy_in_another_namespace_claims_the_queue_too_and_is_not_named():
    """The claim's message is in team-b's status and events: it does not name a
    policy of another namespace (its readers may not see that namespace)."""
    newer = copy.deepcopy(NEWER)
    newer["metadata"]["namespace"] = "team-b"
    newer["spec"]["redis"] = {"url": "redis://redis.example/0"}
    apps, ctl = start(OLDER, newer)
    sweeping(ctl, OLDER)
    apps.of("emails-dup-sweeper").stored = None
    ctl.observe_deployment(copy.deepcopy(apps.of("emails-sweeper").stored), "ADDED")
    outcome = reconcile(ctl, copy.deepcopy(newer))
    assert outcome.reason == "QueueClaimed"
    assert "an older StalledPolicy in another namespace (kubectl get stalledpolicies -A)" in outcome.message
    assert "ns/" not in outcome.message and "emails " not in outcome.message.replace("queue emails ", "")
    ctl.sync(key_of(newer))
    status = ctl.policies[key_of(newer)].status
    assert "ns/emails" not in str(status)
    assert all("ns/emails" not in e[3] for e in ctl.recorder.events if e[0] == "emails-dup")


# -- an unknown claim moves nothing ------------------------------------------

OLDER_BY_SECRET = policy("emails", "u-1", "2026-12-01T10:00:00Z", {"secretRef": {"name": "old-creds", "key": "url"}})


@pytest.mark.parametrize("down", ["creds", "old-creds", "*"])
def test_an_api_blip_keeps_a_claimed_policy_claimed(down):
    """The endpoint of either policy cannot be read (the API server down, a Secret
    unreadable): unknown, not "no longer claimed". Before, the newer policy's
    sweeper was applied (a second sweeper with another budget) and scaled to 0 again
    at the next refresh, on every blip."""
    apps, ctl = start(OLDER_BY_SECRET, NEWER)
    store = ctl.store
    store[("ns", "old-creds")] = b64_url("redis://:s3cret@redis.example:6379/0")
    sweeping(ctl, OLDER_BY_SECRET)
    assert reconcile(ctl, copy.deepcopy(NEWER)).reason == "QueueClaimed"
    store.down = {down}
    for _ in range(3):
        ctl.sync(key_of(NEWER))
        assert newer_state(ctl).reason == "QueueClaimed"
        assert newer_state(ctl).claimed_by == ("ns", "emails")
    assert apps.of("emails-dup-sweeper").stored is None, "no sweeper started on a blip"
    # A kopf retry or update while it cannot be told: still held back.
    assert reconcile(ctl, copy.deepcopy(NEWER)).reason == "QueueClaimed"
    assert apps.of("emails-dup-sweeper").stored is None
    store.down = set()
    ctl.sync(key_of(NEWER))
    assert newer_state(ctl).reason == "QueueClaimed"


def test_an_unknown_claim_keeps_a_running_sweeper_and_starts_none():
    apps, ctl = start(NEWER)
    assert sweeping(ctl, NEWER).ok
    store = ctl.store
    store[("ns", "old-creds")] = b64_url("redis://:s3cret@redis.example:6379/0")
    ctl.observe_policy(copy.deepcopy(OLDER_BY_SECRET), "ADDED")
    store.down = {"old-creds"}
    sweeping(ctl, OLDER_BY_SECRET)
    ctl.sync(key_of(NEWER))
    assert newer_state(ctl).ok and apps.of("emails-dup-sweeper").stored["spec"]["replicas"] == 1
    # A policy the operator has not reconciled a sweeper for yet starts none.
    third = policy("emails-3", "u-3", "2026-12-01T10:09:00Z", {"secretRef": {"name": "creds", "key": "url"}})
    ctl.observe_policy(copy.deepcopy(third), "ADDED")
    store.down = {"creds"}
    outcome = reconcile(ctl, copy.deepcopy(third))
    assert outcome.reason == "QueueClaimed" and "cannot be told" in outcome.message
    assert apps.of("emails-3-sweeper").stored is None


def test_an_older_policy_not_yet_refreshed_since_start_holds_back_a_new_sweeper():
    """An operator start: the older policy is reconciled, its queue not read yet."""
    apps, ctl = start(OLDER, NEWER)
    assert reconcile(ctl, copy.deepcopy(OLDER)).ok
    outcome = reconcile(ctl, copy.deepcopy(NEWER))
    assert outcome.reason == "QueueClaimed" and outcome.claimed_by is None
    assert apps.of("emails-dup-sweeper").stored is None
    ctl.sync(key_of(OLDER))
    ctl.sync(key_of(NEWER))  # known now: held back by the older policy
    assert newer_state(ctl).claimed_by == ("ns", "emails") and "ns/emails" in newer_state(ctl).message


# -- only a policy that sweeps holds a claim ----------------------------------

def changed(body, generation, **spec):
    body = copy.deepcopy(body)
    body["spec"].update(spec)
    body["metadata"].update(generation=generation, resourceVersion=str(100 + generation))
    return body


def test_a_suspended_older_policy_gives_the_queue_up_and_takes_it_back_when_resumed():
    apps, ctl = start(OLDER, NEWER)
    sweeping(ctl, OLDER)
    assert reconcile(ctl, copy.deepcopy(NEWER)).reason == "QueueClaimed"
    suspended = changed(OLDER, 2, suspend=True)
    ctl.observe_policy(copy.deepcopy(suspended), "MODIFIED")
    assert reconcile(ctl, copy.deepcopy(suspended)).ok
    ctl.sync(key_of(NEWER))
    assert newer_state(ctl).ok, newer_state(ctl)
    assert apps.of("emails-dup-sweeper").stored["spec"]["replicas"] == 1
    assert apps.of("emails-sweeper").stored["spec"]["replicas"] == 0
    ctl.sync(key_of(NEWER))  # stays so
    assert newer_state(ctl).ok
    # Resumed: the older policy sweeps again and takes the queue back.
    resumed = changed(OLDER, 3, suspend=False)
    ctl.observe_policy(copy.deepcopy(resumed), "MODIFIED")
    assert reconcile(ctl, copy.deepcopy(resumed)).ok
    ctl.sync(key_of(NEWER))
    assert newer_state(ctl).reason == "QueueClaimed"
    assert apps.of("emails-dup-sweeper").stored["spec"]["replicas"] == 0
    assert apps.of("emails-sweeper").stored["spec"]["replicas"] == 1


def test_an_older_policy_with_no_replicas_holds_no_claim():
    apps, ctl = start(OLDER, NEWER)
    sweeping(ctl, changed(OLDER, 1, sweeper={"replicas": 0}))
    assert reconcile(ctl, copy.deepcopy(NEWER)).ok
    assert apps.of("emails-dup-sweeper").stored["spec"]["replicas"] == 1


def test_an_older_policy_with_an_invalid_spec_holds_a_claim_only_while_its_last_sweeper_runs():
    from stalledpolicy.controller.retry import InvalidPolicy

    invalid = changed(OLDER, 1, maxStalled=-1)
    apps, ctl = start(invalid, NEWER)
    with pytest.raises(InvalidPolicy):
        reconcile(ctl, copy.deepcopy(invalid))
    ctl.sync(key_of(OLDER))
    assert reconcile(ctl, copy.deepcopy(NEWER)).ok, "no sweeper of the older policy: the queue is free"
    # An older policy whose spec turned invalid keeps its last applied sweeper running:
    # that one sweeps, so the queue stays its own.
    apps, ctl = start(OLDER, NEWER)
    sweeping(ctl, OLDER)
    broken = changed(OLDER, 2, maxStalled=-1)
    ctl.observe_policy(copy.deepcopy(broken), "MODIFIED")
    with pytest.raises(InvalidPolicy):
        reconcile(ctl, copy.deepcopy(broken))
    ctl.sync(key_of(OLDER))
    assert reconcile(ctl, copy.deepcopy(NEWER)).reason == "QueueClaimed"


def refusing(ctl, urls):
    """Redis refuses the clients of ``urls`` (a wrong password, say)."""
    import redis

    ok = ctl.__dict__.setdefault("readable_snapshot_fn", ctl.snapshot_fn)

    def snapshot(client, queue, lanes):
        if client.url in urls:
            raise redis.AuthenticationError("invalid username-password pair")
        return ok(client, queue, lanes)

    ctl.snapshot_fn = snapshot


def test_an_older_policy_whose_redis_refuses_it_gives_the_queue_up_after_three_refreshes():
    from stalledpolicy.controller.queue_claims import CLAIM_LOST_AFTER

    apps, ctl = start(OLDER, NEWER)
    sweeping(ctl, OLDER)
    assert reconcile(ctl, copy.deepcopy(NEWER)).reason == "QueueClaimed"
    refusing(ctl, {OLDER["spec"]["redis"]["url"]})
    for _ in range(CLAIM_LOST_AFTER - 1):  # a blip moves nothing
        ctl.sync(key_of(OLDER))
        ctl.sync(key_of(NEWER))
        assert newer_state(ctl).reason == "QueueClaimed"
    ctl.sync(key_of(OLDER))
    ctl.sync(key_of(NEWER))
    assert newer_state(ctl).ok and apps.of("emails-dup-sweeper").stored["spec"]["replicas"] == 1
    # Read again: the older policy takes its queue back at once.
    refusing(ctl, set())
    ctl.sync(key_of(OLDER))
    ctl.sync(key_of(NEWER))
    assert newer_state(ctl).reason == "QueueClaimed"
    assert apps.of("emails-dup-sweeper").stored["spec"]["replicas"] == 0


@pytest.mark.parametrize("secret", ["deleted", "blank"])
def test_an_older_policy_whose_secret_goes_bad_keeps_its_claim(secret):
    """Its running pods keep the URL they started with (secretKeyRef; a configuration
    problem rolls nothing), so it still sweeps: the newer policy must not start a
    second sweeper. Before, SecretNotFound counted as an unreadable queue and after
    three refreshes both swept the queue, for good."""
    from stalledpolicy.controller.queue_claims import CLAIM_LOST_AFTER

    apps, ctl = start(OLDER_BY_SECRET, NEWER)
    store = ctl.store
    store[("ns", "old-creds")] = b64_url("redis://:s3cret@redis.example:6379/0")
    sweeping(ctl, OLDER_BY_SECRET)
    pods_available(ctl, apps, OLDER_BY_SECRET, 1)
    assert reconcile(ctl, copy.deepcopy(NEWER)).reason == "QueueClaimed"
    break_secret(ctl, "old-creds", secret)
    refresh_rounds(ctl, OLDER_BY_SECRET, NEWER, rounds=CLAIM_LOST_AFTER + 2)
    assert newer_state(ctl).reason == "QueueClaimed"
    assert apps.of("emails-dup-sweeper").stored is None


def pods_available(ctl, apps, body, available):
    """The sweeper Deployment of ``body`` as the watch shows it with ``available`` pods."""
    deployment = copy.deepcopy(apps.of(body["metadata"]["name"] + "-sweeper").stored)
    deployment["status"] = {"availableReplicas": available, "readyReplicas": available}
    ctl.observe_deployment(deployment, "MODIFIED")


def break_secret(ctl, name, how):
    if how == "deleted":
        del ctl.store[("ns", name)]
    else:
        ctl.store[("ns", name)] = b64_url("  ")
    ctl.secrets.forget("ns", name)


@pytest.mark.parametrize("secret", ["deleted", "blank"])
def test_an_older_policy_whose_sweeper_cannot_run_for_its_secret_holds_no_claim(secret):
    """Its Secret gives no URL and no pod of its sweeper runs (none can start): it
    held the queue for good, swept by no one, and the newer policy said only that
    the claim "cannot be told". A walkthrough found it with a misspelled Secret."""
    apps, ctl = start(OLDER_BY_SECRET, NEWER)
    ctl.store[("ns", "old-creds")] = b64_url("redis://:s3cret@redis.example:6379/0")
    sweeping(ctl, OLDER_BY_SECRET)
    assert reconcile(ctl, copy.deepcopy(NEWER)).reason == "QueueClaimed"
    break_secret(ctl, "old-creds", secret)
    refresh_rounds(ctl, OLDER_BY_SECRET, NEWER, rounds=1)
    assert newer_state(ctl).ok, newer_state(ctl)
    assert apps.of("emails-dup-sweeper").stored["spec"]["replicas"] == 1

    # Its Secret fixed: it sweeps again and takes the queue back.
    ctl.store[("ns", "old-creds")] = b64_url("redis://:s3cret@redis.example:6379/0")
    ctl.secrets.forget("ns", "old-creds")
    refresh_rounds(ctl, OLDER_BY_SECRET, NEWER, rounds=1)
    assert newer_state(ctl).reason == "QueueClaimed"
    assert apps.of("emails-dup-sweeper").stored["spec"]["replicas"] == 0


def test_a_misspelled_older_secret_from_the_start_does_not_block_the_newer_policy():
    apps, ctl = start(OLDER_BY_SECRET, NEWER)  # ns/old-creds was never created
    sweeping(ctl, OLDER_BY_SECRET)
    assert reconcile(ctl, copy.deepcopy(NEWER)).ok
    assert apps.of("emails-dup-sweeper").stored["spec"]["replicas"] == 1


def test_a_claim_that_cannot_be_told_names_the_older_policy():
    """The message named no policy: which one blocks this one was for the user to find."""
    apps, ctl = start(OLDER_BY_SECRET, NEWER)
    ctl.store[("ns", "old-creds")] = b64_url("redis://:s3cret@redis.example:6379/0")
    sweeping(ctl, OLDER_BY_SECRET)
    pods_available(ctl, apps, OLDER_BY_SECRET, 1)
    break_secret(ctl, "old-creds", "deleted")  # its pods run on, with a URL no one can read now
    ctl.sync(key_of(OLDER_BY_SECRET))
    outcome = reconcile(ctl, copy.deepcopy(NEWER))
    assert outcome.reason == "QueueClaimed" and outcome.claimed_by is None
    assert "may be swept for the older StalledPolicy ns/emails on this Redis" in outcome.message, outcome.message


def test_a_newer_policy_with_a_bad_url_of_its_own_is_held_back_and_says_what_to_fix_first():
    """QueueClaimed said only that the claim "cannot be told", hiding the URL to fix."""
    apps, ctl = start(OLDER, NEWER)
    sweeping(ctl, OLDER)
    # a URL only the operator can judge (the CRD and the model refuse one without a host)
    broken = changed(NEWER, 1, redis={"url": "redis://redis.example:6379/0?protocol=9"})
    ctl.observe_policy(copy.deepcopy(broken), "MODIFIED")
    outcome = reconcile(ctl, copy.deepcopy(broken))
    assert outcome.reason == "QueueClaimed" and outcome.message.startswith("spec.redis.url "), outcome.message
    assert "the older StalledPolicy ns/emails" in outcome.message
    assert apps.of("emails-dup-sweeper").stored is None


def test_a_newer_policy_whose_secret_is_missing_starts_no_sweeper_that_would_run_once_it_is_created():
    """A sweeper applied for it ran as soon as the Secret was created (its pods read
    the URL by secretKeyRef), a second sweeper of the older policy's queue until the
    next refresh."""
    apps, ctl = start(OLDER, NEWER)
    sweeping(ctl, OLDER)
    saved = ctl.store.pop(("ns", "creds"))
    ctl.secrets.forget("ns", "creds")
    outcome = reconcile(ctl, copy.deepcopy(NEWER))
    assert outcome.reason == "QueueClaimed" and outcome.message.startswith("Secret ns/creds"), outcome.message
    assert apps.of("emails-dup-sweeper").stored is None
    ctl.sync(key_of(NEWER))
    assert apps.of("emails-dup-sweeper").stored is None

    ctl.store[("ns", "creds")] = saved  # created: the same Redis as the older policy's
    ctl.sync(key_of(NEWER))
    assert newer_state(ctl).claimed_by == ("ns", "emails"), newer_state(ctl)
    assert apps.of("emails-dup-sweeper").stored is None


def test_a_claim_still_unknown_at_the_next_reconcile_keeps_naming_the_older_policy():
    """The second reconcile dropped the name (and posted a second Warning)."""
    apps, ctl = start(OLDER_BY_SECRET, NEWER)
    ctl.store[("ns", "old-creds")] = b64_url("redis://:s3cret@redis.example:6379/0")
    sweeping(ctl, OLDER_BY_SECRET)
    pods_available(ctl, apps, OLDER_BY_SECRET, 1)
    break_secret(ctl, "old-creds", "deleted")
    ctl.sync(key_of(OLDER_BY_SECRET))
    first = reconcile(ctl, copy.deepcopy(NEWER))
    second = reconcile(ctl, changed(NEWER, 2, maxStalled=11))
    assert "the older StalledPolicy ns/emails on this Redis" in second.message, second.message
    assert first.message == second.message
    assert [e[2] for e in ctl.recorder.events].count("QueueClaimed") == 1


def test_a_redis_both_policies_cannot_read_moves_nothing():
    from stalledpolicy.controller.queue_claims import CLAIM_LOST_AFTER

    apps, ctl = start(OLDER, NEWER)
    sweeping(ctl, OLDER)
    assert reconcile(ctl, copy.deepcopy(NEWER)).reason == "QueueClaimed"
    refusing(ctl, {OLDER["spec"]["redis"]["url"], "redis://:s3cret@Redis.Example:6379/0"})
    refresh_rounds(ctl, OLDER, NEWER, rounds=CLAIM_LOST_AFTER + 2)
    assert newer_state(ctl).reason == "QueueClaimed"
    assert apps.of("emails-dup-sweeper").stored is None


def test_after_an_outage_of_a_redis_both_share_the_older_policy_keeps_the_queue():
    """Both policies fail long enough for the older one to lose its claim; when the
    Redis is back and the newer one happens to be refreshed first, it must not take
    the queue over (the older one's sweeper sweeps again at once): it waits until
    it has read the queue as long as a claim takes to be lost."""
    from stalledpolicy.controller.queue_claims import CLAIM_LOST_AFTER

    apps, ctl = start(OLDER, NEWER)
    sweeping(ctl, OLDER)
    assert reconcile(ctl, copy.deepcopy(NEWER)).reason == "QueueClaimed"
    for _ in range(3):
        ctl.sync(key_of(NEWER))  # read fine while claimed
    refusing(ctl, {OLDER["spec"]["redis"]["url"], "redis://:s3cret@Redis.Example:6379/0"})
    refresh_rounds(ctl, OLDER, NEWER, rounds=CLAIM_LOST_AFTER + 1)
    refusing(ctl, set())
    ctl.sync(key_of(NEWER))  # the newer one first, the older still counted as failing
    ctl.sync(key_of(OLDER))
    for _ in range(CLAIM_LOST_AFTER + 1):
        ctl.sync(key_of(NEWER))
    assert newer_state(ctl).reason == "QueueClaimed"
    assert apps.of("emails-dup-sweeper").stored is None, "no second sweeper, not even for a moment"


# -- the claim checks' cost -----------------------------------------------------

def test_claims_look_only_at_the_queue_s_policies_and_read_secrets_outside_the_status_lock():
    import threading

    apps, ctl = start(OLDER_BY_SECRET, NEWER)
    ctl.store[("ns", "old-creds")] = b64_url("redis://:s3cret@redis.example:6379/0")
    sweeping(ctl, OLDER_BY_SECRET)
    reconcile(ctl, copy.deepcopy(NEWER))

    class Untouchable(dict):
        def get(self, *args):
            raise AssertionError("a policy of another queue was looked at")

    for i in range(50):
        other = policy(f"other-{i}", f"u-o{i}", "2026-12-01T09:00:00Z", OLDER["spec"]["redis"], queue=f"q{i}")
        ctl.observe_policy(other, "ADDED")
        ctl.policies[key_of(other)].body = Untouchable(other)
    assert [s.key for s in ctl.queue_policies("emails")] in ([("ns", "emails"), ("ns", "emails-dup")],
                                                             [("ns", "emails-dup"), ("ns", "emails")])
    lock = ctl.policies[key_of(NEWER)].lock
    held = []
    reader = ctl.secrets._read

    def read(namespace, name):
        if name != "old-creds":
            return reader(namespace, name)
        grabbed = []

        def grab():
            grabbed.append(lock.acquire(timeout=0.5))
            if grabbed[0]:
                lock.release()

        t = threading.Thread(target=grab)
        t.start()
        t.join()
        held.append(not grabbed[0])
        return reader(namespace, name)

    ctl.secrets._read = read
    ctl.sync(key_of(NEWER))
    assert held and not any(held), "a Secret was read holding the policy's status lock"
    assert newer_state(ctl).reason == "QueueClaimed"
    ctl.observe_policy(copy.deepcopy(OLDER), "DELETED")
    assert [s.key for s in ctl.queue_policies("emails")] == [("ns", "emails-dup")]


def b64_url(url):
    return {"url": b64(url)}
