"""The StalledPolicy spec models: the CRD's rules, errors in the user's words,
and the sweeper's env (the contract with `stalledpolicy sweep`)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from stalledpolicy.policy import crd
from stalledpolicy.policy.models import (
    ENV_LANES,
    ENV_REDIS_URL,
    PolicyError,
    StalledPolicySpec,
    format_lane_budgets,
    parse_lane_budgets,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BASE = {"queue": "emails", "redis": {"url": "redis://redis.queues.svc:6379/0"}}


def spec_with(**changes):
    spec = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is _DROP:
            spec.pop(key, None)
        else:
            spec[key] = value
    return spec


_DROP = object()


def problem_of(spec) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        StalledPolicySpec.from_k8s(spec)
    return info.value


def env_of(spec: StalledPolicySpec) -> dict[str, dict]:
    return {entry["name"]: entry for entry in spec.sweeper_env()}


def test_defaults_match_the_documented_ones():
    spec = StalledPolicySpec.from_k8s(BASE)
    assert spec.max_stalled == 1
    assert spec.sweep_interval == "30s" and spec.interval_seconds == 30.0
    assert spec.batch_size == 1000
    assert spec.suspend is False
    assert spec.lanes == []
    assert spec.sweeper.replicas == 1 and spec.sweeper.image is None
    assert spec.sweeper.image_pull_secrets == []


def test_camel_case_and_snake_case_names_are_both_accepted():
    camel = StalledPolicySpec.from_k8s(spec_with(maxStalled=3, sweepInterval="2m", batchSize=7))
    snake = StalledPolicySpec.model_validate(spec_with(max_stalled=3, sweep_interval="2m", batch_size=7))
    assert camel == snake
    assert (camel.max_stalled, camel.interval_seconds, camel.batch_size) == (3, 120.0, 7)


class _ReadOnlyView(Mapping):
    """Stands in for kopf's Spec: a Mapping that is not a dict."""

    def __init__(self, data):
        self._data = data

    def __getitem__(self, key):
        value = self._data[key]
        return _ReadOnlyView(value) if isinstance(value, dict) else value

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


def test_a_mapping_view_like_kopfs_spec_is_accepted():
    raw = spec_with(lanes=[{"name": "imports", "maxStalled": 1}], redis={"secretRef": {"name": "r"}})
    spec = StalledPolicySpec.from_k8s(_ReadOnlyView(raw))
    assert spec.lane_budgets() == {"imports": 1}
    assert spec.redis.secret_ref.name == "r" and spec.redis.secret_ref.key == "url"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_policy_is_valid(path):
    policies = [doc for doc in yaml.safe_load_all(path.read_text()) if doc and doc["kind"] == "StalledPolicy"]
    assert policies, f"{path} holds no StalledPolicy"
    for policy in policies:
        StalledPolicySpec.from_k8s(policy["spec"])


@pytest.mark.parametrize(
    "changes, path, words",
    [
        ({"queue": "a:b"}, "spec.queue", "':'"),
        ({"queue": "{x}"}, "spec.queue", "'{'"),
        ({"queue": "has space"}, "spec.queue", "' '"),
        ({"queue": "tab\there"}, "spec.queue", "'\\t'"),
        ({"queue": "nbsp\u00a0here"}, "spec.queue", "'\\xa0'"),
        ({"queue": ""}, "spec.queue", "non-empty"),
        ({"queue": "q" * 129}, "spec.queue", "at most 128"),
        ({"queue": _DROP}, "spec.queue", "is required"),
        ({"queue": 7}, "spec.queue", "must be a string"),
        ({"maxStalled": -1}, "spec.maxStalled", "at least 0"),
        ({"maxStalled": "3"}, "spec.maxStalled", "whole number"),
        ({"maxStalled": True}, "spec.maxStalled", "whole number"),
        ({"sweepInterval": "30"}, "spec.sweepInterval", "not a duration"),
        ({"sweepInterval": "2x"}, "spec.sweepInterval", "not a duration"),
        ({"sweepInterval": "1d"}, "spec.sweepInterval", "not a duration"),
        ({"sweepInterval": "0s"}, "spec.sweepInterval", "from 1s to 1h"),
        ({"sweepInterval": "999ms"}, "spec.sweepInterval", "from 1s to 1h"),
        ({"sweepInterval": "2h"}, "spec.sweepInterval", "from 1s to 1h"),
        ({"sweepInterval": "1h0m1s"}, "spec.sweepInterval", "from 1s to 1h"),
        ({"batchSize": 0}, "spec.batchSize", "at least 1"),
        ({"batchSize": 10001}, "spec.batchSize", "at most 10000"),
        ({"suspend": "yes"}, "spec.suspend", "true or false"),
        ({"redis": {}}, "spec.redis", "exactly one"),
        ({"redis": _DROP}, "spec.redis", "is required"),
        (
            {"redis": {"url": "redis://h:6379/0", "secretRef": {"name": "r", "key": "url"}}},
            "spec.redis",
            "exactly one",
        ),
        ({"redis": {"url": "http://h:6379"}}, "spec.redis.url", "redis://"),
        ({"redis": {"secretRef": {"name": "Not_A_Name"}}}, "spec.redis.secretRef.name", "Secret name"),
        ({"redis": {"secretRef": {"name": "r", "key": "a/b"}}}, "spec.redis.secretRef.key", "Secret key"),
        ({"redis": {"secretRef": {"key": "url"}}}, "spec.redis.secretRef.name", "is required"),
        ({"sweeper": {"replicas": -1}}, "spec.sweeper.replicas", "at least 0"),
        ({"sweeper": {"resources": {"limits": {"cpu": "lots"}}}}, "spec.sweeper.resources.limits.cpu", "quantity"),
        ({"sweeper": {"resources": {"requests": {"memory": "5 gigs"}}}}, "spec.sweeper.resources.requests.memory",
         "'5 gigs' is not a quantity; write a number with an optional unit, for example 250m, 0.5, 1e3, 512Mi"),
        ({"sweeper": {"resources": {"limits": {"cpu": "1.2.3"}}}}, "spec.sweeper.resources.limits.cpu",
         "is not a quantity; write a number with an optional unit"),
        ({"sweeper": {"resources": {"limits": {"cpu": "1e99999999999"}}}}, "spec.sweeper.resources.limits.cpu",
         "is not a quantity"),
        ({"sweeper": {"resources": {"limits": {"cpu": "-1"}}}}, "spec.sweeper.resources.limits.cpu", "negative"),
        ({"sweeper": {"resources": {"requests": {"memory": -1}}}}, "spec.sweeper.resources.requests.memory",
         "negative"),
        ({"sweeper": {"resources": {"requests": {"cpu": "-.5m"}}}}, "spec.sweeper.resources.requests.cpu", "negative"),
        ({"sweeper": {"resources": {"limits": {"cpu": "1" * 65}}}}, "spec.sweeper.resources.limits.cpu", "at most 64"),
        ({"sweeper": {"priorityClassName": "Not_Valid"}}, "spec.sweeper.priorityClassName", "PriorityClass name"),
        ({"sweeper": {"priorityClassName": "high."}}, "spec.sweeper.priorityClassName", "PriorityClass name"),
        ({"sweeper": {"tolerations": [{"operator": "Maybe"}]}}, "spec.sweeper.tolerations[0].operator", "Exists"),
        ({"sweeper": {"tolerations": [{"effect": "Sometimes"}]}}, "spec.sweeper.tolerations[0].effect", "NoSchedule"),
        ({"sweeper": {"nodeSelector": {"zone": 1}}}, "spec.sweeper.nodeSelector.zone", "string"),
        ({"sweeper": {"imagePullSecrets": [{"name": "Bad_Name"}]}},
         "spec.sweeper.imagePullSecrets[0].name", "Secret name"),
        ({"sweeper": {"imagePullSecrets": [{}]}}, "spec.sweeper.imagePullSecrets[0].name", "is required"),
        ({"sweeper": {"imagePullSecrets": [{"name": ""}]}},
         "spec.sweeper.imagePullSecrets[0].name", "must not be empty"),
        ({"sweeper": {"imagePullSecrets": ["regcred"]}}, "spec.sweeper.imagePullSecrets[0]", "{name} objects"),
        (
            {"sweeper": {"imagePullSecrets": [{"name": "a"}, {"name": "b"}, {"name": "a"}]}},
            "spec.sweeper.imagePullSecrets[2].name",
            "already listed at imagePullSecrets[0]",
        ),
        (
            {"sweeper": {"imagePullSecrets": [{"name": f"s{i}"} for i in range(17)]}},
            "spec.sweeper.imagePullSecrets",
            "at most 16",
        ),
    ],
)
def test_each_bad_field_is_named_in_the_users_words(changes, path, words):
    error = problem_of(spec_with(**changes))
    assert error.field == path, str(error)
    assert str(error).startswith(f"{path}: ")
    assert words in str(error)


@pytest.mark.parametrize(
    "lanes, path, words",
    [
        ([{"name": "a"}, {"name": "b"}, {"name": "c", "maxStalled": -2}], "spec.lanes[2].maxStalled", "at least 0"),
        ([{"name": "a"}, {"name": "b"}, {"name": "a"}], "spec.lanes[2].name", "already listed at lanes[0]"),
        ([{"name": "x=y"}], "spec.lanes[0].name", "'='"),
        ([{"name": "x,y"}], "spec.lanes[0].name", "','"),
        ([{"name": "x:y"}], "spec.lanes[0].name", "':'"),
        ([{"name": ""}], "spec.lanes[0].name", "must not be empty"),
        # keyspace's one rule: a lone surrogate (an undecodable byte) was let through by a copy of it
        ([{"name": "l\udcfe"}], "spec.lanes[0].name", "an undecodable byte"),
        ([{"name": "a\tb"}], "spec.lanes[0].name", "a control character"),
        ([{"maxStalled": 2}], "spec.lanes[0].name", "is required"),
        ([{"name": f"l{i}"} for i in range(257)], "spec.lanes", "at most 256"),
    ],
)
def test_lane_problems_name_the_lane_index(lanes, path, words):
    error = problem_of(spec_with(lanes=lanes))
    assert error.field == path, str(error)
    assert words in str(error)


def test_a_problem_says_how_to_fix_it():
    message = str(problem_of(spec_with(maxStalled=-1)))
    assert "got -1" in message
    assert "0 (never dead-letter)" in message and "1 = no recovery" in message


def test_every_problem_is_reported_at_once():
    error = problem_of(spec_with(queue="a:b", maxStalled=-1, sweepInterval="2x"))
    assert [path for path, _ in error.problems] == ["spec.queue", "spec.maxStalled", "spec.sweepInterval"]


def test_a_missing_spec_is_a_policy_error():
    assert problem_of(None).field == "spec"


@pytest.mark.parametrize(
    "url",
    [
        "redis://:hunter2@redis.queues.svc:6379/0",
        "redis://app:hunter2@redis.queues.svc:6379/0",
        "rediss://hunter2@redis.queues.svc:6380",
        "redis://redis.queues.svc:6379/0?password=hunter2",
        "redis://redis.queues.svc:6379/0?db=1&password=hunter2",
        # query keys redis-py reads percent-decoded, or as other password options
        "redis://redis.queues.svc:6379/0?pass%77ord=hunter2",
        "redis://redis.queues.svc:6379/0?%70assword=hunter2",
        "rediss://redis.queues.svc:6380/0?ssl_password=hunter2",
        "redis://redis.queues.svc:6379/0?PASSWORD=hunter2",
        "redis://redis.queues.svc:6379/0?db=1&Password=hunter2",
        "redis://redis.queues.svc:6379/0?socket%5Ftimeout=5&x=hunter2",
        "redis://redis.queues.svc:6379/0?username=hunter2",
        # a password holding '/', '?' or '#' ends urlsplit's userinfo early
        "redis://:hunter2/x@redis.queues.svc:6379/0",
        "redis://app:hun?ter2@redis.queues.svc:6379/0",
        "redis://:hunter2#x@redis.queues.svc:6379/0",
    ],
)
def test_an_inline_url_with_credentials_is_refused_without_echoing_it(url):
    error = problem_of(spec_with(redis={"url": url}))
    assert error.field == "spec.redis.url"
    assert "secretRef" in str(error)
    assert "hunter2" not in str(error) and "hunter2" not in repr(error.problems)
    assert error.__cause__ is None and error.__suppress_context__


@pytest.mark.parametrize("url", ["redis://redis.queues.svc:6379/0", "rediss://r.example:6380/2", "redis://[::1]:6379",
                                 "redis://r.example:6379/0?socket_timeout=5&db=1",
                                 "rediss://r.example:6380/0?ssl_cert_reqs=none&client_name=a%20b"])
def test_a_credential_free_url_is_accepted(url):
    assert StalledPolicySpec.from_k8s(spec_with(redis={"url": url})).redis.url == url


def test_lane_budgets_override_the_policy_budget_in_spec_order():
    spec = StalledPolicySpec.from_k8s(
        spec_with(maxStalled=2, lanes=[{"name": "imports", "maxStalled": 1}, {"name": "reports"},
                                       {"name": "billing", "maxStalled": 0}])
    )
    assert spec.lane_budgets() == {"imports": 1, "reports": 2, "billing": 0}
    assert spec.lanes_env() == "imports=1,reports=2,billing=0"
    assert parse_lane_budgets(spec.lanes_env()) == spec.lane_budgets()


def test_sweeper_env_carries_the_whole_sweep_config():
    spec = StalledPolicySpec.from_k8s(
        spec_with(maxStalled=3, sweepInterval="15s", batchSize=500,
                  lanes=[{"name": "a", "maxStalled": 3}, {"name": "b", "maxStalled": 0}])
    )
    env = env_of(spec)
    values = {name: entry.get("value") for name, entry in env.items()}
    assert values == {
        "STALLEDPOLICY_QUEUE": "emails",
        "STALLEDPOLICY_MAX_STALLED": "3",
        "STALLEDPOLICY_LANES": "a=3,b=0",
        "STALLEDPOLICY_INTERVAL": "15s",
        "STALLEDPOLICY_BATCH_SIZE": "500",
        "STALLEDPOLICY_METRICS_PORT": "9090",
        "STALLEDPOLICY_LOG_FORMAT": "json",
        "STALLEDPOLICY_REDIS_URL": "redis://redis.queues.svc:6379/0",
    }
    assert all(isinstance(v, str) for v in values.values())


def test_no_lanes_means_no_lanes_variable():
    assert ENV_LANES not in env_of(StalledPolicySpec.from_k8s(BASE))


def test_a_secret_ref_reaches_the_sweeper_by_secret_key_ref_only():
    spec = StalledPolicySpec.from_k8s(spec_with(redis={"secretRef": {"name": "orders-redis", "key": "url"}}))
    redis_env = env_of(spec)[ENV_REDIS_URL]
    assert redis_env == {"name": ENV_REDIS_URL, "valueFrom": {"secretKeyRef": {"name": "orders-redis", "key": "url"}}}


def test_the_sweeper_accepts_the_env_the_operator_writes():
    """The env names and formats are a contract with `stalledpolicy sweep`."""
    from stalledpolicy.sweeper.config import load_config

    spec = StalledPolicySpec.from_k8s(
        spec_with(maxStalled=4, sweepInterval="1m30s", batchSize=250,
                  lanes=[{"name": "imports", "maxStalled": 1}, {"name": "reports"}],
                  redis={"secretRef": {"name": "s"}})
    )
    environ = {}
    for entry in spec.sweeper_env():
        # the kubelet resolves secretKeyRef; here the Secret holds a password URL
        environ[entry["name"]] = entry.get("value", "redis://:pw@redis.queues.svc:6379/0")
    config = load_config({}, environ)
    assert config.queue == "emails"
    assert config.max_stalled == 4
    assert config.lanes == {"imports": 1, "reports": 4}
    assert config.interval == 90.0
    assert config.batch_size == 250
    assert config.metrics_port == 9090
    assert config.log_format == "json"
    assert config.redis_url.get_secret_value() == "redis://:pw@redis.queues.svc:6379/0"


@pytest.mark.parametrize("text", ["a", "a=", "=1", "a=-1", "a=x"])
def test_parse_lane_budgets_refuses_malformed_pairs(text):
    with pytest.raises(ValueError, match="name=budget"):
        parse_lane_budgets(text)


def test_parse_lane_budgets_refuses_a_lane_given_twice():
    with pytest.raises(ValueError, match="twice"):
        parse_lane_budgets("a=1,a=2")


def test_format_and_parse_lane_budgets_round_trip():
    budgets = {"imports": 1, "billing": 0, "x.y-z": 12}
    assert parse_lane_budgets(format_lane_budgets(budgets)) == budgets
    assert parse_lane_budgets("") == {}


# --- the CRD: generated from these models (hack/gen-crd.py) ---------------------

def test_every_crd_field_has_a_description():
    missing = []

    def walk(schema, path):
        # list items are described by their list; metadata by Kubernetes
        if path and not path.endswith(("[]", "metadata")) and not schema.get("description"):
            missing.append(path)
        for name, child in (schema.get("properties") or {}).items():
            walk(child, f"{path}.{name}" if path else name)
        if "items" in schema:
            walk(schema["items"], path + "[]")

    versions = crd.load_crd()["spec"]["versions"]
    walk(versions[0]["schema"]["openAPIV3Schema"], "")
    assert missing == []


# What the Pod API's parser (resource.ParseQuantity, CEL's isQuantity) takes,
# quirks included; the kube test test_the_api_server_and_the_model_judge_quantities_alike
# compares is_quantity with the API server on many more.
@pytest.mark.parametrize("text", ["250m", "1Gi", "0.5", "1e3", "+1Gi", "-0", ".5", "1.", "1.5Ki", "1E", "1e-3",
                                  "1e+3", "1e999", "1e0999", "0", "00", "-", ".", "m", "Ki", "Ti", "e-9", "1" * 64])
def test_quantities_the_api_server_takes_are_quantities(text):
    from stalledpolicy.policy.models import is_quantity

    assert is_quantity(text)


@pytest.mark.parametrize("text", ["", "5 gigs", "1.2.3", "1e1.5", "1e.5", "1K", "1ki", "1mm", "1e", "1i", "0x1",
                                  " 1", "1Mi ", "1.5e3Mi", "Ei", "Pi", "e-10", "1e1000", "1e0001000",
                                  "1e99999999999", "1e-2147483648"])
def test_what_the_api_server_refuses_is_not_a_quantity(text):
    from stalledpolicy.policy.models import is_quantity

    assert not is_quantity(text)


@pytest.mark.parametrize("changes", [
    {"queue": "redis://:s3cr3t-password@redis.example:6379/0"},
    {"sweepInterval": "rediss://ops:s3cr3t-password@redis.example:6380/0"},
    {"lanes": [{"name": "redis://:s3cr3t-password@h"}]},
])
def test_a_url_in_the_wrong_field_shows_no_password(changes):
    """A Redis URL pasted into another field is quoted back redacted (status,
    events and the operator's log carry this message)."""
    error = str(problem_of(spec_with(**changes)))
    assert "s3c" not in error and "***" in error


@pytest.mark.parametrize("sweeper", [
    {"priorityClassName": "high-priority"}, {"priorityClassName": "system.node-critical"},
    {"resources": {"limits": {"cpu": "-0", "memory": "+1Gi"}, "requests": {"cpu": 0, "memory": "1e3"}}},
])
def test_sweeper_values_the_pod_api_takes_are_accepted(sweeper):
    assert StalledPolicySpec.from_k8s(spec_with(sweeper=sweeper)).sweeper is not None


# --- the url's form: port, host, database path --------------------------------

def test_the_url_form_rules_refuse_no_url_the_operator_accepts():
    """Admission must never refuse what the operator takes: every URL of the
    corpus (ports, brackets, percent-encoding, dropped tabs and newlines) that
    check_redis_url accepts passes the rules (the kube test feeds a sample of
    them to the API server)."""
    from stalledpolicy.policy.models import url_form_problems
    from tests.unit.inline_urls import all_urls, operator_accepts

    urls = all_urls()
    accepted = [url for url in urls if operator_accepts(url)]
    assert len(accepted) > 1000
    assert [url for url in accepted if url_form_problems(url)] == []
    # and what the rules refuse, the operator refuses too (it is the same judgment, earlier)
    assert all(not operator_accepts(url) for url in urls if url_form_problems(url))


@pytest.mark.parametrize(("url", "words"), [
    ("redis://h:99999/0", "has a port that is not a number from 1 to 65535"),
    ("redis://h:0/0", "has a port that is not a number from 1 to 65535"),
    ("redis://h:6s/0", "has a port that is not a number from 1 to 65535"),
    ("redis://:6379/0", "has no host"),
    ("rediss:///0", "has no host"),
    ("redis://h:6379/1x", "has a path that is not a database number"),
    ("redis://h/%2F", "has a path that is not a database number"),
])
def test_an_inline_url_of_the_wrong_form_is_refused_with_the_fix(url, words):
    error = problem_of(spec_with(redis={"url": url}))
    assert error.field == "spec.redis.url" and words in str(error)
    assert "write " in str(error) and "redis.queues.svc:6379/0" in str(error)


@pytest.mark.parametrize("url", ["redis://h", "redis://h:/", "redis://h:065535/%31%2F", "redis://[::1]:6379/0",
                                 "rediss://h/0?db=2", "redis://10.0.0.1:6379/15/"])
def test_an_inline_url_of_the_right_form_is_accepted(url):
    assert StalledPolicySpec.from_k8s(spec_with(redis={"url": url})).redis.url == url
