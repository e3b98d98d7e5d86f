"""Pure parts of the operator: replay requests, event texts, Redis URL resolution,
ownership, the scheduler, log hygiene, and the pod runner's translation of a container."""

from __future__ import annotations

import base64
import logging
import sys
import threading
import time

import pytest

from stalledpolicy.controller import REPLAY_ANNOTATION, REPLAY_LANE_ANNOTATION
from stalledpolicy.controller.apply import conflict_reason
from stalledpolicy.controller.config import OperatorConfig, backoff
from stalledpolicy.controller.events import (budget_change_message, build_event,
                                             dead_letter_growth_message)
from stalledpolicy.controller.logfilter import KopfRecordFilter
from stalledpolicy.controller.redis_clients import RedisClients, RedisConfigError, SecretReader, resolve_url
from stalledpolicy.controller.replay import (InvalidReplayRequest, ReplayRequest, replay_warning,
                                               requested_replay)
from stalledpolicy.engine import ReplayResult
from stalledpolicy.controller.runtime import safe_error
from stalledpolicy.controller.scheduler import Scheduler
from stalledpolicy.devenv.podrunner import EnvError, local_command, probe_port, resolve_env


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
    assert "s3cret" not in text and "user" not in text
    assert text == "ConnectionError: cannot connect to redis://:***@db:6380/1 using ***"


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


# -- ownership -----------------------------------------------------------------------

def test_conflict_reason():
    ours = {"metadata": {"ownerReferences": [{"kind": "StalledPolicy", "name": "p", "uid": "u1",
                                              "controller": True}]}}
    assert conflict_reason(None, "u1") is None
    assert conflict_reason(ours, "u1") is None
    assert "not by this policy" in conflict_reason(ours, "u2")
    assert "no controller owner" in conflict_reason({"metadata": {}}, "u1")
    not_controller = {"metadata": {"ownerReferences": [{"uid": "u1", "controller": False}]}}
    assert conflict_reason(not_controller, "u1") is not None


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
    from stalledpolicy.controller.runtime import snapshot

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
