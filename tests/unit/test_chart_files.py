"""The Helm chart's files, without Helm: versions, values vs schema (the CRD
copy is generated: tests/unit/test_generated_docs.py).

Rendering, linting and installing are proven against the real control plane
in tests/kube/test_chart.py.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

import stalledpolicy

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "stalledpolicy-operator"


def load_schema() -> dict:
    return json.loads((CHART / "values.schema.json").read_text())


def load_values() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def test_chart_has_no_crds_directory_that_would_install_the_crd_twice():
    # The CRD is a template (templates/crd.yaml) so that upgrades and crds.keep apply;
    # a chart-level crds/ directory would make Helm install it a second time.
    assert not (CHART / "crds").exists()


def test_chart_versions_follow_the_package():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"] == stalledpolicy.__version__
    assert chart["version"] == project["version"]


def test_default_image_is_the_one_the_dockerfile_builds():
    values = load_values()
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    expected = f"{values['image']['repository']}:{chart['appVersion']}"
    assert expected in (REPO / "Dockerfile").read_text()


def test_schema_is_valid_draft7_and_accepts_the_defaults():
    schema = load_schema()
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(load_values())


def _objects_without_closed_properties(node, path="$"):
    """Paths of schema objects that declare properties but allow unknown ones."""
    found = []
    if isinstance(node, dict):
        if "properties" in node and node.get("additionalProperties") is not False:
            found.append(path)
        for key, value in node.items():
            found += _objects_without_closed_properties(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _objects_without_closed_properties(value, f"{path}[{i}]")
    return found


def test_every_schema_object_refuses_unknown_keys():
    assert _objects_without_closed_properties(load_schema()) == []


def _keys(values: dict, schema: dict, prefix="") -> list[str]:
    """values.yaml keys the schema does not describe (a default nobody validates)."""
    missing = []
    props = schema.get("properties") or {}
    for key, value in values.items():
        if key not in props:
            missing.append(prefix + key)
        elif isinstance(value, dict) and "properties" in props[key]:
            missing += _keys(value, props[key], f"{prefix}{key}.")
    return missing


def test_schema_and_values_describe_the_same_keys():
    schema, values = load_schema(), load_values()
    assert _keys(values, schema) == []
    undocumented = set(schema["properties"]) - set(values) - {"global"}
    assert undocumented == set(), f"keys in the schema without a default in values.yaml: {undocumented}"


@pytest.mark.parametrize("override, field", [
    ({"imagee": {"tag": "x"}}, "imagee"),
    ({"image": {"tga": "x"}}, "tga"),
    ({"crds": {"keep": "yes"}}, "keep"),
    ({"operator": {"statusWorkers": "8"}}, "statusWorkers"),
    ({"operator": {"statusInterval": "10 seconds"}}, "statusInterval"),
    ({"watchNamespaces": "team-a"}, "watchNamespaces"),
    ({"watchNamespaces": ["team-*"]}, "team-*"),
    ({"resources": {"limits": {"memory": "lots"}}}, "lots"),
    ({"podMonitor": {"enabled": True, "intervall": "30s"}}, "intervall"),
    ({"sweeperAllowedImages": "registry.example/team/*"}, "sweeperAllowedImages"),
    ({"sweeperAllowedImages": ["registry.example/*/sweeper"]}, "registry.example/*/sweeper"),
    ({"sweeperAllowedImages": ["a:1,b:1"]}, "a:1,b:1"),
    ({"sweeperAllowedImages": [""]}, "sweeperAllowedImages"),
    # the chart's selectors use these: a pod label of the same name broke the install or the PodMonitor
    ({"podLabels": {"app.kubernetes.io/name": "x"}}, "app.kubernetes.io/name"),
    ({"podLabels": {"app.kubernetes.io/component": "x"}}, "app.kubernetes.io/component"),
    ({"nameOverride": "Bad_Name"}, "Bad_Name"),
    ({"fullnameOverride": "UPPER"}, "UPPER"),
    ({"networkPolicy": {"redis": {"ports": [6379], "cidrs": ["not-a-cidr"]}}}, "not-a-cidr"),
    ({"networkPolicy": {"apiServer": {"ports": [443], "cidrs": ["10.0.0.1"]}}}, "10.0.0.1"),
])
def test_schema_refuses_unknown_or_mistyped_values(override, field):
    values = load_values()
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            values[key] = {**values[key], **value}
        else:
            values[key] = value
    errors = list(jsonschema.Draft7Validator(load_schema()).iter_errors(values))
    assert errors, f"{override} was accepted"
    assert any(field in (e.message + " ".join(map(str, e.path))) for e in errors), [e.message for e in errors]


@pytest.mark.parametrize("key", ["statusInterval", "maxBackoff"])
def test_status_interval_and_max_backoff_are_at_least_a_second(key):
    # The operator refuses less than 1s (it would spin its status loop); the
    # schema refuses it before Helm renders a Deployment that crash-loops.
    from stalledpolicy.durations import parse_duration

    validator = jsonschema.Draft7Validator(load_schema())

    def accepted(value):
        values = load_values()
        values["operator"] = {**values["operator"], key: value}
        return not list(validator.iter_errors(values))

    refused = ["0s", "1ms", "999ms", "1500ms", "0.5s", "0h", "00s"]
    fine = ["1s", "1.5s", "10s", "5m", "1h30m", "0h1s"]
    assert [v for v in refused if accepted(v)] == []
    assert [v for v in fine if not accepted(v)] == []
    assert all(parse_duration(v) >= 1 for v in fine)  # and the operator takes what the schema lets through


@pytest.mark.parametrize("entry", [
    "registry.example/team/*", "*", "other:1", "r.example/s@sha256:" + "0" * 64,
    "", "a/*/b", "**", "a:1,b:1", "a b", " a:1", "registry.example*", "registry.example/sweeper:*",
    "a\vb", "a\u00a0b", "a\u2003b",  # spaces Helm's \s does not know: the schema refuses them as the operator does
])
def test_schema_and_operator_agree_on_allowed_sweeper_images(entry):
    # sweeperAllowedImages reaches the operator as one comma-separated variable:
    # what the schema lets through, the operator takes as the same entry.
    from stalledpolicy.controller.config import OperatorConfig

    values = load_values()
    assert values["sweeperAllowedImages"] == []
    values["sweeperAllowedImages"] = [entry]
    by_schema = not list(jsonschema.Draft7Validator(load_schema()).iter_errors(values))
    try:
        parsed = OperatorConfig.from_env({"STALLEDPOLICY_OPERATOR_ALLOWED_SWEEPER_IMAGES": entry})
        by_operator = parsed.allowed_sweeper_images == (entry,)
    except SystemExit:
        by_operator = False
    assert by_schema == by_operator, (entry, by_schema, by_operator)


def test_schema_takes_valid_values_the_templates_render():
    values = load_values()
    values["resources"] = {"requests": {"cpu": 0.5, "memory": "64Mi"}, "limits": {"cpu": 1, "memory": "128Mi"}}
    values["podLabels"] = {"team": "queues"}
    values["nameOverride"] = "sp"
    values["priorityClassName"] = "high-priority"
    assert list(jsonschema.Draft7Validator(load_schema()).iter_errors(values)) == []



# prometheus-operator's monitoring/v1 Duration (pkg/apis/monitoring/v1: the type of a
# PodMetricsEndpoint's interval and scrapeTimeout), its kubebuilder validation pattern
PROMETHEUS_OPERATOR_DURATION = ("^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                                "(([0-9]+)s)?(([0-9]+)ms)?)$")


@pytest.mark.parametrize("key", ["interval", "scrapeTimeout"])
def test_pod_monitor_durations_are_what_the_pod_monitor_crd_accepts(key):
    """The schema let 1.5s through, which the PodMonitor CRD refuses at install
    (after the CRD and the RBAC went in); it now takes exactly the CRD's pattern
    (the empty string aside: the chart always renders the field)."""
    import re

    prop = load_schema()["properties"]["podMonitor"]["properties"][key]
    assert prop["pattern"] == PROMETHEUS_OPERATOR_DURATION and prop["minLength"] == 1
    validator = jsonschema.Draft7Validator(load_schema())

    def accepted(value):
        values = load_values()
        values["podMonitor"] = {**values["podMonitor"], key: value}
        return not list(validator.iter_errors(values))

    crd = re.compile(PROMETHEUS_OPERATOR_DURATION)
    refused = ["1.5s", "0.5m", "1s30m", "30S", "1 s", "-1s", "1us", "1µs", "30", ""]
    fine = ["0", "30s", "1m30s", "500ms", "1h", "2d", "1w", "1y", "1h0m0s", "0s", "1m5ms"]
    assert [v for v in refused if accepted(v)] == []
    assert [v for v in fine if not accepted(v)] == []
    assert [v for v in refused[:-1] if crd.fullmatch(v)] == [] and all(crd.fullmatch(v) for v in fine)
