"""The operator's status loop against a real Redis, with the Kubernetes API
replaced by recorders: what it patches, when, and which events it posts."""

from __future__ import annotations

import base64
import json

import pytest
import redis

from stalledpolicy.controller import REPLAY_ANNOTATION, REPLAY_LANE_ANNOTATION
from stalledpolicy.controller.config import OperatorConfig
from stalledpolicy.controller.events import NullRecorder
from stalledpolicy.controller.redis_clients import RedisClients, SecretReader
from stalledpolicy.controller.runtime import Controller
from stalledpolicy.controller.status import ReconcileOutcome, condition_of
from stalledpolicy.devenv.echomq import EchoMQ
from stalledpolicy.keyspace import QueueKeys
from stalledpolicy.lua import script
from tests.redis.test_morgue_cli import another_clients_long_script

pytestmark = pytest.mark.redis


def written_status(ops: list[dict]) -> dict:
    """The status members a status JSON patch sets (each guarded by a test of the uid)."""
    assert ops[0] == {"op": "test", "path": "/metadata/uid", "value": "u-1"}
    written: dict = {}
    for op in ops[1:]:
        assert op["op"] in ("add", "remove")
        if op["op"] == "remove":  # the queue figures of another Redis
            assert "value" not in op and op["path"] != "/status"
            continue
        if op["path"] == "/status":
            written.update(op["value"])
        else:
            written[op["path"].removeprefix("/status/").replace("~1", "/").replace("~0", "~")] = op["value"]
    return written


class StatusSink:
    """Stands in for CustomObjectsApi: records status patches (the members each sets)."""

    def __init__(self):
        self.patches: list[dict] = []

    def patch_namespaced_custom_object_status(self, group, version, namespace, plural, name, body, **_):
        self.patches.append(written_status(body))


class Apps:
    """Enough of AppsV1Api for the re-apply a changed Secret value asks for: the
    sweeper as ``sweeper()`` has it (available), with the applied spec."""

    class Response:
        def __init__(self, obj):
            self.data = json.dumps(obj).encode()

    def __init__(self):
        self.applied: list[dict] = []

    def read_namespaced_deployment(self, name, namespace, **_):
        return self.Response(sweeper())

    def patch_namespaced_deployment(self, name, namespace, body, **_):
        self.applied.append(body)
        stored = sweeper()
        stored["spec"] = body["spec"]
        return self.Response(stored)


def make_controller(secrets: dict, status: StatusSink, recorder: NullRecorder) -> Controller:
    def read(namespace, name):
        return secrets.get((namespace, name))

    return Controller(OperatorConfig(status_interval=1, max_backoff=4), apps=Apps(), core=None,
                      custom=status, recorder=recorder, secrets=SecretReader(read, ttl=0.0),
                      clients=RedisClients(timeout=1.0))


def policy(queue: str, url_secret="creds", annotations=None, generation=1, rv="1"):
    return {
        "apiVersion": "queues.emq.dev/v1alpha1", "kind": "StalledPolicy",
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "generation": generation,
                     "resourceVersion": rv, "annotations": annotations or {}},
        "spec": {"queue": queue, "maxStalled": 1, "lanes": [{"name": "imports"}],
                 "redis": {"secretRef": {"name": url_secret, "key": "url"}}},
    }


def sweeper(generation=1, available=1):
    return {"metadata": {"name": "p-sweeper", "namespace": "ns", "generation": generation,
                         "resourceVersion": "5",
                         "ownerReferences": [{"kind": "StalledPolicy", "name": "p", "uid": "u-1",
                                              "controller": True}]},
            "spec": {"replicas": 1},
            "status": {"observedGeneration": generation, "replicas": 1, "updatedReplicas": 1,
                       "availableReplicas": available, "readyReplicas": available}}


def b64(text):
    return base64.b64encode(text.encode()).decode()


@pytest.fixture
def world(redis_server, r, queue_name):
    secrets = {("ns", "creds"): {"url": b64(redis_server.url)}}
    sink, recorder = StatusSink(), NullRecorder()
    ctl = make_controller(secrets, sink, recorder)
    body = policy(queue_name)
    ctl.observe_policy(body, "ADDED")
    ctl.observe_deployment(sweeper())
    # Applied with this Secret value (its digest in the pod template): no re-apply for it.
    ctl.record_outcome(body, ReconcileOutcome(1, True, "Applied", "applied", deployment_generation=1,
                                              secret_digest=ctl.secret_digest("ns", {"name": "creds"})))
    yield ctl, sink, recorder, body, secrets
    ctl.stop()


def dead_letter(r, queue, job_id):
    keys = QueueKeys(queue)
    r.hset(keys.job(job_id), mapping={"state": "dead", "attempts": "1", "payload": "{}", "stalled": "1",
                                      "last_error": "stalled"})
    r.zadd(keys.dead, {job_id: 0})


def test_first_refresh_publishes_numbers_and_ready(world, r, queue_name):
    ctl, sink, _, _, _ = world
    mq = EchoMQ(r, queue_name)
    mq.enqueue_many(3)
    ctl.sync(("ns", "p"))
    assert len(sink.patches) == 1
    status = sink.patches[0]
    assert status["pending"] == 3 and status["deadLetters"] == 0
    assert condition_of(status, "Ready")["status"] == "True"
    assert status["observedGeneration"] == 1


def test_nothing_changed_means_no_patch(world):
    ctl, sink, _, _, _ = world
    ctl.sync(("ns", "p"))
    ctl.sync(("ns", "p"))
    ctl.sync(("ns", "p"))
    assert len(sink.patches) == 1


def test_a_status_edited_by_hand_is_written_back_and_our_own_is_not_rewritten(world, queue_name):
    ctl, sink, recorder, body, _ = world
    ctl.sync(("ns", "p"))
    [written] = sink.patches
    # the watch brings back our own write: nothing to write (nulls: the all-lanes replay test)
    ctl.observe_policy(policy(queue_name, rv="2") | {"status": json.loads(json.dumps(written))}, "MODIFIED")
    ctl.sync(("ns", "p"))
    assert len(sink.patches) == 1
    # someone wipes the status (kubectl edit --subresource=status): it comes back
    ctl.observe_policy(policy(queue_name, rv="3") | {"status": {"deadLetters": 99}}, "MODIFIED")
    ctl.sync(("ns", "p"))
    assert len(sink.patches) == 2
    restored = sink.patches[-1]
    assert restored["deadLetters"] == written["deadLetters"]
    assert {c["type"] for c in restored["conditions"]} == {c["type"] for c in written["conditions"]}
    assert [e[2] for e in recorder.events].count("DeadLettered") == 0  # no growth announced
    # an event older than what we know changes nothing
    ctl.observe_policy(policy(queue_name, rv="2") | {"status": {}}, "MODIFIED")
    ctl.sync(("ns", "p"))
    assert len(sink.patches) == 2


class AnsweringStatusSink(StatusSink):
    """A StatusSink that answers as the API server does: the policy after the write,
    with a resourceVersion of its own (``versions``: opaque strings, in no order)."""

    def __init__(self, queue: str, versions):
        super().__init__()
        self.queue, self.versions = queue, iter(versions)
        self.written: dict | None = None

    def patch_namespaced_custom_object_status(self, *args, **kwargs):
        super().patch_namespaced_custom_object_status(*args, **kwargs)
        self.written = policy(self.queue, rv=next(self.versions)) | {
            "status": json.loads(json.dumps(self.patches[-1]))}
        return json.loads(json.dumps(self.written))


@pytest.mark.parametrize("late_rv, written_rv, wiped_rv", [
    ("1", "11", "12"), ("2", "11", "12"),
    ("99", "11", "3"),  # versions that order the wrong way as numbers
    ("b7f3", "a0c1", "0d2e")])  # or are no numbers at all
def test_a_watch_event_from_before_our_status_write_does_not_write_it_again(world, queue_name, late_rv,
                                                                             written_rv, wiped_rv):
    """At a cold start the watch delivers events from before our first status write
    after it: kopf's own annotation patch (sent just before the write) or the policy's
    ADDED still queued. They hold no status, yet are no newer than anything we had
    seen: the whole status was written again, the same (2.26 status writes per policy
    at 1,000 policies instead of 2). resourceVersions are opaque: the watch's order
    and the version our write returned tell what is older, never the numbers."""
    ctl, _, _, _, _ = world
    sink = ctl.custom = AnsweringStatusSink(queue_name, [written_rv])
    ctl.sync(("ns", "p"))
    assert len(sink.patches) == 1
    ctl.observe_policy(policy(queue_name, rv=late_rv), "MODIFIED")
    ctl.sync(("ns", "p"))
    assert len(sink.patches) == 1
    # the watch then brings our own write, and after it a status wiped by hand: written back
    ctl.observe_policy(sink.written, "MODIFIED")
    ctl.observe_policy(policy(queue_name, rv=wiped_rv), "MODIFIED")
    ctl.sync(("ns", "p"))
    assert len(sink.patches) == 2


def test_dead_letters_growth_is_patched_and_announced(world, r, queue_name):
    ctl, sink, recorder, _, _ = world
    ctl.sync(("ns", "p"))
    dead_letter(r, queue_name, "JOB0001")
    dead_letter(r, queue_name, "JOB0002")
    ctl.sync(("ns", "p"))
    assert sink.patches[-1]["deadLetters"] == 2
    assert set(sink.patches[-1]) == {"deadLetters", "lastUpdateTime"}
    grown = [e for e in recorder.events if e[2] == "DeadLettered"]
    assert len(grown) == 1 and "2 jobs dead-lettered" in grown[0][3]


def test_uncounted_lapses_are_published_and_announced_as_they_grow(world, r, queue_name):
    """The sweep counts in the queue's totals the lapses another reaper returned
    before it could count them (lib/holds.lua): the status shows the total, and
    its growth is a Warning, not its first reading."""
    ctl, sink, recorder, _, _ = world
    keys = QueueKeys(queue_name)
    r.hincrby(keys.sweeper_totals, "uncounted", 4)
    ctl.sync(("ns", "p"))
    assert sink.patches[-1]["uncountedLapsesTotal"] == 4
    assert [e for e in recorder.events if e[2] == "LapsesUncounted"] == []
    r.hincrby(keys.sweeper_totals, "uncounted", 1)
    ctl.sync(("ns", "p"))
    assert set(sink.patches[-1]) == {"uncountedLapsesTotal", "lastUpdateTime"}
    assert sink.patches[-1]["uncountedLapsesTotal"] == 5
    [warning] = [e for e in recorder.events if e[2] == "LapsesUncounted"]
    assert warning[1] == "Warning"
    assert "1 lapsed lease of queue" in warning[3] and "(5 in total)" in warning[3]
    ctl.sync(("ns", "p"))
    assert len([e for e in recorder.events if e[2] == "LapsesUncounted"]) == 1


def test_missing_secret_then_created(world):
    ctl, sink, recorder, _, secrets = world
    saved = secrets.pop(("ns", "creds"))
    delay = ctl.sync(("ns", "p"))
    ready = condition_of(sink.patches[-1], "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "SecretNotFound")
    assert delay == 1  # looked at again after one interval
    assert ctl.sync(("ns", "p")) == 1  # and every interval: a user creates it, no backoff
    assert len(sink.patches) == 1  # the same problem is not patched again
    assert [e[2] for e in recorder.events].count("SecretNotFound") == 1
    secrets[("ns", "creds")] = saved
    assert ctl.sync(("ns", "p")) == 1
    assert condition_of(sink.patches[-1], "Ready")["status"] == "True"
    assert "RedisReachable" in [e[2] for e in recorder.events]


def test_the_secret_digest_follows_the_url_the_sweeper_uses(world, redis_server):
    """Only a new URL rolls the sweeper: a value saved again with a trailing
    newline (``echo url | kubectl create secret ... --from-file``) is the same URL."""
    ctl, _, _, _, secrets = world
    ref = {"name": "creds"}
    digest = ctl.secret_digest("ns", ref)
    assert digest is not None and redis_server.url.split("//")[-1] not in digest
    secrets[("ns", "creds")] = {"url": b64(redis_server.url + "\n")}
    assert ctl.secret_digest("ns", ref) == digest
    secrets[("ns", "creds")] = {"url": b64(redis_server.url.replace("127.0.0.1", "localhost"))}
    assert ctl.secret_digest("ns", ref) not in (digest, None)
    secrets[("ns", "creds")] = {"url": b64("http://not-redis")}
    assert ctl.secret_digest("ns", ref) is None  # not usable: the pods keep what they have


def test_unreachable_redis_is_a_condition_and_an_event_never_a_password(world):
    ctl, sink, recorder, _, secrets = world
    ctl.sync(("ns", "p"))
    secrets[("ns", "creds")] = {"url": b64("redis://:hunter2@127.0.0.1:1/0")}
    ctl.sync(("ns", "p"))
    redis = condition_of(sink.patches[-1], "RedisReachable")
    assert (redis["status"], redis["reason"]) == ("False", "RedisUnreachable")
    assert "deadLetters" not in ctl.policies[("ns", "p")].status  # another Redis: the old one's figures go
    assert "hunter2" not in str(sink.patches) and "hunter2" not in str(recorder.events)
    assert [e[2] for e in recorder.events].count("RedisUnreachable") == 1


def test_a_server_that_wants_a_password_is_explained_in_our_words(world, redis_server):
    """The condition says what to fix in the Secret, not redis-py's "HELLO must be
    called with the client already authenticated"."""
    ctl, sink, _, _, secrets = world
    redis_server.client().config_set("requirepass", "c0rrect-h0rse")
    try:
        ctl.sync(("ns", "p"))
    finally:
        redis_server.client(password="c0rrect-h0rse").config_set("requirepass", "")
    redis = condition_of(sink.patches[-1], "RedisReachable")
    assert redis["status"] == "False" and "requires a password" in redis["message"], redis
    assert "HELLO" not in redis["message"] and "c0rrect" not in str(sink.patches)
    # Redis answers: no outage (an alert on RedisUnreachable would page its owners)
    assert redis["reason"] == "RedisCredentialsRefused"
    assert condition_of(sink.patches[-1], "Ready")["reason"] == "RedisCredentialsRefused"


def test_a_password_wanted_for_spec_redis_url_points_at_the_secret_ref(redis_server, queue_name):
    """spec.redis.url refuses credentials, so "put them in the URL" would send the
    user round in circles: the advice names spec.redis.secretRef."""
    sink = StatusSink()
    ctl = make_controller({}, sink, NullRecorder())
    body = policy(queue_name)
    body["spec"]["redis"] = {"url": redis_server.url}
    ctl.observe_policy(body, "ADDED")
    ctl.observe_deployment(sweeper())
    ctl.record_outcome(body, ReconcileOutcome(1, True, "Applied", "applied", deployment_generation=1))
    redis_server.client().config_set("requirepass", "c0rrect-h0rse")
    try:
        ctl.sync(("ns", "p"))
    finally:
        redis_server.client(password="c0rrect-h0rse").config_set("requirepass", "")
        ctl.stop()
    redis = condition_of(sink.patches[-1], "RedisReachable")
    assert redis["status"] == "False" and "requires a password" in redis["message"], redis
    assert "spec.redis.secretRef" in redis["message"] and "put them in the URL" not in redis["message"], redis


def test_a_database_the_server_lacks_is_an_invalid_url_not_an_outage(world, redis_server):
    """Redis answered (SELECT 16: 'DB index is out of range'): the URL is wrong, so
    InvalidRedisURL naming the database and the server's own count, not RedisUnreachable."""
    ctl, sink, recorder, _, secrets = world
    ctl.sync(("ns", "p"))
    url = redis_server.url.replace("redis://", "redis://:hunter2@").removesuffix("/0") + "/16"
    secrets[("ns", "creds")] = {"url": b64(url)}
    redis_server.client().config_set("requirepass", "hunter2")
    try:
        ctl.sync(("ns", "p"))
        ctl.sync(("ns", "p"))
    finally:
        redis_server.client(password="hunter2").config_set("requirepass", "")
    reachable = condition_of(sink.patches[-1], "RedisReachable")
    assert (reachable["status"], reachable["reason"]) == ("False", "InvalidRedisURL"), reachable
    assert "database 16" in reachable["message"] and "it has 16" in reachable["message"], reachable
    assert "hunter2" not in str(sink.patches) and "hunter2" not in str(recorder.events)
    assert [e[2] for e in recorder.events].count("InvalidRedisURL") == 1
    assert "RedisUnreachable" not in [e[2] for e in recorder.events]


def test_a_queue_key_redis_refuses_to_read_is_no_outage_and_keeps_the_shared_client(world, r, queue_name,
                                                                                     redis_server):
    """Redis answered (WRONGTYPE: a key of the queue holds another type): not
    RedisUnreachable, and the client, shared by every policy on that Redis, is not
    closed under their feet (a command of theirs in flight would fail)."""
    ctl, sink, recorder, _, _ = world
    ctl.sync(("ns", "p"))
    shared = ctl.clients.client(("ns", "other"), redis_server.url)  # another policy, same Redis
    r.set(QueueKeys(queue_name).dead, "not a sorted set")
    ctl.sync(("ns", "p"))
    reachable = condition_of(sink.patches[-1], "RedisReachable")
    assert (reachable["status"], reachable["reason"]) == ("False", "QueueUnreadable"), reachable
    assert "WRONGTYPE" in reachable["message"] and queue_name in reachable["message"]
    assert ctl.clients.client(("ns", "other"), redis_server.url) is shared
    assert shared.ping()
    assert [e[2] for e in recorder.events].count("QueueUnreadable") == 1
    assert ctl.metrics.value("stalledpolicy_operator_status_refresh_failures_total", reason="QueueUnreadable") == 1


def test_a_spec_change_is_observed_once_its_sync_has_applied_it(world):
    """The status's observedGeneration is the generation applied: a sync applies a
    generation it sees before it writes the status that observes it."""
    ctl, sink, _, body, _ = world
    ctl.sync(("ns", "p"))
    assert sink.patches[-1]["observedGeneration"] == 1
    newer = policy(body["spec"]["queue"], generation=2, rv="2")
    newer["spec"]["maxStalled"] = 2
    ctl.observe_policy(newer, "MODIFIED")
    applied = len(ctl.apps.applied)
    ctl.sync(("ns", "p"))
    assert len(ctl.apps.applied) == applied + 1
    assert ctl.policies[("ns", "p")].outcome.generation == 2
    assert sink.patches[-1]["observedGeneration"] == 2


def test_replay_annotation_replays_once_per_token(world, r, queue_name):
    ctl, sink, recorder, body, secrets = world
    mq = EchoMQ(r, queue_name)
    job = mq.enqueue(group="imports")
    claim = mq.claim(lease_ms=1)
    assert claim is not None and claim.id == job
    mq.expire(claim)
    from stalledpolicy.engine import Budgets, sweep_batch

    assert sweep_batch(r, queue_name, Budgets(default=1), 10).dead_lettered == 1
    ctl.sync(("ns", "p"))
    assert sink.patches[-1]["deadLetters"] == 1

    annotated = policy(queue_name, annotations={REPLAY_ANNOTATION: "first",
                                                REPLAY_LANE_ANNOTATION: "imports"}, rv="9")
    ctl.observe_policy(annotated, "MODIFIED")
    ctl.sync(("ns", "p"))
    last = sink.patches[-1]
    assert last["lastReplay"]["token"] == "first" and last["lastReplay"]["replayed"] == 1
    assert last["lastReplay"]["lane"] == "imports"
    assert last["deadLetters"] == 0
    assert r.zscore(QueueKeys(queue_name).lane_pending("imports"), job) is not None
    assert [e[2] for e in recorder.events].count("Replayed") == 1

    # The same token again (another refresh, an operator restart reading status): no replay.
    dead_letter(r, queue_name, "JOB0009")
    ctl.sync(("ns", "p"))
    assert r.zscore(QueueKeys(queue_name).dead, "JOB0009") is not None
    restarted = make_controller(secrets, StatusSink(), NullRecorder())
    written: dict = {}
    for patch in sink.patches:
        written.update(patch)
    seen = dict(annotated, status=written)
    restarted.observe_policy(seen, "ADDED")
    restarted.observe_deployment(sweeper())
    restarted.record_outcome(seen, ReconcileOutcome(1, True, "Applied", "applied", deployment_generation=1))
    restarted.sync(("ns", "p"))
    restarted.stop()
    assert r.zscore(QueueKeys(queue_name).dead, "JOB0009") is not None


class MergingStatus(StatusSink):
    """The API server's side too: each JSON patch applied to the stored status
    (``add`` sets a member whole), which the next watch event brings back."""

    def __init__(self):
        super().__init__()
        self.stored: dict = {}

    def patch_namespaced_custom_object_status(self, group, version, namespace, plural, name, body, **kw):
        super().patch_namespaced_custom_object_status(group, version, namespace, plural, name, body, **kw)
        for op in body[1:]:
            if op["op"] == "remove":
                self.stored.pop(op["path"].removeprefix("/status/"), None)
                continue
            value = json.loads(json.dumps(op["value"]))
            if op["path"] == "/status":
                self.stored = value
            else:
                self.stored[op["path"].removeprefix("/status/")] = value


def test_an_all_lanes_replay_after_a_lane_replay_shows_no_lane_and_writes_once(redis_server, r, queue_name):
    secrets = {("ns", "creds"): {"url": b64(redis_server.url)}}
    sink = MergingStatus()
    ctl = start(secrets, policy(queue_name, annotations={REPLAY_ANNOTATION: "t1", REPLAY_LANE_ANNOTATION: "imports"}),
                sink)
    rv = [1]

    def refresh(annotations):
        ctl.sync(("ns", "p"))
        rv[0] += 1  # the watch brings back what the server holds
        ctl.observe_policy(policy(queue_name, annotations=annotations, rv=str(rv[0])) | {"status": sink.stored},
                           "MODIFIED")

    try:
        refresh({REPLAY_ANNOTATION: "t1", REPLAY_LANE_ANNOTATION: "imports"})
        assert sink.stored["lastReplay"]["lane"] == "imports"
        everything = {REPLAY_ANNOTATION: "t2"}
        ctl.observe_policy(policy(queue_name, annotations=everything, rv=str(rv[0] + 1)) | {"status": sink.stored},
                           "MODIFIED")
        rv[0] += 1
        refresh(everything)
        assert sink.stored["lastReplay"]["token"] == "t2" and "lane" not in sink.stored["lastReplay"]
        written = len(sink.patches)
        refresh(everything)
        refresh(everything)
        assert len(sink.patches) == written, "the status was written again with nothing new"
    finally:
        ctl.stop()


def test_a_replay_that_leaves_jobs_in_the_morgue_says_which_and_why(world, r, queue_name):
    ctl, sink, recorder, _, _ = world
    keys = QueueKeys(queue_name)
    dead_letter(r, queue_name, "JOB0001")
    r.hset(keys.job("JOB0001"), "group", "imports")  # its lane goes back on the ring: met the bad key
    dead_letter(r, queue_name, "JOB0002")
    r.hset(keys.job("JOB0002"), "state", "active")  # listed as dead, the row says otherwise
    r.set(keys.ring, "oops")
    ctl.observe_policy(policy(queue_name, annotations={REPLAY_ANNOTATION: "t1"}, rv="9"), "MODIFIED")
    ctl.sync(("ns", "p"))
    assert sink.patches[-1]["lastReplay"]["replayed"] == 1
    [(_, kind, reason, message)] = [e for e in recorder.events if e[2] == "ReplayIncomplete"]
    assert kind == "Warning"
    assert "1 job left in the morgue" in message and "JOB0002: state is 'active', not dead" in message
    assert f"{keys.ring} is a string, not a list" in message
    assert r.zrange(keys.dead, 0, -1) == ["JOB0002"]


class LostStatus(StatusSink):
    """An API server that never takes the status write (the operator dies before it lands)."""

    def patch_namespaced_custom_object_status(self, *args, **kwargs):
        raise ConnectionError("the operator died before its status write")


def start(secrets, body, status: StatusSink) -> Controller:
    ctl = make_controller(secrets, status, NullRecorder())
    ctl.observe_policy(body, "ADDED")
    ctl.observe_deployment(sweeper())
    ctl.record_outcome(body, ReconcileOutcome(1, True, "Applied", "applied", deployment_generation=1))
    return ctl


def test_a_replay_whose_status_write_was_lost_is_not_run_again_after_a_restart(redis_server, r, queue_name):
    secrets = {("ns", "creds"): {"url": b64(redis_server.url)}}
    keys = QueueKeys(queue_name)
    dead_letter(r, queue_name, "JOB0001")
    annotated = policy(queue_name, annotations={REPLAY_ANNOTATION: "t1"})

    first = start(secrets, annotated, LostStatus())
    first.sync(("ns", "p"))
    first.stop()
    assert r.zscore(keys.pending, "JOB0001") is not None  # replayed, status never written

    dead_letter(r, queue_name, "JOB0002")  # died after the replay was asked for
    sink = StatusSink()
    restarted = start(secrets, annotated, sink)
    restarted.sync(("ns", "p"))
    restarted.stop()
    assert r.zscore(keys.dead, "JOB0002") is not None
    assert sink.patches[-1]["lastReplay"]["token"] == "t1"
    assert sink.patches[-1]["lastReplay"]["replayed"] == 1

    renewed = start(secrets, policy(queue_name, annotations={REPLAY_ANNOTATION: "t2"}), StatusSink())
    renewed.sync(("ns", "p"))
    renewed.stop()
    assert r.zscore(keys.pending, "JOB0002") is not None


class FailingStatus(StatusSink):
    """An API server that refuses status writes while ``down``."""

    def __init__(self):
        super().__init__()
        self.down = True

    def patch_namespaced_custom_object_status(self, *args, **kwargs):
        if self.down:
            raise ConnectionError("the API server is down")
        super().patch_namespaced_custom_object_status(*args, **kwargs)


def test_two_replays_served_before_one_status_write_are_both_announced(redis_server, r, queue_name):
    secrets = {("ns", "creds"): {"url": b64(redis_server.url)}}
    keys = QueueKeys(queue_name)
    sink, recorder = FailingStatus(), NullRecorder()
    ctl = make_controller(secrets, sink, recorder)
    first = policy(queue_name, annotations={REPLAY_ANNOTATION: "t1"})
    ctl.observe_policy(first, "ADDED")
    ctl.observe_deployment(sweeper())
    ctl.record_outcome(first, ReconcileOutcome(1, True, "Applied", "applied", deployment_generation=1))
    dead_letter(r, queue_name, "JOB0001")
    ctl.sync(("ns", "p"))
    assert r.zscore(keys.pending, "JOB0001") is not None  # replayed; its status write failed
    assert sink.patches == [] and recorder.events == []

    dead_letter(r, queue_name, "JOB0002")
    ctl.observe_policy(policy(queue_name, annotations={REPLAY_ANNOTATION: "t2"}, rv="9"), "MODIFIED")
    sink.down = False
    ctl.sync(("ns", "p"))
    ctl.stop()
    assert r.zscore(keys.pending, "JOB0002") is not None
    assert sink.patches[-1]["lastReplay"]["token"] == "t2"
    replayed = [message for _, _, reason, message in recorder.events if reason == "Replayed"]
    # each once, in the order served (t1's was lost: t2's record took its place)
    assert [message.endswith(f"(token {token!r})") and message.startswith("replayed 1 job ")
            for message, token in zip(replayed, ["t1", "t2"])] == [True, True], recorder.events
    assert len(replayed) == 2, recorder.events


def test_an_unreadable_replay_record_does_not_block_a_replay(redis_server, r, queue_name):
    secrets = {("ns", "creds"): {"url": b64(redis_server.url)}}
    keys = QueueKeys(queue_name)
    r.set(keys.sweeper_last_replay, "{not json")
    dead_letter(r, queue_name, "JOB0001")
    ctl = start(secrets, policy(queue_name, annotations={REPLAY_ANNOTATION: "t1"}), StatusSink())
    ctl.sync(("ns", "p"))
    ctl.stop()
    assert r.zscore(keys.pending, "JOB0001") is not None
    assert '"token": "t1"' in r.get(keys.sweeper_last_replay)


def dead_letter_raw(redis_server, queue, job_id: bytes, last_error: bytes):
    """A dead job whose id and last_error are not UTF-8 (Redis keys and values are bytes)."""
    raw = redis_server.client(decode_responses=False)
    keys = QueueKeys(queue)
    raw.hset(keys.job("").encode() + job_id, mapping={
        b"state": b"dead", b"attempts": b"1", b"payload": b"{}", b"stalled": b"1", b"last_error": last_error})
    raw.zadd(keys.dead, {job_id: 0})
    raw.close()


def test_a_replay_of_ids_that_are_not_utf8_is_served_once(redis_server, r, queue_name):
    secrets = {("ns", "creds"): {"url": b64(redis_server.url)}}
    keys = QueueKeys(queue_name)
    dead_letter_raw(redis_server, queue_name, b"JOB\xff\xfe1", b"boom \xc3\x28")
    sink = StatusSink()
    ctl = start(secrets, policy(queue_name, annotations={REPLAY_ANNOTATION: "t1"}), sink)
    recorder = ctl.recorder
    try:
        ctl.sync(("ns", "p"))
        assert r.zcard(keys.pending) == 1 and r.zcard(keys.dead) == 0
        assert sink.patches[-1]["lastReplay"]["token"] == "t1"
        assert sink.patches[-1]["lastReplay"]["replayed"] == 1
        assert '"token": "t1"' in r.get(keys.sweeper_last_replay)
        # Served: what dies afterwards stays in the morgue on the next refreshes.
        dead_letter_raw(redis_server, queue_name, b"JOB\xff2", b"\xff")
        ctl.sync(("ns", "p"))
        ctl.sync(("ns", "p"))
    finally:
        ctl.stop()
    assert r.zcard(keys.dead) == 1
    assert [e[2] for e in recorder.events].count("Replayed") == 1


def test_a_replay_whose_reply_cannot_be_read_is_still_served_once(redis_server, r, queue_name):
    from stalledpolicy.engine import morgue_replay

    secrets = {("ns", "creds"): {"url": b64(redis_server.url)}}
    keys = QueueKeys(queue_name)
    dead_letter(r, queue_name, "JOB0001")
    runs = []

    def replay_then_fail_to_parse(client, queue, lane=None, progress=None):
        runs.append(queue)
        morgue_replay(client, queue, lane=lane)  # the jobs move ...
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")  # ... the reply is unreadable

    ctl = start(secrets, policy(queue_name, annotations={REPLAY_ANNOTATION: "t1"}), StatusSink())
    ctl.replay_fn = replay_then_fail_to_parse
    try:
        ctl.sync(("ns", "p"))
        dead_letter(r, queue_name, "JOB0002")
        ctl.sync(("ns", "p"))
    finally:
        ctl.stop()
    assert runs == [queue_name], "the replay ran again"
    assert r.zscore(keys.pending, "JOB0001") is not None and r.zscore(keys.dead, "JOB0002") is not None
    last = ctl.custom.patches[-1]["lastReplay"] if "lastReplay" in ctl.custom.patches[-1] else next(
        p["lastReplay"] for p in reversed(ctl.custom.patches) if "lastReplay" in p)
    assert last["token"] == "t1" and "replayed" not in last  # unknown: no count, not an old one
    assert '"token": "t1"' in r.get(keys.sweeper_last_replay)
    [(_, kind, _, message)] = [e for e in ctl.recorder.events if e[2] == "ReplayIncomplete"]
    assert kind == "Warning" and "could not be read" in message and "UnicodeDecodeError" in message
    assert [e[2] for e in ctl.recorder.events].count("Replayed") == 1


def test_a_replay_that_answered_too_late_is_served_once_and_not_resent(redis_server, r, queue_name):
    """The first call's answer does not come within the timeout, yet the script
    runs: neither redis-py (which resends after a timeout) nor the next refresh
    may run the replay again on what has died since."""
    from stalledpolicy.engine import morgue_replay

    secrets = {("ns", "creds"): {"url": b64(f"{redis_server.url}?socket_timeout=1")}}
    keys = QueueKeys(queue_name)
    dead_letter(r, queue_name, "JOB0001")
    # the call that goes unanswered is the replay itself: with the script not yet
    # in the server's cache (this test alone, on a new server) it would be an
    # EVALSHA answered NOSCRIPT after the timeout, and the EVAL never sent
    r.script_load(script("morgue_replay").body)
    busy = another_clients_long_script(redis_server, 2.0)
    runs = []

    def replay_behind_a_long_script(client, queue, lane=None, progress=None):
        runs.append(queue)
        busy.start()  # another client's script: ours runs after it, ~1 s past our timeout
        return morgue_replay(client, queue, lane=lane, progress=progress)

    ctl = start(secrets, policy(queue_name, annotations={REPLAY_ANNOTATION: "t1"}), StatusSink())
    ctl.replay_fn = replay_behind_a_long_script
    try:
        ctl.sync(("ns", "p"))
        busy.join()
        dead_letter(r, queue_name, "JOB0002")  # died after the token was acted on
        ctl.sync(("ns", "p"))
    finally:
        ctl.stop()
    assert runs == [queue_name], "the replay ran again"
    assert r.zscore(keys.pending, "JOB0001") is not None, "the one call sent did run"
    assert r.zscore(keys.dead, "JOB0002") is not None
    last = next(p["lastReplay"] for p in reversed(ctl.custom.patches) if "lastReplay" in p)
    assert last["token"] == "t1" and "replayed" not in last
    [(_, kind, _, message)] = [e for e in ctl.recorder.events if e[2] == "ReplayIncomplete"]
    assert kind == "Warning" and "no answer" in message and "TimeoutError" in message


def test_an_operator_stopped_during_a_long_replay_does_not_run_it_again(redis_server, r, queue_name):
    from stalledpolicy import engine

    secrets = {("ns", "creds"): {"url": b64(redis_server.url)}}
    keys = QueueKeys(queue_name)
    for n in range(engine.MORGUE_BATCH + 20):
        dead_letter(r, queue_name, f"JOB{n:05d}")

    class Stopped(BaseException):
        """The process ends here (SIGKILL after the grace period, say)."""

    def replay_until_stopped(client, queue, lane=None, progress=None):
        def one_call_then_stop(so_far):
            progress(so_far)
            raise Stopped

        return engine.morgue_replay(client, queue, lane=lane, progress=one_call_then_stop)

    annotated = policy(queue_name, annotations={REPLAY_ANNOTATION: "t1"})
    first = start(secrets, annotated, StatusSink())
    first.replay_fn = replay_until_stopped
    try:
        with pytest.raises(Stopped):
            first.sync(("ns", "p"))
    finally:
        first.stop()
    dead_letter(r, queue_name, "JOB99999")  # died after the token was acted on

    again = start(secrets, annotated, StatusSink())  # the operator comes back
    runs = []
    again.replay_fn = lambda *a, **k: runs.append(a)
    try:
        again.sync(("ns", "p"))
    finally:
        again.stop()
    assert runs == [], "the replay ran again"
    assert r.zcard(keys.dead) == 21 and r.zscore(keys.dead, "JOB99999") is not None
    last = next(p["lastReplay"] for p in reversed(again.custom.patches) if "lastReplay" in p)
    assert last == {"token": "t1", "replayed": engine.MORGUE_BATCH, "time": last["time"], "servedTokens": ["t1"]}
    [(_, kind, _, message)] = [e for e in again.recorder.events if e[2] == "ReplayIncomplete"]
    assert kind == "Warning" and f"stopped after {engine.MORGUE_BATCH} jobs" in message


def test_a_replay_stopped_half_way_by_redis_is_served_with_what_moved(redis_server, r, queue_name):
    from stalledpolicy import engine

    secrets = {("ns", "creds"): {"url": b64(redis_server.url)}}
    keys = QueueKeys(queue_name)
    for n in range(engine.MORGUE_BATCH + 20):
        dead_letter(r, queue_name, f"JOB{n:05d}")
    runs = []

    def replay_then_lose_redis(client, queue, lane=None, progress=None):
        runs.append(queue)

        def one_call_then_fail(so_far):
            progress(so_far)
            raise redis.ConnectionError("connection reset by peer")

        return engine.morgue_replay(client, queue, lane=lane, progress=one_call_then_fail)

    ctl = start(secrets, policy(queue_name, annotations={REPLAY_ANNOTATION: "t1"}), StatusSink())
    ctl.replay_fn = replay_then_lose_redis
    try:
        ctl.sync(("ns", "p"))
        dead_letter(r, queue_name, "JOB99999")  # died after the token was acted on
        ctl.sync(("ns", "p"))
    finally:
        ctl.stop()
    assert runs == [queue_name], "the replay ran again"
    assert r.zcard(keys.dead) == 21 and r.zscore(keys.dead, "JOB99999") is not None
    last = next(p["lastReplay"] for p in reversed(ctl.custom.patches) if "lastReplay" in p)
    assert last["token"] == "t1" and last["replayed"] == engine.MORGUE_BATCH
    [(_, kind, _, message)] = [e for e in ctl.recorder.events if e[2] == "ReplayIncomplete"]
    assert kind == "Warning" and f"stopped after {engine.MORGUE_BATCH} jobs" in message
    assert "ConnectionError" in message


# --------------------------------------------------------------------------- metrics


def test_replays_are_counted_by_result_with_the_jobs_they_moved(world, r, queue_name):
    ctl, sink, _, _, _ = world
    dead_letter(r, queue_name, "JOB0001")
    dead_letter(r, queue_name, "JOB0002")
    ctl.observe_policy(policy(queue_name, annotations={REPLAY_ANNOTATION: "first"}, rv="9"), "MODIFIED")
    ctl.sync(("ns", "p"))
    assert sink.patches[-1]["lastReplay"]["replayed"] == 2
    assert ctl.metrics.value("stalledpolicy_operator_replays_total", result="done") == 1
    assert ctl.metrics.value("stalledpolicy_operator_replayed_jobs_total") == 2
    ctl.sync(("ns", "p"))  # the same token: served already, not counted again
    assert ctl.metrics.value("stalledpolicy_operator_replays_total", result="done") == 1

    bad_lane = {REPLAY_ANNOTATION: "second", REPLAY_LANE_ANNOTATION: "no spaces allowed"}
    ctl.observe_policy(policy(queue_name, annotations=bad_lane, rv="10"), "MODIFIED")
    ctl.sync(("ns", "p"))
    assert ctl.metrics.value("stalledpolicy_operator_replays_total", result="refused") == 1
    assert ctl.metrics.value("stalledpolicy_operator_replayed_jobs_total") == 2


def test_a_replay_served_from_its_redis_record_after_a_restart_is_not_counted_again(
        redis_server, r, queue_name):
    secrets = {("ns", "creds"): {"url": b64(redis_server.url)}}
    dead_letter(r, queue_name, "JOB0001")
    dead_letter(r, queue_name, "JOB0002")
    annotated = policy(queue_name, annotations={REPLAY_ANNOTATION: "t1"})
    done, jobs = "stalledpolicy_operator_replays_total", "stalledpolicy_operator_replayed_jobs_total"

    first = start(secrets, annotated, LostStatus())  # replays, dies before its status write lands
    first.sync(("ns", "p"))
    first.stop()
    assert first.metrics.value(done, result="done") == 1 and first.metrics.value(jobs) == 2

    sink = StatusSink()
    restarted = start(secrets, annotated, sink)
    restarted.sync(("ns", "p"))
    restarted.stop()
    assert sink.patches[-1]["lastReplay"]["replayed"] == 2  # served from the record
    assert restarted.metrics.value(done, result="done") == 0, "counted twice across the restart"
    assert restarted.metrics.value(jobs) == 0


def test_an_unreachable_redis_is_a_failed_refresh(world):
    ctl, _, _, _, secrets = world
    ctl.sync(("ns", "p"))
    secrets[("ns", "creds")] = {"url": b64("redis://:hunter2@127.0.0.1:1/0")}
    ctl.sync(("ns", "p"))
    failures = "stalledpolicy_operator_status_refresh_failures_total"
    assert ctl.metrics.value(failures, reason="RedisUnreachable") == 1
    assert ctl.metrics.value("stalledpolicy_operator_status_refreshes_total") == 2
    assert "hunter2" not in ctl.metrics.exposition().decode()


def test_an_earlier_replay_token_put_back_never_replays_again_even_after_a_restart(redis_server, r, queue_name):
    """`kubectl annotate ... replay=r2`, then Argo CD's self-heal puts back the Git
    value `r1`: before, r1 (no longer the last served) replayed the morgue a second
    time, moving the jobs that died since. The tokens served are kept in
    status.lastReplay.servedTokens; a new value still replays."""
    secrets = {("ns", "creds"): {"url": b64(redis_server.url)}}
    sink = MergingStatus()
    keys = QueueKeys(queue_name)
    rv = [1]

    def annotate(ctl, token):
        rv[0] += 1
        ctl.observe_policy(policy(queue_name, annotations={REPLAY_ANNOTATION: token}, rv=str(rv[0]))
                           | {"status": json.loads(json.dumps(sink.stored))}, "MODIFIED")
        ctl.sync(("ns", "p"))

    dead_letter(r, queue_name, "JOB0001")
    ctl = start(secrets, policy(queue_name, annotations={REPLAY_ANNOTATION: "r1"}), sink)
    try:
        ctl.sync(("ns", "p"))
        assert sink.stored["lastReplay"]["token"] == "r1" and r.zcard(keys.dead) == 0
        dead_letter(r, queue_name, "JOB0002")
        annotate(ctl, "r2")
        assert sink.stored["lastReplay"]["replayed"] == 1 and r.zcard(keys.dead) == 0
        assert sink.stored["lastReplay"]["servedTokens"] == ["r1", "r2"]
        dead_letter(r, queue_name, "JOB0003")
        annotate(ctl, "r1")  # the GitOps tool's self-heal
        assert r.zcard(keys.dead) == 1, "an earlier token replayed the morgue again"
        assert sink.stored["lastReplay"]["token"] == "r2"
    finally:
        ctl.stop()

    # A new process knows them from the status (the Redis record names r2 only).
    body = policy(queue_name, annotations={REPLAY_ANNOTATION: "r1"}) | {"status": json.loads(json.dumps(sink.stored))}
    ctl = start(secrets, body, sink)
    try:
        ctl.sync(("ns", "p"))
        assert r.zcard(keys.dead) == 1
        annotate(ctl, "r3")  # a new value replays
        assert r.zcard(keys.dead) == 0 and sink.stored["lastReplay"]["servedTokens"] == ["r1", "r2", "r3"]
    finally:
        ctl.stop()
