"""The StalledPolicy CRD on the real API server: applied by server-side apply,
defaults filled, bad input refused at apply time with a clear message,
`kubectl explain` teaching every field, printer columns, the status
subresource, and the builder's Deployment accepted (and garbage-collected
with its policy)."""

from __future__ import annotations

import copy
import json
import time
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from stalledpolicy.policy.builder import CONFIG_HASH_ANNOTATION, FIELD_MANAGER, build_sweeper_deployment
from stalledpolicy.policy.conditions import (
    READY,
    REDIS_REACHABLE,
    SWEEPER_AVAILABLE,
    Condition,
    set_conditions,
)
from stalledpolicy.policy.crd import API_VERSION, CRD_NAME, GROUP, KIND, PLURAL, VERSION, crd_path, load_crd
from stalledpolicy.policy.models import StalledPolicySpec

pytestmark = pytest.mark.kube

REPO = Path(__file__).resolve().parents[2]
APPLY = "application/apply-patch+yaml"
TEST_MANAGER = "stalledpolicy-tests"
BASE_SPEC = {"queue": "emails", "redis": {"url": "redis://redis.queues.svc:6379/0"}}


def wait_for(predicate, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception as exc:  # noqa: BLE001 - keep polling, report the last failure
            last, value = exc, None
        if value:
            return value
        time.sleep(0.25)
    pytest.fail(f"timed out after {timeout}s waiting for {what}" + (f" (last error: {last})" if last else ""))


@pytest.fixture(scope="module")
def crd_installed(control_plane, kube_api):
    """The CRD from crds/stalledpolicies.yaml, server-side applied and Established.
    Left installed: other modules of the session may use it too."""
    extensions = client.ApiextensionsV1Api(kube_api)
    extensions.patch_custom_resource_definition(
        CRD_NAME, load_crd(), field_manager=TEST_MANAGER, force=True, _content_type=APPLY
    )

    def established():
        crd = extensions.read_custom_resource_definition(CRD_NAME)
        status = {c.type: c.status for c in (crd.status.conditions or [])}
        return status.get("Established") == "True" and status.get("NamesAccepted") == "True"

    wait_for(established, "the CRD to be Established")
    # Discovery (what kubectl resolves `stp` with) follows shortly after.
    wait_for(lambda: control_plane.kubectl("get", "stp", "-A", check=False).returncode == 0, "stp in discovery")
    return CRD_NAME


@pytest.fixture
def objects(kube_api):
    return client.CustomObjectsApi(kube_api)


def policy(name: str, spec: dict, **metadata) -> dict:
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name, **metadata}, "spec": spec}


def create(objects, namespace: str, spec: dict, name: str | None = None) -> dict:
    body = policy(name or f"p-{uuid.uuid4().hex[:6]}", spec)
    return objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def refusal(objects, namespace: str, spec: dict) -> str:
    """The API server's message for a refused create (fails the test if accepted)."""
    with pytest.raises(ApiException) as info:
        create(objects, namespace, spec)
    assert info.value.status == 422, info.value.body
    return json.loads(info.value.body)["message"]


def with_(**changes) -> dict:
    spec = copy.deepcopy(BASE_SPEC)
    spec.update(changes)
    return spec


def without(key: str) -> dict:
    spec = copy.deepcopy(BASE_SPEC)
    spec.pop(key)
    return spec


# --- the CRD itself ----------------------------------------------------------


def test_the_crd_is_established_with_its_names(crd_installed, kube_api):
    crd = client.ApiextensionsV1Api(kube_api).read_custom_resource_definition(crd_installed)
    names = crd.status.accepted_names
    assert (names.kind, names.plural, names.singular) == ("StalledPolicy", "stalledpolicies", "stalledpolicy")
    assert names.short_names == ["stp"] and names.categories == ["emq"]
    assert crd.spec.scope == "Namespaced"
    (version,) = crd.spec.versions
    assert (version.name, version.served, version.storage) == ("v1alpha1", True, True)
    assert version.subresources.status is not None


def test_applying_the_crd_again_changes_nothing(crd_installed, kube_api):
    extensions = client.ApiextensionsV1Api(kube_api)
    before = extensions.read_custom_resource_definition(crd_installed).metadata.resource_version
    extensions.patch_custom_resource_definition(
        CRD_NAME, load_crd(), field_manager=TEST_MANAGER, force=True, _content_type=APPLY
    )
    assert extensions.read_custom_resource_definition(crd_installed).metadata.resource_version == before


def test_the_crd_file_applies_with_kubectl_server_side(crd_installed, control_plane):
    done = control_plane.kubectl(
        "apply", "--server-side", "--force-conflicts", f"--field-manager={TEST_MANAGER}", "-f", str(crd_path())
    )
    assert "stalledpolicies.queues.emq.dev" in done.stdout


# --- accepted, with defaults ---------------------------------------------------


def test_a_minimal_policy_gets_the_documented_defaults(crd_installed, objects, kube_namespace):
    created = create(objects, kube_namespace, dict(BASE_SPEC, redis={"secretRef": {"name": "emails-redis"}}))
    spec = created["spec"]
    assert spec["maxStalled"] == 1
    assert spec["sweepInterval"] == "30s"
    assert spec["batchSize"] == 1000
    assert spec["suspend"] is False
    assert spec["redis"]["secretRef"] == {"name": "emails-redis", "key": "url"}
    assert "sweeper" not in spec
    # what the API server stores is what the operator's model accepts
    assert StalledPolicySpec.from_k8s(spec).max_stalled == 1


def test_sweeper_overrides_get_their_defaults(crd_installed, objects, kube_namespace):
    created = create(objects, kube_namespace, with_(sweeper={"image": "registry.example/sweeper:2"}))
    assert created["spec"]["sweeper"] == {"image": "registry.example/sweeper:2", "replicas": 1}


def test_every_example_applies_and_its_values_survive(crd_installed, control_plane, objects, kube_namespace):
    for path in sorted((REPO / "examples").glob("*.yaml")):
        control_plane.kubectl("apply", "--server-side", f"--field-manager={TEST_MANAGER}", "-n", kube_namespace,
                              "-f", str(path))
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc["kind"] != KIND:
                continue
            stored = objects.get_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL,
                                                          doc["metadata"]["name"])
            for key, value in doc["spec"].items():
                assert stored["spec"][key] == value, (path.name, key)
            StalledPolicySpec.from_k8s(stored["spec"])


def test_a_full_policy_is_accepted_as_written(crd_installed, objects, kube_namespace):
    spec = {
        "queue": "tenants.eu-1_x",
        "maxStalled": 0,
        "sweepInterval": "1h",
        "batchSize": 10000,
        "lanes": [{"name": "imports", "maxStalled": 1}, {"name": "billing", "maxStalled": 0}, {"name": "reports"}],
        "redis": {"url": "rediss://redis.queues.svc:6380/2"},
        "suspend": True,
        "sweeper": {
            "image": "registry.example/sweeper:2",
            "replicas": 0,
            "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": 1, "memory": "128Mi"}},
            "nodeSelector": {"pool": "queues"},
            "tolerations": [{"key": "queues", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}],
            "priorityClassName": "queue-critical",
            "imagePullSecrets": [{"name": "registry-credentials"}, {"name": "mirror.example"}],
        },
    }
    assert create(objects, kube_namespace, spec)["spec"] == spec
    StalledPolicySpec.from_k8s(spec)


@pytest.mark.parametrize("interval", ["1s", "1000ms", "90s", "1m30s", "0.5h", "1h",
                                      # more digits than 5 (they were refused as "not a number
                                      # with a unit"); a sum of 1s exactly, in floating point 0.99...
                                      "120000ms", "3600000ms", "3600s", "0.7s0.2s0.1s"])
def test_intervals_within_bounds_are_accepted(crd_installed, objects, kube_namespace, interval):
    assert create(objects, kube_namespace, with_(sweepInterval=interval))["spec"]["sweepInterval"] == interval
    assert 1 <= StalledPolicySpec.from_k8s(with_(sweepInterval=interval)).interval_seconds <= 3600


# --- refused at apply time --------------------------------------------------------


REFUSED = [
        (with_(queue="a:b"), ["spec.queue", "queue must not contain"]),
        (with_(queue="{x}"), ["spec.queue", "queue must not contain"]),
        (with_(queue="has space"), ["spec.queue", "queue must not contain"]),
        (with_(queue=""), ["spec.queue", "queue must not be empty"]),
        (with_(queue="q" * 129), ["spec.queue", "128"]),
        (without("queue"), ["spec.queue", "Required value"]),
        (with_(maxStalled=-1), ["spec.maxStalled", "greater than or equal to 0"]),
        (with_(lanes=[{"name": "a", "maxStalled": -1}]), ["spec.lanes[0].maxStalled", "greater than or equal to 0"]),
        (with_(sweepInterval="30"), ["spec.sweepInterval", "must be a number with a unit"]),
        (with_(sweepInterval="2x"), ["spec.sweepInterval", "must be a number with a unit"]),
        (with_(sweepInterval="1d"), ["spec.sweepInterval", "must be a number with a unit"]),
        (with_(sweepInterval="0s"), ["spec.sweepInterval", "must be from 1s to 1h"]),
        (with_(sweepInterval="999ms"), ["spec.sweepInterval", "must be from 1s to 1h"]),
        (with_(sweepInterval="2h"), ["spec.sweepInterval", "must be from 1s to 1h"]),
        (with_(sweepInterval="3600001ms"), ["spec.sweepInterval", "must be from 1s to 1h"]),
        (with_(sweepInterval="0.6s0.3s0.0999s"), ["spec.sweepInterval", "must be from 1s to 1h"]),
        (with_(batchSize=0), ["spec.batchSize", "greater than or equal to 1"]),
        (with_(batchSize=10001), ["spec.batchSize", "less than or equal to 10000"]),
        (with_(lanes=[{"name": "a"}, {"name": "b"}, {"name": "a", "maxStalled": 2}]),
         ["spec.lanes[2]", "Duplicate value"]),
        (with_(lanes=[{"name": "x=y"}]), ["spec.lanes[0].name", "lane name must not contain"]),
        (with_(lanes=[{"name": ""}]), ["spec.lanes[0].name", "lane name must not be empty"]),
        (
            with_(sweeper={"priorityClassName": "Not_Valid"}),
            ["spec.sweeper.priorityClassName", "sweeper.priorityClassName must be a PriorityClass name"],
        ),
        (
            with_(sweeper={"resources": {"limits": {"cpu": "-1"}}}),
            ["spec.sweeper.resources.limits", "sweeper.resources.limits must not be negative"],
        ),
        (
            with_(sweeper={"resources": {"requests": {"memory": -1}}}),
            ["spec.sweeper.resources.requests", "sweeper.resources.requests must not be negative"],
        ),
        (
            with_(sweeper={"resources": {"requests": {"memory": "5 gigs"}}}),
            ["spec.sweeper.resources.requests", "spec.sweeper.resources.requests[memory]", '"5 gigs"',
             "sweeper.resources.requests must hold quantities; write a number with an optional unit, "
             "for example 250m, 0.5, 1e3, 512Mi or 1Gi"],
        ),
        (
            with_(sweeper={"resources": {"limits": {"cpu": "1.2.3"}}}),
            ["spec.sweeper.resources.limits", "spec.sweeper.resources.limits[cpu]",
             "sweeper.resources.limits must hold quantities; write a number with an optional unit"],
        ),
        (
            with_(sweeper={"resources": {"limits": {"memory": "1e1.5"}}}),
            ["spec.sweeper.resources.limits", "spec.sweeper.resources.limits[memory]", "must hold quantities"],
        ),
        (with_(redis={}), ["spec.redis", "set exactly one of redis.url"]),
        (
            with_(redis={"url": "redis://r:6379/0", "secretRef": {"name": "r", "key": "url"}}),
            ["spec.redis", "set exactly one of redis.url"],
        ),
        (without("redis"), ["spec.redis", "Required value", "set redis.url", "or redis.secretRef {name, key}"]),
        (with_(redis={"url": "http://r:6379"}), ["spec.redis.url", "must start with redis:// or rediss://"]),
        (with_(redis={"url": "redis://:s3cret@r:6379/0"}),
         ["spec.redis.url", "must not carry credentials", "secretRef"]),
        (with_(redis={"url": "redis://r:6379/0?password=s3cret"}), ["spec.redis.url", "must not carry credentials"]),
        (
            with_(redis={"secretRef": {"name": "Bad_Name"}}),
            ["spec.redis.secretRef.name", "redis.secretRef.name must be a Secret name: lowercase letters"],
        ),
        (
            with_(redis={"secretRef": {"name": "r", "key": "b c"}}),
            ["spec.redis.secretRef.key", "redis.secretRef.key must be a Secret key: letters, digits"],
        ),
        (
            with_(redis={"url": "redis://h:99999/0"}),
            ["spec.redis.url", "redis.url has a port that is not a number from 1 to 65535",
             "write redis://host[:port][/db]"],
        ),
        (with_(redis={"url": "redis://:6379/0"}), ["spec.redis.url", "redis.url has no host; write redis://host"]),
        (
            with_(redis={"url": "redis://h:6379/1x"}),
            ["spec.redis.url", "redis.url has a path that is not a database number; write /0, /1"],
        ),
        (with_(sweeper={"replicas": -1}), ["spec.sweeper.replicas", "greater than or equal to 0"]),
        # the Pod API's own rules: admitted, the sweeper Deployment was refused after admission
        (with_(redis={"secretRef": {"name": "r", "key": ".."}}),
         ["spec.redis.secretRef.key", "neither '.' nor starting with '..'"]),
        (with_(sweeper={"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}),
         ["spec.sweeper.tolerations[0].value", "operator Exists matches any value; remove value"]),
        (with_(sweeper={"tolerations": [{"operator": "Equal", "value": "v"}]}),
         ["spec.sweeper.tolerations[0].operator", "needs operator Exists"]),
        (with_(sweeper={"tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 30}]}),
         ["spec.sweeper.tolerations[0].tolerationSeconds", "applies to effect NoExecute only"]),
        (with_(sweeper={"tolerations": [{"key": "bad key!", "operator": "Exists"}]}),
         ["spec.sweeper.tolerations[0].key", "toleration key must be a label key"]),
        (with_(sweeper={"tolerations": [{"key": "k", "value": "bad value!"}]}),
         ["spec.sweeper.tolerations[0].value", "toleration value must be a label value"]),
        (with_(sweeper={"nodeSelector": {"bad key!": "x"}}), ["spec.sweeper.nodeSelector", "must be label keys"]),
        (with_(sweeper={"nodeSelector": {"disk": "bad value!"}}),
         ["spec.sweeper.nodeSelector", "must be label values"]),
        (with_(sweeper={"resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "128Mi"}}}),
         ["spec.sweeper.resources.requests", "must not exceed sweeper.resources.limits"]),
        (with_(sweeper={"resources": {"requests": {"cpu": 2}, "limits": {"cpu": "1500m"}}}),
         ["spec.sweeper.resources.requests", "must not exceed sweeper.resources.limits"]),
        (with_(sweeper={"resources": {"requests": {"gpu": "1"}}}),
         ["spec.sweeper.resources.requests", "names a resource that is none of cpu, memory"]),
        (with_(sweeper={"tolerations": [{"operator": "Maybe"}]}), ["spec.sweeper.tolerations[0].operator", "Exists"]),
        (
            with_(sweeper={"imagePullSecrets": [{"name": "Registry_Credentials"}]}),
            ["spec.sweeper.imagePullSecrets[0].name", "imagePullSecrets name must be a Secret name"],
        ),
        (with_(sweeper={"imagePullSecrets": [{}]}), ["spec.sweeper.imagePullSecrets[0].name", "Required value"]),
        (
            with_(sweeper={"imagePullSecrets": [{"name": "a"}, {"name": "b"}, {"name": "a"}]}),
            ["spec.sweeper.imagePullSecrets[2]", "Duplicate value"],
        ),
        (
            with_(sweeper={"imagePullSecrets": [{"name": f"s{i}"} for i in range(17)]}),
            ["spec.sweeper.imagePullSecrets", "must have at most 16 items"],
        ),
]


@pytest.mark.parametrize("spec, words", REFUSED, ids=[f"{i}:{words[0]}" for i, (_, words) in enumerate(REFUSED)])
def test_bad_input_is_refused_with_a_clear_message(crd_installed, objects, kube_namespace, spec, words):
    message = refusal(objects, kube_namespace, spec)
    for word in words:
        assert word in message, message
    # The operator's model (its second line) refuses it too, naming the same field.
    from stalledpolicy.policy.models import PolicyError

    with pytest.raises(PolicyError) as info:
        StalledPolicySpec.from_k8s(spec)
    assert any(path.startswith(words[0]) for path, _ in info.value.problems), str(info.value)


ONE_PROBLEM = [
    with_(queue=""), with_(queue="a:b"), with_(queue="{x}"), with_(lanes=[{"name": ""}]),
    with_(lanes=[{"name": "a:b"}]), with_(sweeper={"priorityClassName": "Not_Valid"}),
    with_(sweeper={"priorityClassName": ""}), with_(sweeper={"resources": {"limits": {"cpu": "-1"}}}),
    with_(sweeper={"imagePullSecrets": [{"name": "Registry_Credentials"}]}),
    with_(sweeper={"imagePullSecrets": [{"name": ""}]}),
    # each showed a raw regex (twice over for sweepInterval), or a bare "Required value"
    with_(redis={"secretRef": {"name": "Bad Name"}}), with_(redis={"secretRef": {"name": ""}}),
    with_(redis={"secretRef": {"name": "r", "key": "b c"}}), with_(redis={"secretRef": {"name": "r", "key": ""}}),
    with_(sweepInterval="1d"), with_(sweepInterval="2x"), without("redis"),
    with_(redis={"url": "redis://h:99999/0"}), with_(redis={"url": "redis://:6379/0"}),
    with_(redis={"url": "redis://h:6379/1x"}),
    # a quantity pattern showed the raw regex
    with_(sweeper={"resources": {"limits": {"cpu": "5 gigs"}}}),
    with_(sweeper={"resources": {"requests": {"memory": "1.2.3"}}}),
    with_(sweeper={"resources": {"requests": {"memory": ""}}}),
    # an empty URL said "at least 1 chars long" too
    with_(redis={"url": ""}),
    with_(sweeper={"tolerations": [{"key": "bad key!", "operator": "Exists"}]}),
    with_(sweeper={"resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "128Mi"}}}),
]


@pytest.mark.parametrize("spec", ONE_PROBLEM, ids=[json.dumps(s, sort_keys=True)[:60] for s in ONE_PROBLEM])
def test_one_bad_value_is_one_message(crd_installed, objects, kube_namespace, spec):
    """A schema keyword (pattern, minLength) beside a rule refusing the same value
    made the API server list the problem twice, the rule's words second."""
    with pytest.raises(ApiException) as info:
        create(objects, kube_namespace, spec)
    causes = json.loads(info.value.body)["details"]["causes"]
    assert len(causes) == 1, causes
    assert "should match" not in causes[0]["message"] and "chars long" not in causes[0]["message"]
    assert causes[0]["message"] not in ("Required value", ""), causes


@pytest.mark.parametrize("sweeper", [
    {"priorityClassName": "high-priority"}, {"priorityClassName": "system.node-critical"},
    {"resources": {"limits": {"cpu": "-0", "memory": "+1Gi"}, "requests": {"cpu": 0, "memory": "1e3"}}},
    {"resources": {"limits": {"cpu": 2, "memory": "1.5Gi"}, "requests": {"cpu": "250m", "memory": "64Mi"}}},
    {"resources": {"limits": {"cpu": "0.5", "memory": "1Gi"}, "requests": {"cpu": "250m", "memory": "1e3"}}},
    {"resources": {"limits": {"cpu": ".5", "memory": "512Mi"}, "requests": {"cpu": "1e-3", "memory": "1.5Ki"}}},
    # a request equal to its limit; resource names beyond cpu and memory
    {"resources": {"limits": {"cpu": "500m", "memory": "128Mi", "example.com/gpu": 1, "hugepages-2Mi": "64Mi"},
                   "requests": {"cpu": "0.5", "memory": "134217728", "example.com/gpu": "1",
                                "ephemeral-storage": "1Gi"}}},
    {"nodeSelector": {"kubernetes.io/os": "linux", "node.example.com/pool": "", "tier": "batch_1.a-b"}},
    {"tolerations": [{"operator": "Exists"}, {"key": "dedicated", "operator": "Equal", "value": "queues",
                                              "effect": "NoSchedule"},
                     {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                      "tolerationSeconds": 30}, {"key": "spot", "value": ""}]},
])
def test_sweeper_values_the_pod_api_takes_are_accepted(crd_installed, objects, kube_namespace, sweeper):
    assert create(objects, kube_namespace, with_(sweeper=sweeper))["spec"]["sweeper"] == \
        {"replicas": 1, **sweeper}
    assert StalledPolicySpec.from_k8s(with_(sweeper=sweeper)).sweeper is not None


def _quantity_corpus() -> list[str]:
    """Signs, numbers and suffixes of every kind, well and badly formed."""
    numbers = ["", "0", "00", "1", "12", "007", ".", "1.", ".5", "1.5", "0.0", "1.2.3", "123456789012345678",
               "1234567890123456789", "12345678901234"]
    suffixes = ["", "n", "u", "m", "k", "K", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "ki",
                "mi", "KI", "i", "mm", "e", "E3", "e3", "e-3", "e+3", "e-9", "e-10", "e-12", "e18", "e1.5", "e.5",
                "e999", "e-999", "e1000", "e0001000", "e99999999999", "ee3", "e-", "e+-3", "Ei5", " ", "x", "gigs",
                " Gi"]
    return [sign + number + suffix for sign in ("", "+", "-") for number in numbers for suffix in suffixes]


def test_the_api_server_and_the_model_judge_quantities_alike(crd_installed, objects, kube_namespace):
    """The CRD's rules (CEL isQuantity(), the Pod API's parser) and the model
    (is_quantity, a port of it) admit and refuse the same quantities, negative
    ones refused as negative, in the same words. Sixteen values a request, as
    limits (all refusals are listed, one per key)."""
    from stalledpolicy.policy.models import QUANTITY_FIX, _is_negative_quantity, is_quantity

    corpus = _quantity_corpus()
    assert len(corpus) > 2000
    refused: dict[str, str] = {}
    for start in range(0, len(corpus), 16):
        # domain-qualified resource names (an extended resource): the names rule lets them by
        values = {f"example.com/r{start + i}": text for i, text in enumerate(corpus[start:start + 16])}
        body = policy("q", with_(sweeper={"resources": {"limits": values}}))
        try:
            objects.create_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, body, dry_run="All")
        except ApiException as exc:
            assert exc.status == 422, exc.body
            for cause in json.loads(exc.body)["details"]["causes"]:
                key = cause["field"].removeprefix("spec.sweeper.resources.limits[").removesuffix("]")
                assert key in values and key not in refused, cause
                refused[values[key]] = cause["message"]
    not_quantities = {text for text in corpus if not is_quantity(text)}
    negatives = {text for text in corpus if is_quantity(text) and _is_negative_quantity(text)}
    message = f"sweeper.resources.limits must hold quantities; {QUANTITY_FIX}"
    assert {text for text, why in refused.items() if why.endswith(message)} == not_quantities
    assert {text for text, why in refused.items() if "must not be negative" in why} == negatives
    assert refused.keys() == not_quantities | negatives
    assert {"1.2.3", "1e1.5", "1e99999999999", "1K", "1 Gi", "12gigs"} <= not_quantities
    assert {"1Gi", "1.5", "1e3", "12m", "+1.5Gi", "-", "Ki"} <= set(corpus) - refused.keys()


@pytest.mark.parametrize("text", ["1e99999999999", "-1e2147483647", "1E1000", "1e-0001000"])
def test_a_huge_exponent_is_refused_at_once(crd_installed, objects, kube_namespace, text):
    """Go's parser computes 10 to the exponent's power: unguarded, 1e99999999999
    timed the request out (504) and kept the API server at 100% CPU after it."""
    started = time.monotonic()
    message = refusal(objects, kube_namespace, with_(sweeper={"resources": {"requests": {"cpu": text}}}))
    assert time.monotonic() - started < 20  # unguarded: a 504 once the request timed out
    assert "spec.sweeper.resources.requests[cpu]" in message and "must hold quantities" in message, message
    assert "must not be negative" not in message


def test_refused_credentials_are_not_echoed_back(crd_installed, objects, kube_namespace):
    message = refusal(objects, kube_namespace, with_(redis={"url": "redis://:s3cret@r:6379/0"}))
    # The CEL message names the field and the fix; the value itself is not part of it.
    assert "must not carry credentials" in message
    assert message.count("s3cret") == 0


# Credentials the first rule (userinfo before the first '/', '?' or '#', and a
# plain "password=") let through: a key redis-py reads percent-decoded, other
# password options, any case, and a password holding a delimiter.
CREDENTIAL_BYPASSES = [
    "redis://r:6379/0?pass%77ord=zq7xk9",
    "redis://r:6379/0?db=1&%70assword=zq7xk9",
    "rediss://r:6380/0?ssl_password=zq7xk9",
    "redis://r:6379/0?PASSWORD=zq7xk9",
    "redis://r:6379/0?username=zq7xk9",
    "redis://:zq7/xk9@r:6379/0",
    "redis://u:zq7?xk9@r:6379/0",
    "redis://:zq7#xk9@r:6379/0",
]


@pytest.mark.parametrize("url", CREDENTIAL_BYPASSES)
def test_credentials_in_any_spelling_are_refused_without_echo(crd_installed, objects, kube_namespace, url):
    from stalledpolicy.policy.models import PolicyError

    message = refusal(objects, kube_namespace, with_(redis={"url": url}))
    assert "spec.redis.url" in message and "must not carry credentials" in message and "secretRef" in message
    assert "zq7" not in message and "xk9" not in message, message
    with pytest.raises(PolicyError) as info:
        StalledPolicySpec.from_k8s(with_(redis={"url": url}))
    assert info.value.field == "spec.redis.url" and "zq7" not in str(info.value) and "xk9" not in str(info.value)


_FORM = "write redis://host[:port][/db]"
WALKTHROUGH = [
    ({"redis": {"url": "redis://h:99999/0"}},
     f"spec.redis.url: Invalid value: redis.url has a port that is not a number from 1 to 65535; {_FORM}"),
    ({"redis": {"url": "redis://:6379/0"}}, f"spec.redis.url: Invalid value: redis.url has no host; {_FORM}"),
    ({"redis": {"url": "redis://h:6379/1x"}},
     "spec.redis.url: Invalid value: redis.url has a path that is not a database number; write /0, /1, ..."),
    ({"redis": {"secretRef": {"name": "Bad Name"}}},
     'spec.redis.secretRef.name: Invalid value: "Bad Name": redis.secretRef.name must be a Secret name'),
    ({"sweepInterval": "1d", "redis": {"url": "redis://h:6379/0"}},
     'spec.sweepInterval: Invalid value: "1d": sweepInterval must be a number with a unit'),
    ({}, "spec.redis: Required value: redis is required; set redis.url (without credentials) or "
         "redis.secretRef {name, key}"),
    ({"sweeper": {"resources": {"limits": {"cpu": "5 gigs"}}}, "redis": {"url": "redis://h:6379/0"}},
     'spec.sweeper.resources.limits[cpu]: Invalid value: "5 gigs": sweeper.resources.limits must hold '
     "quantities; write a number with an optional unit, for example 250m, 0.5, 1e3, 512Mi or 1Gi"),
]


@pytest.mark.parametrize("spec, line", WALKTHROUGH,
                         ids=[line.split(":")[0] + f"-{i}" for i, (_, line) in enumerate(WALKTHROUGH)])
def test_kubectl_apply_shows_the_field_and_the_fix_once(crd_installed, control_plane, kube_namespace, tmp_path,
                                                         spec, line):
    """Found in a user walkthrough: these were admitted (and Ready=False at
    reconcile), or refused with a raw regex, or with a bare "Required value"."""
    manifest = tmp_path / "p.yaml"
    manifest.write_text(yaml.safe_dump(policy("walk", {"queue": "emails", **spec})))
    done = control_plane.kubectl("apply", "-n", kube_namespace, "-f", str(manifest), check=False)
    assert done.returncode != 0 and line in done.stderr, done.stderr
    assert "should match" not in done.stderr
    assert done.stderr.count("Invalid value") + done.stderr.count("Required value") == 1, done.stderr


def test_an_empty_spec_is_told_of_every_field_it_lacks(crd_installed, control_plane, kube_namespace, tmp_path):
    """Both required fields in one answer, each with its fix, as the model says them
    (the schema's `required` had stopped every rule: only the queue was named)."""
    from stalledpolicy.policy.models import PolicyError, StalledPolicySpec

    manifest = tmp_path / "p.yaml"
    manifest.write_text(yaml.safe_dump(policy("empty", {})))
    done = control_plane.kubectl("apply", "-n", kube_namespace, "-f", str(manifest), check=False)
    assert done.returncode != 0
    assert "spec.queue: Required value: queue is required; give the EchoMQ queue name" in done.stderr, done.stderr
    assert "spec.redis: Required value: redis is required; set redis.url" in done.stderr, done.stderr
    assert done.stderr.count("Required value") == 2 and "Invalid value" not in done.stderr, done.stderr
    with pytest.raises(PolicyError) as refused:
        StalledPolicySpec.from_k8s({})
    assert "spec.queue: is required" in str(refused.value) and "spec.redis: is required" in str(refused.value)


def test_every_url_the_operator_accepts_is_admitted(crd_installed, objects, kube_namespace):
    """Admission must never refuse an inline URL the operator takes
    (validation.check_redis_url): a sample of the corpus it accepts, its edge
    cases first (brackets, percent-encoded paths, leading zeros, a tab or a
    newline urlsplit drops), each a dry-run create."""
    from tests.unit.inline_urls import accepted_sample

    refused = {}
    for url in accepted_sample(300) + ["redis://h", "redis://h:/", "rediss://h:065535/%31%2F", "redis://:[::1]:6379/0"]:
        try:
            objects.create_namespaced_custom_object(
                GROUP, VERSION, kube_namespace, PLURAL, policy("p", with_(redis={"url": url})), dry_run="All")
        except ApiException as exc:
            refused[url] = json.loads(exc.body)["message"]
    assert refused == {}


def test_the_api_server_and_the_model_refuse_the_same_urls_in_the_same_words(crd_installed, objects, kube_namespace):
    """The CEL rules (RE2) and the model (Python re) run the same patterns: on
    URLs of the wrong form both give the same problems."""
    import random

    from stalledpolicy.policy.models import url_form_problems
    from tests.unit.inline_urls import all_urls

    wrong = [url for url in all_urls() if url_form_problems(url)]
    for url in random.Random(3).sample(wrong, 120):
        with pytest.raises(ApiException) as info:
            objects.create_namespaced_custom_object(
                GROUP, VERSION, kube_namespace, PLURAL, policy("p", with_(redis={"url": url})), dry_run="All")
        causes = json.loads(info.value.body)["details"]["causes"]
        assert sorted(c["message"].removeprefix("Invalid value: ") for c in causes) == \
            sorted(f"redis.url {problem}" for problem in url_form_problems(url)), url
        assert {c["field"] for c in causes} == {"spec.redis.url"}


@pytest.mark.parametrize("url", ["redis://r:6379/0?socket_timeout=5&db=1",
                                 "rediss://r:6380/0?ssl_cert_reqs=none&client_name=a%20b"])
def test_query_options_without_credentials_are_accepted(crd_installed, objects, kube_namespace, url):
    assert create(objects, kube_namespace, with_(redis={"url": url}))["spec"]["redis"]["url"] == url
    assert StalledPolicySpec.from_k8s(with_(redis={"url": url})).redis.url == url


def test_the_queue_is_immutable_but_the_budget_is_not(crd_installed, objects, kube_namespace):
    created = create(objects, kube_namespace, with_(maxStalled=2), name="orders")
    with pytest.raises(ApiException) as info:
        objects.patch_namespaced_custom_object(
            GROUP, VERSION, kube_namespace, PLURAL, "orders", {"spec": {"queue": "orders-v2"}}
        )
    assert info.value.status == 422
    assert "queue is immutable; create a new StalledPolicy for another queue" in json.loads(info.value.body)["message"]

    patched = objects.patch_namespaced_custom_object(
        GROUP, VERSION, kube_namespace, PLURAL, "orders", {"spec": {"maxStalled": 5, "sweepInterval": "10s"}}
    )
    spec = patched["spec"]
    assert (spec["queue"], spec["maxStalled"], spec["sweepInterval"]) == ("emails", 5, "10s")
    assert patched["metadata"]["generation"] == created["metadata"]["generation"] + 1


def test_the_immutable_message_reaches_kubectl_apply(crd_installed, control_plane, kube_namespace, tmp_path):
    manifest = tmp_path / "p.yaml"
    manifest.write_text(yaml.safe_dump(policy("gitops", with_())))
    control_plane.kubectl("apply", "-n", kube_namespace, "-f", str(manifest))
    manifest.write_text(yaml.safe_dump(policy("gitops", with_(queue="other"))))
    done = control_plane.kubectl("apply", "-n", kube_namespace, "-f", str(manifest), check=False)
    assert done.returncode != 0
    assert "queue is immutable; create a new StalledPolicy for another queue" in done.stderr


def test_unknown_fields_are_reported_by_kubectl(crd_installed, control_plane, kube_namespace, tmp_path):
    manifest = tmp_path / "typo.yaml"
    manifest.write_text(yaml.safe_dump(policy("typo", with_(maxStaled=3))))
    done = control_plane.kubectl("apply", "-n", kube_namespace, "-f", str(manifest), check=False)
    assert done.returncode != 0 and "maxStaled" in done.stderr


# --- kubectl explain ------------------------------------------------------------


def explain(control_plane, what: str) -> str:
    done = wait_for(
        lambda: (lambda d: d if d.returncode == 0 else None)(control_plane.kubectl("explain", what, check=False)),
        f"kubectl explain {what} (OpenAPI publication)",
    )
    return " ".join(done.stdout.split())


def test_kubectl_explain_teaches_the_spec(crd_installed, control_plane):
    text = explain(control_plane, "stalledpolicy.spec")
    for field in ("queue", "maxStalled", "sweepInterval", "batchSize", "lanes", "redis", "suspend", "sweeper"):
        assert f"{field} <" in text, field
    assert "The EchoMQ queue name" in text
    assert "Immutable: to sweep another queue, create a new StalledPolicy" in text
    assert "The stall budget" in text
    assert "Time between two sweeps, from 1s to 1h" in text


def test_kubectl_explain_gives_the_budget_table(crd_installed, control_plane):
    text = explain(control_plane, "stp.spec.maxStalled")
    assert "0: never dead-letter" in text
    assert "1: no recovery: the first stall dead-letters the job" in text
    assert "2: one recovery: the second stall dead-letters it" in text
    assert "n allows n-1 recoveries" in text


def test_kubectl_explain_reaches_nested_fields(crd_installed, control_plane):
    assert "overriding spec.maxStalled" in explain(control_plane, "stalledpolicy.spec.lanes.maxStalled")
    assert "never copied into the Deployment" in explain(control_plane, "stalledpolicy.spec.redis")
    assert "morgue" in explain(control_plane, "stalledpolicy.status.deadLetters")
    assert "private registry" in explain(control_plane, "stalledpolicy.spec.sweeper.imagePullSecrets")


# --- status subresource and printer columns -----------------------------------------


def _status(generation: int) -> dict:
    conditions = set_conditions(
        [],
        [
            Condition(SWEEPER_AVAILABLE, "True", "Available", "1 of 1 sweeper replicas available"),
            Condition(REDIS_REACHABLE, "True", "Reachable", "the queue was read"),
            Condition(READY, "True", "Ready", "the sweeper is available and Redis is reachable"),
        ],
        generation,
        "2026-12-02T16:00:00Z",
    )
    return {
        "observedGeneration": generation,
        "conditions": conditions,
        "deadLetters": 3,
        "pending": 41,
        "active": 7,
        "recoveredTotal": 12,
        "deadLetteredTotal": 3,
        "orphansTotal": 1,
        "quarantinedTotal": 0,
        "uncountedLapsesTotal": 2,
        "lanes": [{"name": "imports", "pending": 5, "deadLettered": 2, "recovered": 4}],
        "lastReplay": {"token": "r1", "replayed": 2, "time": "2026-12-02T15:30:00Z", "lane": "imports",
                       "servedTokens": ["r0", "r1"]},  # kept, not pruned: no earlier token replays again
        "lastUpdateTime": "2026-12-02T16:00:00Z",
        "sweeperDeployment": "tenants-sweeper",
    }


@pytest.fixture
def tenants(crd_installed, objects, kube_namespace):
    created = create(objects, kube_namespace, with_(queue="tenants", maxStalled=2, sweepInterval="15s",
                                                   lanes=[{"name": "imports", "maxStalled": 1}]), name="tenants")
    status = _status(created["metadata"]["generation"])
    objects.patch_namespaced_custom_object_status(GROUP, VERSION, kube_namespace, PLURAL, "tenants", {"status": status})
    return status


def test_the_status_the_operator_writes_is_stored_whole(tenants, objects, kube_namespace):
    stored = objects.get_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "tenants")
    assert stored["status"] == tenants


def test_status_is_only_written_through_the_subresource(tenants, objects, kube_namespace):
    objects.patch_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "tenants",
                                           {"status": {"deadLetters": 999}})
    stored = objects.get_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "tenants")
    assert stored["status"]["deadLetters"] == 3


@pytest.mark.parametrize("field, value", [("reason", "not a reason"), ("reason", ""), ("reason", "Ends,"),
                                          ("type", "not a type"), ("type", "-Ready"), ("type", "Bad_Prefix/Ready")])
def test_a_status_condition_with_a_bad_type_or_reason_is_refused_once_in_words(tenants, objects, kube_namespace,
                                                                               field, value):
    """Refused by the rule alone (a pattern showed the raw regex, and an empty
    reason got a second message from minLength), as set_condition refuses it."""
    from stalledpolicy.policy import conditions

    bad = copy.deepcopy(tenants["conditions"])
    bad[0][field] = value
    with pytest.raises(ApiException) as info:
        objects.patch_namespaced_custom_object_status(GROUP, VERSION, kube_namespace, PLURAL, "tenants",
                                                      {"status": {"conditions": bad}})
    assert info.value.status == 422
    [cause] = json.loads(info.value.body)["details"]["causes"]
    fix = {"type": conditions.CONDITION_TYPE_FIX, "reason": conditions.CONDITION_REASON_FIX}[field]
    assert cause["field"] == f"status.conditions[0].{field}"
    assert cause["message"] == f"Invalid value: {json.dumps(value)}: status.conditions {field} {fix}"
    assert "should match" not in cause["message"]
    with pytest.raises(ValueError, match=f"status.conditions {field} must be"):
        conditions.set_condition([], value if field == "type" else READY, True,
                                 value if field == "reason" else "Sweeping", "", 1, "2026-12-02T16:00:00Z")


@pytest.mark.parametrize("type_, reason", [("example.com/SweeperAvailable", "A"), ("a_b.c-d", "Drift:Conflict_2"),
                                           ("Drifted", "x,y_")])
def test_a_status_condition_the_crd_takes_is_stored(tenants, objects, kube_namespace, type_, reason):
    good = copy.deepcopy(tenants["conditions"])
    good[0]["type"], good[0]["reason"] = type_, reason
    stored = objects.patch_namespaced_custom_object_status(GROUP, VERSION, kube_namespace, PLURAL, "tenants",
                                                           {"status": {"conditions": good}})
    assert (stored["status"]["conditions"][0]["type"], stored["status"]["conditions"][0]["reason"]) == (type_, reason)


def table(control_plane, *args: str) -> list[list[str]]:
    out = control_plane.kubectl("get", *args).stdout
    return [line.split() for line in out.strip().splitlines()]


def test_printer_columns(tenants, control_plane, kube_namespace):
    header, row = table(control_plane, "stp", "-n", kube_namespace)
    assert header == ["NAME", "QUEUE", "MAX-STALLED", "INTERVAL", "DEAD", "READY", "REASON", "AGE"]
    assert row[:7] == ["tenants", "tenants", "2", "15s", "3", "True", "Ready"]


def test_wide_printer_columns_add_pending_and_active(tenants, control_plane, kube_namespace):
    header, row = table(control_plane, "stalledpolicies", "-n", kube_namespace, "-o", "wide")
    assert header == ["NAME", "QUEUE", "MAX-STALLED", "INTERVAL", "DEAD", "READY", "REASON", "PENDING", "ACTIVE",
                      "UNCOUNTED", "AGE"]
    assert row[:10] == ["tenants", "tenants", "2", "15s", "3", "True", "Ready", "41", "7", "2"]


def test_the_emq_category_lists_policies(tenants, control_plane, kube_namespace):
    out = control_plane.kubectl("get", "emq", "-n", kube_namespace, "-o", "name").stdout
    assert "stalledpolicy.queues.emq.dev/tenants" in out


def test_kubectl_wait_for_ready_works_on_the_condition(tenants, control_plane, kube_namespace):
    control_plane.kubectl("wait", "-n", kube_namespace, "--for=condition=Ready", "stp/tenants", "--timeout=20s")


# --- the builder's Deployment on the real API ---------------------------------------


def apply_deployment(apps, deployment: dict):
    return apps.patch_namespaced_deployment(
        deployment["metadata"]["name"], deployment["metadata"]["namespace"], deployment,
        field_manager=FIELD_MANAGER, force=True, _content_type=APPLY,
    )


def test_the_sweeper_deployment_is_valid_idempotent_and_collected_with_its_policy(
    crd_installed, objects, kube_api, kube_namespace
):
    apps = client.AppsV1Api(kube_api)
    created = create(objects, kube_namespace, with_(redis={"secretRef": {"name": "emails-redis", "key": "url"}},
                                                   lanes=[{"name": "imports", "maxStalled": 1}],
                                                   sweeper={"imagePullSecrets": [{"name": "registry-credentials"}]}),
                     name="emails")
    uid = created["metadata"]["uid"]

    def built(raw_spec, generation):
        return build_sweeper_deployment("emails", kube_namespace, uid, StalledPolicySpec.from_k8s(raw_spec),
                                        image="stalledpolicy:test", generation=generation)

    first = apply_deployment(apps, built(created["spec"], 1))
    assert first.metadata.name == "emails-sweeper"
    again = apply_deployment(apps, built(created["spec"], 1))
    # Nothing changed (the resourceVersion may: the deployment controller writes status).
    plain = kube_api.sanitize_for_serialization
    assert again.metadata.generation == first.metadata.generation
    assert plain(again.spec) == plain(first.spec)
    ours_meta = built(created["spec"], 1)["metadata"]
    assert again.metadata.labels == ours_meta["labels"]
    assert ours_meta["annotations"].items() <= again.metadata.annotations.items()  # + the controller's revision
    ours = [plain(f) for f in again.metadata.managed_fields if f.manager == FIELD_MANAGER]
    assert ours == [plain(f) for f in first.metadata.managed_fields if f.manager == FIELD_MANAGER]

    env = {e.name: e for e in again.spec.template.spec.containers[0].env}
    assert env["STALLEDPOLICY_REDIS_URL"].value is None
    assert env["STALLEDPOLICY_REDIS_URL"].value_from.secret_key_ref.name == "emails-redis"

    patched = objects.patch_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "emails",
                                                     {"spec": {"maxStalled": 4}})
    changed = apply_deployment(apps, built(patched["spec"], patched["metadata"]["generation"]))
    assert changed.metadata.generation == first.metadata.generation + 1
    old_hash = first.spec.template.metadata.annotations[CONFIG_HASH_ANNOTATION]
    assert changed.spec.template.metadata.annotations[CONFIG_HASH_ANNOTATION] != old_hash
    assert {e.name: e.value for e in changed.spec.template.spec.containers[0].env}["STALLEDPOLICY_MAX_STALLED"] == "4"
    assert [s.name for s in changed.spec.template.spec.image_pull_secrets] == ["registry-credentials"]

    # Dropping the pull Secrets from the policy drops them from the pods (server-side apply
    # removes what the operator set before and no longer sets).
    unpulled = objects.patch_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "emails",
                                                      {"spec": {"sweeper": {"imagePullSecrets": None}}})
    assert "imagePullSecrets" not in unpulled["spec"].get("sweeper", {})
    dropped = apply_deployment(apps, built(unpulled["spec"], unpulled["metadata"]["generation"]))
    assert not dropped.spec.template.spec.image_pull_secrets
    assert dropped.metadata.generation == changed.metadata.generation + 1

    suspended = objects.patch_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "emails",
                                                       {"spec": {"suspend": True}})
    assert apply_deployment(apps, built(suspended["spec"], suspended["metadata"]["generation"])).spec.replicas == 0

    objects.delete_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "emails")

    def collected():
        try:
            apps.read_namespaced_deployment("emails-sweeper", kube_namespace)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(collected, "the garbage collector to delete the sweeper with its policy", timeout=90)


def _pods_of(core, namespace: str, deployment: dict) -> list:
    selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
    return core.list_namespaced_pod(namespace, label_selector=selector).items


def _admission_refusal(core, namespace: str, deployment: dict) -> str | None:
    """Why a pod of this template is refused (a dry-run create: full admission, nothing stored)."""
    template = deployment["spec"]["template"]
    pod_body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": "dry-", "labels": template["metadata"]["labels"]},
                "spec": template["spec"]}
    try:
        core.create_namespaced_pod(namespace, pod_body, dry_run="All")
    except ApiException as exc:
        return json.loads(exc.body)["message"]
    return None


def test_the_sweeper_pod_is_admitted_under_the_restricted_pod_security_standard(
    crd_installed, objects, kube_api, kube_namespace
):
    """The ReplicaSet controller creates the pod (no kubelet runs it): admission
    with `enforce=restricted` is the real Pod Security check. A control
    Deployment without the security context is refused in the same namespace."""
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    core.patch_namespace(kube_namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    created = create(objects, kube_namespace, with_(redis={"secretRef": {"name": "emails-redis"}}), name="strict")
    spec = StalledPolicySpec.from_k8s(created["spec"])
    deployment = build_sweeper_deployment("strict", kube_namespace, created["metadata"]["uid"], spec,
                                          image="stalledpolicy:test")
    apply_deployment(apps, deployment)
    wait_for(lambda: _pods_of(core, kube_namespace, deployment), "the sweeper pod to be admitted", timeout=90)

    control = build_sweeper_deployment("lax", kube_namespace, created["metadata"]["uid"], spec,
                                       image="stalledpolicy:test")
    del control["spec"]["template"]["spec"]["securityContext"]
    del control["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    # The first pods of a fresh namespace may wait for its default ServiceAccount.
    message = wait_for(
        lambda: (lambda m: m if m and "PodSecurity" in m else None)(_admission_refusal(core, kube_namespace, control)),
        "the lax pod to be refused by Pod Security",
    )
    assert 'violates PodSecurity "restricted' in message
    assert _admission_refusal(core, kube_namespace, deployment) is None


# --- the Pod API's rules, judged alike -----------------------------------------

LABEL_KEYS = ["a", "A", "a_b", "a.b", "1", "kubernetes.io/os", "node.example.com/pool", "nvidia/gpu",
              "a" * 63, "example.com/" + "a" * 63, "-a", "a-", "_a", "a b", "é", "a/b/c", "/a", "a/", "A.b/c",
              "ex_ample.com/a", "a..b/c", ".a/b", "a" * 64, "example.com/" + "a" * 64, "a" * 254 + "/b"]
LABEL_VALUES = ["", "a", "A-b_c.d", "1", "a" * 63, "-a", "a-", "a b", "é", "a/b", "a" * 64]
RESOURCE_NAMES = ["memory", "ephemeral-storage", "nvidia.com/gpu", "nvidia/gpu", "example.com/a_b", "hugepages-2Mi",
                  "hugepages-1Gi", "storage", "gpu", "Example.com/gpu", "example.com/", "/gpu", "hugepages-",
                  "hugepages-x", "kubernetes.io/gpu", "requests.example.com/x"]
TOLERATIONS = [{"operator": "Exists"}, {"key": "k"}, {"key": "k", "value": "v"}, {"key": "k", "value": ""},
               {"key": "", "operator": "Exists", "effect": "NoSchedule"},
               {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 3},
               {"key": "k", "operator": "Exists", "value": "v"}, {"operator": "Equal"}, {"value": "v"},
               {"key": "k", "effect": "NoSchedule", "tolerationSeconds": 3}, {"key": "k", "tolerationSeconds": 3},
               {"key": "a b", "operator": "Exists"}, {"key": "k", "value": "a b"}]
REQUEST_LIMIT = [("cpu", "1", "2"), ("cpu", "500m", "0.5"), ("cpu", "2", "1"), ("cpu", "1001m", "1"),
                 ("memory", "1Gi", "1024Mi"), ("memory", "1025Mi", "1Gi"), ("memory", "1e3", "1k"),
                 ("memory", "1001", "1k"), ("memory", 1024, "1Ki"), ("memory", 1025, "1Ki")]
# Refused by the Pod API, admitted by the CRD (the sweeper Deployment's refusal names them,
# ApplyFailed): rarer rules not repeated in the CRD. Listed so a change either way shows.
POD_ONLY = {
    "label key": {"a" * 254 + "/b"},  # a prefix over 253 characters
    "resource": {"hugepages-x", "requests.example.com/x"},
}


def _pod(name: str, sweeper: dict) -> dict:
    """A Pod with what ``sweeper`` sets, as the builder puts it on the sweeper's pod."""
    container = {"name": "c", "image": "example.com/sweeper:1"}
    spec: dict = {"containers": [container], "automountServiceAccountToken": False}
    if "resources" in sweeper:  # (this client takes quantities as strings only)
        container["resources"] = {which: {k: str(v) for k, v in values.items()}
                                  for which, values in sweeper["resources"].items()}
    for field in ("nodeSelector", "tolerations"):
        if field in sweeper:
            spec[field] = sweeper[field]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_what_the_crd_refuses_of_pod_fields_the_pod_api_refuses_too(crd_installed, objects, kube_api, kube_namespace):
    """The CRD's copies of the Pod API's rules (label keys and values, tolerations,
    resource names, a request above its limit) never refuse what a Pod takes, and
    catch all but the POD_ONLY cases; the model judges as the CRD does."""
    core = client.CoreV1Api(kube_api)
    wait_for(lambda: core.read_namespaced_service_account("default", kube_namespace), "the default ServiceAccount")

    def admitted(call) -> bool:
        try:
            call()
            return True
        except ApiException as exc:
            assert exc.status == 422, exc.body
            return False

    def model_takes(spec: dict) -> bool:
        from stalledpolicy.policy.models import PolicyError

        try:
            StalledPolicySpec.from_k8s(spec)
            return True
        except PolicyError:
            return False

    cases = [("label key", key, {"nodeSelector": {key: "v"}}) for key in LABEL_KEYS]
    cases += [("label value", value, {"nodeSelector": {"k": value}}) for value in LABEL_VALUES]
    # (a huge page quantity is a multiple of its page size)
    amount = {name: name.removeprefix("hugepages-") if name in ("hugepages-2Mi", "hugepages-1Gi") else "1"
              for name in RESOURCE_NAMES}
    cases += [("resource", name, {"resources": {"requests": {"cpu": "1", name: amount[name]},
                                                "limits": {"cpu": "1", name: amount[name]}}})
              for name in RESOURCE_NAMES]
    cases += [("toleration", json.dumps(t), {"tolerations": [t]}) for t in TOLERATIONS]
    cases += [("request/limit", f"{r} {lim}", {"resources": {"requests": {n: r}, "limits": {n: lim}}})
              for n, r, lim in REQUEST_LIMIT]
    pod_only: dict[str, set] = {}
    for i, (kind, value, sweeper) in enumerate(cases):
        pod = admitted(lambda: core.create_namespaced_pod(kube_namespace, _pod(f"p{i}", sweeper), dry_run="All"))
        ours = admitted(lambda: objects.create_namespaced_custom_object(
            GROUP, VERSION, kube_namespace, PLURAL, policy(f"p{i}", with_(sweeper=sweeper)), dry_run="All"))
        assert pod or not ours or kind in POD_ONLY, f"{kind} {value!r}: the Pod API refuses it, the CRD admits it"
        assert ours or not pod, f"{kind} {value!r}: the CRD refuses what a Pod takes"
        assert model_takes(with_(sweeper=sweeper)) == ours, f"{kind} {value!r}: the model and the CRD disagree"
        if ours and not pod:
            pod_only.setdefault(kind, set()).add(value)
    assert pod_only == POD_ONLY
