"""An operator start on the real API server: the resume apply of a sweeper that is as
the operator left it is not made (no PATCH of the Deployment at all), and one that
someone changed while no operator ran is still put back and counted as a revert.
Each Controller here is a new operator process's memory, in this process, so that
its PATCH requests can be counted."""

from __future__ import annotations

import pytest
from kubernetes import client

from stalledpolicy.controller.apply_requests import ApplyRequest
from stalledpolicy.controller.config import OperatorConfig
from stalledpolicy.controller.wiring import build_controller
from stalledpolicy.policy.crd import API_VERSION, GROUP, KIND, PLURAL, VERSION
from tests.kube.operator_harness import apply_crd, events_for, read_deployment

pytestmark = [pytest.mark.kube, pytest.mark.redis]


def started(kube_api, namespace: str, name: str, *, resume: bool, requests: list[str] | None = None):
    """A new Controller that took kopf's request for the policy (its resume handler's
    at an operator start) and ran the policy's sync; and the PATCH requests it sent
    to Deployments, by path. ``requests``: gets every request to a Deployment, as
    "METHOD path"."""
    ctl = build_controller(OperatorConfig(sweeper_image="stalledpolicy:test"), api_client=kube_api)
    patches: list[str] = []
    api = ctl.apps.api_client
    call_api = api.call_api

    def counted(method, url, *args, **kwargs):
        if method == "PATCH" and "/deployments/" in url:
            patches.append(url)
        if requests is not None and "/deployments/" in url:
            requests.append(f"{method} {url}")
        return call_api(method, url, *args, **kwargs)

    api.call_api = counted
    body = ctl.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    ctl.observe_policy(body, "ADDED")
    why = "the operator started" if resume else "the policy was created"
    ctl.request_policy_apply(body, ApplyRequest(why, kind="policy-event", body=body,
                                                generation=body["metadata"]["generation"], resume=resume))
    ctl.sync((namespace, name))
    return ctl, patches


def test_a_restart_applies_nothing_unchanged_and_reverts_a_change_made_while_down(
        control_plane, kube_api, kube_namespace, redis_server, queue_name):
    ns = kube_namespace
    apply_crd(control_plane)
    apps, custom = client.AppsV1Api(kube_api), client.CustomObjectsApi(kube_api)
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, {
        "apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "p"},
        "spec": {"queue": queue_name, "redis": {"url": redis_server.url}}})

    first, patches = started(kube_api, ns, "p", resume=False)
    first.stop()
    assert len(patches) == 1, patches  # the apply that created the sweeper
    made = read_deployment(apps, ns, "p-sweeper")

    for _ in range(2):  # two restarts, nothing changed
        restarted, patches = started(kube_api, ns, "p", resume=True)
        restarted.stop()
        assert patches == [], "a resume apply that changes nothing was made"
        assert restarted.policies[(ns, "p")].outcome.ok
        assert restarted.policies[(ns, "p")].outcome.deployment_generation == made.metadata.generation
    assert read_deployment(apps, ns, "p-sweeper").metadata.generation == made.metadata.generation

    # While no operator runs, another field manager takes spec.replicas.
    apps.patch_namespaced_deployment(
        "p-sweeper", ns, {"apiVersion": "apps/v1", "kind": "Deployment",
                          "metadata": {"name": "p-sweeper", "namespace": ns}, "spec": {"replicas": 0}},
        field_manager="rival-operator", force=True, _content_type="application/apply-patch+yaml")
    restarted, patches = started(kube_api, ns, "p", resume=True)
    restarted.stop()
    assert patches, "the change made while down was not applied over"
    assert read_deployment(apps, ns, "p-sweeper").spec.replicas == 1
    assert restarted.metrics.value("stalledpolicy_operator_drift_reverts_total") == 1
    told = [e for e in events_for(kube_api, ns, "p") if e.reason == "DriftReverted"]
    assert len(told) == 1 and "while the operator was not running" in told[0].message

    again, patches = started(kube_api, ns, "p", resume=True)  # and the next start finds it in place
    again.stop()
    assert patches == [] and again.metrics.value("stalledpolicy_operator_drift_reverts_total") == 0


def test_a_first_apply_is_one_request_and_never_takes_over_a_deployment_of_that_name(
        control_plane, kube_api, kube_namespace, redis_server, queue_name):
    """A policy no apply has been recorded for: its sweeper is created by the apply
    alone, no read first. When a Deployment of that name exists (here one the
    operator did not make), that apply is refused and changes nothing; the
    Deployment is read and judged as before (NameConflict)."""
    ns = kube_namespace
    apply_crd(control_plane)
    apps, custom = client.AppsV1Api(kube_api), client.CustomObjectsApi(kube_api)
    for name in ("p", "clash"):
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, {
            "apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name},
            "spec": {"queue": f"{queue_name}-{name}", "redis": {"url": redis_server.url}}})

    requests: list[str] = []
    first, _ = started(kube_api, ns, "p", resume=False, requests=requests)
    first.stop()
    assert [r.split(" ")[0] for r in requests] == ["PATCH"], requests
    made = read_deployment(apps, ns, "p-sweeper")
    assert made.metadata.owner_references[0].name == "p" and made.spec.replicas == 1
    assert first.policies[(ns, "p")].outcome.ok

    labels = {"app": "theirs"}
    apps.create_namespaced_deployment(ns, {
        "metadata": {"name": "clash-sweeper", "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "app", "image": "theirs:1"}]}}}})
    before = read_deployment(apps, ns, "clash-sweeper")
    requests.clear()
    clash, _ = started(kube_api, ns, "clash", resume=False, requests=requests)
    clash.stop()
    assert [r.split(" ")[0] for r in requests] == ["PATCH", "GET"], requests
    assert clash.policies[(ns, "clash")].outcome.reason == "NameConflict"
    after = read_deployment(apps, ns, "clash-sweeper")
    # (Its status moves: the deployment controller works on it. Nothing else may.)
    assert after.metadata.generation == before.metadata.generation
    assert "stalledpolicy-operator" not in {m.manager for m in after.metadata.managed_fields}
    assert not after.metadata.owner_references
    assert after.spec.template.spec.containers[0].image == "theirs:1"
