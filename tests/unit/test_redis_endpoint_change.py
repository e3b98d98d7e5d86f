"""Status figures across a change of the policy's Redis endpoint: the figures of the
old Redis are dropped (not shown for the new generation) until the new one is read,
and the new morgue's first reading is a baseline, not a DeadLettered event."""

from __future__ import annotations

import redis

from stalledpolicy.controller.reconcile import reconcile
from stalledpolicy.controller.same_redis_server import HostResolver
from stalledpolicy.controller.status_document import REMOVED, status_json_patch, status_patch
from stalledpolicy.engine import QueueSnapshot
from tests.unit.test_operator_parts import FakeApps, b64, fake_controller, policy_body
from tests.unit.test_same_redis_server import FakeDns

KEY = ("ns", "p")
FIGURES = ("deadLetters", "pending", "active", "recoveredTotal", "deadLetteredTotal", "orphansTotal",
           "quarantinedTotal", "uncountedLapsesTotal", "lanes")


def snap(dead):
    return QueueSnapshot(dead=dead, pending=3, active=1, recovered_total=7, dead_lettered_total=dead,
                         orphans_total=0, quarantined_total=0, lanes=[])


class Cluster:
    """A controller whose Redis servers are a dict url -> morgue size (absent: unreachable)."""

    def __init__(self, spec, secrets=None):
        self.servers = {}
        self.patches = []
        self.ctl = fake_controller(FakeApps(), secrets if secrets is not None else {})
        # no real lookups: these host names resolve nowhere (compared as names)
        self.ctl.redis_hosts = HostResolver(lookup=FakeDns({}))
        outer = self

        class Custom:
            def patch_namespaced_custom_object_status(self, *args, **kwargs):
                outer.patches.append(args[-1])

        self.ctl.custom = Custom()
        self.ctl.snapshot_fn = self.read
        self.generation = 0
        self.apply(spec)

    def read(self, client, queue, lanes):
        if client.url not in self.servers:
            raise redis.ConnectionError(f"Error 111 connecting to {client.url}. Connection refused.")
        return snap(self.servers[client.url])

    def apply(self, spec):
        self.generation += 1
        body = policy_body(spec, generation=self.generation)
        if KEY in self.ctl.policies:  # the status the API server holds, as a watch event has it
            body["status"] = dict(self.ctl.policies[KEY].status_cache.stored or {})
        self.ctl.observe_policy(body, "MODIFIED")
        reconcile(self.ctl, body)

    @property
    def status(self):
        return self.ctl.policies[KEY].status

    def dead_lettered(self):
        return [e[3] for e in self.ctl.recorder.events if e[2] == "DeadLettered"]


def test_a_new_url_drops_the_old_figures_and_its_morgue_is_no_dead_lettering():
    """Before: the unreachable new Redis kept `DEAD 1` from the old one for the new
    generation, and the reachable one after it posted "50 jobs dead-lettered"."""
    cluster = Cluster({"queue": "emails", "redis": {"url": "redis://old:6379/0"}})
    cluster.servers["redis://old:6379/0"] = 1
    cluster.ctl.sync(KEY)
    assert cluster.status["deadLetters"] == 1 and cluster.dead_lettered() == []

    cluster.apply({"queue": "emails", "redis": {"url": "redis://gone:6379/0"}})
    cluster.ctl.sync(KEY)
    status = cluster.status
    assert status["observedGeneration"] == 2
    assert not any(k in status for k in FIGURES), status
    removed = {op["path"] for op in cluster.patches[-1] if op["op"] == "remove"}
    assert removed == {f"/status/{k}" for k in FIGURES}

    cluster.servers["redis://other:6379/0"] = 50
    cluster.apply({"queue": "emails", "redis": {"url": "redis://other:6379/0"}})
    cluster.ctl.sync(KEY)
    assert cluster.status["deadLetters"] == 50 and cluster.dead_lettered() == []
    cluster.servers["redis://other:6379/0"] = 52
    cluster.ctl.sync(KEY)
    assert cluster.dead_lettered() == ["2 jobs dead-lettered in queue emails (morgue now holds 52); "
                                       "inspect with `stalledpolicy morgue list`"]


def test_a_reachable_redis_to_another_reachable_redis_posts_no_dead_lettered():
    cluster = Cluster({"queue": "emails", "redis": {"url": "redis://old:6379/0"}})
    cluster.servers.update({"redis://old:6379/0": 1, "redis://other:6379/0": 50})
    cluster.ctl.sync(KEY)
    cluster.apply({"queue": "emails", "redis": {"url": "redis://other:6379/0"}})
    cluster.ctl.sync(KEY)
    assert cluster.status["deadLetters"] == 50 and cluster.dead_lettered() == []


def test_a_new_url_in_the_secret_drops_the_old_figures_too():
    secrets = {("ns", "creds"): {"url": b64("redis://old:6379/0")}}
    cluster = Cluster({"queue": "emails", "redis": {"secretRef": {"name": "creds", "key": "url"}}}, secrets)
    cluster.servers.update({"redis://old:6379/0": 1, "redis://other:6379/0": 50})
    cluster.ctl.sync(KEY)
    assert cluster.status["deadLetters"] == 1
    secrets[("ns", "creds")] = {"url": b64("redis://other:6379/0")}
    cluster.ctl.sync(KEY)
    assert cluster.status["deadLetters"] == 50 and cluster.dead_lettered() == []
    # An unreadable Secret for a while (the same spec) is no change of Redis: figures kept.
    del secrets[("ns", "creds")]
    cluster.ctl.sync(KEY)
    assert cluster.status["deadLetters"] == 50
    secrets[("ns", "creds")] = {"url": b64("redis://other:6379/0")}
    cluster.servers["redis://other:6379/0"] = 51
    cluster.ctl.sync(KEY)
    assert len(cluster.dead_lettered()) == 1


def test_a_new_password_for_the_same_redis_keeps_the_figures_and_counts_growth():
    """A credentials rotation names the same server and database: not another Redis,
    so the jobs that died meanwhile still raise DeadLettered (before, the whole URL
    was compared and the rotation reset the baseline)."""
    secrets = {("ns", "creds"): {"url": b64("redis://:old-pw@redis:6379/0")}}
    cluster = Cluster({"queue": "emails", "redis": {"secretRef": {"name": "creds", "key": "url"}}}, secrets)
    cluster.servers.update({"redis://:old-pw@redis:6379/0": 1, "redis://user:new-pw@REDIS:6379/0": 3})
    cluster.ctl.sync(KEY)
    secrets[("ns", "creds")] = {"url": b64("redis://user:new-pw@REDIS:6379/0")}
    cluster.ctl.secrets.forget("ns", "creds")
    cluster.ctl.sync(KEY)
    assert cluster.status["deadLetters"] == 3 and len(cluster.dead_lettered()) == 1


def test_the_same_redis_keeps_its_figures_and_counts_growth():
    cluster = Cluster({"queue": "emails", "redis": {"url": "redis://old:6379/0"}})
    cluster.servers["redis://old:6379/0"] = 1
    cluster.ctl.sync(KEY)
    del cluster.servers["redis://old:6379/0"]  # an outage of the same Redis keeps the last figures
    cluster.ctl.sync(KEY)
    assert cluster.status["deadLetters"] == 1
    cluster.servers["redis://old:6379/0"] = 4
    cluster.apply({"queue": "emails", "maxStalled": 3, "redis": {"url": "redis://old:6379/0"}})
    cluster.ctl.sync(KEY)
    assert cluster.status["deadLetters"] == 4 and len(cluster.dead_lettered()) == 1


def test_a_removed_figure_is_a_remove_operation_and_never_in_a_whole_status():
    patch = status_patch({"deadLetters": 1, "observedGeneration": 1}, {"observedGeneration": 2})
    assert patch == {"observedGeneration": 2, "deadLetters": REMOVED}
    assert status_json_patch("u", {"deadLetters": 1}, patch) == [
        {"op": "test", "path": "/metadata/uid", "value": "u"},
        {"op": "add", "path": "/status/observedGeneration", "value": 2},
        {"op": "remove", "path": "/status/deadLetters"}]
    assert status_json_patch(None, {}, patch) == [{"op": "add", "path": "/status",
                                                   "value": {"observedGeneration": 2}}]
