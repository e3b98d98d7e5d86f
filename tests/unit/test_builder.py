"""The sweeper Deployment builder: pure, deterministic, secret-free, restricted."""

from __future__ import annotations

import copy
import json

import pytest

from stalledpolicy.policy.builder import (
    APPLIED_DIGEST_ANNOTATION,
    CONFIG_HASH_ANNOTATION,
    applied_digest,
    build_sweeper_deployment,
    sweeper_labels,
    sweeper_name,
)
from stalledpolicy.policy.models import ENV_REDIS_URL, StalledPolicySpec

UID = "0b7c7a4e-5f7b-4a53-9a1d-1c2f3e4d5a6b"
DIGEST = "d" * 64
BASE = {"queue": "orders", "maxStalled": 2, "redis": {"secretRef": {"name": "orders-redis", "key": "url"}}}


def spec_of(**changes) -> StalledPolicySpec:
    raw = copy.deepcopy(BASE)
    raw.update(changes)
    return StalledPolicySpec.from_k8s(raw)


def build(spec=None, *, name="orders", digest=DIGEST, **kwargs):
    return build_sweeper_deployment(
        name, "queues", UID, spec or spec_of(), image="ghcr.io/stalledpolicy/stalledpolicy-operator:0.1.0",
        scripts_digest=digest, **kwargs
    )


def pod(deployment):
    return deployment["spec"]["template"]["spec"]


def container(deployment):
    (only,) = pod(deployment)["containers"]
    return only


def env(deployment):
    return {entry["name"]: entry for entry in container(deployment)["env"]}


def config_hash(deployment):
    return deployment["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]


def test_name_namespace_and_kind():
    deployment = build()
    assert (deployment["apiVersion"], deployment["kind"]) == ("apps/v1", "Deployment")
    assert deployment["metadata"]["name"] == "orders-sweeper" == sweeper_name("orders")
    assert deployment["metadata"]["namespace"] == "queues"


def test_the_policy_is_the_controlling_owner():
    assert build()["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "queues.emq.dev/v1alpha1",
            "kind": "StalledPolicy",
            "name": "orders",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def test_labels_and_a_selector_that_matches_the_pods():
    deployment = build()
    labels = deployment["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "stalledpolicy-sweeper"
    assert labels["app.kubernetes.io/instance"] == "orders"
    assert labels["app.kubernetes.io/managed-by"] == "stalledpolicy-operator"
    assert labels["queues.emq.dev/policy"] == "orders"
    selector = deployment["spec"]["selector"]["matchLabels"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector and all(pod_labels[k] == v for k, v in selector.items())


def test_another_policy_gets_a_selector_that_does_not_match_this_ones_pods():
    ours = build(name="orders")["spec"]["selector"]["matchLabels"]
    theirs = build(name="orders-eu")["spec"]["template"]["metadata"]["labels"]
    assert not all(theirs.get(k) == v for k, v in ours.items())


def test_long_policy_names_still_give_valid_names_and_labels():
    long_a, long_b = "p" * 250 + "a", "p" * 250 + "b"
    assert len(sweeper_name(long_a)) <= 253 and sweeper_name(long_a).endswith("-sweeper")
    assert sweeper_name(long_a) != sweeper_name(long_b)
    for value in sweeper_labels(long_a).values():
        assert len(value) <= 63 and value[-1].isalnum()
    assert sweeper_labels(long_a)["queues.emq.dev/policy"] != sweeper_labels(long_b)["queues.emq.dev/policy"]


def test_the_container_runs_the_sweeper_configured_through_env():
    deployment = build()
    c = container(deployment)
    assert c["name"] == "sweeper"
    assert c["command"] == ["stalledpolicy", "sweep"]
    assert "args" not in c
    values = {name: entry.get("value") for name, entry in env(deployment).items()}
    assert values["STALLEDPOLICY_QUEUE"] == "orders"
    assert values["STALLEDPOLICY_MAX_STALLED"] == "2"
    assert values["STALLEDPOLICY_INTERVAL"] == "30s"
    assert values["STALLEDPOLICY_LOG_FORMAT"] == "json"
    assert values["STALLEDPOLICY_METRICS_PORT"] == "9090"


def test_the_redis_url_of_a_secret_ref_is_never_inlined():
    deployment = build()
    assert env(deployment)[ENV_REDIS_URL] == {
        "name": ENV_REDIS_URL,
        "valueFrom": {"secretKeyRef": {"name": "orders-redis", "key": "url"}},
    }
    assert "value" not in env(deployment)[ENV_REDIS_URL]
    assert "redis://" not in json.dumps(deployment)


def test_an_inline_credential_free_url_is_a_plain_value():
    deployment = build(spec_of(redis={"url": "redis://redis.queues.svc:6379/0"}))
    assert env(deployment)[ENV_REDIS_URL] == {"name": ENV_REDIS_URL, "value": "redis://redis.queues.svc:6379/0"}


def test_restricted_security_context_at_pod_and_container_level():
    deployment = build()
    pod_context = pod(deployment)["securityContext"]
    assert pod_context["runAsNonRoot"] is True
    assert pod_context["runAsUser"] != 0
    assert pod_context["seccompProfile"] == {"type": "RuntimeDefault"}
    c_context = container(deployment)["securityContext"]
    assert c_context["runAsNonRoot"] is True
    assert c_context["allowPrivilegeEscalation"] is False
    assert c_context["readOnlyRootFilesystem"] is True
    assert c_context["capabilities"] == {"drop": ["ALL"]}
    assert c_context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c_context.get("privileged", False) is False
    assert pod(deployment)["automountServiceAccountToken"] is False


def test_probes_use_the_named_metrics_port():
    c = container(build())
    assert c["ports"] == [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


def test_a_read_only_root_gets_a_writable_tmp():
    deployment = build()
    mounts = {m["mountPath"]: m["name"] for m in container(deployment)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod(deployment)["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]


def test_rolling_update_and_small_history():
    spec = build()["spec"]
    assert spec["strategy"]["type"] == "RollingUpdate"
    assert 0 < spec["revisionHistoryLimit"] <= 5


def test_the_builder_is_pure_and_deterministic():
    spec = spec_of(lanes=[{"name": "a", "maxStalled": 1}])
    before = spec.model_dump()
    first, second = build(spec), build(spec)
    assert first == second
    assert spec.model_dump() == before
    first["metadata"]["labels"]["x"] = "y"  # results share no mutable state
    assert "x" not in build(spec)["metadata"]["labels"]


@pytest.mark.parametrize(
    "changes",
    [
        {"maxStalled": 3},
        {"sweepInterval": "45s"},
        {"batchSize": 50},
        {"lanes": [{"name": "imports", "maxStalled": 1}]},
        {"redis": {"secretRef": {"name": "orders-redis", "key": "other"}}},
        {"redis": {"secretRef": {"name": "other-redis", "key": "url"}}},
    ],
)
def test_the_config_hash_changes_with_the_sweep_config(changes):
    assert config_hash(build(spec_of(**changes))) != config_hash(build())


def test_the_config_hash_changes_with_a_lane_budget():
    one = spec_of(lanes=[{"name": "imports", "maxStalled": 1}])
    two = spec_of(lanes=[{"name": "imports", "maxStalled": 2}])
    assert config_hash(build(one)) != config_hash(build(two))


def test_the_config_hash_changes_with_the_scripts():
    assert config_hash(build(digest="a" * 64)) != config_hash(build(digest="b" * 64))


def test_the_default_digest_is_the_lua_loaders():
    from stalledpolicy import lua

    deployment = build_sweeper_deployment("orders", "queues", UID, spec_of(), image="img")
    assert config_hash(deployment) == config_hash(build(digest=lua.scripts_digest()))


@pytest.mark.parametrize(
    "kwargs, changes",
    [
        ({"generation": 7}, {}),
        ({}, {"suspend": True}),
        ({}, {"sweeper": {"replicas": 3}}),
        ({}, {"sweeper": {"image": "other:1"}}),
        # Shown in the template itself: a change rolls the pods without the hash.
        ({}, {"sweeper": {"imagePullSecrets": [{"name": "registry-credentials"}]}}),
    ],
)
def test_the_config_hash_ignores_what_is_not_sweep_config(kwargs, changes):
    assert config_hash(build(spec_of(**changes), **kwargs)) == config_hash(build())


SECRET_DIGEST = "queues.emq.dev/redis-secret-digest"


def template_annotations(deployment):
    return deployment["spec"]["template"]["metadata"]["annotations"]


def test_a_new_secret_digest_rolls_the_pods():
    # A rotated password changes the digest of the Secret value, not its name or
    # key: the pod template must change with it, or the pods keep the old env.
    before, after = build(secret_digest="41"), build(secret_digest="42")
    assert config_hash(before) != config_hash(after)
    assert template_annotations(before)[SECRET_DIGEST] == "41"
    assert template_annotations(after)[SECRET_DIGEST] == "42"
    assert build(secret_digest="42") == after  # still pure
    # Only the template changes: a rollout, nothing else.
    assert {k: v for k, v in before["spec"].items() if k != "template"} == {
        k: v for k, v in after["spec"].items() if k != "template"}


def test_the_secret_digest_is_the_only_thing_taken_from_the_secret():
    deployment = build(secret_digest="42")
    text = json.dumps(deployment)
    # The digest appears once, as itself; the URL arrives by secretKeyRef only.
    assert text.count('"42"') == 1 and template_annotations(deployment)[SECRET_DIGEST] == "42"
    assert env(deployment)[ENV_REDIS_URL] == {
        "name": ENV_REDIS_URL, "valueFrom": {"secretKeyRef": {"name": "orders-redis", "key": "url"}}}
    # Without a digest (Secret not read yet) the hash is what it always was: no rollout on upgrade.
    assert SECRET_DIGEST not in template_annotations(build())
    assert config_hash(build()) == config_hash(build(secret_digest=None))


def test_an_inline_url_ignores_a_secret_digest():
    inline = spec_of(redis={"url": "redis://db:6379/0"})
    assert build(inline, secret_digest="42") == build(inline)


def test_a_different_uid_only_changes_the_owner_reference():
    one = build()
    other = build_sweeper_deployment("orders", "queues", "another-uid", spec_of(), image=container(one)["image"],
                                     scripts_digest=DIGEST)
    assert other["spec"] == one["spec"]
    assert other["metadata"]["ownerReferences"][0]["uid"] == "another-uid"


def test_the_generation_is_recorded_on_the_deployment_only():
    deployment = build(generation=7)
    assert deployment["metadata"]["annotations"]["queues.emq.dev/policy-generation"] == "7"
    assert deployment["spec"] == build(generation=8)["spec"] == build()["spec"]


def applied(deployment):
    return deployment["metadata"]["annotations"][APPLIED_DIGEST_ANNOTATION]


def test_the_applied_digest_is_the_same_for_the_same_input_and_changes_with_anything_applied():
    base = build(generation=7, secret_digest="41")
    assert applied(base) == applied(build(generation=7, secret_digest="41"))
    assert applied(base) == applied_digest(base)
    changed = [build(generation=8, secret_digest="41"), build(generation=7, secret_digest="42"),
               build(spec_of(sweeper={"replicas": 2}), generation=7, secret_digest="41"),
               build(spec_of(maxStalled=3), generation=7, secret_digest="41"),
               build(generation=7, secret_digest="41", digest="e" * 64),
               build(generation=7, secret_digest="41", name="other")]
    digests = {applied(d) for d in changed}
    assert applied(base) not in digests and len(digests) == len(changed)


def test_suspend_scales_to_zero():
    assert build(spec_of(suspend=True, sweeper={"replicas": 3}))["spec"]["replicas"] == 0
    assert build(spec_of(suspend=False, sweeper={"replicas": 3}))["spec"]["replicas"] == 3
    assert build()["spec"]["replicas"] == 1


def test_sweeper_overrides_reach_the_pod():
    deployment = build(
        spec_of(
            sweeper={
                "image": "registry.example/sweeper:2",
                "replicas": 2,
                "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": 1, "memory": "128Mi"}},
                "nodeSelector": {"pool": "queues"},
                "tolerations": [{"key": "queues", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}],
                "priorityClassName": "queue-critical",
            }
        )
    )
    assert deployment["spec"]["replicas"] == 2
    assert container(deployment)["image"] == "registry.example/sweeper:2"
    assert container(deployment)["resources"] == {
        "requests": {"cpu": "50m", "memory": "32Mi"},
        "limits": {"cpu": 1, "memory": "128Mi"},
    }
    assert pod(deployment)["nodeSelector"] == {"pool": "queues"}
    assert pod(deployment)["tolerations"] == [
        {"key": "queues", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}]
    assert pod(deployment)["priorityClassName"] == "queue-critical"


def test_without_overrides_the_default_image_and_modest_resources():
    deployment = build()
    assert container(deployment)["image"] == "ghcr.io/stalledpolicy/stalledpolicy-operator:0.1.0"
    assert container(deployment)["resources"]["requests"]
    for key in ("nodeSelector", "tolerations", "priorityClassName", "imagePullSecrets"):
        assert key not in pod(deployment)


def test_image_pull_secrets_reach_the_pod_in_order():
    deployment = build(spec_of(sweeper={"imagePullSecrets": [{"name": "registry-credentials"},
                                                             {"name": "mirror.example"}]}))
    assert pod(deployment)["imagePullSecrets"] == [{"name": "registry-credentials"}, {"name": "mirror.example"}]


def test_no_image_pull_secrets_leave_the_template_as_it_was():
    # No empty list on the pod: a policy without them (or with []) gets the
    # same Deployment as before the field existed, so an upgrade rolls nothing.
    assert build(spec_of(sweeper={"imagePullSecrets": []})) == build(spec_of(sweeper={})) == build()


def test_a_change_of_image_pull_secrets_rolls_the_pods():
    # The Deployment controller rolls on any change of the pod template.
    one = build(spec_of(sweeper={"imagePullSecrets": [{"name": "registry-a"}]}))
    two = build(spec_of(sweeper={"imagePullSecrets": [{"name": "registry-b"}]}))
    assert one["spec"]["template"] != two["spec"]["template"] != build()["spec"]["template"]
    assert {k: v for k, v in one["spec"].items() if k != "template"} == {
        k: v for k, v in two["spec"].items() if k != "template"}


def test_the_object_is_plain_json():
    deployment = build(spec_of(lanes=[{"name": "a"}], sweeper={"tolerations": [{"operator": "Exists"}]}))
    assert json.loads(json.dumps(deployment)) == deployment
