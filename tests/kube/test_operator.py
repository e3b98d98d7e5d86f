"""The operator against the real control plane (real CRD, real garbage collector),
run as a process under a ServiceAccount holding only the chart's RBAC rules."""

from __future__ import annotations

import json
import re
import time
import urllib.request

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stalledpolicy.controller.config import OperatorConfig
from stalledpolicy.controller.reconcile import InvalidPolicy, reconcile
from stalledpolicy.controller.wiring import build_controller
from stalledpolicy.devenv.ports import free_port
from tests.kube.operator_harness import (
    OperatorProcess,
    PodRunnerThread,
    apply_crd,
    condition,
    events_for,
    operator_kubeconfig,
    policy_manifest,
    read_deployment,
    redis_secret,
    wait_for,
)

pytestmark = [pytest.mark.kube, pytest.mark.redis]

GROUP, VERSION, PLURAL = "queues.emq.dev", "v1alpha1", "stalledpolicies"
# Chosen when the operator starts (chosen at import, minutes before, a Redis of the
# session could take one first): its liveness and metrics ports.
PORTS: dict[str, int] = {}


@pytest.fixture(scope="module")
def operator(control_plane, kube_api, tmp_path_factory):
    apply_crd(control_plane)
    kubeconfig = operator_kubeconfig(control_plane, kube_api)
    log_path = tmp_path_factory.mktemp("operator") / "operator.log"
    PORTS.update(liveness=free_port(), metrics=free_port())
    process = OperatorProcess(kubeconfig, log_path, "--all-namespaces",
                              "--liveness", f"http://127.0.0.1:{PORTS['liveness']}/healthz",
                              "--metrics-port", str(PORTS["metrics"]), "--metrics-address", "127.0.0.1")
    # Started, not just spawned: a test run alone would otherwise read an empty log
    # and signal an interpreter that has not yet installed its SIGTERM handling.
    # Stopped if it never answers: left running, it would serve every namespace
    # beside the operators of the tests that follow.
    try:
        wait_for(lambda: _answers(f"http://127.0.0.1:{PORTS['liveness']}/healthz"),
                 "the operator's liveness endpoint")
    except BaseException:
        process.stop()
        raise
    yield process
    code = process.stop()
    assert code == 0, f"the operator did not exit cleanly on SIGTERM ({code}):\n{process.log()[-3000:]}"


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


@pytest.fixture
def apis(kube_api):
    return client.CoreV1Api(kube_api), client.AppsV1Api(kube_api), client.CustomObjectsApi(kube_api)


@pytest.fixture
def secret(apis, kube_namespace, redis_server):
    core, _, _ = apis
    core.create_namespaced_secret(kube_namespace, redis_secret("redis", redis_server.url))
    return "redis"


@pytest.fixture
def pods(kube_api, kube_namespace, tmp_path):
    runner = PodRunnerThread(kube_api, kube_namespace, tmp_path / "pods")
    yield runner
    runner.stop()


def get_policy(custom, namespace, name):
    return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def env_of(deployment) -> dict:
    return {e.name: e.value for e in deployment.spec.template.spec.containers[0].env if e.value is not None}


def our_managed_fields(deployment) -> list:
    return [(m.operation, m.time, m.fields_v1) for m in deployment.metadata.managed_fields
            if m.manager == "stalledpolicy-operator"]


def create_policy(custom, namespace, manifest):
    return custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)


def wait_for_reason(custom, namespace: str, name: str, reason: str, type_: str = "Ready") -> dict:
    """The policy's ``type_`` condition once its reason is ``reason``."""
    def check():
        found = condition(get_policy(custom, namespace, name), type_)
        return found if found and found["reason"] == reason else None
    return wait_for(check, f"{type_} reason {reason}")


def test_policy_becomes_a_sweeper_deployment_owned_by_it(operator, apis, kube_namespace, secret, queue_name):
    _, apps, custom = apis
    created = create_policy(custom, kube_namespace, policy_manifest("orders", queue_name, max_stalled=2))
    deployment = wait_for(lambda: read_deployment(apps, kube_namespace, "orders-sweeper"), "the sweeper")
    owner = deployment.metadata.owner_references[0]
    assert (owner.kind, owner.name, owner.uid, owner.controller) == (
        "StalledPolicy", "orders", created["metadata"]["uid"], True)
    assert env_of(deployment)["STALLEDPOLICY_MAX_STALLED"] == "2"
    url = next(e for e in deployment.spec.template.spec.containers[0].env if e.name == "STALLEDPOLICY_REDIS_URL")
    assert url.value is None and url.value_from.secret_key_ref.name == "redis"
    managers = {m.manager for m in deployment.metadata.managed_fields}
    assert "stalledpolicy-operator" in managers
    policy = get_policy(custom, kube_namespace, "orders")
    assert not policy["metadata"].get("finalizers"), "the operator must not add finalizers"


def test_second_reconcile_changes_nothing(operator, apis, kube_api, kube_namespace, secret, queue_name):
    _, apps, custom = apis
    create_policy(custom, kube_namespace, policy_manifest("idem", queue_name))
    first = wait_for(lambda: read_deployment(apps, kube_namespace, "idem-sweeper"), "the sweeper")
    # Let the operator finish with the new object (its status write and kopf's annotations).
    wait_for(lambda: (get_policy(custom, kube_namespace, "idem").get("status") or {}).get("observedGeneration"),
             "a first status")
    # The resourceVersion is no judge: the deployment controller keeps writing
    # the Deployment's status. A no-op apply leaves the generation, the spec and
    # our managed-fields entry (its timestamp included) exactly as they were.
    before = read_deployment(apps, kube_namespace, "idem-sweeper")
    ctl = build_controller(OperatorConfig(sweeper_image="stalledpolicy:test"), api_client=kube_api)
    body = get_policy(custom, kube_namespace, "idem")
    reconcile(ctl, body)
    reconcile(ctl, body)
    after = read_deployment(apps, kube_namespace, "idem-sweeper")
    assert after.metadata.uid == first.metadata.uid
    assert after.metadata.generation == before.metadata.generation
    assert after.spec == before.spec
    assert our_managed_fields(before), "the operator's server-side apply left no managed fields"
    assert our_managed_fields(after) == our_managed_fields(before)


def test_budget_change_updates_the_deployment_in_place_with_an_event(operator, apis, kube_api,
                                                                      kube_namespace, secret, queue_name):
    _, apps, custom = apis
    create_policy(custom, kube_namespace, policy_manifest("gitops", queue_name, max_stalled=1))
    first = wait_for(lambda: read_deployment(apps, kube_namespace, "gitops-sweeper"), "the sweeper")
    old_hash = first.spec.template.metadata.annotations["queues.emq.dev/config-hash"]
    custom.patch_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "gitops",
                                          {"spec": {"maxStalled": 4}})
    updated = wait_for(lambda: (lambda d: d if env_of(d)["STALLEDPOLICY_MAX_STALLED"] == "4" else None)(
        read_deployment(apps, kube_namespace, "gitops-sweeper")), "the new budget in the Deployment")
    assert updated.metadata.uid == first.metadata.uid
    assert updated.spec.template.metadata.annotations["queues.emq.dev/config-hash"] != old_hash
    changed = wait_for(lambda: [e for e in events_for(kube_api, kube_namespace, "gitops")
                                if e.reason == "BudgetChanged"], "a BudgetChanged event")
    assert "maxStalled 1 -> 4" in changed[0].message


def log_lines(operator, namespace: str, text: str) -> list[dict]:
    """The operator's lines (its own and kopf's) about ``namespace`` that say ``text`` (JSON logs)."""
    found = []
    for line in operator.log().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line being written
        if entry.get("namespace") == namespace and text in entry.get("msg", ""):
            found.append(entry)
    return found


def test_refuses_to_take_over_a_deployment_it_does_not_own(operator, apis, kube_api, kube_namespace,
                                                         secret, queue_name):
    _, apps, custom = apis
    labels = {"app": "theirs"}
    apps.create_namespaced_deployment(kube_namespace, {
        "metadata": {"name": "clash-sweeper", "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "app", "image": "theirs:1"}]}}}})
    before = read_deployment(apps, kube_namespace, "clash-sweeper")
    create_policy(custom, kube_namespace, policy_manifest("clash", queue_name))

    ready = wait_for_reason(custom, kube_namespace, "clash", "NameConflict")
    assert ready["status"] == "False" and "clash-sweeper" in ready["message"]
    warning = wait_for(lambda: [e for e in events_for(kube_api, kube_namespace, "clash")
                                if e.reason == "NameConflict"], "a NameConflict event")
    assert warning[0].type == "Warning"
    # An expected wait, said once as a warning by the operator; its retries are no ERROR.
    said = wait_for(lambda: log_lines(operator, kube_namespace, "clash-sweeper already exists"),
                    "the operator's warning")
    time.sleep(6)  # the first retry (5 s) runs meanwhile; it must neither write nor say it again
    said = log_lines(operator, kube_namespace, "clash-sweeper already exists")
    assert [entry["level"] for entry in said] == ["warning"], said
    after = read_deployment(apps, kube_namespace, "clash-sweeper")
    # (Its status moves: the deployment controller works on it. Its spec must not.)
    assert after.metadata.generation == before.metadata.generation
    assert "stalledpolicy-operator" not in {m.manager for m in after.metadata.managed_fields}
    assert not after.metadata.owner_references
    assert after.spec.template.spec.containers[0].image == "theirs:1"


def test_a_refused_sweeper_image_is_invalid_spec_and_a_running_one_is_scaled_to_zero(
        operator, apis, kube_api, kube_namespace, secret, queue_name):
    _, apps, custom = apis
    manifest = policy_manifest("custom", queue_name)
    manifest["spec"]["sweeper"] = {"image": "attacker.example/steal:1"}
    create_policy(custom, kube_namespace, manifest)

    # The operator (default allowlist: its own --sweeper-image only) refuses it.
    ready = wait_for_reason(custom, kube_namespace, "custom", "InvalidSpec")
    assert ready["status"] == "False"
    assert ready["message"].startswith("spec.sweeper.image 'attacker.example/steal:1' is not an allowed")
    wait_for(lambda: [e for e in events_for(kube_api, kube_namespace, "custom") if e.reason == "InvalidSpec"],
             "an InvalidSpec event")
    assert read_deployment(apps, kube_namespace, "custom-sweeper") is None

    # A sweeper made while any image was allowed, then the list narrowed: scaled to 0.
    body = get_policy(custom, kube_namespace, "custom")
    lax = build_controller(OperatorConfig(sweeper_image="stalledpolicy:test", allowed_sweeper_images=("*",)),
                           api_client=kube_api)
    assert reconcile(lax, body).ok
    running = read_deployment(apps, kube_namespace, "custom-sweeper")
    assert running.spec.replicas == 1
    assert running.spec.template.spec.containers[0].image == "attacker.example/steal:1"
    strict = build_controller(OperatorConfig(sweeper_image="stalledpolicy:test"), api_client=kube_api)
    with pytest.raises(InvalidPolicy, match="is scaled to 0 replicas"):
        reconcile(strict, body)
    scaled = read_deployment(apps, kube_namespace, "custom-sweeper")
    assert scaled.spec.replicas == 0
    assert scaled.spec.template.spec.containers[0].image == "attacker.example/steal:1"  # nothing else changed

    # Fixed: the operator applies the policy again, with its own image and the replicas back.
    custom.patch_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "custom",
                                          {"spec": {"sweeper": {"image": None}}})
    fixed = wait_for(lambda: (lambda d: d if d and d.spec.replicas == 1
                              and d.spec.template.spec.containers[0].image == "stalledpolicy:test" else None)(
        read_deployment(apps, kube_namespace, "custom-sweeper")), "the sweeper with the operator's image")
    assert fixed.metadata.uid == running.metadata.uid


def test_missing_secret_is_ready_false_then_recovers(operator, apis, kube_namespace, redis_server, queue_name):
    core, _, custom = apis
    create_policy(custom, kube_namespace, policy_manifest("nosecret", queue_name, secret="later"))

    redis_condition = wait_for_reason(custom, kube_namespace, "nosecret", "SecretNotFound", "RedisReachable")
    assert redis_condition["status"] == "False" and "later" in redis_condition["message"]
    ready = condition(get_policy(custom, kube_namespace, "nosecret"), "Ready")
    assert ready["status"] == "False"
    core.create_namespaced_secret(kube_namespace, redis_secret("later", redis_server.url))
    reachable = wait_for_reason(custom, kube_namespace, "nosecret", "Reachable", "RedisReachable")
    assert reachable["status"] == "True"
    assert "password" not in json.dumps(get_policy(custom, kube_namespace, "nosecret")["status"]).lower()


def test_a_blank_secret_value_is_secret_value_empty_then_recovers(operator, apis, kube_namespace, redis_server,
                                                                   queue_name):
    """The key exists and holds only whitespace: SecretValueEmpty (it was SecretKeyNotFound,
    'has no key', which sent people looking for a key that is there)."""
    core, _, custom = apis
    core.create_namespaced_secret(kube_namespace, redis_secret("blank", " \n"))
    create_policy(custom, kube_namespace, policy_manifest("blankurl", queue_name, secret="blank"))

    redis_condition = wait_for_reason(custom, kube_namespace, "blankurl", "SecretValueEmpty", "RedisReachable")
    assert redis_condition["status"] == "False"
    assert redis_condition["message"].startswith(
        f"the value of key 'url' in Secret {kube_namespace}/blank (spec.redis.secretRef) is empty or only whitespace; ")
    ready = condition(get_policy(custom, kube_namespace, "blankurl"), "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "SecretValueEmpty")
    core.patch_namespaced_secret("blank", kube_namespace, {"stringData": {"url": redis_server.url}})
    # read again once the operator's Secret cache (30 s) expires
    reachable = wait_for(lambda: (lambda c: c if c and c["reason"] == "Reachable" else None)(
        condition(get_policy(custom, kube_namespace, "blankurl"), "RedisReachable")), "RedisReachable again",
        timeout=75, interval=1)
    assert reachable["status"] == "True"
    assert redis_server.url not in json.dumps(get_policy(custom, kube_namespace, "blankurl")["status"])


def policy_gone(custom, namespace: str, name: str) -> bool:
    try:
        get_policy(custom, namespace, name)
        return False
    except ApiException as exc:
        return exc.status == 404


def test_deleting_the_policy_garbage_collects_its_sweeper(operator, apis, kube_namespace, secret, queue_name):
    _, apps, custom = apis
    create_policy(custom, kube_namespace, policy_manifest("gone", queue_name))
    wait_for(lambda: read_deployment(apps, kube_namespace, "gone-sweeper"), "the sweeper")
    custom.delete_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "gone")
    wait_for(lambda: policy_gone(custom, kube_namespace, "gone"),
             "the policy to disappear (no finalizer holds it)", timeout=15)
    wait_for(lambda: read_deployment(apps, kube_namespace, "gone-sweeper") is None,
             "the garbage collector to delete the sweeper")


def owner_uids(deployment) -> list[str]:
    return [ref.uid for ref in deployment.metadata.owner_references or [] if ref.controller]


def test_a_sweeper_that_lost_its_owner_reference_is_adopted_again(operator, apis, kube_api, kube_namespace,
                                                                   secret, queue_name):
    """Its owner reference removed by hand (or a GitOps tool), the sweeper was
    invisible to the operator: the garbage collector could no longer delete it
    with its policy, and every later edit was a NameConflict ("it was not
    created by this operator"), the sweeper keeping its old budget."""
    _, apps, custom = apis
    policy = create_policy(custom, kube_namespace, policy_manifest("orphaned", queue_name, max_stalled=2))
    uid = policy["metadata"]["uid"]
    wait_for(lambda: read_deployment(apps, kube_namespace, "orphaned-sweeper"), "the sweeper")
    wait_for_status(custom, kube_namespace, "orphaned")
    apps.patch_namespaced_deployment("orphaned-sweeper", kube_namespace,
                                     [{"op": "remove", "path": "/metadata/ownerReferences"}],
                                     _content_type="application/json-patch+json")
    wait_for(lambda: owner_uids(read_deployment(apps, kube_namespace, "orphaned-sweeper")) == [uid],
             "the owner reference put back", timeout=30)
    adopted = wait_for(lambda: [e for e in events_for(kube_api, kube_namespace, "orphaned")
                                if e.reason == "SweeperAdopted"], "a SweeperAdopted event")
    assert adopted[0].type == "Normal"
    custom.patch_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "orphaned",
                                          {"spec": {"maxStalled": 6}})
    wait_for(lambda: env_of(read_deployment(apps, kube_namespace, "orphaned-sweeper"))
             .get("STALLEDPOLICY_MAX_STALLED") == "6", "the edit applied", timeout=30)
    assert condition(get_policy(custom, kube_namespace, "orphaned"), "Ready")["reason"] != "NameConflict"


def test_a_policy_deleted_with_its_sweeper_orphaned_adopts_it_when_created_again(
        operator, apis, kube_api, kube_namespace, secret, queue_name):
    _, apps, custom = apis
    create_policy(custom, kube_namespace, policy_manifest("kept", queue_name, max_stalled=2))
    first = wait_for(lambda: read_deployment(apps, kube_namespace, "kept-sweeper"), "the sweeper")
    custom.delete_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "kept",
                                           body=client.V1DeleteOptions(propagation_policy="Orphan"))
    wait_for(lambda: policy_gone(custom, kube_namespace, "kept"), "the policy gone", timeout=30)
    wait_for(lambda: not owner_uids(read_deployment(apps, kube_namespace, "kept-sweeper")),
             "the sweeper orphaned by the garbage collector", timeout=30)
    second = create_policy(custom, kube_namespace, policy_manifest("kept", queue_name, max_stalled=5))
    adopted = wait_for(lambda: (lambda d: d if owner_uids(d) == [second["metadata"]["uid"]] else None)(
        read_deployment(apps, kube_namespace, "kept-sweeper")), "the new policy owning the sweeper", timeout=30)
    assert adopted.metadata.uid == first.metadata.uid  # the same Deployment, taken back
    assert env_of(adopted)["STALLEDPOLICY_MAX_STALLED"] == "5"
    assert not [e for e in events_for(kube_api, kube_namespace, "kept") if e.reason == "NameConflict"]


def test_kubectl_wait_for_ready_after_a_change(operator, pods, control_plane, apis, kube_namespace, secret,
                                               queue_name):
    _, apps, custom = apis
    create_policy(custom, kube_namespace, policy_manifest("waiter", queue_name))
    control_plane.kubectl("wait", "-n", kube_namespace, "--for=condition=Ready", "stalledpolicy/waiter",
                          "--timeout=90s")
    custom.patch_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "waiter",
                                          {"spec": {"maxStalled": 5}})
    control_plane.kubectl("wait", "-n", kube_namespace, "--for=condition=Ready", "stalledpolicy/waiter",
                          "--timeout=90s")
    policy = get_policy(custom, kube_namespace, "waiter")
    generation = policy["metadata"]["generation"]
    assert policy["status"]["observedGeneration"] == generation
    assert condition(policy, "Ready")["observedGeneration"] == generation
    deployment = read_deployment(apps, kube_namespace, "waiter-sweeper")
    assert env_of(deployment)["STALLEDPOLICY_MAX_STALLED"] == "5"
    # Ready after the change means the new pod template is rolled out and available.
    assert deployment.status.observed_generation == deployment.metadata.generation
    assert deployment.status.updated_replicas == 1 and deployment.status.available_replicas == 1
    # The old pod is gone from the API; the pod runner stops its process on its next look.
    running = wait_for(lambda: (lambda r: r if len(r) == 1 else None)(pods.runner.processes()),
                       "one sweeper process left", timeout=10)
    (name,) = running
    assert name.startswith("waiter-sweeper-")


def test_operator_logs_are_json_and_never_hold_the_password(operator):
    lines = [line for line in operator.log().splitlines() if line.strip()]
    assert lines
    for line in lines:
        entry = json.loads(line)
        assert "settings" not in entry
    # a URL is only ever shown redacted: its userinfo, if any, is the mask; the forms
    # our messages teach (redis://[user:password@]host:port/db) are placeholders, no one's
    from stalledpolicy.redis_url.redaction import URL_FORMS

    log = operator.log()
    for form in URL_FORMS:
        log = log.replace(form, "")
    assert set(re.findall(r"rediss?://([^@/\s\"]*)@", log)) <= {":***"}


def test_liveness_endpoint_answers(operator):
    assert operator.alive() and _answers(f"http://127.0.0.1:{PORTS['liveness']}/healthz")


def scrape_metrics() -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORTS['metrics']}/metrics", timeout=2) as answer:
            return answer.read().decode()
    except OSError:
        return ""


def sample(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def test_the_operator_serves_its_metrics(operator, apis, kube_namespace, secret, queue_name):
    _, apps, custom = apis
    create_policy(custom, kube_namespace, policy_manifest("scraped", queue_name))
    wait_for(lambda: read_deployment(apps, kube_namespace, "scraped-sweeper"), "the sweeper")
    ok = 'stalledpolicy_operator_reconciles_total{result="ok"}'
    text = wait_for(lambda: (lambda t: t if sample(t, ok) > 0 else None)(scrape_metrics()),
                    "a reconcile counted on /metrics", timeout=30)
    assert sample(text, "stalledpolicy_operator_policies") >= 1
    # the status loop has refreshed the policy (Redis is reachable: no failure of that reason)
    text = wait_for(lambda: (lambda t: t if sample(t, "stalledpolicy_operator_status_refreshes_total") > 0
                             else None)(scrape_metrics()), "a status refresh counted", timeout=30)
    assert "stalledpolicy_operator_status_loop_lag_seconds_count" in text
    assert "redis://" not in text and kube_namespace not in text  # no URL, namespace or policy in labels


def test_a_deleted_sweeper_is_put_back(operator, apis, kube_namespace, secret, queue_name):
    _, apps, custom = apis
    create_policy(custom, kube_namespace, policy_manifest("phoenix", queue_name))
    first = wait_for(lambda: read_deployment(apps, kube_namespace, "phoenix-sweeper"), "the sweeper")
    apps.delete_namespaced_deployment("phoenix-sweeper", kube_namespace)
    again = wait_for(lambda: (lambda d: d if d is not None and d.metadata.uid != first.metadata.uid else None)(
        read_deployment(apps, kube_namespace, "phoenix-sweeper")), "the sweeper re-created")
    assert again.metadata.owner_references[0].uid == first.metadata.owner_references[0].uid



def test_a_policy_deleted_and_created_again_waits_for_its_old_sweeper_without_a_name_conflict(
        operator, apis, kube_api, kube_namespace, secret, queue_name):
    """`kubectl delete` then `kubectl apply` of the same policy: the old sweeper is
    the garbage collector's to delete (held here by a finalizer, as a slow garbage
    collector would hold it); the new policy waits for it, says so, and gets its
    own sweeper once it is gone. It is no NameConflict asking to delete or rename."""
    _, apps, custom = apis
    first = create_policy(custom, kube_namespace, policy_manifest("reborn", queue_name))
    wait_for(lambda: read_deployment(apps, kube_namespace, "reborn-sweeper"), "the sweeper")
    hold = {"metadata": {"finalizers": ["test.emq.dev/hold"]}}
    apps.patch_namespaced_deployment("reborn-sweeper", kube_namespace, hold)
    custom.delete_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "reborn")
    wait_for(lambda: policy_gone(custom, kube_namespace, "reborn"), "the policy to disappear")
    second = create_policy(custom, kube_namespace, policy_manifest("reborn", queue_name))
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    try:
        ready = wait_for(lambda: condition(get_policy(custom, kube_namespace, "reborn"), "Ready"),
                         "a Ready condition of the new policy")
        assert ready["status"] == "False"
        assert ready["reason"] == "OldSweeperDeleting", ready
        assert "garbage collector" in ready["message"] and first["metadata"]["uid"] in ready["message"]
        sweeper = condition(get_policy(custom, kube_namespace, "reborn"), "SweeperAvailable")
        assert (sweeper["status"], sweeper["reason"]) == ("False", "OldSweeperDeleting")
        said = wait_for(lambda: log_lines(operator, kube_namespace, "belongs to the deleted"), "the operator's line")
        assert {entry["level"] for entry in said} == {"info"}, said  # an expected wait: news, not a warning
    finally:
        apps.patch_namespaced_deployment("reborn-sweeper", kube_namespace, {"metadata": {"finalizers": None}})

    def owned_by_the_new_policy():
        found = read_deployment(apps, kube_namespace, "reborn-sweeper")
        return found is not None and found.metadata.owner_references[0].uid == second["metadata"]["uid"]

    wait_for(owned_by_the_new_policy, "the new policy's own sweeper")
    wait_for(lambda: condition(get_policy(custom, kube_namespace, "reborn"), "SweeperAvailable")["reason"]
             != "OldSweeperDeleting", "the new sweeper in status")
    assert not [e for e in events_for(kube_api, kube_namespace, "reborn")
                if e.reason == "NameConflict" and e.involved_object.uid == second["metadata"]["uid"]]


def test_sweeper_pods_the_cluster_refuses_to_create_are_named_in_ready(operator, apis, kube_namespace, secret,
                                                                       queue_name):
    """A LimitRange (or a ResourceQuota, a PodSecurity level) refuses the sweeper's
    pods: only the Deployment's ReplicaFailure condition says so. Ready must carry
    it, not an endless '0 of 1 sweeper replicas available'."""
    core, apps, custom = apis
    core.create_namespaced_limit_range(kube_namespace, {
        "metadata": {"name": "small"},
        "spec": {"limits": [{"type": "Container", "max": {"memory": "100Mi"}}]}})  # the sweeper's: 256Mi
    create_policy(custom, kube_namespace, policy_manifest("limited", queue_name))
    ready = wait_for_reason(custom, kube_namespace, "limited", "PodsNotCreated")
    assert ready["status"] == "False"
    assert "limited-sweeper" in ready["message"] and "100Mi" in ready["message"], ready["message"]
    assert "spec.sweeper.resources" in ready["message"]
    sweeper = condition(get_policy(custom, kube_namespace, "limited"), "SweeperAvailable")
    assert (sweeper["status"], sweeper["reason"]) == ("False", "PodsNotCreated")

    core.delete_namespaced_limit_range("small", kube_namespace)  # the pods can be created again
    wait_for(lambda: condition(get_policy(custom, kube_namespace, "limited"), "SweeperAvailable")["reason"]
             != "PodsNotCreated", "the refusal to leave the status", timeout=120)


def test_a_namespace_being_deleted_is_no_apply_failure(control_plane, kube_api, apis, queue_name):
    """Deleting a namespace deletes the sweeper, often before its policy: putting it
    back is refused (403, NamespaceTerminating). That is the namespace going away,
    not an ApplyFailed (a warning, an event, the apply_failed metric that alerts)."""
    import uuid

    core, _, _ = apis
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": namespace}})
    # Something that holds the namespace in Terminating (a finalizer), as any slow deletion would.
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "hold",
                                                               "finalizers": ["test.emq.dev/hold"]}})
    try:
        core.delete_namespace(namespace)
        wait_for(lambda: core.read_namespace(namespace).status.phase == "Terminating", "Terminating")
        ctl = build_controller(OperatorConfig(sweeper_image="stalledpolicy:test"), api_client=kube_api)
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "StalledPolicy",
                "metadata": {"name": "leaving", "namespace": namespace, "uid": str(uuid.uuid4()),
                             "generation": 1, "resourceVersion": "1"},
                "spec": {"queue": queue_name, "redis": {"url": "redis://127.0.0.1:6379/0"}}}
        ctl.observe_policy(body, "MODIFIED")
        reconcile(ctl, body)  # raised RetryLater: "HTTP 403 ... being terminated"
        recorded = ctl.policies[(namespace, "leaving")]
        assert recorded.outcome is None or recorded.outcome.reason != "ApplyFailed"
        assert ctl.metrics.value("stalledpolicy_operator_reconciles_total", result="apply_failed") == 0
    finally:
        core.patch_namespaced_config_map("hold", namespace, {"metadata": {"finalizers": None}})


def test_steady_state_writes_nothing(operator, apis, kube_namespace, secret, queue_name):
    _, _, custom = apis
    create_policy(custom, kube_namespace, policy_manifest("quiet", queue_name))

    def settled():
        policy = get_policy(custom, kube_namespace, "quiet")
        return policy if (policy.get("status") or {}).get("observedGeneration") == 1 else None

    wait_for(settled, "a first status")
    # The Deployment settles (the deployment controller) and the status with it: no
    # write for two status intervals, however slowly this machine gets there.
    seen = []

    def unchanged_for_two_intervals():
        seen.append(get_policy(custom, kube_namespace, "quiet")["metadata"]["resourceVersion"])
        return len(seen) >= 3 and seen[-1] == seen[-2] == seen[-3] and seen[-1]

    before = wait_for(unchanged_for_two_intervals, "the status to settle", interval=1.0)
    time.sleep(5)  # five status intervals
    policy = get_policy(custom, kube_namespace, "quiet")
    assert policy["metadata"]["resourceVersion"] == before
    # the status is written under the operator's name (the client's default is "OpenAPI-Generator")
    status_writers = {e["manager"] for e in policy["metadata"]["managedFields"] if e.get("subresource") == "status"}
    assert status_writers == {"stalledpolicy-operator"}


def test_redis_unreachable_then_back_is_a_condition_and_two_events(operator, apis, kube_api, kube_namespace,
                                                                  redis_server, queue_name):
    core, _, custom = apis
    core.create_namespaced_secret(kube_namespace, redis_secret("flaky", "redis://:pw-not-shown@127.0.0.1:1/0"))
    create_policy(custom, kube_namespace, policy_manifest("flaky", queue_name, secret="flaky"))

    def redis_reason(expected):
        def check():
            found = condition(get_policy(custom, kube_namespace, "flaky"), "RedisReachable")
            return found if found and found["reason"] == expected else None
        return check

    down = wait_for(redis_reason("RedisUnreachable"), "RedisReachable=False reason RedisUnreachable")
    assert down["status"] == "False" and "127.0.0.1:1" in down["message"]
    assert "pw-not-shown" not in down["message"]
    core.patch_namespaced_secret("flaky", kube_namespace, {"stringData": {"url": redis_server.url}})
    wait_for(redis_reason("Reachable"), "RedisReachable=True after the Secret is fixed", timeout=30)
    # the event is posted after the status write that shows the condition
    reasons = wait_for(lambda: (lambda found: found if "RedisReachable" in found else None)(
        [e.reason for e in events_for(kube_api, kube_namespace, "flaky")]), "the RedisReachable event")
    time.sleep(2)  # two more status intervals: a repeat would have come
    reasons = [e.reason for e in events_for(kube_api, kube_namespace, "flaky")]
    assert reasons.count("RedisUnreachable") == 1 and reasons.count("RedisReachable") == 1
    assert all("pw-not-shown" not in e.message for e in events_for(kube_api, kube_namespace, "flaky"))


def test_suspended_policy_scales_the_sweeper_to_zero_and_is_ready(operator, apis, kube_namespace, secret,
                                                                  queue_name):
    _, apps, custom = apis
    manifest = policy_manifest("paused", queue_name)
    manifest["spec"]["suspend"] = True
    create_policy(custom, kube_namespace, manifest)

    def ready():
        found = condition(get_policy(custom, kube_namespace, "paused"), "Ready")
        return found if found and found["status"] == "True" else None

    assert wait_for(ready, "Ready=True while suspended")["reason"] == "Suspended"
    assert read_deployment(apps, kube_namespace, "paused-sweeper").spec.replicas == 0
    custom.patch_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "paused",
                                          {"spec": {"suspend": False}})
    wait_for(lambda: read_deployment(apps, kube_namespace, "paused-sweeper").spec.replicas == 1,
             "the sweeper scaled back to one")


def wait_for_status(custom, namespace, name):
    return wait_for(lambda: (get_policy(custom, namespace, name).get("status") or {}).get("observedGeneration"),
                    f"a first status of {name}")


def test_a_sweeper_scaled_or_edited_by_hand_is_put_back(operator, control_plane, apis, kube_api, kube_namespace,
                                                         secret, queue_name):
    _, apps, custom = apis
    create_policy(custom, kube_namespace, policy_manifest("drift", queue_name, max_stalled=2))
    first = wait_for(lambda: read_deployment(apps, kube_namespace, "drift-sweeper"), "the sweeper")
    wait_for_status(custom, kube_namespace, "drift")

    apps.patch_namespaced_deployment_scale("drift-sweeper", kube_namespace, {"spec": {"replicas": 0}})
    wait_for(lambda: read_deployment(apps, kube_namespace, "drift-sweeper").spec.replicas == 1,
             "the sweeper scaled back to the policy's one replica", timeout=30)

    control_plane.kubectl("-n", kube_namespace, "set", "env", "deployment/drift-sweeper",
                          "STALLEDPOLICY_MAX_STALLED=99")
    back = wait_for(lambda: (lambda d: d if env_of(d)["STALLEDPOLICY_MAX_STALLED"] == "2" else None)(
        read_deployment(apps, kube_namespace, "drift-sweeper")), "the policy's budget back in the env", timeout=30)
    assert back.metadata.uid == first.metadata.uid  # re-applied in place, not re-created
    reverted = wait_for(lambda: [e for e in events_for(kube_api, kube_namespace, "drift")
                                 if e.reason == "DriftReverted"], "a DriftReverted event")
    assert reverted[0].type == "Normal"

    # What server-side apply leaves alone (another manager's fields) and the
    # sweeper would run with: flags, a variable the policy does not set.
    # (One write: the third revert of the window, the last the budget allows.)
    container_path = "/spec/template/spec/containers/0"
    apps.patch_namespaced_deployment("drift-sweeper", kube_namespace, [
        {"op": "add", "path": f"{container_path}/args", "value": ["--max-stalled", "9"]},
        {"op": "add", "path": f"{container_path}/env/-", "value": {"name": "STALLEDPOLICY_LANES", "value": "vip=1"}},
        {"op": "add", "path": f"{container_path}/env/-", "value": {"name": "TZ", "value": "UTC"}}],
        _content_type="application/json-patch+json")
    cleaned = wait_for(lambda: (lambda d: d if not d.spec.template.spec.containers[0].args
                                and "STALLEDPOLICY_LANES" not in env_of(d) else None)(
        read_deployment(apps, kube_namespace, "drift-sweeper")), "the hand-added flags and variable taken out",
        timeout=30)
    assert env_of(cleaned)["TZ"] == "UTC" and env_of(cleaned)["STALLEDPOLICY_MAX_STALLED"] == "2"

    # No loop: our own (no-op) applies and the deployment controller's status
    # writes do not make the operator apply again.
    time.sleep(2)
    settled = read_deployment(apps, kube_namespace, "drift-sweeper")
    time.sleep(4)
    after = read_deployment(apps, kube_namespace, "drift-sweeper")
    assert after.metadata.generation == settled.metadata.generation
    assert our_managed_fields(after) == our_managed_fields(settled)


def test_an_apply_the_api_refuses_is_ready_false_with_its_message_and_an_event(operator, apis, kube_api,
                                                                                kube_namespace, secret,
                                                                                queue_name):
    _, apps, custom = apis
    manifest = policy_manifest("refused", queue_name)
    # An extended resource requested without its limit: the CRD admits it (it judges names
    # and request <= limit), the Pod API refuses it (test_crd: POD_ONLY's kind of rule).
    manifest["spec"]["sweeper"] = {"resources": {"requests": {"cpu": "10m", "example.com/gpu": "1"}}}
    create_policy(custom, kube_namespace, manifest)

    ready = wait_for_reason(custom, kube_namespace, "refused", "ApplyFailed")
    assert ready["status"] == "False"
    assert "HTTP 422" in ready["message"] and "Limit must be set" in ready["message"], ready["message"]
    warning = wait_for(lambda: [e for e in events_for(kube_api, kube_namespace, "refused")
                                if e.reason == "ApplyFailed"], "an ApplyFailed event")
    assert warning[0].type == "Warning" and "Limit must be set" in warning[0].message
    assert read_deployment(apps, kube_namespace, "refused-sweeper") is None
    time.sleep(6)  # retries (4s backoff cap here) post no second event for the same refusal
    assert len([e for e in events_for(kube_api, kube_namespace, "refused") if e.reason == "ApplyFailed"]) == 1
    lines = [json.loads(line) for line in operator.log().splitlines() if '"refused' in line]
    assert lines and not [entry for entry in lines if entry.get("exc")], "a traceback was logged"

    custom.patch_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "refused",
                                          {"spec": {"sweeper": {"resources": {"limits": {"example.com/gpu": "1"}}}}})
    wait_for(lambda: read_deployment(apps, kube_namespace, "refused-sweeper"), "the sweeper once the spec is fixed")
    wait_for(lambda: (lambda c: c and c["reason"] != "ApplyFailed")(
        condition(get_policy(custom, kube_namespace, "refused"), "Ready")), "Ready no longer ApplyFailed")


def test_a_rotated_secret_rolls_the_sweeper(operator, apis, kube_namespace, redis_server, queue_name):
    core, apps, custom = apis
    core.create_namespaced_secret(kube_namespace, redis_secret("rotating", redis_server.url))
    create_policy(custom, kube_namespace, policy_manifest("rotated", queue_name, secret="rotating"))
    first = wait_for(lambda: read_deployment(apps, kube_namespace, "rotated-sweeper"), "the sweeper")
    before = first.spec.template.metadata.annotations
    digest = before["queues.emq.dev/redis-secret-digest"]
    secret = core.read_namespaced_secret("rotating", kube_namespace)
    assert len(digest) == 16 and digest != secret.metadata.resource_version  # a digest of the value, not the version
    # keyed with the Secret's uid: who may only read pods cannot test guesses of the password
    from stalledpolicy.controller.redis_clients import secret_value_digest
    assert digest == secret_value_digest(kube_namespace, "rotating", "url", redis_server.url, secret.metadata.uid)
    assert digest != secret_value_digest(kube_namespace, "rotating", "url", redis_server.url, None)

    # A label (say, external-secrets' own) is a new resourceVersion, not a new value: no rollout.
    core.patch_namespaced_secret("rotating", kube_namespace, {"metadata": {"labels": {"synced": "yes"}}})
    time.sleep(45)  # past the operator's Secret cache (30 s) and a status interval
    assert read_deployment(apps, kube_namespace, "rotated-sweeper").metadata.generation == first.metadata.generation

    # A new password (here: the same server written another way) is a new value.
    same_server = redis_server.url.rsplit("/", 1)[0]
    core.patch_namespaced_secret("rotating", kube_namespace, {"stringData": {"url": same_server}})

    # The operator reads the Secret again when its cache (30 s) expires.
    rolled = wait_for(lambda: (lambda d: d if d.spec.template.metadata.annotations.get(
        "queues.emq.dev/redis-secret-digest") != digest else None)(
        read_deployment(apps, kube_namespace, "rotated-sweeper")), "a new Secret digest in the pod template",
        timeout=75, interval=1)
    assert rolled.metadata.generation == first.metadata.generation + 1, "one rollout, for the value only"
    after = rolled.spec.template.metadata.annotations
    assert after["queues.emq.dev/config-hash"] != before["queues.emq.dev/config-hash"]
    assert rolled.metadata.generation > first.metadata.generation and rolled.metadata.uid == first.metadata.uid
    assert same_server not in json.dumps(client.ApiClient().sanitize_for_serialization(rolled))
