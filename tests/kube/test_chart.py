"""The Helm chart, proven on the real control plane, not only linted.

- ``helm lint`` in both RBAC shapes with every optional resource on;
- values the schema must refuse (unknown key, wrong type) make ``helm template`` fail;
- the rendered CRD is the repository's ``crds/stalledpolicies.yaml``; the RBAC
  rules are the ones the operator's own tests run with; the PodMonitor selects
  the pods the operator's Deployment builder makes;
- ``helm template`` output passes a server-side dry run, in a namespace that
  enforces the ``restricted`` Pod Security Standard;
- ``helm install`` for real, cluster-wide and namespaced; then the operator,
  run here with a token of the chart's ServiceAccount (and nothing else),
  reconciles a policy end to end: sweeper Deployment applied, the sweeper run
  by the pod runner dead-letters a poison job, ``Ready`` and ``deadLetters``
  written to the status. Missing RBAC would fail it;
- a watched namespace, a ServiceAccount (serviceAccount.create=false) or a PriorityClass
  that does not exist fails a real ``helm install`` at the render, naming the value and
  the fix, with nothing applied; ``helm template`` still renders them.

These run on the control plane alone (no node): the operator runs here as a
process with the chart's identity, and the pod runner plays the kubelet. The
chart installed for real on a node, its operator and the sweepers as real pods
of `make image`'s image, is tests/node/test_real_pods.py (`make test`'s second
session).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from stalledpolicy.devenv.controlplane import wait_crd_established
from stalledpolicy.devenv.echomq import EchoMQ
from stalledpolicy.devenv.ports import free_port
from stalledpolicy.keyspace import QueueKeys
from stalledpolicy.policy.builder import METRICS_PORT_NAME, build_sweeper_deployment, sweeper_name
from stalledpolicy.policy.models import StalledPolicySpec
from tests.kube.operator_harness import (
    LEASE_RULES,
    NAMESPACE_RULES,
    OPERATOR_RULES,
    PodRunnerThread,
    condition,
    redis_secret,
    wait_for,
)
from tests.kube_fixtures import CHART, REPO, Helm

pytestmark = [pytest.mark.kube, pytest.mark.redis]

CRD_SOURCE = REPO / "crds" / "stalledpolicies.yaml"
TEST_SWEEPER_IMAGE = "stalledpolicy:chart-test"
# What `helm template` must be told of a cluster that serves PodMonitors (helm install asks the
# cluster itself): without it, podMonitor.enabled=true fails the render on purpose.
WITH_PODMONITOR_CRD = ["--api-versions", "monitoring.coreos.com/v1/PodMonitor"]
EVERY_OPTION = ["--set", "podMonitor.enabled=true", "--set", "networkPolicy.enabled=true",
                "--set", "podDisruptionBudget.enabled=true", *WITH_PODMONITOR_CRD]
# helm lint has no --api-versions, so it cannot render the PodMonitors (the render tests
# below and the server-side dry run cover them).
EVERY_LINTABLE_OPTION = ["--set", "networkPolicy.enabled=true", "--set", "podDisruptionBudget.enabled=true"]


@pytest.fixture(scope="module")
def helm(control_plane, tmp_path_factory) -> Helm:
    return Helm(control_plane, tmp_path_factory.mktemp("helm-home"))


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind]


def rule_set(rules: list[dict]) -> set[tuple]:
    """Rules as (group, resource, verb) triples, so grouping and order do not matter."""
    return {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


# --------------------------------------------------------------------------- rendering


@pytest.mark.parametrize("shape", [[], ["--set", "watchNamespaces={team-a,team-b}"]],
                         ids=["cluster-wide", "namespaced"])
def test_lint_passes_strict_with_every_option(helm, shape):
    done = helm("lint", "--strict", str(CHART), *EVERY_LINTABLE_OPTION, *shape)
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("shape, flag", [([], ""), (["--set", "watchNamespaces={team-a,team-b}"], " -n team-a")],
                         ids=["cluster-wide", "namespaced"])
def test_the_notes_point_kubectl_at_a_watched_namespace(helm, shape, flag):
    """Namespaced, the notes' commands had no -n: the example landed in default,
    which the operator does not watch, and the kubectl wait timed out."""
    notes = helm("install", "notes", str(CHART), "--namespace", "sp", "--dry-run=client", *shape).stdout
    notes = notes.split("NOTES:", 1)[1]
    assert f"kubectl apply{flag} -f examples/flat-queue.yaml" in notes
    assert f"kubectl wait{flag} --for=condition=Ready stalledpolicy/emails" in notes
    assert f"kubectl get stalledpolicies{flag} -o wide" in notes
    assert ("in a namespace\nthe operator watches" in notes) == bool(flag)


@pytest.mark.parametrize("values, complaint", [
    ({"imagee": {"tag": "x"}}, "imagee"),
    ({"operator": {"statusWorkers": "eight"}}, "statusWorkers"),
    ({"crds": {"keep": "yes"}}, "keep"),
    ({"watchNamespaces": ["team-*"]}, "watchNamespaces"),
    ({"operator": {"statusInterval": "0s"}}, "statusInterval"),
    ({"operator": {"maxBackoff": "1ms"}}, "maxBackoff"),
    ({"sweeperAllowedImages": ["registry.example/*/sweeper"]}, "sweeperAllowedImages"),
    ({"podMonitor": {"enabled": True, "interval": "1.5s"}}, "interval"),
    ({"podMonitor": {"enabled": True, "scrapeTimeout": "0.5s"}}, "scrapeTimeout"),
    # Helm located a propertyNames failure at a random other value (reviewer's reproduction)
    ({"podLabels": {"app.kubernetes.io/name": "x"}}, "at '/podLabels'"),
    ({"resources": {"requests": {"bad name": "1"}}}, "at '/resources/requests': additional properties 'bad name'"),
    # each of these passed the schema and failed at apply, the release half-applied (reviewer's reproduction)
    ({"networkPolicy": {"redis": {"cidrs": ["10.0.0.0/99"]}}}, "cidrs"),
    ({"networkPolicy": {"apiServer": {"cidrs": ["300.0.0.0/8"]}}}, "cidrs"),
    ({"podDisruptionBudget": {"enabled": True, "maxUnavailable": "500%"}}, "maxUnavailable"),
    ({"podDisruptionBudget": {"enabled": True, "maxUnavailable": 1.5}}, "maxUnavailable"),
    ({"operator": {"listenAddress": "999.1.1.1"}}, "listenAddress"),
    ({"sweeperImage": " "}, "sweeperImage"),
    ({"leaderElection": {"duration": "2s"}}, "duration"),  # the operator refuses it at start (exit 2)
    ({"replicas": 0}, "replicas"),
], ids=["unknown-key", "string-for-integer", "string-for-boolean", "namespace-pattern",
        "zero-status-interval", "sub-second-backoff", "star-inside-an-allowed-image",
        "fractional-scrape-interval", "fractional-scrape-timeout", "reserved-pod-label", "resource-name",
        "cidr-prefix-too-long", "cidr-octet-too-big", "percentage-over-100", "fractional-pod-count",
        "address-octet-too-big", "blank-sweeper-image", "lease-under-3s", "no-replica"])
def test_schema_refuses_bad_values_files(helm, tmp_path, values, complaint):
    bad = tmp_path / "values.yaml"
    bad.write_text(yaml.safe_dump(values))
    done = helm("template", "rel", str(CHART), "-f", str(bad), check=False)
    assert done.returncode != 0, f"helm accepted {values}:\n{done.stdout[:500]}"
    assert "schema" in done.stderr.lower() and complaint in done.stderr, done.stderr


def test_rendered_crd_is_the_repository_crd_and_kept_on_uninstall(helm):
    source = yaml.safe_load(CRD_SOURCE.read_text())
    kept = by_kind(helm.template(), "CustomResourceDefinition")
    assert len(kept) == 1
    annotations = kept[0]["metadata"].pop("annotations")
    assert annotations == {"helm.sh/resource-policy": "keep"}
    assert kept[0] == source

    plain = by_kind(helm.template("--set", "crds.keep=false"), "CustomResourceDefinition")
    assert plain == [source]
    assert by_kind(helm.template("--set", "crds.install=false"), "CustomResourceDefinition") == []


def test_cluster_wide_rbac_is_exactly_the_operator_rules(helm):
    docs = helm.template()
    [role] = by_kind(docs, "ClusterRole")
    assert rule_set(role["rules"]) == rule_set(OPERATOR_RULES)
    # Least privilege: the status is only patched (a JSON patch guarded by the
    # policy's uid), never read through the subresource.
    assert [r["verbs"] for r in role["rules"] if "stalledpolicies/status" in r["resources"]] == [["patch"]]
    assert [r["metadata"]["name"] for r in by_kind(docs, "Role")] == ["rel-stalledpolicy-operator-leader"]
    [binding] = by_kind(docs, "ClusterRoleBinding")
    [account] = by_kind(docs, "ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": "stalledpolicy-system"}]
    [deployment] = by_kind(docs, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" in args and not any(a.startswith("--namespace") for a in args)


def test_values_that_look_like_numbers_stay_strings(helm):
    """YAML reads an unquoted 123 as a number, and the API server refuses a number there."""
    [deployment] = by_kind(helm.template("--set-string", "priorityClassName=123",
                                         "--set-string", "sweeperImage=123"), "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "123"
    assert "--sweeper-image=123" in spec["containers"][0]["args"]


def test_namespaced_rbac_grants_only_the_watched_namespaces(helm):
    docs = helm.template("--set", "watchNamespaces={team-a,team-b}")
    roles = [r for r in by_kind(docs, "Role") if not r["metadata"]["name"].endswith("-leader")]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    # kopf lists and watches CRDs, and namespaces when given namespace names.
    crds = rule_set([{"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                      "verbs": ["list", "watch"]}])
    namespaces = rule_set(NAMESPACE_RULES)  # the harness's namespaced operators hold the same
    for role in roles:
        assert rule_set(role["rules"]) == rule_set(OPERATOR_RULES) - crds
    [cluster_role] = by_kind(docs, "ClusterRole")
    assert rule_set(cluster_role["rules"]) == crds | namespaces
    assert sorted(b["metadata"]["namespace"] for b in by_kind(docs, "RoleBinding")
                  if not b["metadata"]["name"].endswith("-leader")) == ["team-a", "team-b"]
    [deployment] = by_kind(docs, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]
    assert "--all-namespaces" not in args


def test_leader_election_is_a_lease_of_the_release_and_replicas_need_it(helm):
    """By default the operator elects its acting replica with the release's Lease
    (the harness's LEASE_RULES, get/update limited to that Lease) and rolls on
    upgrade; off, it is one replica replaced with Recreate, and more are refused."""
    docs = helm.template("--set", "replicas=3")
    [deployment] = by_kind(docs, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert "--leader-election-lease=stalledpolicy-system/rel-stalledpolicy-operator" in container["args"]
    assert "--leader-election-duration=15s" in container["args"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]
    [role] = by_kind(docs, "Role")
    assert role["metadata"]["namespace"] == "stalledpolicy-system"
    assert rule_set(role["rules"]) == rule_set(LEASE_RULES)
    assert [r.get("resourceNames") for r in role["rules"] if "get" in r["verbs"]] == [["rel-stalledpolicy-operator"]]
    [binding] = by_kind(docs, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]

    off = helm.template("--set", "leaderElection.enabled=false")
    [deployment] = by_kind(off, "Deployment")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"} and deployment["spec"]["replicas"] == 1
    assert not [a for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"] if "leader" in a]
    assert by_kind(off, "Role") == []
    refused = helm("template", "rel", str(CHART), "--set", "replicas=2", "--set", "leaderElection.enabled=false",
                   check=False)
    assert refused.returncode != 0 and "replicas above 1 need leaderElection.enabled=true" in refused.stderr


def test_operator_deployment_shape(helm):
    [deployment] = by_kind(helm.template("--set", "image.tag=9.9.9"), "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "RollingUpdate"  # leader election
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    assert container["image"] == "ghcr.io/stalledpolicy/stalledpolicy-operator:9.9.9"
    assert "--sweeper-image=ghcr.io/stalledpolicy/stalledpolicy-operator:9.9.9" in container["args"]
    assert "--liveness=http://[::]:8080/healthz" in container["args"]
    assert "--metrics-port=8081" in container["args"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"healthz": 8080, "metrics": 8081}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    # /healthz is 503 until the startup is done: a slow start gets 5 minutes, not the liveness probe's ~75 s
    startup = container["startupProbe"]
    assert startup["httpGet"] == container["livenessProbe"]["httpGet"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["resources"]["limits"]["memory"]

    # The args are the operator's real command line: its own parser accepts them.
    from stalledpolicy.cli import build_parser

    parsed = build_parser().parse_args(container["args"])
    assert parsed.all_namespaces and parsed.status_interval == 10.0 and parsed.max_backoff == 300.0
    assert parsed.metrics_port == 8081
    assert parsed.leader_election_lease == "stalledpolicy-system/rel-stalledpolicy-operator"
    assert parsed.leader_election_duration == 15.0


def test_operator_metrics_port_can_be_turned_off_and_never_shares_the_liveness_port(helm):
    [deployment] = by_kind(helm.template("--set", "operator.metricsPort=0"), "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert "--metrics-port=0" in container["args"]
    assert [p["name"] for p in container["ports"]] == ["healthz"]
    failed = helm("template", "r", str(CHART), "--set", "operator.metricsPort=8080", check=False)
    assert failed.returncode != 0 and "must differ from operator.livenessPort" in failed.stderr


def test_listen_address_reaches_the_liveness_url_and_the_metrics_server(helm):
    """The kubelet probes the pod's IP, IPv4 or IPv6: by default both servers listen on ::
    (every address, as the sweepers'); an explicit address is passed as given."""
    from urllib.parse import urlsplit

    from stalledpolicy.cli import build_parser

    def operator_args(*values: str):
        [deployment] = by_kind(helm.template(*values), "Deployment")
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        parsed = build_parser().parse_args(container["args"])
        # The settings only: the parser's own bookkeeping (its sub-parsers) differs per build.
        return argparse.Namespace(**{k: v for k, v in vars(parsed).items() if not k.startswith("_")})

    default = operator_args()
    # the liveness URL's host is where it listens; :: needs brackets in a URL.
    assert default.liveness == "http://[::]:8080/healthz" and urlsplit(default.liveness).hostname == "::"
    assert default.metrics_address == "::"
    assert operator_args("--set", "operator.listenAddress=::") == default
    ipv4 = operator_args("--set", "operator.listenAddress=0.0.0.0")
    assert (ipv4.liveness, ipv4.metrics_address) == ("http://0.0.0.0:8080/healthz", "0.0.0.0")
    failed = helm("template", "r", str(CHART), "--set", "operator.listenAddress=everywhere", check=False)
    assert failed.returncode != 0 and "listenAddress" in failed.stderr


def test_allowed_sweeper_images_reach_the_operator_as_its_env(helm, monkeypatch):
    from stalledpolicy.cli import build_parser
    from stalledpolicy.controller.cli import config_from_args
    from stalledpolicy.controller.config import OperatorConfig

    [default] = by_kind(helm.template(), "Deployment")
    # only the sweeper image
    assert [e["name"] for e in default["spec"]["template"]["spec"]["containers"][0]["env"]] == ["POD_NAME"]

    [deployment] = by_kind(helm.template("--set", "sweeperAllowedImages={registry.example/team/*,other:1}"),
                           "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env == {"STALLEDPOLICY_OPERATOR_ALLOWED_SWEEPER_IMAGES": "registry.example/team/*,other:1"}
    assert OperatorConfig.from_env(env).allowed_sweeper_images == ("registry.example/team/*", "other:1")
    # The operator's command line with that environment: the list, and the chart's sweeper image.
    for name in [k for k in os.environ if k.startswith("STALLEDPOLICY_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = config_from_args(build_parser().parse_args(container["args"]))
    assert config.allowed_sweeper_images == ("registry.example/team/*", "other:1")
    assert config.sweeper_image.startswith("ghcr.io/stalledpolicy/stalledpolicy-operator:")


def pod_monitor(objects, suffix):
    [monitor] = [m for m in by_kind(objects, "PodMonitor") if m["metadata"]["name"].endswith(suffix)]
    return monitor


def test_pod_monitor_selects_the_sweeper_pods_the_operator_builds(helm):
    monitor = pod_monitor(helm.template("--set", "podMonitor.enabled=true", *WITH_PODMONITOR_CRD), "-sweepers")
    spec = StalledPolicySpec.from_k8s({"queue": "q", "redis": {"url": "redis://r:6379/0"}})
    sweeper = build_sweeper_deployment("p", "ns", "uid", spec, image="i", scripts_digest="d")
    pod = sweeper["spec"]["template"]
    for key, value in monitor["spec"]["selector"]["matchLabels"].items():
        assert pod["metadata"]["labels"].get(key) == value, key
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == METRICS_PORT_NAME
    assert endpoint["port"] in [p["name"] for p in pod["spec"]["containers"][0]["ports"]]
    assert monitor["spec"]["namespaceSelector"] == {"any": True}


def test_pod_monitor_of_the_operator_selects_its_pod_and_metrics_port(helm):
    objects = helm.template("--set", "podMonitor.enabled=true", *WITH_PODMONITOR_CRD)
    monitor = pod_monitor(objects, "-operator")
    [deployment] = by_kind(objects, "Deployment")
    pod = deployment["spec"]["template"]
    for key, value in monitor["spec"]["selector"]["matchLabels"].items():
        assert pod["metadata"]["labels"].get(key) == value, key
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in [p["name"] for p in pod["spec"]["containers"][0]["ports"]]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [deployment["metadata"]["namespace"]]}
    # no metrics port: only the sweepers' PodMonitor
    off = helm.template("--set", "podMonitor.enabled=true", "--set", "operator.metricsPort=0",
                        *WITH_PODMONITOR_CRD)
    assert [m["metadata"]["name"] for m in by_kind(off, "PodMonitor")] == [
        pod_monitor(off, "-sweepers")["metadata"]["name"]]


PODMONITOR_REFUSAL = ("podMonitor.enabled=true needs the Prometheus Operator's PodMonitor CRD "
                      "(monitoring.coreos.com/v1), which this cluster does not serve: install the "
                      "Prometheus Operator CRDs first, or set podMonitor.enabled=false")


def test_pod_monitors_without_their_crd_fail_the_render_naming_the_value_and_the_fix(helm):
    """Not Helm's own "no matches for kind PodMonitor" at install time, after the CRD and
    the RBAC went in: a refusal before anything is applied, saying what to do."""
    refused = helm("template", "rel", str(CHART), "--set", "podMonitor.enabled=true", check=False)
    assert refused.returncode != 0
    assert PODMONITOR_REFUSAL in refused.stderr and "--api-versions" in refused.stderr, refused.stderr
    assert "no matches for kind" not in refused.stderr
    # the group's other versions are not enough: the chart writes monitoring.coreos.com/v1 PodMonitors
    other = helm("template", "rel", str(CHART), "--set", "podMonitor.enabled=true",
                 "--api-versions", "monitoring.coreos.com/v1alpha1/PodMonitor", check=False)
    assert other.returncode != 0 and PODMONITOR_REFUSAL in other.stderr
    served = helm.template("--set", "podMonitor.enabled=true", *WITH_PODMONITOR_CRD)
    assert len(by_kind(served, "PodMonitor")) == 2
    # off (the default), the CRD is not needed
    assert by_kind(helm.template(), "PodMonitor") == []


def test_a_scrape_timeout_longer_than_the_interval_fails_the_render_naming_both(helm):
    """The Prometheus Operator drops such a PodMonitor (its log only): nothing would
    be scraped. Compared as durations, whatever their units."""
    def render(interval, timeout):
        return helm("template", "rel", str(CHART), "--set", "podMonitor.enabled=true", *WITH_PODMONITOR_CRD,
                    "--set-string", f"podMonitor.interval={interval}",
                    "--set-string", f"podMonitor.scrapeTimeout={timeout}", check=False)

    for interval, timeout in [("30s", "45s"), ("1m", "1m1s"), ("500ms", "1s"), ("1h", "1h0m0s1ms")]:
        refused = render(interval, timeout)
        assert refused.returncode != 0, (interval, timeout)
        assert (f"podMonitor.scrapeTimeout ({timeout}) is longer than podMonitor.interval ({interval})"
                in refused.stderr), refused.stderr
        assert f"set podMonitor.scrapeTimeout to at most {interval}" in refused.stderr
    for interval, timeout in [("30s", "10s"), ("30s", "30s"), ("1m", "59s"), ("1m30s", "90s"), ("1w", "2d"),
                              ("0", "0"), ("1h", "59m59s999ms"),
                              # "0" is Prometheus's own default, unknown to the chart: not compared
                              ("0", "10s"), ("30s", "0")]:
        done = render(interval, timeout)
        assert done.returncode == 0, (interval, timeout, done.stderr)
        monitors = by_kind([d for d in yaml.safe_load_all(done.stdout) if d], "PodMonitor")
        assert [(e["interval"], e["scrapeTimeout"]) for m in monitors for e in m["spec"]["podMetricsEndpoints"]] \
            == [(interval, timeout)] * 2  # strings, "0" too


# --------------------------------------------------------------------------- against the API server

STUB_MONITORING_CRD = {
    # Only to let the API server accept a PodMonitor in a dry run: the real
    # prometheus-operator CRD is not part of this control plane.
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "podmonitors.monitoring.coreos.com"},
    "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
             "names": {"kind": "PodMonitor", "plural": "podmonitors", "singular": "podmonitor",
                       "listKind": "PodMonitorList"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def restricted_namespace(control_plane, name: str) -> None:
    control_plane.kubectl("create", "namespace", name)
    control_plane.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted",
                          "pod-security.kubernetes.io/warn=restricted")


def delete_namespaces(control_plane, *names: str) -> None:
    control_plane.kubectl("delete", "namespace", "--wait=false", "--ignore-not-found", *names, check=False)


def test_template_passes_a_server_side_dry_run(helm, control_plane):
    control_plane.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(STUB_MONITORING_CRD))
    wait_crd_established(control_plane.kubectl, "podmonitors.monitoring.coreos.com")
    release_ns, team_a, team_b = unique("chart-dry"), unique("team-a"), unique("team-b")
    for name in (release_ns, team_a, team_b):
        restricted_namespace(control_plane, name)
    try:
        for shape in ([], ["--set", f"watchNamespaces={{{team_a},{team_b}}}"]):
            rendered = helm("template", "rel", str(CHART), "--namespace", release_ns,
                            *EVERY_OPTION, *shape).stdout
            done = control_plane.kubectl("apply", "--server-side", "--dry-run=server",
                                         "--field-manager=chart-dry-run", "-f", "-", input=rendered,
                                         check=False)
            assert done.returncode == 0, done.stderr
            # PodSecurity warns about a Deployment whose pods a restricted namespace would refuse.
            assert "PodSecurity" not in done.stderr, done.stderr
            applied = [line for line in done.stdout.splitlines() if "(server dry run)" in line]
            assert len(applied) == len([d for d in yaml.safe_load_all(rendered) if d]), done.stdout
    finally:
        delete_namespaces(control_plane, release_ns, team_a, team_b)


def test_install_asks_the_cluster_whether_it_serves_pod_monitors(helm, control_plane):
    """helm install fills .Capabilities from the API server's discovery: the refusal
    comes while the CRD is missing, and a served CRD lets the same install through."""
    release_ns = unique("chart-pm")
    restricted_namespace(control_plane, release_ns)

    def dry_install():
        return helm("install", unique("pm"), str(CHART), "--namespace", release_ns, "--dry-run=server",
                    "--set", "crds.install=false", "--set", "podMonitor.enabled=true", check=False)

    try:
        control_plane.kubectl("delete", "crd", "podmonitors.monitoring.coreos.com", "--ignore-not-found",
                              "--wait=true", "--timeout=60s")
        refused = wait_for(lambda: (lambda done: done.returncode != 0 and done)(dry_install()),
                           "the install refused without the PodMonitor CRD")
        assert PODMONITOR_REFUSAL in refused.stderr, refused.stderr
        control_plane.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(STUB_MONITORING_CRD))
        wait_crd_established(control_plane.kubectl, "podmonitors.monitoring.coreos.com")
        served = wait_for(lambda: (lambda done: done.returncode == 0 and done)(dry_install()),
                          "the install accepted once the PodMonitor CRD is served")
        assert served.stdout.count("kind: PodMonitor") == 2
    finally:
        delete_namespaces(control_plane, release_ns)


CRD_NAME = "stalledpolicies.queues.emq.dev"
RELEASE_ANNOTATIONS = ("meta.helm.sh/release-name", "meta.helm.sh/release-namespace")
MANAGED_BY = "app.kubernetes.io/managed-by"


def test_a_second_release_installing_the_crd_is_told_to_set_crds_install_false(helm, control_plane):
    """The CRD belongs to another release: not Helm's own 'invalid ownership metadata'
    after the render, but a refusal naming the owner and crds.install=false. lookup
    sees the cluster in helm install --dry-run=server (helm template sees nothing)."""
    from tests.kube.operator_harness import apply_crd

    apply_crd(control_plane)
    meta = json.loads(control_plane.kubectl("get", "crd", CRD_NAME, "-o", "json").stdout)["metadata"]
    before, labels_before = meta.get("annotations") or {}, meta.get("labels") or {}
    release_ns, owner_ns = unique("chart-crd"), unique("chart-owner")
    restricted_namespace(control_plane, release_ns)

    def annotate(name, namespace):
        # what Helm writes on what it installs
        control_plane.kubectl("annotate", "--overwrite", "crd", CRD_NAME, f"meta.helm.sh/release-name={name}",
                              f"meta.helm.sh/release-namespace={namespace}")
        control_plane.kubectl("label", "--overwrite", "crd", CRD_NAME, f"{MANAGED_BY}=Helm")

    def dry_install(release, *values):
        return helm("install", release, str(CHART), "--namespace", release_ns, "--dry-run=server",
                    *values, check=False)

    try:
        annotate("team-a-operator", owner_ns)
        refused = dry_install("team-b-operator")
        assert refused.returncode != 0
        assert (f"crds.install=true, but the StalledPolicy CRD ({CRD_NAME}) belongs to Helm release "
                f"team-a-operator in namespace {owner_ns}") in refused.stderr, refused.stderr
        assert "--set crds.install=false" in refused.stderr and "invalid ownership metadata" not in refused.stderr
        # the same name in another namespace is another release
        annotate("team-b-operator", owner_ns)
        assert "belongs to Helm release team-b-operator" in dry_install("team-b-operator").stderr
        # the fix it names
        annotate("team-a-operator", owner_ns)
        fixed = dry_install("team-b-operator", "--set", "crds.install=false")
        assert fixed.returncode == 0, fixed.stderr
        assert "kind: CustomResourceDefinition" not in fixed.stdout
        # the owner itself (its upgrade), and a take-over asked for, render the CRD
        annotate("team-b-operator", release_ns)
        owned = dry_install("team-b-operator")
        assert owned.returncode == 0, owned.stderr
        assert owned.stdout.count("kind: CustomResourceDefinition") == 1
        annotate("team-a-operator", owner_ns)
        taken = dry_install("team-b-operator", "--take-ownership", "--set", "crds.takeOwnership=true")
        assert taken.returncode == 0, taken.stderr
        # helm template cannot look: no refusal there
        assert helm("template", "team-b-operator", str(CHART), "--namespace", release_ns,
                    check=False).returncode == 0
    finally:
        control_plane.kubectl("annotate", "--overwrite", "crd", CRD_NAME,
                              *[f"{key}={before[key]}" if key in before else f"{key}-" for key in RELEASE_ANNOTATIONS])
        control_plane.kubectl("label", "--overwrite", "crd", CRD_NAME, f"{MANAGED_BY}={labels_before[MANAGED_BY]}"
                              if MANAGED_BY in labels_before else f"{MANAGED_BY}-")
        delete_namespaces(control_plane, release_ns)


# --------------------------------------------------------------------------- installed for real


def can_i(control_plane, kubeconfig: Path, *args: str) -> bool:
    done = control_plane.kubectl("auth", "can-i", *args, kubeconfig=kubeconfig, check=False)
    return done.stdout.strip() == "yes"


def install(helm, control_plane, release: str, namespace: str, *values: str) -> None:
    restricted_namespace(control_plane, namespace)
    # Other kube tests apply the CRD with kubectl, and an earlier release of these tests
    # left it behind (crds.keep): Helm, and the chart, let this release take it over.
    helm("install", release, str(CHART), "--namespace", namespace, "--take-ownership",
         "--set", "crds.takeOwnership=true", "--set", f"sweeperImage={TEST_SWEEPER_IMAGE}", *values)


class ChartOperator:
    """The operator as the chart's Deployment runs it (its args, its ServiceAccount), here.

    Only the liveness and metrics ports move to free ones (their address stays the chart's);
    the identity is a TokenRequest token of the chart's ServiceAccount, so the API server
    applies the chart's RBAC.
    """

    def __init__(self, control_plane, release_ns: str, release: str, kubeconfig: Path,
                 log_path: Path) -> None:
        deployment = json.loads(control_plane.kubectl(
            "get", "deployment", f"{release}-stalledpolicy-operator", "-n", release_ns,
            "-o", "json").stdout)
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        self.metrics_port, self.liveness_port = free_port(), free_port()
        self.args = [self._liveness_on_a_free_port(a) if a.startswith("--liveness=")
                     else f"--metrics-port={self.metrics_port}" if a.startswith("--metrics-port=")
                     else a for a in args]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("STALLEDPOLICY_") and k != "KUBECONFIG"}
        # and the container's environment (sweeperAllowedImages)
        env.update({e["name"]: e["value"] for e in
                    deployment["spec"]["template"]["spec"]["containers"][0].get("env") or [] if "value" in e})
        self.log_path = log_path
        with open(log_path, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "stalledpolicy", *self.args, "--kubeconfig", str(kubeconfig)],
                env=env, stdout=out, stderr=subprocess.STDOUT)

    def _liveness_on_a_free_port(self, arg: str) -> str:
        from urllib.parse import urlsplit

        url = urlsplit(arg.removeprefix("--liveness="))
        host = url.netloc.rsplit(":", 1)[0]  # [::] keeps its brackets
        return f"--liveness={url.scheme}://{host}:{self.liveness_port}{url.path}"

    def probe_over_ipv4_and_ipv6(self) -> None:
        """The chart's default listen address (::) answers a probe of either family, as a
        kubelet's of the pod's IPv4 or IPv6 address (IPv6 where this host has a loopback)."""
        import urllib.request

        from tests.unit.test_listen import has_ipv6_loopback

        hosts = ["127.0.0.1"] + (["[::1]"] if has_ipv6_loopback() and socket.has_dualstack_ipv6() else [])
        for host in hosts:
            for port, path in ((self.liveness_port, "/healthz"), (self.metrics_port, "/metrics")):
                with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as answer:
                    assert answer.status == 200, (host, path)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
                return -9
        return self.process.returncode


def reconcile_end_to_end(control_plane, kube_api, namespace: str, redis_server, tmp_path: Path,
                         start_operator, refused_image: str | None = None) -> None:
    """A policy in ``namespace`` reconciled by the operator acting as the chart's ServiceAccount;
    with ``refused_image``, a second policy naming that image is refused (InvalidSpec)."""
    queue = unique("chartq")
    client = redis_server.client(decode_responses=True)
    mq = EchoMQ(client, queue)
    poison = mq.enqueue('{"poison":true}')
    claim = mq.claim(lease_ms=60_000, group_mode="flat")
    assert claim is not None and claim.id == poison
    mq.expire(claim)  # its worker died: the lease lapsed

    control_plane.kubectl("apply", "-n", namespace, "-f", "-",
                          input=json.dumps(redis_secret("redis", redis_server.url)))
    policy = {"apiVersion": "queues.emq.dev/v1alpha1", "kind": "StalledPolicy",
              "metadata": {"name": "chart"},
              "spec": {"queue": queue, "maxStalled": 1, "sweepInterval": "1s",
                       "redis": {"secretRef": {"name": "redis"}}}}
    operator, pods = start_operator(), None
    try:
        pods = PodRunnerThread(kube_api, namespace, tmp_path / "pods")
        control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(policy))
        done = control_plane.kubectl("wait", "-n", namespace, "--for=condition=Ready",
                                     "stalledpolicy/chart", "--timeout=90s", check=False)
        assert done.returncode == 0, done.stderr + operator.log()[-3000:]
        deployment = json.loads(control_plane.kubectl(
            "get", "deployment", sweeper_name("chart"), "-n", namespace, "-o", "json").stdout)
        assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == TEST_SWEEPER_IMAGE

        def dead_letters():
            current = json.loads(control_plane.kubectl(
                "get", "stalledpolicy", "chart", "-n", namespace, "-o", "json").stdout)
            return current.get("status", {}).get("deadLetters") == 1 and current

        current = wait_for(dead_letters, "the poison job in the policy's status", timeout=60)
        operator.probe_over_ipv4_and_ipv6()
        assert condition(current, "RedisReachable")["status"] == "True"
        assert client.zscore(QueueKeys(queue).dead, poison) is not None
        log = operator.log()
        # kopf reports missing permissions as warnings and carries on half-blind: none allowed.
        lowered = log.lower()
        assert "forbidden" not in lowered and "http 403" not in lowered, log[-3000:]
        assert "not enough permissions" not in lowered, log[-3000:]
        if refused_image:
            stolen = {**policy, "metadata": {"name": "stolen"},
                      "spec": {**policy["spec"], "queue": unique("stolenq"), "sweeper": {"image": refused_image}}}
            control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(stolen))

            def refused():
                current = json.loads(control_plane.kubectl(
                    "get", "stalledpolicy", "stolen", "-n", namespace, "-o", "json").stdout)
                ready = condition(current, "Ready") or {}
                return ready.get("reason") == "InvalidSpec" and ready

            ready = wait_for(refused, "the policy with a refused image: InvalidSpec", timeout=60)
            assert ready["status"] == "False" and f"spec.sweeper.image {refused_image!r}" in ready["message"]
            assert control_plane.kubectl("get", "deployment", sweeper_name("stolen"), "-n", namespace,
                                         check=False).returncode != 0
    finally:
        if pods is not None:
            pods.stop()
        code = operator.stop()
        client.close()
    assert code == 0, operator.log()[-3000:]


def test_installed_cluster_wide_the_chart_identity_reconciles_a_policy(
        helm, control_plane, kube_api, redis_server, tmp_path):
    release, release_ns, work_ns = "spo", unique("chart-cw"), unique("chart-work")
    install(helm, control_plane, release, release_ns)
    restricted_namespace(control_plane, work_ns)
    try:
        account = f"{release}-stalledpolicy-operator"
        # The operator's pod was admitted under the restricted Pod Security Standard.
        wait_for(lambda: control_plane.kubectl(
            "get", "pods", "-n", release_ns, "-l", "app.kubernetes.io/component=operator",
            "-o", "name").stdout.strip(), "the operator pod (restricted namespace)")
        kubeconfig = control_plane.kubeconfig_for_service_account(release_ns, account)
        assert can_i(control_plane, kubeconfig, "list", "deployments.apps", "--all-namespaces")
        assert not can_i(control_plane, kubeconfig, "list", "secrets", "-n", work_ns)
        assert not can_i(control_plane, kubeconfig, "delete", "deployments.apps", "-n", work_ns)
        operator = lambda: ChartOperator(control_plane, release_ns, release, kubeconfig,  # noqa: E731
                                         tmp_path / "operator.log")
        reconcile_end_to_end(control_plane, kube_api, work_ns, redis_server, tmp_path, operator)
    finally:
        helm("uninstall", release, "--namespace", release_ns, "--wait", check=False)
        # crds.keep (default): the CRD, and the policies with it, outlive the release.
        assert control_plane.kubectl("get", "crd", "stalledpolicies.queues.emq.dev",
                                     check=False).returncode == 0
        delete_namespaces(control_plane, release_ns, work_ns)


def test_installed_namespaced_the_chart_identity_reconciles_only_there(
        helm, control_plane, kube_api, redis_server, tmp_path):
    release, release_ns = "spn", unique("chart-ns")
    watched, other = unique("chart-watched"), unique("chart-other")
    restricted_namespace(control_plane, watched)
    restricted_namespace(control_plane, other)
    install(helm, control_plane, release, release_ns, "--set", f"watchNamespaces={{{watched}}}",
            "--set", "sweeperAllowedImages={registry.example/team/*}")
    try:
        kubeconfig = control_plane.kubeconfig_for_service_account(release_ns, f"{release}-stalledpolicy-operator")
        assert can_i(control_plane, kubeconfig, "patch", "deployments.apps", "-n", watched)
        assert not can_i(control_plane, kubeconfig, "list", "deployments.apps", "-n", other)
        assert not can_i(control_plane, kubeconfig, "get", "secrets", "-n", other)
        assert not can_i(control_plane, kubeconfig, "patch", "stalledpolicies.queues.emq.dev", "-n", other)
        operator = lambda: ChartOperator(control_plane, release_ns, release, kubeconfig,  # noqa: E731
                                         tmp_path / "operator.log")
        reconcile_end_to_end(control_plane, kube_api, watched, redis_server, tmp_path, operator,
                             refused_image="registry.example/teamx/steal:1")
    finally:
        helm("uninstall", release, "--namespace", release_ns, "--wait", check=False)
        delete_namespaces(control_plane, release_ns, watched, other)


def test_a_crd_no_release_owns_is_named_with_the_values_that_take_it_over(helm, control_plane):
    """A CRD applied with kubectl (the repository's crds/): Helm's own refusal
    ("invalid ownership metadata") named no value; the chart names them."""
    from tests.kube.operator_harness import apply_crd

    apply_crd(control_plane)
    release_ns = unique("chart-bare")
    restricted_namespace(control_plane, release_ns)
    try:
        # as kubectl apply leaves it (the owner of an earlier test's release is gone: not put
        # back, since a value written by kubectl annotate would conflict with Helm's next apply)
        control_plane.kubectl("annotate", "crd", CRD_NAME, *[f"{key}-" for key in RELEASE_ANNOTATIONS])
        refused = helm("install", "bare", str(CHART), "--namespace", release_ns, "--dry-run=server", check=False)
        assert refused.returncode != 0
        assert ("crds.install=true, but the StalledPolicy CRD (stalledpolicies.queues.emq.dev) exists and no Helm "
                "release owns it (applied with kubectl?)") in refused.stderr, refused.stderr
        assert "--set crds.takeOwnership=true and helm's --take-ownership" in refused.stderr
        assert "invalid ownership metadata" not in refused.stderr
        for fix in (["--take-ownership", "--set", "crds.takeOwnership=true"], ["--set", "crds.install=false"]):
            done = helm("install", "bare", str(CHART), "--namespace", release_ns, "--dry-run=server", *fix,
                        check=False)
            assert done.returncode == 0, (fix, done.stderr)
    finally:
        delete_namespaces(control_plane, release_ns)


def test_turning_crds_install_off_never_deletes_a_crd_installed_without_keep(helm, control_plane):
    """Helm deletes what a release no longer renders: with crds.keep=false, an
    upgrade to crds.install=false deleted the CRD, every policy and every
    sweeper. It is refused, naming crds.keep=true; after that, it goes through
    and the CRD stays."""
    release, release_ns = "spk", unique("chart-keep")
    install(helm, control_plane, release, release_ns, "--set", "crds.keep=false")
    try:
        annotations = json.loads(control_plane.kubectl("get", "crd", CRD_NAME, "-o", "json").stdout)[
            "metadata"].get("annotations") or {}
        assert "helm.sh/resource-policy" not in annotations
        refused = helm("upgrade", release, str(CHART), "--namespace", release_ns, "--reuse-values",
                       "--set", "crds.install=false", check=False)
        assert refused.returncode != 0
        assert (f"crds.install=false, but release {release} installed the StalledPolicy CRD without crds.keep: "
                "this upgrade would delete the CRD") in refused.stderr, refused.stderr
        assert control_plane.kubectl("get", "crd", CRD_NAME, check=False).returncode == 0
        # the fix it names, then the same upgrade
        helm("upgrade", release, str(CHART), "--namespace", release_ns, "--reuse-values", "--set", "crds.keep=true")
        helm("upgrade", release, str(CHART), "--namespace", release_ns, "--reuse-values", "--set", "crds.install=false")
        assert control_plane.kubectl("get", "crd", CRD_NAME, check=False).returncode == 0
    finally:
        if helm("get", "values", release, "--namespace", release_ns, "--all", check=False).stdout.count(
                "keep: false"):
            helm("upgrade", release, str(CHART), "--namespace", release_ns, "--reuse-values",
                 "--set", "crds.keep=true", check=False)  # never uninstall with the CRD unprotected
        helm("uninstall", release, "--namespace", release_ns, "--wait", check=False)
        delete_namespaces(control_plane, release_ns)
    assert control_plane.kubectl("get", "crd", CRD_NAME, check=False).returncode == 0


# Each of these installed "successfully" (or stopped half-way with Helm's own message) and left an
# operator that never ran: lookup now refuses them before anything is applied.

def refused_install(helm, control_plane, release: str, namespace: str, *values: str,
                    create_namespace: bool = False) -> str:
    """A real ``helm install`` that must fail at the render: its stderr, after checking that
    nothing of the release was applied, nor recorded as a (failed) release."""
    done = helm("install", release, str(CHART), "--namespace", namespace, "--set", "crds.install=false",
                *(["--create-namespace"] if create_namespace else []), *values, check=False)
    assert done.returncode != 0, f"helm install accepted {values}:\n{done.stdout[:500]}"
    assert "execution error at" in done.stderr, done.stderr  # the chart's own fail, at the render
    instance = f"app.kubernetes.io/instance={release}"
    left = control_plane.kubectl("get", "clusterroles,clusterrolebindings,deployments,serviceaccounts,roles,"
                                 "rolebindings", "--all-namespaces", "-l", instance, "-o", "name").stdout
    assert left.strip() == "", left
    status = helm("status", release, "--namespace", namespace, check=False)
    assert status.returncode != 0 and "not found" in status.stderr, status.stdout
    return done.stderr


def renders_without_a_cluster(helm, release_ns: str, *values: str) -> dict:
    """helm template (and a client-side dry run) cannot look: no refusal there. The Deployment."""
    [deployment] = by_kind(helm.template(*values, namespace=release_ns), "Deployment")
    client = helm("install", "dry", str(CHART), "--namespace", release_ns, "--dry-run=client", *values)
    assert "kind: Deployment" in client.stdout
    return deployment


def operator_pod(control_plane, namespace: str) -> dict:
    """The operator's pod, once its ReplicaSet created it (no kubelet here: created is all)."""
    def pod():
        pods = json.loads(control_plane.kubectl("get", "pods", "-n", namespace, "-l",
                                                "app.kubernetes.io/component=operator", "-o", "json").stdout)
        return pods["items"] and pods["items"][0]

    return wait_for(pod, f"the operator pod in {namespace}")


def test_install_refuses_watched_namespaces_that_do_not_exist_before_applying_anything(helm, control_plane):
    release, release_ns = unique("spw"), unique("chart-wn")
    there, missing_a, missing_b = unique("chart-there"), unique("chart-missing-a"), unique("chart-missing-b")
    restricted_namespace(control_plane, there)
    # the release namespace is in the list, and helm's --create-namespace creates it after the
    # render: it is not reported missing
    watch = ["--set", f"watchNamespaces={{{release_ns},{there},{missing_a},{missing_b}}}"]
    try:
        stderr = refused_install(helm, control_plane, release, release_ns, *watch, create_namespace=True)
        assert (f"watchNamespaces names namespaces {missing_a}, {missing_b}, which do not exist: the chart "
                "creates the operator's Role and RoleBinding in each watched namespace. Create them first "
                "(kubectl create namespace NAME, for each), or remove them from watchNamespaces.") in stderr, stderr
        assert "not found" not in stderr, stderr  # not Helm's 'namespaces "..." not found', half-way
        assert control_plane.kubectl("get", "namespace", release_ns, check=False).returncode != 0
        one = refused_install(helm, control_plane, release, there, "--set", f"watchNamespaces={{{missing_a}}}")
        assert (f"watchNamespaces names namespace {missing_a}, which does not exist: the chart creates the "
                f"operator's Role and RoleBinding in each watched namespace. Create it first (kubectl create "
                f"namespace {missing_a}), or remove it from watchNamespaces.") in one, one
        # rbac.create=false: no Roles to create (kopf serves a watched namespace once it exists)
        no_rbac = helm("install", release, str(CHART), "--namespace", there, "--dry-run=server",
                       "--set", "crds.install=false", "--set", "rbac.create=false",
                       "--set", f"watchNamespaces={{{missing_a}}}", check=False)
        assert no_rbac.returncode == 0, no_rbac.stderr

        deployment = renders_without_a_cluster(helm, release_ns, *watch)
        assert f"--namespace={missing_b}" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]

        # the fix the message names: the same install goes through
        for name in (missing_a, missing_b):
            restricted_namespace(control_plane, name)
        helm("install", release, str(CHART), "--namespace", release_ns, "--create-namespace",
             "--set", "crds.install=false", *watch)
        for name in (release_ns, there, missing_a, missing_b):
            assert control_plane.kubectl("get", "role", f"{release}-stalledpolicy-operator", "-n", name,
                                         check=False).returncode == 0, name
        operator_pod(control_plane, release_ns)
    finally:
        helm("uninstall", release, "--namespace", release_ns, "--wait", check=False)
        delete_namespaces(control_plane, release_ns, there, missing_a, missing_b)


def test_install_refuses_a_service_account_that_does_not_exist_before_applying_anything(helm, control_plane):
    release, release_ns, account = unique("spa"), unique("chart-sa"), unique("operator")
    restricted_namespace(control_plane, release_ns)
    values = ["--set", "serviceAccount.create=false", "--set", f"serviceAccount.name={account}"]
    try:
        stderr = refused_install(helm, control_plane, release, release_ns, *values)
        assert (f"serviceAccount.create=false, but ServiceAccount {account} does not exist in namespace "
                f"{release_ns}: the operator's pod would never be created. Create it first (kubectl create "
                f"serviceaccount {account} -n {release_ns}), or set serviceAccount.name to an existing one, "
                "or serviceAccount.create=true to have the chart create it.") in stderr, stderr

        deployment = renders_without_a_cluster(helm, release_ns, *values)
        assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account

        control_plane.kubectl("create", "serviceaccount", account, "-n", release_ns)
        helm("install", release, str(CHART), "--namespace", release_ns, "--set", "crds.install=false", *values)
        assert operator_pod(control_plane, release_ns)["spec"]["serviceAccountName"] == account
        # the chart made no ServiceAccount of its own, and bound its RBAC to this one
        assert control_plane.kubectl("get", "serviceaccounts", "-n", release_ns, "-l",
                                     f"app.kubernetes.io/instance={release}", "-o", "name").stdout.strip() == ""
        binding = json.loads(control_plane.kubectl("get", "clusterrolebinding", f"{release}-stalledpolicy-operator",
                                                   "-o", "json").stdout)
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": release_ns}]
    finally:
        helm("uninstall", release, "--namespace", release_ns, "--wait", check=False)
        delete_namespaces(control_plane, release_ns)


def test_install_refuses_a_priority_class_that_does_not_exist_before_applying_anything(helm, control_plane):
    release, release_ns, priority = unique("spp"), unique("chart-pc"), unique("chart-priority")
    restricted_namespace(control_plane, release_ns)
    values = ["--set", f"priorityClassName={priority}"]
    try:
        stderr = refused_install(helm, control_plane, release, release_ns, *values)
        assert (f"priorityClassName={priority}, but PriorityClass {priority} does not exist: the operator's pod "
                "would never be created. Create it first (kubectl get priorityclasses lists those there are), "
                'or set priorityClassName to an existing one, or to "" (none).') in stderr, stderr
        # upgrades are asked the same
        helm("install", release, str(CHART), "--namespace", release_ns, "--set", "crds.install=false")
        upgrade = helm("upgrade", release, str(CHART), "--namespace", release_ns, "--reuse-values", *values,
                       check=False)
        assert upgrade.returncode != 0 and f"PriorityClass {priority} does not exist" in upgrade.stderr
        helm("uninstall", release, "--namespace", release_ns, "--wait")

        deployment = renders_without_a_cluster(helm, release_ns, *values)
        assert deployment["spec"]["template"]["spec"]["priorityClassName"] == priority

        control_plane.kubectl("create", "priorityclass", priority, "--value=1000")
        helm("install", release, str(CHART), "--namespace", release_ns, "--set", "crds.install=false", *values)
        pod = operator_pod(control_plane, release_ns)
        assert (pod["spec"]["priorityClassName"], pod["spec"]["priority"]) == (priority, 1000)
    finally:
        helm("uninstall", release, "--namespace", release_ns, "--wait", check=False)
        control_plane.kubectl("delete", "priorityclass", priority, "--ignore-not-found", check=False)
        delete_namespaces(control_plane, release_ns)


def test_check_references_false_lets_an_installer_who_cannot_read_them_install(helm, control_plane, tmp_path):
    """A namespace's admin (no CRD, no cluster RBAC of the chart's) may name a PriorityClass it
    cannot read: the lookup is forbidden, which fails the render; checkReferences=false skips it."""
    release_ns, priority = unique("chart-tenant"), unique("chart-priority")
    restricted_namespace(control_plane, release_ns)
    control_plane.kubectl("create", "priorityclass", priority, "--value=10")
    control_plane.kubectl("create", "serviceaccount", "installer", "-n", release_ns)
    control_plane.kubectl("create", "serviceaccount", "operator", "-n", release_ns)
    control_plane.kubectl("create", "rolebinding", "installer-admin", "-n", release_ns, "--clusterrole=admin",
                          f"--serviceaccount={release_ns}:installer")
    tenant = Helm(control_plane, tmp_path / "tenant-helm")
    tenant.env["KUBECONFIG"] = str(control_plane.kubeconfig_for_service_account(release_ns, "installer"))
    values = ["--set", "crds.install=false", "--set", "rbac.create=false", "--set", "serviceAccount.create=false",
              "--set", "serviceAccount.name=operator", "--set", f"priorityClassName={priority}"]

    def dry_install(*more):
        return tenant("install", unique("spt"), str(CHART), "--namespace", release_ns, "--dry-run=server",
                      *values, *more, check=False)

    try:
        forbidden = dry_install()
        assert forbidden.returncode != 0 and "forbidden" in forbidden.stderr, forbidden.stderr
        assert 'cannot get resource "priorityclasses"' in forbidden.stderr, forbidden.stderr
        unchecked = dry_install("--set", "checkReferences=false")
        assert unchecked.returncode == 0, unchecked.stderr
        assert f"priorityClassName: {json.dumps(priority)}" in unchecked.stdout
        # the ServiceAccount check alone needs no more than a namespace's admin has
        no_priority = dry_install("--set", "priorityClassName=")
        assert no_priority.returncode == 0, no_priority.stderr
        missing = dry_install("--set", "priorityClassName=", "--set", "serviceAccount.name=nobody")
        assert "ServiceAccount nobody does not exist" in missing.stderr, missing.stderr
    finally:
        control_plane.kubectl("delete", "priorityclass", priority, "--ignore-not-found", check=False)
        delete_namespaces(control_plane, release_ns)

def test_upgrade_from_cluster_wide_to_namespaced_swaps_the_rbac(helm, control_plane):
    release, release_ns, team = "spu", unique("chart-up"), unique("chart-team")
    restricted_namespace(control_plane, team)
    install(helm, control_plane, release, release_ns)
    fullname = f"{release}-stalledpolicy-operator"
    try:
        assert control_plane.kubectl("get", "clusterrole", fullname, check=False).returncode == 0
        helm("upgrade", release, str(CHART), "--namespace", release_ns, "--reuse-values",
             "--set", f"watchNamespaces={{{team}}}")
        assert control_plane.kubectl("get", "clusterrole", fullname, check=False).returncode != 0
        assert control_plane.kubectl("get", "clusterrole", f"{fullname}-discovery", check=False).returncode == 0
        assert control_plane.kubectl("get", "role", fullname, "-n", team, check=False).returncode == 0
        args = json.loads(control_plane.kubectl("get", "deployment", fullname, "-n", release_ns, "-o",
                                                "json").stdout)["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--namespace={team}" in args and "--all-namespaces" not in args
        crd = json.loads(control_plane.kubectl("get", "crd", "stalledpolicies.queues.emq.dev", "-o", "json").stdout)
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == release
    finally:
        helm("uninstall", release, "--namespace", release_ns, "--wait", check=False)
        delete_namespaces(control_plane, release_ns, team)
