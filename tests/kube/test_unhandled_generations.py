"""On the real API server: an edit of the policy back to the spec kopf last handled,
after its handler applied a newer generation, reaches the sweeper Deployment.

kopf's part is played by the test (its update handler is ``reconcile`` with the
body kopf was called with; for an edit whose spec equals the one it recorded as
handled it calls none), so the order of events is the one of the bug, every run.
The status write's answer, the server-side applies and the generations are the
API server's own."""

from __future__ import annotations

import pytest
from kubernetes import client

from stalledpolicy.controller.config import OperatorConfig
from stalledpolicy.controller.reconcile import reconcile
from stalledpolicy.controller.wiring import build_controller
from stalledpolicy.policy.builder import POLICY_GENERATION_ANNOTATION
from stalledpolicy.policy.crd import API_VERSION, GROUP, KIND, PLURAL, VERSION
from tests.kube.operator_harness import apply_crd, events_for, read_deployment

pytestmark = pytest.mark.kube


def max_stalled_of(deployment) -> str:
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return next(item["value"] for item in container["env"] if item["name"] == "STALLEDPOLICY_MAX_STALLED")


def test_an_edit_back_to_the_spec_kopf_last_handled_reaches_the_sweeper(control_plane, kube_api, kube_namespace,
                                                                         redis_server):
    apply_crd(control_plane)
    custom = client.CustomObjectsApi(kube_api)
    apps = client.AppsV1Api(kube_api)
    key = (kube_namespace, "p")

    def sweeper() -> dict:
        return kube_api.sanitize_for_serialization(read_deployment(apps, kube_namespace, "p-sweeper"))

    def edit(max_stalled: int) -> dict:
        return custom.patch_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "p",
                                                     {"spec": {"maxStalled": max_stalled}})

    ctl = build_controller(OperatorConfig(sweeper_image="stalledpolicy:test"), api_client=kube_api)
    try:
        first = custom.create_namespaced_custom_object(
            GROUP, VERSION, kube_namespace, PLURAL,
            {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "p"},
             "spec": {"queue": "emails", "maxStalled": 1, "redis": {"url": redis_server.url}}})
        ctl.observe_policy(first, "ADDED")
        reconcile(ctl, first)  # kopf's create handler
        second, third = edit(2), edit(3)
        assert third["metadata"]["generation"] == 3
        ctl.sync(key)  # its status write answers with generation 3
        reconcile(ctl, second)  # kopf's handler for generation 2
        assert max_stalled_of(sweeper()) == "3"

        fourth = edit(2)  # generation 2's spec: kopf calls no handler
        ctl.observe_policy(fourth, "MODIFIED")
        for _ in range(3):
            ctl.sync(key)

        applied = sweeper()
        assert max_stalled_of(applied) == "2", "the sweeper runs the policy's current maxStalled"
        assert applied["metadata"]["annotations"][POLICY_GENERATION_ANNOTATION] == "4"
        policy = custom.get_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "p")
        assert policy["status"]["observedGeneration"] == 4
        told = sorted(e.message for e in events_for(kube_api, kube_namespace, "p") if e.reason == "BudgetChanged")
        assert told == ["maxStalled 1 -> 3", "maxStalled 3 -> 2"]
    finally:
        ctl.stop()
