"""`stalledpolicy operator --namespace NS` acts on NS only (no other operator runs
in this module: the all-namespaces one of test_operator.py is torn down with it)."""

from __future__ import annotations

import time

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.kube.operator_harness import (OperatorProcess, apply_crd, operator_kubeconfig,
                                         policy_manifest, wait_for)

pytestmark = [pytest.mark.kube]

GROUP, VERSION, PLURAL = "queues.emq.dev", "v1alpha1", "stalledpolicies"


def read_deployment(apps, namespace, name):
    try:
        return apps.read_namespaced_deployment(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def create_policy(custom, namespace, manifest):
    return custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)


def test_namespace_flag_limits_what_the_operator_watches(control_plane, kube_api, tmp_path,
                                                         kube_namespace, queue_name):
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    custom = client.CustomObjectsApi(kube_api)
    apply_crd(control_plane)
    other = f"{kube_namespace}-other"
    core.create_namespace({"metadata": {"name": other}})
    try:
        scoped = OperatorProcess(operator_kubeconfig(control_plane, kube_api), tmp_path / "scoped.log",
                                 "--namespace", other)
        try:
            create_policy(custom, other, policy_manifest("mine", queue_name))
            create_policy(custom, kube_namespace, policy_manifest("notmine", queue_name))
            wait_for(lambda: read_deployment(apps, other, "mine-sweeper"), "the sweeper in the watched namespace")
            time.sleep(3)
            assert read_deployment(apps, kube_namespace, "notmine-sweeper") is None
        finally:
            assert scoped.stop() == 0, scoped.log()[-2000:]
    finally:
        core.delete_namespace(other)
