"""Pure parts of the operator: replay requests, event texts, Redis URL resolution,
ownership, the scheduler, log hygiene, and the pod runner's translation of a container."""

from __future__ import annotations

import base64
import copy
import json
import logging
import sys
import threading
import time

import pytest
import yaml

from stalledpolicy.controller import REPLAY_ANNOTATION, REPLAY_LANE_ANNOTATION
from stalledpolicy.controller.apply import conflict_reason, policy_owner
from stalledpolicy.controller.config import OperatorConfig, backoff
from stalledpolicy.controller.events import budget_change_message, build_event, dead_letter_growth_message
from stalledpolicy.controller.logfilter import KopfRecordFilter
from stalledpolicy.controller.queue_figures import safe_error
from stalledpolicy.controller.reconcile import reconcile as reconcile_policy
from stalledpolicy.controller.redis_clients import RedisClients, RedisConfigError, SecretReader, resolve_url
from stalledpolicy.controller.replay import InvalidReplayRequest, ReplayRequest, replay_warning, requested_replay
from stalledpolicy.controller.retry import Retries
from stalledpolicy.controller.scheduler import Scheduler
from stalledpolicy.controller.status import ReconcileOutcome
from stalledpolicy.devenv.podrunner import EnvError, local_command, probe_port, resolve_env
from stalledpolicy.engine import ReplayResult


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# -- replay ---------------------------------------------------------------------

def test_a_new_token_asks_for_a_replay_and_a_served_one_does_not():
    annotations = {REPLAY_ANNOTATION: "2026-12-02"}
    assert requested_replay(annotations, None) == ReplayRequest("2026-12-02", None)
    assert requested_replay(annotations, "2026-12-02") is None
    assert requested_replay(annotations, "older") == ReplayRequest("2026-12-02", None)
    assert requested_replay({}, None) is None
    assert requested_replay({REPLAY_ANNOTATION: "  "}, None) is None


def test_replay_lane_is_taken_and_checked():
    annotations = {REPLAY_ANNOTATION: "t", REPLAY_LANE_ANNOTATION: "imports"}
    assert requested_replay(annotations, None) == ReplayRequest("t", "imports")
    with pytest.raises(InvalidReplayRequest, match=REPLAY_LANE_ANNOTATION):
        requested_replay({REPLAY_ANNOTATION: "t", REPLAY_LANE_ANNOTATION: "a:b"}, None)


def test_a_replay_that_left_jobs_or_met_a_bad_key_is_a_warning_naming_them():
    clean = ReplayResult(replayed=2, ids=["JOB1", "JOB2"], lanes={"": 2}, missing=[])
    assert replay_warning("orders", clean) is None
    left = {f"JOB{i}": "job row is missing" for i in range(5)}
    text = replay_warning("orders", ReplayResult(0, [], {}, [], unreplayable=left, problems=["ring is a string"]))
    assert text.startswith("5 jobs left in the morgue of queue orders (JOB0: job row is missing; ")
    assert "JOB2: job row is missing; and 2 more; `stalledpolicy morgue list` shows them)" in text
    assert "JOB3" not in text and text.endswith(". ring is a string")


# -- events ---------------------------------------------------------------------

def test_budget_change_message_names_old_and_new():
    assert budget_change_message({"maxStalled": 1}, {"maxStalled": 3}) == "maxStalled 1 -> 3"
    assert budget_change_message({"maxStalled": 2}, {"maxStalled": 2}) is None
    text = budget_change_message({"lanes": [{"name": "a", "maxStalled": 1}]},
                                 {"lanes": [{"name": "a", "maxStalled": 4}, {"name": "b"}]})
    assert "lane a maxStalled 1 -> 4" in text and "lane b added" in text


def test_dead_letter_growth_only_when_the_morgue_grew():
    assert "3 jobs dead-lettered" in dead_letter_growth_message("orders", 2, 5)
    assert "1 job dead-lettered" in dead_letter_growth_message("orders", 0, 1)
    assert dead_letter_growth_message("orders", 5, 2) is None
    assert dead_letter_growth_message("orders", None, 7) is None  # first sight is not growth


def test_event_refers_to_the_policy():
    policy = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}}
    event = build_event(policy, "Warning", "NameConflict", "x" * 5000, now="2026-12-02T00:00:00Z")
    assert event["involvedObject"] == {"apiVersion": "queues.emq.dev/v1alpha1", "kind": "StalledPolicy",
                                       "name": "p", "namespace": "ns", "uid": "u-1"}
    assert len(event["message"]) == 1024 and event["metadata"]["namespace"] == "ns"


# -- Redis URL ----------------------------------------------------------------------

def secrets_with(store):
    reads = []

    def read(namespace, name):
        reads.append((namespace, name))
        return store.get((namespace, name))
    return SecretReader(read, ttl=60), reads


def test_url_from_a_secret():
    reader, _ = secrets_with({("ns", "creds"): {"url": b64("redis://:s3cret@db:6379/0")}})
    url = resolve_url("ns", {"secretRef": {"name": "creds", "key": "url"}}, reader)
    assert url == "redis://:s3cret@db:6379/0"


def test_missing_secret_and_key_have_their_reasons_and_never_show_the_password():
    reader, _ = secrets_with({("ns", "creds"): {"other": b64("redis://:s3cret@db")}})
    with pytest.raises(RedisConfigError) as missing:
        resolve_url("ns", {"secretRef": {"name": "nope", "key": "url"}}, reader)
    assert missing.value.reason == "SecretNotFound" and "ns/nope" in missing.value.message
    with pytest.raises(RedisConfigError) as no_key:
        resolve_url("ns", {"secretRef": {"name": "creds", "key": "url"}}, reader)
    assert no_key.value.reason == "SecretKeyNotFound" and "'url'" in no_key.value.message
    assert "s3cret" not in no_key.value.message


def test_bad_url_in_a_secret_is_reported_without_its_text():
    reader, _ = secrets_with({("ns", "creds"): {"url": b64("http://:s3cret@db")}})
    with pytest.raises(RedisConfigError) as bad:
        resolve_url("ns", {"secretRef": {"name": "creds"}}, reader)
    assert bad.value.reason == "InvalidRedisURL" and "s3cret" not in bad.value.message


def test_a_secret_value_that_is_not_utf8_is_an_invalid_url_condition_not_a_crash():
    """A secretRef.key naming a binary value (a keystore, a DER certificate): the
    policy says so (InvalidRedisURL), the status loop goes on, nothing is echoed."""
    from stalledpolicy.controller.status import condition_of

    binary = base64.b64encode(b"redis://:s3cr\xffet@db:6379/0").decode()
    reader, _ = secrets_with({("ns", "creds"): {"url": binary}})
    with pytest.raises(RedisConfigError) as bad:
        resolve_url("ns", {"secretRef": {"name": "creds", "key": "url"}}, reader)
    assert bad.value.reason == "InvalidRedisURL"
    assert "key 'url' in Secret ns/creds" in bad.value.message and "UTF-8" in bad.value.message
    assert "s3cr" not in bad.value.message

    _, ctl, _ = reconciled_policy({("ns", "creds"): {"url": binary}})
    ctl.sync(("ns", "p"))  # raised UnicodeDecodeError: no condition, a traceback every 30 s
    status = ctl.policies[("ns", "p")].status
    reachable = condition_of(status, "RedisReachable")
    assert (reachable["status"], reachable["reason"]) == ("False", "InvalidRedisURL")
    assert condition_of(status, "Ready")["reason"] == "InvalidRedisURL"


def test_secret_reads_are_cached_but_a_missing_secret_is_read_again():
    store = {("ns", "a"): {"url": b64("redis://db")}}
    reader, reads = secrets_with(store)
    reader.get("ns", "a")
    reader.get("ns", "a")
    reader.get("ns", "b")
    reader.get("ns", "b")
    assert reads == [("ns", "a"), ("ns", "b"), ("ns", "b")]


def test_safe_error_hides_credentials():
    url = "redis://user:s3cret@db:6380/1"
    text = safe_error(ConnectionError(f"cannot connect to {url} using s3cret"), url)
    assert "s3cret" not in text  # the user name is no secret: shown, to tell which user was tried
    assert text == "ConnectionError: cannot connect to redis://user:***@db:6380/1 using ***"


class FakeClient:
    def __init__(self, url):
        self.url, self.closed = url, False

    def close(self):
        self.closed = True


def test_clients_are_shared_per_url_and_closed_when_unused():
    clients = RedisClients(connect_fn=lambda url, timeout: FakeClient(url))
    a = clients.client(("ns", "p1"), "redis://one")
    b = clients.client(("ns", "p2"), "redis://one")
    assert a is b
    c = clients.client(("ns", "p1"), "redis://two")  # p1 moved to another server
    assert c is not a and not a.closed  # p2 still uses the first
    clients.drop(("ns", "p2"))
    assert a.closed and not c.closed
    clients.invalidate(("ns", "p1"))
    assert c.closed
    assert clients.client(("ns", "p1"), "redis://two") is not c  # reconnects


def test_an_invalidated_client_another_policy_uses_is_left_open_for_it():
    clients = RedisClients(connect_fn=lambda url, timeout: FakeClient(url))
    shared = clients.client(("ns", "p1"), "redis://one")
    assert clients.client(("ns", "p2"), "redis://one") is shared
    clients.invalidate(("ns", "p1"))
    assert not shared.closed  # p2 may be reading on it (tests/redis/test_shared_client.py)
    renewed = clients.client(("ns", "p2"), "redis://one")
    assert renewed is not shared and clients.client(("ns", "p1"), "redis://one") is renewed


# -- ownership -----------------------------------------------------------------------

def test_conflict_reason():
    ours = {"metadata": {"ownerReferences": [{"kind": "StalledPolicy", "name": "p", "uid": "u1",
                                              "controller": True}]}}
    assert conflict_reason(None, "u1", "orders") is None
    assert conflict_reason(ours, "u1", "orders") is None
    assert "not by this policy" in conflict_reason(ours, "u2", "orders")
    assert "no controller owner" in conflict_reason({"metadata": {}}, "u1", "orders")
    not_controller = {"metadata": {"ownerReferences": [{"uid": "u1", "controller": False}]}}
    assert conflict_reason(not_controller, "u1", "orders") is not None


def test_a_sweeper_that_lost_its_owner_reference_is_adopted_not_a_conflict():
    from stalledpolicy.controller import FIELD_MANAGER
    from stalledpolicy.policy.builder import sweeper_labels

    def unowned(labels, managers):
        return {"metadata": {"labels": labels, "managedFields": [{"manager": m} for m in managers]}}

    ours = unowned(sweeper_labels("orders"), [FIELD_MANAGER, "kubectl-edit"])
    assert conflict_reason(ours, "u1", "orders") is None
    # another policy's labels, no field manager of ours, or not our labels at all: a conflict
    assert conflict_reason(ours, "u1", "billing") is not None
    assert conflict_reason(unowned(sweeper_labels("orders"), ["kubectl-client-side-apply"]), "u1", "orders")
    assert conflict_reason(unowned({"app": "theirs"}, [FIELD_MANAGER]), "u1", "orders")


def test_only_a_stalled_policy_of_our_group_owns_a_deployment():
    def controlled_by(api_version: str, kind: str) -> dict:
        return {"metadata": {"ownerReferences": [{"apiVersion": api_version, "kind": kind, "name": "p",
                                                  "uid": "u1", "controller": True}]}}

    assert policy_owner(controlled_by("queues.emq.dev/v1alpha1", "StalledPolicy"))["uid"] == "u1"
    assert policy_owner(controlled_by("other.example/v1", "StalledPolicy")) is None
    assert policy_owner(controlled_by("queues.emq.dev/v1alpha1", "Deployment")) is None
    assert policy_owner({"metadata": {}}) is None


# -- config --------------------------------------------------------------------------

def test_backoff_grows_and_is_capped():
    assert [backoff(n, 1, 10) for n in range(6)] == [1, 2, 4, 8, 10, 10]


def test_config_round_trips_through_env():
    config = OperatorConfig(sweeper_image="img:1", status_interval=2.5, max_backoff=7)
    assert OperatorConfig.from_env(config.to_env()) == config
    with pytest.raises(SystemExit, match="STATUS_INTERVAL"):
        OperatorConfig.from_env({"STALLEDPOLICY_OPERATOR_STATUS_INTERVAL": "soon"})


# -- scheduler -------------------------------------------------------------------------

def test_scheduler_runs_each_key_once_at_a_time_and_reschedules():
    runs: dict[str, int] = {}
    active: set[str] = set()
    overlap = threading.Event()
    lock = threading.Lock()

    def work(key):
        with lock:
            if key in active:
                overlap.set()
            active.add(key)
            runs[key] = runs.get(key, 0) + 1
        time.sleep(0.01)
        with lock:
            active.discard(key)
        return 0.02 if runs[key] < 3 else None

    scheduler = Scheduler(work, workers=3)
    try:
        for key in ("a", "b"):
            scheduler.kick(key)
            scheduler.kick(key)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (runs.get("a", 0) < 3 or runs.get("b", 0) < 3):
            time.sleep(0.01)
    finally:
        scheduler.stop()
    assert runs["a"] >= 3 and runs["b"] >= 3
    assert not overlap.is_set()


def test_scheduler_forgets_a_removed_key():
    runs = []
    started = threading.Event()

    def work(key):
        runs.append(key)
        started.set()
        return 0.01

    scheduler = Scheduler(work, workers=1)
    try:
        scheduler.kick("gone")
        assert started.wait(2)
        scheduler.remove("gone")
        time.sleep(0.1)
        count = len(runs)
        time.sleep(0.1)
        assert len(runs) == count
    finally:
        scheduler.stop()


def test_scheduler_stop_waits_one_overall_deadline_for_stuck_workers():
    """Eight workers stuck (a Redis that never answers): stop() gives them its
    timeout in all, not each (8 x 5 s outlasted kopf's exit timeout and the pod's
    grace period). Time here is a fake clock that each join moves on by all it
    waited: a join of a stuck worker waits its whole timeout."""
    now = [0.0]
    release = threading.Event()
    entered = threading.Semaphore(0)

    def work(key):
        entered.release()
        release.wait()
        return None

    scheduler = Scheduler(work, workers=8, clock=lambda: now[0])
    joins = []
    try:
        for key in range(8):
            scheduler.kick(key)
        for _ in range(8):
            assert entered.acquire(timeout=30), "a worker never started"  # a backstop only
        for thread in scheduler._threads:
            def join(timeout=None):
                assert timeout is not None, "an unbounded join"
                joins.append(timeout)
                now[0] += timeout

            thread.join = join
        scheduler.stop(timeout=5.0)
    finally:
        release.set()
    assert joins and sum(joins) <= 5.0, joins


# -- log hygiene ---------------------------------------------------------------------------

def kopf_record(message):
    record = logging.LogRecord("kopf.objects", logging.ERROR, __file__, 1, message, None, None)
    record.k8s_ref = {"uid": "u1", "name": "p", "namespace": "ns", "kind": "StalledPolicy"}
    record.settings = object()
    return record


def test_repeated_retry_errors_are_logged_once_per_change():
    log_filter = KopfRecordFilter()
    first = kopf_record("Handler 'reconcile-create' failed temporarily: clash")
    assert log_filter.filter(first)
    assert not hasattr(first, "settings") and first.namespace == "ns"
    assert not log_filter.filter(kopf_record("Handler 'reconcile-create' failed temporarily: clash"))
    assert log_filter.filter(kopf_record("Handler 'reconcile-create' failed temporarily: other"))
    assert log_filter.filter(kopf_record("Handler 'reconcile-create' succeeded."))
    assert log_filter.filter(kopf_record("Handler 'reconcile-create' failed temporarily: other"))


def test_only_the_cancel_of_the_lease_wait_is_dropped_from_kopfs_warnings():
    log_filter = KopfRecordFilter()

    def warning(name, message):
        return logging.LogRecord(name, logging.WARNING, __file__, 1, message, None, None)

    cut_short = "Startup activity is only partially executed due to cancellation."
    assert log_filter.filter(warning("kopf._core.reactor.running", cut_short))  # not after the lease wait
    assert log_filter.filter(warning("kopf.activities.startup", "Activity 'startup' is cancelled. Will escalate."))
    assert log_filter.filter(warning("stalledpolicy.operator", "Activity 'lead' is cancelled. Will escalate."))
    assert not log_filter.filter(warning("kopf.activities.startup", "Activity 'lead' is cancelled. Will escalate."))
    assert not log_filter.filter(warning("kopf._core.reactor.running", cut_short))


# -- pod runner --------------------------------------------------------------------------

def test_local_command_runs_stalledpolicy_from_this_python():
    assert local_command({"command": ["stalledpolicy", "sweep"]}) == [sys.executable, "-m", "stalledpolicy", "sweep"]
    assert local_command({"args": ["sweep", "--once"]}) == [sys.executable, "-m", "stalledpolicy", "sweep", "--once"]
    assert local_command({"command": ["/bin/true"]}) == ["/bin/true"]


def test_env_resolves_secret_refs_and_fields():
    container = {"env": [
        {"name": "PLAIN", "value": "1"},
        {"name": "URL", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "url"}}},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]}
    pod = {"metadata": {"name": "p-sweeper-abc", "namespace": "ns"}}
    env = resolve_env(container, pod, lambda name: {"url": b64("redis://db")} if name == "creds" else None)
    assert env == {"PLAIN": "1", "URL": "redis://db", "POD": "p-sweeper-abc"}
    with pytest.raises(EnvError, match="not found"):
        resolve_env(container, pod, lambda name: None)
    with pytest.raises(EnvError, match="key url"):
        resolve_env(container, pod, lambda name: {})


def test_probe_port_resolves_a_named_port_and_remaps_it():
    container = {"ports": [{"name": "metrics", "containerPort": 9090}]}
    probe = {"httpGet": {"path": "/readyz", "port": "metrics"}}
    assert probe_port(probe, container, {9090: 40001}) == (40001, "/readyz")
    assert probe_port(None, container, {}) is None


# -- reconcile and CLI without a cluster ------------------------------------------------

def test_a_spec_the_models_reject_is_recorded_and_permanent():
    from stalledpolicy.controller.events import NullRecorder
    from stalledpolicy.controller.reconcile import InvalidPolicy, reconcile
    from stalledpolicy.controller.runtime import Controller

    recorder = NullRecorder()
    ctl = Controller(OperatorConfig(), apps=None, core=None, custom=None, recorder=recorder,
                     secrets=SecretReader(lambda ns, name: None, ttl=1), clients=RedisClients(),
                     snapshot_fn=lambda *a, **k: None)
    body = {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "generation": 3, "resourceVersion": "1"},
            "spec": {"queue": "orders", "redis": {"url": "redis://:pw@db:6379"}}}
    with pytest.raises(InvalidPolicy, match="spec.redis.url"):
        reconcile(ctl, body)
    outcome = ctl.policies[("ns", "p")].outcome
    assert (outcome.ok, outcome.reason, outcome.generation) == (False, "InvalidSpec", 3)
    assert "pw" not in outcome.message
    assert [e[2] for e in recorder.events] == ["InvalidSpec"]


def test_operator_command_needs_a_scope(capsys):
    from stalledpolicy.cli import main

    assert main(["operator"]) == 2
    assert "--all-namespaces" in capsys.readouterr().err


def test_the_operator_keeps_objects_without_managed_fields():
    from stalledpolicy.controller.objects import snapshot

    body = {"metadata": {"name": "p", "managedFields": [{"manager": "kubectl"}]},
            "spec": {"queue": "q"}}
    kept = snapshot(body)
    assert kept == {"metadata": {"name": "p"}, "spec": {"queue": "q"}}
    assert body["metadata"]["managedFields"], "the caller's object is left as it was"


def test_the_api_connection_pool_fits_every_thread_that_calls_the_api():
    from stalledpolicy.controller.config import OperatorConfig

    config = OperatorConfig(status_workers=12)
    assert config.handler_workers == 12
    assert config.api_connections == 24
    assert OperatorConfig(status_workers=2).api_connections == 6


def test_an_api_server_that_never_answers_does_not_hold_the_status_loop():
    """A connection the API server (or a load balancer before it) stops answering
    on: every call of the operator's own client has a deadline, so a status worker
    or a handler thread is not held for ever (kopf's watches have their own), and
    the Secret read says what happened instead of raising out of the refresh."""
    import socket

    from kubernetes import client

    from stalledpolicy.controller.wiring import build_controller

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # accepts (the kernel does), never answers
    api = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{silent.getsockname()[1]}"))
    ctl = build_controller(OperatorConfig.from_env({"STALLEDPOLICY_OPERATOR_API_TIMEOUT": "0.5"}), api_client=api)
    outcome = {}

    def calls():
        try:
            resolve_url("ns", {"secretRef": {"name": "creds"}}, ctl.secrets)
        except RedisConfigError as exc:
            outcome["secret"] = exc
        # a refresh of a policy applied before: it reads the Secret, then writes the status
        body = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "generation": 1},
                "spec": {"queue": "emails", "redis": {"secretRef": {"name": "creds"}}}}
        ctl.observe_policy(body, "ADDED")
        ctl.record_outcome(body, ReconcileOutcome(1, True, "Applied", "applied"))
        outcome["next sync"] = ctl.sync(("ns", "p"))

    worker = threading.Thread(target=calls, daemon=True)
    worker.start()
    worker.join(60)  # a backstop, far above the 0.5 s deadline (and urllib3's retries of a GET)
    silent.close()
    assert not worker.is_alive(), "an API call without a deadline is still waiting"
    assert outcome["secret"].reason == "SecretUnreadable"
    assert "ns/creds" in outcome["secret"].message and "did not answer" in outcome["secret"].message
    assert outcome["next sync"] is not None, "the policy is still known: its next sync is scheduled"
    assert ctl.policies[("ns", "p")].status == {}, "no status written: the API server never answered"


# -- settings: at least a second ---------------------------------------------------------

@pytest.mark.parametrize("text", ["0s", "1ms", "999ms", "0.5s"])
def test_the_operator_refuses_a_status_interval_or_backoff_under_a_second(text, capsys):
    from stalledpolicy.cli import build_parser

    for flag in ("--status-interval", "--max-backoff"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["operator", "-A", flag, text])
        assert "must be at least 1s" in capsys.readouterr().err
    seconds = str(parse_seconds(text))
    for name in ("STATUS_INTERVAL", "MAX_BACKOFF"):
        with pytest.raises(SystemExit, match=f"STALLEDPOLICY_OPERATOR_{name}=.*must be at least 1s"):
            OperatorConfig.from_env({f"STALLEDPOLICY_OPERATOR_{name}": seconds})


    # A second is enough.
    args = build_parser().parse_args(["operator", "-A", "--status-interval", "1s", "--max-backoff", "1.5s"])
    assert (args.status_interval, args.max_backoff) == (1.0, 1.5)
    assert OperatorConfig.from_env({"STALLEDPOLICY_OPERATOR_STATUS_INTERVAL": "1"}).status_interval == 1.0


def parse_seconds(text):
    from stalledpolicy.durations import parse_duration

    return parse_duration(text)


# -- kopf settings ---------------------------------------------------------------------------

def test_startup_asks_the_api_server_for_our_sweepers_only(monkeypatch):
    import kopf

    from stalledpolicy.controller import main, wiring

    class Started:
        def start(self):
            pass

    monkeypatch.setattr(wiring, "build_controller", lambda config: Started())
    monkeypatch.setattr(main, "_controller", None)
    settings = kopf.OperatorSettings()
    main.startup(settings=settings)
    deployments = kopf.Resource("apps", "v1", "deployments", kind="Deployment", namespaced=True)
    policies = kopf.Resource("queues.emq.dev", "v1alpha1", "stalledpolicies", kind="StalledPolicy",
                             namespaced=True)
    replicasets = kopf.Resource("apps", "v1", "replicasets", kind="ReplicaSet", namespaced=True)
    # kopf passes these as labelSelector on the list and watch requests.
    assert settings.watching.label_selectors.collect(deployments) == [
        "app.kubernetes.io/managed-by=stalledpolicy-operator"]
    assert settings.watching.label_selectors.collect(policies) == []
    assert settings.watching.label_selectors.collect(replicasets) == []


# -- reconcile against a fake API ---------------------------------------------------------------

class Response:
    def __init__(self, obj):
        self.data = json.dumps(obj).encode()


def api_error(status, reason, message):
    from kubernetes.client.exceptions import ApiException

    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "reason": "Invalid",
                           "code": status})
    return exc


class FakeApps:
    """AppsV1Api enough for reconcile: stores the applied Deployment, bumps its
    generation when its spec changes, or refuses with ``refuse``."""

    def __init__(self):
        self.stored = None
        self.applied = []
        self.refuse = None
        self.patches = []  # merge patches (not applies)
        self.annotation_patches = []  # merge patches of metadata.annotations
        # annotations those patches set: an Update's fields, which our applies leave alone
        self.patched_annotations = {}
        self.rv = 1  # etcd's empty store: an object's first write is revision 2
        # pod template annotations another field manager owns: an apply of ours
        # leaves them (server-side apply), as `kubectl rollout restart`'s
        self.foreign_annotations = {}

    def read_namespaced_deployment(self, name, namespace, **_):
        if self.stored is None:
            raise api_error(404, "Not Found", "not found")
        return Response(self.stored)

    def patch_namespaced_deployment(self, name, namespace, body, **kwargs):
        if kwargs.get("_content_type") == "application/merge-patch+json":
            return self._merge_patch(body, **kwargs)
        assert kwargs["field_manager"] == "stalledpolicy-operator" and kwargs["force"] is True
        if self.refuse is not None:
            raise self.refuse
        precondition = body["metadata"].get("resourceVersion")
        if precondition is not None and self.stored is not None and (
                self.stored["metadata"].get("resourceVersion") != precondition):
            raise api_error(409, "Conflict", "the object has been modified")
        body = {**body, "metadata": {k: v for k, v in body["metadata"].items() if k != "resourceVersion"}}
        self.applied.append(copy.deepcopy(body))
        generation = int((self.stored or {}).get("metadata", {}).get("generation") or 0)
        merged = copy.deepcopy(body)
        template_meta = merged["spec"]["template"].setdefault("metadata", {})
        template_meta.setdefault("annotations", {}).update(self.foreign_annotations)
        if self.patched_annotations:
            merged["metadata"].setdefault("annotations", {}).update(self.patched_annotations)
        if self.stored is None or self.stored["spec"] != merged["spec"]:
            generation += 1
            self.rv += 1
        self.stored = merged
        self.stored["metadata"].update(generation=generation, resourceVersion=str(self.rv))
        return Response(self.stored)

    def _merge_patch(self, body, **kwargs):
        """A JSON merge patch of spec.replicas (the operator scaling a refused sweeper to 0),
        or of the drift reverts' annotation."""
        assert kwargs["field_manager"] == "stalledpolicy-operator" and "force" not in kwargs
        if self.refuse is not None:
            raise self.refuse
        if "metadata" in body:
            assert list(body) == ["metadata"] and list(body["metadata"]) == ["annotations"]
            self.annotation_patches.append(copy.deepcopy(body))
            for name, value in body["metadata"]["annotations"].items():  # null: removed
                for where in (self.patched_annotations, self.stored["metadata"].setdefault("annotations", {})):
                    if value is None:
                        where.pop(name, None)
                    else:
                        where[name] = value
            self.stored["metadata"]["generation"] += 1  # a Deployment's annotations are in its generation
            self.rv += 1
            self.stored["metadata"]["resourceVersion"] = str(self.rv)
            return Response(self.stored)
        assert body == {"spec": {"replicas": body["spec"]["replicas"]}}
        self.patches.append(copy.deepcopy(body))
        if self.stored["spec"]["replicas"] != body["spec"]["replicas"]:
            self.stored["spec"]["replicas"] = body["spec"]["replicas"]
            self.stored["metadata"]["generation"] += 1
            self.rv += 1
            self.stored["metadata"]["resourceVersion"] = str(self.rv)
        return Response(self.stored)

    def scale_by_hand(self, replicas):
        self.stored["spec"]["replicas"] = replicas
        self.stored["metadata"]["generation"] += 1
        return copy.deepcopy(self.stored)

    def restart_by_hand(self, at):
        """`kubectl rollout restart`: a pod template annotation of its own."""
        self.foreign_annotations["kubectl.kubernetes.io/restartedAt"] = at
        self.stored["spec"]["template"].setdefault("metadata", {}).setdefault("annotations", {}).update(
            self.foreign_annotations)
        self.stored["metadata"]["generation"] += 1
        self.stored["metadata"]["managedFields"] = [
            {"manager": "kube-controller-manager", "operation": "Update", "subresource": "status",
             "time": f"{at}"},
            {"manager": "kubectl-rollout", "operation": "Update", "time": f"{at}"}]
        return copy.deepcopy(self.stored)


def fake_controller(apps, secrets=None, config=None):
    from stalledpolicy.controller.events import NullRecorder
    from stalledpolicy.controller.runtime import Controller
    from stalledpolicy.engine import QueueSnapshot

    store = {} if secrets is None else secrets
    snap = QueueSnapshot(dead=0, pending=0, active=0, recovered_total=0, dead_lettered_total=0,
                         orphans_total=0, quarantined_total=0, lanes=[])

    class Custom:
        def patch_namespaced_custom_object_status(self, *args, **kwargs):
            pass

    config = config or OperatorConfig(sweeper_image="img:1", max_backoff=60)
    ctl = Controller(config, apps=apps, core=None,
                     custom=Custom(), recorder=NullRecorder(),
                     secrets=SecretReader(lambda ns, name: store.get((ns, name)), ttl=0),
                     clients=RedisClients(connect_fn=lambda url, timeout: FakeClient(url)),
                     snapshot_fn=lambda *a, **k: snap)
    ctl.retry_clock = FakeClock()  # the retries' time: a test moves it on to make a retry due
    ctl.retries = Retries(config.max_backoff, clock=ctl.retry_clock)
    return ctl


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def retry_due(ctl, key=("ns", "p")) -> None:
    """Move the retries' clock on to the retry of ``key``."""
    ctl.retry_clock.advance(ctl.retries.wait(key))


def policy_body(spec=None, generation=1):
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "generation": generation,
                         "resourceVersion": str(generation)},
            "spec": spec or {"queue": "orders", "redis": {"secretRef": {"name": "creds", "key": "url"}}}}


def reconciled_policy(*controller_args):
    """A fake cluster, its controller, and one policy it has reconciled."""
    from stalledpolicy.controller.reconcile import reconcile

    apps = FakeApps()
    ctl = fake_controller(apps, *controller_args)
    body = policy_body()
    ctl.observe_policy(body, "ADDED")
    reconcile(ctl, body)
    return apps, ctl, body


def test_an_apply_the_api_refuses_is_a_condition_an_event_and_a_growing_retry():
    from stalledpolicy.controller.apply_requests import ApplyRequest
    from stalledpolicy.controller.reconcile import reconcile

    apps = CountingApps()
    apps.refuse = api_error(422, "Unprocessable Entity",
                            'Deployment.apps "p-sweeper" is invalid: spec.template.spec.containers[0]'
                            '.resources.requests: Invalid value: "2": must be less than or equal to cpu limit of 1')
    ctl = fake_controller(apps, {("ns", "creds"): {"url": b64("redis://db:6379/0")}})
    body = policy_body()
    ctl.request_policy_apply(body, ApplyRequest("created", body=body, generation=1))
    delays = []
    for _ in range(3):
        ctl.sync(("ns", "p"))
        delays.append(ctl.retries.wait(("ns", "p")))
        assert ctl.sync(("ns", "p")) <= delays[-1]  # not due yet: no apply, and the next sync by then
        retry_due(ctl)
    assert delays == [5, 10, 20] and apps.attempts == 3
    outcome = ctl.policies[("ns", "p")].outcome
    assert (outcome.ok, outcome.reason) == (False, "ApplyFailed")
    assert outcome.message.startswith("applying Deployment ns/p-sweeper failed: HTTP 422 Unprocessable Entity: ")
    assert "must be less than or equal to cpu limit of 1" in outcome.message
    # the field to edit is the policy's (the message names the Deployment's)
    assert outcome.message.endswith("(set by the StalledPolicy's spec.sweeper.resources)")
    warnings = [e for e in ctl.recorder.events if e[2] == "ApplyFailed"]
    assert len(warnings) == 1 and warnings[0][1] == "Warning"  # once, not once per retry
    assert "less than or equal to cpu limit" in warnings[0][3]

    apps.refuse = None
    ctl.sync(("ns", "p"))
    assert ctl.policies[("ns", "p")].outcome.reason == "Applied" and apps.attempts == 4
    assert ctl.retries.wait(("ns", "p")) == 0 and ctl.retries.failures(("ns", "p")) == 0
    assert reconcile(ctl, body).ok


@pytest.mark.parametrize("message, fields", [
    ('spec.template.spec.containers[0].image: Required value', "spec.sweeper.image"),
    ('spec.template.spec.priorityClassName: Invalid value', "spec.sweeper.priorityClassName"),
    ('spec.replicas: Invalid value: -1 and spec.template.spec.tolerations[0].operator: Unsupported',
     "spec.sweeper.tolerations, spec.sweeper.replicas"),
])
def test_an_api_refusal_names_the_policy_fields_of_the_deployment_fields_it_names(message, fields):
    from stalledpolicy.controller.api_errors import with_policy_fields

    assert with_policy_fields(message) == f"{message} (set by the StalledPolicy's {fields})"


def test_an_api_refusal_of_no_policy_field_is_left_as_it_is():
    from stalledpolicy.controller.api_errors import with_policy_fields

    message = 'metadata.labels: Invalid value: "x"; status.replicas: 0'
    assert with_policy_fields(message) == message


def test_a_failed_read_of_the_deployment_is_an_apply_failure_too():
    from stalledpolicy.controller.reconcile import RetryLater, reconcile

    class Forbidden(FakeApps):
        def read_namespaced_deployment(self, name, namespace, **_):
            raise api_error(403, "Forbidden", 'deployments.apps "p-sweeper" is forbidden')

    ctl = fake_controller(Forbidden())
    body = {**policy_body(), "status": {"observedGeneration": 1}}  # applied before: read first
    with pytest.raises(RetryLater, match="HTTP 403 Forbidden"):
        reconcile(ctl, body)
    assert ctl.policies[("ns", "p")].outcome.reason == "ApplyFailed"


def test_a_first_apply_is_made_without_a_read_and_a_deployment_of_that_name_is_judged_first():
    from stalledpolicy.controller.reconcile import RetryLater, reconcile

    class Unreadable(FakeApps):
        reads = 0

        def read_namespaced_deployment(self, name, namespace, **_):
            self.reads += 1
            return super().read_namespaced_deployment(name, namespace)

    apps = Unreadable()
    ctl = fake_controller(apps)
    assert reconcile(ctl, policy_body()).ok
    assert (apps.reads, len(apps.applied)) == (0, 1)

    # Another policy's sweeper of the same name: the first apply is refused, the
    # Deployment read and judged, and nothing of it changed.
    apps = Unreadable()
    ctl = fake_controller(apps)
    assert reconcile(ctl, policy_body()).ok
    apps.stored["metadata"]["ownerReferences"][0].update(name="other", uid="u-other")
    stored = copy.deepcopy(apps.stored)
    ctl.forget(("ns", "p"))
    with pytest.raises(RetryLater, match="not by this policy"):
        reconcile(ctl, policy_body())
    assert apps.reads == 1 and len(apps.applied) == 1 and apps.stored == stored
    assert ctl.policies[("ns", "p")].outcome.reason == "NameConflict"


def test_api_messages_never_show_a_password():
    from stalledpolicy.controller.api_errors import describe_api_error

    text = describe_api_error(api_error(422, "Unprocessable Entity", "bad value redis://:hunter2@db:6379/0"))
    assert "hunter2" not in text and "redis://:***@db:6379/0" in text
    # a password holding '/' or '?' (the old masker stopped at '/')
    text = describe_api_error(api_error(422, "Unprocessable Entity", 'bad "redis://u:hun/ter?2@db:6379/0"'))
    assert "hun" not in text and "ter" not in text and "redis://u:***@db:6379/0" in text


def test_the_applied_template_names_the_secret_digest_and_keeps_it_when_unreadable():
    from stalledpolicy.controller.reconcile import reconcile

    apps = FakeApps()
    secrets = {("ns", "creds"): {"url": b64("redis://db:6379/0")}}
    ctl = fake_controller(apps, secrets)
    outcome = reconcile(ctl, policy_body())
    annotations = apps.stored["spec"]["template"]["metadata"]["annotations"]
    digest = annotations["queues.emq.dev/redis-secret-digest"]
    assert len(digest) == 16 and outcome.secret_digest == digest
    assert "redis://db" not in json.dumps(apps.stored) and b64("redis://db:6379/0") not in json.dumps(apps.stored)
    # The Secret is gone (or forbidden) for a moment: no rollout for that.
    secrets.clear()
    reconcile(ctl, policy_body())
    assert apps.stored["spec"]["template"]["metadata"]["annotations"]["queues.emq.dev/redis-secret-digest"] == digest
    assert apps.stored["metadata"]["generation"] == 1


def test_the_status_loop_rolls_the_sweeper_when_the_secret_changes():
    secrets = {("ns", "creds"): {"url": b64("redis://db:6379/0")}}
    apps, ctl, body = reconciled_policy(secrets)
    ctl.sync(("ns", "p"))
    assert len(apps.applied) == 1, "an unchanged Secret re-applies nothing"
    secrets[("ns", "creds")] = {"url": b64("redis://:rotated@db:6379/0")}
    ctl.sync(("ns", "p"))
    assert len(apps.applied) == 2
    template = apps.stored["spec"]["template"]["metadata"]["annotations"]
    assert template["queues.emq.dev/redis-secret-digest"] == ctl.policies[("ns", "p")].outcome.secret_digest
    assert apps.stored["metadata"]["generation"] == 2  # a new pod template: a rollout
    assert "rotated" not in json.dumps(apps.applied)
    ctl.sync(("ns", "p"))
    assert len(apps.applied) == 2, "once per change"
    # A Secret changed to something no sweeper can use rolls nothing (the pods keep the last good URL).
    secrets[("ns", "creds")] = {"url": b64("http://not-redis")}
    ctl.sync(("ns", "p"))
    assert len(apps.applied) == 2


def test_a_failed_reapply_is_tried_again_by_the_status_loop():
    apps, ctl, body = reconciled_policy({("ns", "creds"): {"url": b64("redis://db:6379/0")}})
    before = apps.stored["spec"]["template"]["metadata"]["annotations"]["queues.emq.dev/redis-secret-digest"]
    ctl.secrets._read = lambda ns, name: {"url": b64("redis://:rotated@db:6379/0")}
    apps.refuse = api_error(500, "Internal Server Error", "etcd is down")
    ctl.sync(("ns", "p"))
    assert ctl.policies[("ns", "p")].outcome.reason == "ApplyFailed"
    apps.refuse = None
    ctl.sync(("ns", "p"))  # not due yet
    assert not ctl.policies[("ns", "p")].outcome.ok
    retry_due(ctl)
    ctl.sync(("ns", "p"))
    assert ctl.policies[("ns", "p")].outcome.ok
    after = apps.stored["spec"]["template"]["metadata"]["annotations"]["queues.emq.dev/redis-secret-digest"]
    assert after != before


def test_a_hand_edit_of_the_sweeper_is_drift_and_our_own_apply_is_not():
    from stalledpolicy.controller.drift import drifted_policy, revert_drift

    apps, ctl, body = reconciled_policy()
    ours = copy.deepcopy(apps.stored)
    assert drifted_policy(ctl, ours) is None  # the generation our apply made
    scaled = apps.scale_by_hand(0)
    assert drifted_policy(ctl, scaled) == ("ns", "p")
    revert_drift(ctl, ("ns", "p"), scaled)
    ctl.sync(("ns", "p"))
    assert apps.stored["spec"]["replicas"] == 1
    assert drifted_policy(ctl, copy.deepcopy(apps.stored)) is None  # no loop: our apply is not drift
    [(_, kind, _, message)] = [e for e in ctl.recorder.events if e[2] == "DriftReverted"]
    assert kind == "Normal" and "p-sweeper" in message
    # A Deployment of another owner, or of a policy with another uid, is none of ours.
    foreign = copy.deepcopy(scaled)
    foreign["metadata"]["ownerReferences"][0]["uid"] = "u-2"
    assert drifted_policy(ctl, foreign) is None


def test_a_rival_write_between_a_revert_and_its_record_is_drift_too():
    """The revert's apply, then (before the revert is recorded on the Deployment) the
    other writer again: the record's generation is past the apply's by two. Taking
    it as ours hid the other writer's change: it was neither reverted nor counted
    (raceaudit's reading, seen as a timeout in the kube test on a loaded machine)."""
    from stalledpolicy.controller.drift import DRIFT_REVERTS_ANNOTATION, drifted_policy, revert_drift

    apps, ctl, body = reconciled_policy()
    record = apps._merge_patch

    def rival_first(patch, **kwargs):
        apps.scale_by_hand(0)
        return record(patch, **kwargs)

    apps._merge_patch = rival_first
    revert_drift(ctl, ("ns", "p"), apps.scale_by_hand(0))
    ctl.sync(("ns", "p"))
    apps._merge_patch = record
    assert apps.stored["spec"]["replicas"] == 0 and DRIFT_REVERTS_ANNOTATION in apps.stored["metadata"]["annotations"]
    assert drifted_policy(ctl, copy.deepcopy(apps.stored)) == ("ns", "p")
    revert_drift(ctl, ("ns", "p"), copy.deepcopy(apps.stored))
    ctl.sync(("ns", "p"))
    assert apps.stored["spec"]["replicas"] == 1
    assert len(apps.stored["metadata"]["annotations"][DRIFT_REVERTS_ANNOTATION].split(",")) == 2
    assert drifted_policy(ctl, copy.deepcopy(apps.stored)) is None  # the second record was ours alone


class CountingApps(FakeApps):
    def __init__(self):
        super().__init__()
        self.attempts = 0

    def patch_namespaced_deployment(self, name, namespace, body, **kwargs):
        self.attempts += 1
        return super().patch_namespaced_deployment(name, namespace, body, **kwargs)


def test_a_refused_reapply_of_the_status_loop_waits_a_growing_delay_and_logs_once(caplog):
    from stalledpolicy.controller.reconcile import reconcile

    apps = CountingApps()
    secrets = {("ns", "creds"): {"url": b64("redis://db:6379/0")}}
    ctl = fake_controller(apps, secrets)
    body = policy_body()
    ctl.observe_policy(body, "ADDED")
    reconcile(ctl, body)
    secrets[("ns", "creds")] = {"url": b64("redis://:rotated@db:6379/0")}
    apps.refuse = api_error(422, "Unprocessable Entity", "refused by a webhook")
    caplog.set_level(logging.INFO, logger="stalledpolicy.operator")
    ctl.start()
    try:
        ctl.scheduler.kick(("ns", "p"))
        time.sleep(1.0)
    finally:
        ctl.stop()
    # Before: the re-apply's own outcome kicked the key, the scheduler ran it again at
    # once: hundreds of refused applies a second.
    assert 1 <= apps.attempts - 1 <= 2, apps.attempts
    delays = []
    for _ in range(3):
        delays.append(ctl.retries.wait(("ns", "p")))
        retry_due(ctl)
        ctl.sync(("ns", "p"))
    assert delays == [5, 10, 20]
    applying = [r for r in caplog.records if r.getMessage() == "applying the sweeper Deployment"]
    assert len(applying) == 1, "once per streak of failures"
    apps.refuse = None
    retry_due(ctl)
    ctl.sync(("ns", "p"))
    assert ctl.policies[("ns", "p")].outcome.ok and ctl.retries.failures(("ns", "p")) == 0
    # the same sync wrote the outcome into status
    assert [c for c in ctl.policies[("ns", "p")].status["conditions"] if c["type"] == "Ready"][0]["reason"] \
        != "ApplyFailed"


def test_only_a_new_secret_value_rolls_the_sweeper_not_a_label_on_the_secret():
    secrets = {("ns", "creds"): {"url": b64("redis://db:6379/0"), "other": b64("x")}}
    apps, ctl, body = reconciled_policy(secrets)
    # external-secrets annotates the Secret, or another key of it changes: a new
    # resourceVersion, the same value for the sweeper.
    secrets[("ns", "creds")] = {"url": b64("redis://db:6379/0"), "other": b64("y")}
    ctl.sync(("ns", "p"))
    assert len(apps.applied) == 1 and apps.stored["metadata"]["generation"] == 1
    secrets[("ns", "creds")] = {"url": b64("redis://:rotated@db:6379/0"), "other": b64("y")}
    ctl.sync(("ns", "p"))
    assert len(apps.applied) == 2 and apps.stored["metadata"]["generation"] == 2
    assert "rotated" not in json.dumps(apps.applied)


def test_an_unrelated_apply_keeps_the_running_secret_digest_while_the_secret_is_broken():
    from stalledpolicy.controller.reconcile import reconcile

    apps = FakeApps()
    secrets = {("ns", "creds"): {"url": b64("redis://db:6379/0")}}
    ctl = fake_controller(apps, secrets)
    reconcile(ctl, policy_body())
    running = apps.stored["spec"]["template"]["metadata"]["annotations"]["queues.emq.dev/redis-secret-digest"]
    for broken in ({"uri": b64("redis://db:6379/0")}, {"url": b64("http://not-redis")}):
        secrets[("ns", "creds")] = broken
        spec = {"queue": "orders", "redis": {"secretRef": {"name": "creds", "key": "url"}},
                "sweeper": {"replicas": 2}}
        reconcile(ctl, policy_body(spec, generation=2))  # a replicas change: no pod template change
        template = apps.stored["spec"]["template"]["metadata"]["annotations"]
        assert template["queues.emq.dev/redis-secret-digest"] == running


def test_a_policy_or_sweeper_being_deleted_is_not_drift():
    from stalledpolicy.controller.drift import drifted_policy, revert_drift

    apps, ctl, body = reconciled_policy()
    scaled = apps.scale_by_hand(0)
    going = copy.deepcopy(scaled)
    going["metadata"]["deletionTimestamp"] = "2026-12-03T00:00:00Z"
    assert drifted_policy(ctl, going) is None
    deleting = copy.deepcopy(body)
    deleting["metadata"].update(deletionTimestamp="2026-12-03T00:00:00Z", resourceVersion="5")
    ctl.observe_policy(deleting, "MODIFIED")
    assert drifted_policy(ctl, scaled) is None
    revert_drift(ctl, ("ns", "p"), scaled)
    ctl.sync(("ns", "p"))
    assert apps.stored["spec"]["replicas"] == 0
    assert not [e for e in ctl.recorder.events if e[2] == "DriftReverted"]


def test_the_deletion_of_a_policy_seen_after_its_successor_forgets_only_the_deleted_one():
    """kopf handles each object (uid) in a stream of its own: after a delete and a
    create under the same name, the new policy's events may be handled before the
    old one's DELETED. That DELETED (and a late outcome of the old policy) must not
    take the new policy's state: its status would never be written again."""
    from stalledpolicy.controller.reconcile import reconcile
    from stalledpolicy.controller.status import ReconcileOutcome

    apps, ctl, old = reconciled_policy()
    new = copy.deepcopy(old)
    new["metadata"].update(uid="u-2", resourceVersion="10")  # created after the old one's last write
    apps.stored = None  # the old sweeper went with its policy
    ctl.observe_policy(new, "ADDED")
    reconcile(ctl, new)
    assert ctl.policies[("ns", "p")].body["metadata"]["uid"] == "u-2"

    ctl.observe_policy(old, "DELETED")  # the old policy's stream, handled late
    assert ("ns", "p") in ctl.policies, "the new policy was forgotten"
    assert ctl.policies[("ns", "p")].body["metadata"]["uid"] == "u-2"
    assert ctl.policies[("ns", "p")].outcome is not None
    ctl.record_outcome(old, ReconcileOutcome(1, True, "Applied", "late"))  # an old reconcile ending late
    assert ctl.policies[("ns", "p")].body["metadata"]["uid"] == "u-2"
    assert ctl.policies[("ns", "p")].outcome.message != "late"

    ctl.observe_policy(new, "DELETED")
    assert ("ns", "p") not in ctl.policies


def test_a_policy_deleted_during_a_revert_or_reapply_is_neither_an_error_nor_brought_back(monkeypatch):
    from stalledpolicy.controller import drift
    from stalledpolicy.controller import reconcile as rec
    from stalledpolicy.controller.apply_requests import ApplyRequest

    apps, ctl, body = reconciled_policy()
    scaled = apps.scale_by_hand(0)
    real = drift.drifted_policy

    def deleted_right_after(c, d):
        key = real(c, d)
        c.forget(("ns", "p"))
        return key

    monkeypatch.setattr(drift, "drifted_policy", deleted_right_after)
    drift.revert_drift(ctl, ("ns", "p"), scaled)  # before: KeyError
    ctl.sync(("ns", "p"))
    monkeypatch.undo()
    assert ("ns", "p") not in ctl.policies and apps.stored["spec"]["replicas"] == 0

    # A re-apply whose policy is deleted as its sync takes it.
    ctl.observe_policy(body, "ADDED")
    rec.reconcile(ctl, body)

    def deleted_now():
        ctl.forget(("ns", "p"))
        return body

    ctl.pending_applies.add(("ns", "p"), ApplyRequest("test", check=deleted_now))
    ctl.sync(("ns", "p"))
    assert ("ns", "p") not in ctl.policies, "a forgotten policy's state came back"


def test_rollout_restarts_are_not_reverts_and_use_up_no_budget():
    """`kubectl rollout restart` bumps the generation with a field the operator
    never sets: the re-apply changes nothing, so it is no revert, and a real
    `kubectl scale` right after is still reverted."""
    from stalledpolicy.controller import drift

    apps, ctl, body = reconciled_policy()
    now = [1000.0]
    ctl.clock = lambda: now[0]
    for n in range(drift.DRIFT_MAX_REVERTS + 3):
        drift.revert_drift(ctl, ("ns", "p"), apps.restart_by_hand(f"2026-12-03T00:00:0{n}Z"))
        ctl.sync(("ns", "p"))
        now[0] += 10
    names = [e[2] for e in ctl.recorder.events]
    assert "DriftReverted" not in names and "DriftConflict" not in names
    assert apps.stored["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"]
    drift.revert_drift(ctl, ("ns", "p"), apps.scale_by_hand(0))
    ctl.sync(("ns", "p"))
    assert apps.stored["spec"]["replicas"] == 1
    assert [e[2] for e in ctl.recorder.events if e[2].startswith("Drift")] == ["DriftReverted"]


def test_the_status_writer_is_not_named_as_the_other_writer():
    from stalledpolicy.controller.drift import other_field_managers

    deployment = {"metadata": {"managedFields": [
        {"manager": "kube-controller-manager", "operation": "Update", "subresource": "status",
         "time": "2026-12-03T00:00:09Z"},
        {"manager": "stalledpolicy-operator", "operation": "Apply", "time": "2026-12-03T00:00:08Z"},
        {"manager": "kubectl-edit", "operation": "Update", "time": "2026-12-03T00:00:07Z"}]}}
    assert other_field_managers(deployment) == ["kubectl-edit"]


def test_drift_reverts_stop_when_another_writer_keeps_changing_the_sweeper():
    from stalledpolicy.controller import drift

    apps, ctl, body = reconciled_policy()
    now = [1000.0]
    ctl.clock = lambda: now[0]

    def theirs():
        changed = apps.scale_by_hand(0)
        changed["metadata"]["managedFields"] = [
            {"manager": "stalledpolicy-operator", "operation": "Apply", "time": "2026-12-03T00:00:02Z"},
            {"manager": "stalledpolicy-operator-v2", "operation": "Apply", "time": "2026-12-03T00:00:03Z"},
            {"manager": "kubectl", "operation": "Update", "time": "2026-12-03T00:00:01Z"}]
        return changed

    for _ in range(6):
        drift.revert_drift(ctl, ("ns", "p"), theirs())
        ctl.sync(("ns", "p"))
        now[0] += 10
    assert len([e for e in ctl.recorder.events if e[2] == "DriftReverted"]) == drift.DRIFT_MAX_REVERTS == 3
    [conflict] = [e for e in ctl.recorder.events if e[2] == "DriftConflict"]
    assert conflict[1] == "Warning" and "'stalledpolicy-operator-v2'" in conflict[3] and "kubectl" in conflict[3]
    assert apps.stored["spec"]["replicas"] == 0  # left to the other writer
    # Still fought over: no revert while the changes keep coming.
    now[0] += drift.DRIFT_WINDOW - 20
    drift.revert_drift(ctl, ("ns", "p"), theirs())
    ctl.sync(("ns", "p"))
    assert apps.stored["spec"]["replicas"] == 0
    # Left alone for the whole window: the next change is reverted again.
    now[0] += drift.DRIFT_WINDOW + 1
    drift.revert_drift(ctl, ("ns", "p"), theirs())
    ctl.sync(("ns", "p"))
    assert apps.stored["spec"]["replicas"] == 1
    assert len([e for e in ctl.recorder.events if e[2] == "DriftConflict"]) == 1


# -- allowed sweeper images ---------------------------------------------------------------

def image_policy(image=None, generation=1):
    spec = {"queue": "orders", "redis": {"secretRef": {"name": "creds", "key": "url"}}}
    if image is not None:
        spec["sweeper"] = {"image": image}
    return policy_body(spec, generation=generation)


def reconcile_image(image, *, sweeper_image="img:1", allowed=()):
    """(apps, ctl, outcome or the InvalidPolicy raised) for one policy with ``image``."""
    from stalledpolicy.controller.reconcile import InvalidPolicy, reconcile

    apps = FakeApps()
    ctl = fake_controller(apps, config=OperatorConfig(sweeper_image=sweeper_image, max_backoff=60,
                                                      allowed_sweeper_images=tuple(allowed)))
    try:
        return apps, ctl, reconcile(ctl, image_policy(image))
    except InvalidPolicy as exc:
        return apps, ctl, exc


def test_a_sweeper_image_outside_the_allowlist_is_invalid_spec_and_runs_nowhere():
    from stalledpolicy.controller.reconcile import InvalidPolicy

    apps, ctl, refused = reconcile_image("attacker.example/steal:1", allowed=["registry.example/team/*"])
    assert isinstance(refused, InvalidPolicy)
    assert apps.applied == [] and apps.stored is None and apps.patches == []
    outcome = ctl.policies[("ns", "p")].outcome
    assert (outcome.ok, outcome.reason) == (False, "InvalidSpec")
    message = outcome.message
    assert str(refused) == message
    assert message.startswith("spec.sweeper.image 'attacker.example/steal:1' is not an allowed sweeper image")
    assert "'img:1'" in message and "'registry.example/team/*'" in message
    assert "remove spec.sweeper.image" in message and "sweeperAllowedImages" in message
    [(name, kind, reason, text)] = ctl.recorder.events
    assert (name, kind, reason, text) == ("p", "Warning", "InvalidSpec", message)


def test_an_allowed_prefix_or_exact_image_passes_and_a_near_miss_does_not():
    allowed = ["registry.example/team/*", "mirror.example/sweeper:2"]
    for image in ("registry.example/team/sweeper:2", "registry.example/team/a/b@sha256:" + "0" * 64,
                  "mirror.example/sweeper:2"):
        apps, _, outcome = reconcile_image(image, allowed=allowed)
        assert outcome.ok, image
        assert apps.stored["spec"]["template"]["spec"]["containers"][0]["image"] == image
    for image in ("registry.example/team-b/sweeper:2", "registry.example/teamsweeper:2",
                  "mirror.example/sweeper:20", "mirror.example/sweeper", "docker.io/registry.example/team/x"):
        apps, ctl, outcome = reconcile_image(image, allowed=allowed)
        assert ctl.policies[("ns", "p")].outcome.reason == "InvalidSpec", image
        assert apps.stored is None, image


def test_by_default_only_the_operators_own_sweeper_image_is_allowed():
    from stalledpolicy.controller.sweeper_image import default_sweeper_image

    # The configured sweeper image, set explicitly or left out.
    assert reconcile_image("img:1")[2].ok
    assert reconcile_image(None)[2].ok
    assert not getattr(reconcile_image("img:2")[2], "ok", False)
    assert not getattr(reconcile_image(default_sweeper_image())[2], "ok", False)
    # No configured sweeper image: the operator's own default.
    assert reconcile_image(default_sweeper_image(), sweeper_image=None)[2].ok
    assert not getattr(reconcile_image("img:1", sweeper_image=None)[2], "ok", False)
    message = reconcile_image("img:2")[1].policies[("ns", "p")].outcome.message
    assert "allows 'img:1' only" in message


def test_a_lone_star_allows_any_image():
    for image in ("anything:1", "attacker.example/steal@sha256:" + "1" * 64):
        assert reconcile_image(image, allowed=["*"])[2].ok


def test_a_running_sweeper_of_a_refused_image_is_scaled_to_zero_and_an_allowed_one_is_left():
    from stalledpolicy.controller.drift import drifted_policy
    from stalledpolicy.controller.reconcile import InvalidPolicy, reconcile

    apps = FakeApps()
    ctl = fake_controller(apps, config=OperatorConfig(sweeper_image="img:1", allowed_sweeper_images=("*",)))
    body = image_policy("custom:1")
    assert reconcile(ctl, body).ok and apps.stored["spec"]["replicas"] == 1

    # The admin narrows the list and restarts the operator (kopf resumes every policy).
    ctl.config = OperatorConfig(sweeper_image="img:1")
    with pytest.raises(InvalidPolicy, match="runs a refused image \\('custom:1'\\) and is scaled to 0 replicas"):
        reconcile(ctl, body)
    assert apps.patches == [{"spec": {"replicas": 0}}]
    assert apps.stored["spec"]["replicas"] == 0
    assert len(apps.applied) == 1  # nothing applied for the refused spec
    assert ctl.policies[("ns", "p")].outcome.reason == "InvalidSpec"
    assert drifted_policy(ctl, copy.deepcopy(apps.stored)) is None  # our scale-down is no drift to revert
    message = ctl.policies[("ns", "p")].outcome.message
    with pytest.raises(InvalidPolicy, match="is scaled to 0 replicas"):
        reconcile(ctl, body)
    assert len(apps.patches) == 1  # already at 0: no second patch, and the same message (one event)
    assert ctl.policies[("ns", "p")].outcome.message == message
    assert [e[2] for e in ctl.recorder.events].count("InvalidSpec") == 1

    # Fixed spec: applied again, replicas back.
    fixed = image_policy(None, generation=2)
    assert reconcile(ctl, fixed).ok
    assert apps.stored["spec"]["replicas"] == 1
    assert apps.stored["spec"]["template"]["spec"]["containers"][0]["image"] == "img:1"

    # An edit to a refused image keeps the running (allowed) sweeper, as any InvalidSpec does.
    with pytest.raises(InvalidPolicy, match="keeps running its last applied spec"):
        reconcile(ctl, image_policy("evil:1", generation=3))
    assert apps.stored["spec"]["replicas"] == 1 and len(apps.patches) == 1
    assert apps.stored["spec"]["template"]["spec"]["containers"][0]["image"] == "img:1"


def test_a_failed_scale_down_of_a_refused_sweeper_is_retried():
    from stalledpolicy.controller.reconcile import InvalidPolicy, RetryLater, reconcile

    apps = FakeApps()
    ctl = fake_controller(apps, config=OperatorConfig(sweeper_image="img:1", allowed_sweeper_images=("*",)))
    body = image_policy("custom:1")
    reconcile(ctl, body)
    ctl.config = OperatorConfig(sweeper_image="img:1", max_backoff=60)
    apps.refuse = api_error(500, "Internal Server Error", "etcd is down")
    with pytest.raises(RetryLater, match="may still run a refused image") as retried:
        reconcile(ctl, body)
    assert retried.value.first_delay == 5
    outcome = ctl.policies[("ns", "p")].outcome
    assert outcome.reason == "InvalidSpec" and "etcd is down" in outcome.message
    apps.refuse = None
    with pytest.raises(InvalidPolicy, match="is scaled to 0 replicas"):
        reconcile(ctl, body)
    assert apps.stored["spec"]["replicas"] == 0


def test_allowed_sweeper_images_from_env_and_its_errors():
    env = {"STALLEDPOLICY_OPERATOR_ALLOWED_SWEEPER_IMAGES": " registry.example/team/*, other:1 "}
    config = OperatorConfig.from_env(env)
    assert config.allowed_sweeper_images == ("registry.example/team/*", "other:1")
    assert OperatorConfig.from_env(config.to_env()) == config
    assert OperatorConfig.from_env({}).allowed_sweeper_images == ()
    assert OperatorConfig.from_env({"STALLEDPOLICY_OPERATOR_ALLOWED_SWEEPER_IMAGES": ""}).allowed_sweeper_images == ()
    assert "STALLEDPOLICY_OPERATOR_ALLOWED_SWEEPER_IMAGES" not in OperatorConfig().to_env()
    config = OperatorConfig.from_env({"STALLEDPOLICY_OPERATOR_ALLOWED_SWEEPER_IMAGES": "*"})
    assert config.allowed_sweeper_images == ("*",)
    for raw, complaint in [("registry.example/*/x", "only at the end"), ("a:1,,b:1", "an entry is empty"),
                           ("a:1,", "an entry is empty"), ("a b:1", "no whitespace"), ("**", "only at the end"),
                           ("registry.example*", "ends at a '/', ':' or '@'")]:
        with pytest.raises(SystemExit) as refused:
            OperatorConfig.from_env({"STALLEDPOLICY_OPERATOR_ALLOWED_SWEEPER_IMAGES": raw})
        text = str(refused.value.code)
        assert text.startswith(f"STALLEDPOLICY_OPERATOR_ALLOWED_SWEEPER_IMAGES={raw!r}: ") and complaint in text, text


def test_allowed_sweeper_images_from_flags_override_the_env(monkeypatch, capsys):
    from stalledpolicy.cli import build_parser
    from stalledpolicy.controller.cli import config_from_args

    monkeypatch.setenv("STALLEDPOLICY_OPERATOR_ALLOWED_SWEEPER_IMAGES", "from-env:1")
    args = build_parser().parse_args(["operator", "-A", "--allowed-sweeper-image", "registry.example/team/*",
                                      "--allowed-sweeper-image", "other:1"])
    assert config_from_args(args).allowed_sweeper_images == ("registry.example/team/*", "other:1")
    args = build_parser().parse_args(["operator", "-A"])
    assert config_from_args(args).allowed_sweeper_images == ("from-env:1",)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["operator", "-A", "--allowed-sweeper-image", "registry.example/*/x"])
    err = capsys.readouterr().err
    assert "--allowed-sweeper-image" in err and "only at the end" in err


def test_image_allowed_matches_exactly_or_by_prefix():
    from stalledpolicy.controller.config import image_allowed

    assert image_allowed("own:1", (), "own:1")
    assert not image_allowed("own:2", (), "own:1")
    assert image_allowed("r.example/t/x:1", ("r.example/t/*",), "own:1")
    assert not image_allowed("r.example/tx:1", ("r.example/t/*",), "own:1")
    assert image_allowed("x:10", ("x:1*",), "own:1") and not image_allowed("x:10", ("x:1",), "own:1")
    assert image_allowed("anything", ("*",), "own:1")



def test_the_operator_without_kubernetes_credentials_exits_2_at_once(tmp_path):
    """Not in a cluster and no kubeconfig: one line and exit 2, not kopf's login
    retried every minute with a traceback."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
    env["HOME"] = str(tmp_path)
    result = subprocess.run([sys.executable, "-m", "stalledpolicy", "operator", "-A"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "stalledpolicy operator: no Kubernetes credentials: not running in a cluster (no service account) "
        "and the kubeconfig ~/.kube/config cannot be used (ConfigException); give --kubeconfig FILE or set "
        "KUBECONFIG"]


def test_the_kubeconfig_flag_is_used_whatever_other_flags_are_given(tmp_path):
    """--kubeconfig reaches the kubernetes client with every flag the chart passes:
    the client reads KUBECONFIG once, when imported, so checking a flag's value
    must not import it first (--leader-election-lease once did, and the chart's
    operator found no credentials). The server named is one nothing listens on:
    past the credentials check the operator keeps retrying until stopped."""
    import os
    import signal
    import socket
    import subprocess

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}], "current-context": "x"}))
    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
    env["HOME"] = str(tmp_path)
    log = tmp_path / "operator.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "stalledpolicy", "operator", "--all-namespaces", "--metrics-port=0",
             "--liveness=http://127.0.0.1:0/healthz", "--status-interval=10s", "--max-backoff=5m",
             "--status-workers=2", "--log-format=json", "--leader-election-lease=default/some-lease",
             "--sweeper-image=registry.example/sweeper:1", "--kubeconfig", str(kubeconfig)],
            env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while process.poll() is None and "kopf" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert process.poll() is None, log.read_text()
        assert "no Kubernetes credentials" not in log.read_text()
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def test_a_deleted_sweeper_whose_policy_cannot_be_read_is_put_back_by_the_retries():
    """The policy's GET after its sweeper was deleted meets no API server (a real
    socket nothing listens on): an ApplyFailed condition saying so, and the status
    loop's re-apply with backoff, not an exception into kopf's event handler."""
    import socket

    from kubernetes import client

    from stalledpolicy.controller.sweeper_events import reapply_after_deletion

    apps, ctl, body = reconciled_policy({("ns", "creds"): {"url": b64("redis://db:6379/0")}})
    deleted = copy.deepcopy(apps.stored)
    apps.stored = None
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there: connections are refused
    api = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}"))
    ctl.custom = client.CustomObjectsApi(api)
    ctl.observe_deployment(deleted, "DELETED")

    reapply_after_deletion(ctl, deleted)
    ctl.sync(("ns", "p"))

    state = ctl.policies[("ns", "p")]
    assert ctl.retries.failures(("ns", "p")) == 1 and apps.stored is None
    assert state.outcome.reason == "ApplyFailed" and not state.outcome.ok
    assert "cannot check that StalledPolicy ns/p still exists" in state.outcome.message
    assert "p-sweeper" in state.outcome.message
    assert ctl.sync(("ns", "p")) <= 5 and apps.stored is None  # the retry is not due yet
    retry_due(ctl)
    ctl.sync(("ns", "p"))  # still no API server: not applied, the next retry later
    assert apps.stored is None and ctl.retries.failures(("ns", "p")) == 2

    class Answering:
        def get_namespaced_custom_object(self, *args, **kwargs):
            return copy.deepcopy(body)

        def patch_namespaced_custom_object_status(self, *args, **kwargs):
            pass

    ctl.custom = Answering()  # the API server is back
    retry_due(ctl)
    delay = ctl.sync(("ns", "p"))
    assert apps.stored is not None, "the sweeper was not applied again"
    assert state.outcome.ok and ctl.retries.failures(("ns", "p")) == 0 and delay is not None


def test_a_refused_apply_over_a_sweeper_at_zero_is_not_available():
    """spec.sweeper.replicas 0 -> 2 with a PriorityClass that does not exist: the apply
    is refused and the Deployment still asks for 0. SweeperAvailable must not say "0 of
    0 available"."""
    from stalledpolicy.controller.reconcile import RetryLater, reconcile

    apps = FakeApps()
    ctl = fake_controller(apps, {("ns", "creds"): {"url": b64("redis://db:6379/0")}})
    spec = {"queue": "orders", "redis": {"secretRef": {"name": "creds", "key": "url"}},
            "sweeper": {"replicas": 0}}
    body = policy_body(copy.deepcopy(spec))
    ctl.observe_policy(body, "ADDED")
    reconcile(ctl, body)
    apps.stored["status"] = {"observedGeneration": 1, "replicas": 0}
    ctl.observe_deployment(copy.deepcopy(apps.stored), "MODIFIED")
    spec["sweeper"] = {"replicas": 2, "priorityClassName": "missing-class"}
    edited = policy_body(spec, generation=2)
    apps.refuse = api_error(403, "Forbidden", "no PriorityClass with name missing-class was found")
    with pytest.raises(RetryLater):
        reconcile(ctl, edited)
    outcome = ctl.policies[("ns", "p")].outcome
    assert (outcome.reason, outcome.replicas) == ("ApplyFailed", 2)
    ctl.sync(("ns", "p"))
    status = ctl.policies[("ns", "p")].status
    sweeper = [c for c in status["conditions"] if c["type"] == "SweeperAvailable"][0]
    assert sweeper["status"] == "False", sweeper
    assert "the policy for 2" in sweeper["message"]
    assert [c for c in status["conditions"] if c["type"] == "Ready"][0]["reason"] == "ApplyFailed"


def test_a_missing_secret_is_looked_at_again_every_interval_not_after_a_growing_backoff():
    """A user who creates the Secret waited up to max_backoff (5 minutes by default)
    for the status to see it: the delay doubled as for an outage of Redis."""
    from stalledpolicy.controller.reconcile import reconcile
    from stalledpolicy.controller.status import condition_of

    apps = FakeApps()
    ctl = fake_controller(apps, {}, config=OperatorConfig(sweeper_image="img:1", status_interval=10,
                                                          max_backoff=300))
    body = policy_body()
    ctl.observe_policy(body, "ADDED")
    reconcile(ctl, body)
    delays = [ctl.sync(("ns", "p")) for _ in range(5)]
    assert delays == [10] * 5
    assert condition_of(ctl.policies[("ns", "p")].status, "Ready")["reason"] == "SecretNotFound"


def test_an_unreachable_redis_is_read_again_after_the_status_interval_doubled_per_failure():
    """An outage of Redis: the next refresh waits the status interval doubled per
    failed refresh, up to max_backoff; a missing Secret in between is looked at the
    next interval, and a read that succeeds brings the interval back."""
    import redis  # here, as in this file's other tests: the file loads no redis-py for the rest

    apps = FakeApps()
    secrets = {("ns", "creds"): {"url": b64("redis://db:6379/0")}}
    ctl = fake_controller(apps, secrets, config=OperatorConfig(sweeper_image="img:1", status_interval=10,
                                                               max_backoff=45))
    body = policy_body()
    ctl.observe_policy(body, "ADDED")
    reconcile_policy(ctl, body)
    readable = ctl.snapshot_fn

    def down(*_args, **_kwargs):
        raise redis.ConnectionError("Connection refused")

    ctl.snapshot_fn = down
    assert [ctl.sync(("ns", "p")) for _ in range(4)] == [10, 20, 40, 45]
    saved = secrets.pop(("ns", "creds"))
    ctl.secrets.forget("ns", "creds")
    assert ctl.sync(("ns", "p")) == 10, "a missing Secret is looked at every interval"
    secrets[("ns", "creds")] = saved
    assert ctl.sync(("ns", "p")) == 45, "the outage goes on: its backoff too"
    ctl.snapshot_fn = readable
    assert [ctl.sync(("ns", "p")) for _ in range(2)] == [10, 10]
    ctl.snapshot_fn = down
    assert ctl.sync(("ns", "p")) == 10, "a new outage backs off from the start"
    assert ctl.sync(("ns", "p")) == 20
    successor = policy_body()  # deleted and created again under the name, its deletion not seen
    successor["metadata"].update(uid="u-2", resourceVersion="9")
    apps.stored = None  # the old sweeper went with its policy
    ctl.observe_policy(successor, "ADDED")
    assert ctl.policies[("ns", "p")].body["metadata"]["uid"] == "u-2"
    reconcile_policy(ctl, successor)
    assert ctl.sync(("ns", "p")) == 10, "the backoff of the policy it replaced is not its own"


def test_a_connection_dropped_after_redis_answered_is_not_blamed_on_tls():
    """A proxy in front of a Redis that went down closes connections as a TLS-only
    server does: once a read of the queue came back on this URL, the policy's status
    tells the outage in redis-py's words, not as a question about rediss:// (the
    sweeper's rule, carried to the operator). Before any answer, and again once no
    policy names the URL, the question stands."""
    import redis

    from stalledpolicy.controller.queue_figures import read_queue

    closed = redis.ConnectionError("Connection closed by server.")
    replies = []

    def snapshot_fn(client, queue, lanes):
        reply = replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    clients = RedisClients(connect_fn=lambda url, timeout: FakeClient(url))
    secrets = SecretReader(lambda ns, name: None, ttl=1)
    spec = {"queue": "orders", "redis": {"url": "redis://db:6379/0"}}

    def read(key=("ns", "p")):
        return read_queue(key, spec, secrets=secrets, clients=clients, snapshot_fn=snapshot_fn)

    replies[:] = [closed]
    _, _, problem, _ = read()
    assert "speaking TLS only" in problem.message, problem.message

    replies[:] = ["snapshot", closed]
    assert read()[1] == "snapshot"
    _, _, problem, _ = read()
    assert problem.reason == "RedisUnreachable"
    assert problem.message == ("cannot read queue orders at redis://db:6379/0: "
                               "ConnectionError: Connection closed by server.")
    replies[:] = [closed]  # another policy of the same URL: Redis answered there too
    assert "TLS" not in read(("ns", "q"))[2].message

    clients.drop(("ns", "p"))
    clients.drop(("ns", "q"))
    replies[:] = [closed]
    assert "speaking TLS only" in read()[2].message


def test_a_disowned_sweeper_is_found_by_its_name_short_or_hash_shortened():
    from stalledpolicy.controller import FIELD_MANAGER
    from stalledpolicy.controller.events import NullRecorder
    from stalledpolicy.controller.runtime import Controller
    from stalledpolicy.controller.sweeper_events import disowned_policy
    from stalledpolicy.policy.builder import sweeper_labels, sweeper_name

    ctl = Controller(OperatorConfig(), apps=None, core=None, custom=None, recorder=NullRecorder(),
                     secrets=SecretReader(lambda ns, name: None, ttl=1), clients=RedisClients(),
                     snapshot_fn=lambda *a, **k: None)
    long_name = "a" * 250 + ".b"  # past 245 characters: its sweeper's name is hash-shortened
    for index, name in enumerate(["orders", "orders-1234abcd", long_name, "going"]):
        meta = {"name": name, "namespace": "ns", "uid": f"u{index}", "generation": 1, "resourceVersion": "1"}
        if name == "going":
            meta["deletionTimestamp"] = "2026-12-06T00:00:00Z"
        ctl.get_or_create_state({"metadata": meta, "spec": {"queue": name}})

    def unowned(policy, namespace="ns", labels=None):
        return {"metadata": {"name": sweeper_name(policy), "namespace": namespace,
                             "labels": sweeper_labels(policy) if labels is None else labels,
                             "managedFields": [{"manager": FIELD_MANAGER}]}}

    assert sweeper_name(long_name) != long_name + "-sweeper"
    assert disowned_policy(ctl, unowned("orders")) == ("ns", "orders")
    assert disowned_policy(ctl, unowned("orders-1234abcd")) == ("ns", "orders-1234abcd")
    assert disowned_policy(ctl, unowned(long_name)) == ("ns", long_name)
    assert disowned_policy(ctl, unowned("orders", namespace="other")) is None
    assert disowned_policy(ctl, unowned("unknown")) is None
    assert disowned_policy(ctl, unowned("going")) is None  # its policy is being deleted
    assert disowned_policy(ctl, unowned("orders", labels=sweeper_labels("else"))) is None  # not its labels
    owned = unowned("orders")
    owned["metadata"]["ownerReferences"] = [{"kind": "StalledPolicy", "name": "orders", "uid": "u0",
                                             "controller": True}]
    assert disowned_policy(ctl, owned) is None
