"""Two policies of one queue on one Redis, on the real control plane: the older
keeps the queue, the newer is QueueClaimed (Ready=False, a Warning event, no
sweeper Deployment) and takes the queue over once the older is deleted."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from tests.kube.operator_harness import (
    OperatorProcess,
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


def apis(control_plane, kube_api):
    """The CRD applied; the core, apps and custom objects clients."""
    apply_crd(control_plane)
    return client.CoreV1Api(kube_api), client.AppsV1Api(kube_api), client.CustomObjectsApi(kube_api)


def test_the_newer_policy_of_a_queue_gets_no_sweeper_until_the_older_goes(
        control_plane, kube_api, tmp_path, kube_namespace, redis_server, queue_name):
    ns = kube_namespace
    core, apps, custom = apis(control_plane, kube_api)
    kubeconfig = operator_kubeconfig(control_plane, kube_api, namespaced=True)
    core.create_namespaced_secret(ns, redis_secret("redis", redis_server.url))
    # The same server and database, spelt differently, in a Secret of its own.
    core.create_namespaced_secret(ns, redis_secret("redis-dup", f"redis://127.0.0.1:{redis_server.port}"))

    def policy(name):
        return custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)

    process = OperatorProcess(kubeconfig, tmp_path / "operator.log", "--namespace", ns)
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                               policy_manifest("emails", queue_name, max_stalled=3))
        wait_for(lambda: read_deployment(apps, ns, "emails-sweeper"), "the older policy's sweeper", timeout=90)
        time.sleep(1.1)  # creationTimestamp has seconds: the second policy is the newer
        custom.create_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL,
            policy_manifest("emails-dup", queue_name, secret="redis-dup", max_stalled=10))
        ready = wait_for(lambda: (lambda c: c if c and c["reason"] == "QueueClaimed" else None)(
            condition(policy("emails-dup"), "Ready")), "emails-dup Ready=False QueueClaimed")
        assert ready["status"] == "False" and f"{ns}/emails" in ready["message"], ready
        sweeper = condition(policy("emails-dup"), "SweeperAvailable")
        assert (sweeper["status"], sweeper["reason"]) == ("False", "QueueClaimed")
        warnings = wait_for(lambda: [e for e in events_for(kube_api, ns, "emails-dup")
                                     if e.reason == "QueueClaimed"], "a QueueClaimed event")
        assert warnings[0].type == "Warning"
        time.sleep(3)  # a few status refreshes: still no sweeper for it
        assert read_deployment(apps, ns, "emails-dup-sweeper") is None
        assert condition(policy("emails"), "Ready")["reason"] != "QueueClaimed"
        assert read_deployment(apps, ns, "emails-sweeper").spec.replicas == 1

        custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "emails")
        taken = wait_for(lambda: read_deployment(apps, ns, "emails-dup-sweeper"),
                         "the newer policy to take the queue over", timeout=60)
        assert taken.spec.replicas == 1
        env = {e.name: e.value for e in taken.spec.template.spec.containers[0].env if e.value is not None}
        assert "10" in env.values(), env  # its own budget
        wait_for(lambda: condition(policy("emails-dup"), "Ready")["reason"] != "QueueClaimed",
                 "Ready no longer QueueClaimed")
    finally:
        assert process.stop() == 0, process.log()[-3000:]


def test_one_redis_named_localhost_and_127_0_0_1_is_one_redis(
        control_plane, kube_api, tmp_path, kube_namespace, redis_server, queue_name):
    """The host names are resolved: localhost is 127.0.0.1 (same_redis_server.py)."""
    ns = kube_namespace
    core, apps, custom = apis(control_plane, kube_api)
    core.create_namespaced_secret(ns, redis_secret("by-ip", f"redis://127.0.0.1:{redis_server.port}/0"))
    core.create_namespaced_secret(ns, redis_secret("by-name", f"redis://localhost:{redis_server.port}/0"))
    kubeconfig = operator_kubeconfig(control_plane, kube_api, namespaced=True)
    process = OperatorProcess(kubeconfig, tmp_path / "operator.log", "--namespace", ns)
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                               policy_manifest("by-ip", queue_name, secret="by-ip"))
        wait_for(lambda: read_deployment(apps, ns, "by-ip-sweeper"), "the older policy's sweeper", timeout=90)
        time.sleep(1.1)  # creationTimestamp has seconds: the second policy is the newer
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                               policy_manifest("by-name", queue_name, secret="by-name"))
        ready = wait_for(lambda: (lambda c: c if c and c["reason"] == "QueueClaimed" else None)(condition(
            custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "by-name"), "Ready")),
            "by-name Ready=False QueueClaimed")
        assert ready["status"] == "False" and f"the older StalledPolicy {ns}/by-ip" in ready["message"], ready
        time.sleep(3)  # a few status refreshes: still no sweeper for it
        assert read_deployment(apps, ns, "by-name-sweeper") is None
    finally:
        assert process.stop() == 0, process.log()[-3000:]


def test_an_older_policy_whose_secret_is_misspelled_does_not_hold_the_queue(
        control_plane, kube_api, tmp_path, kube_namespace, redis_server, queue_name):
    """Its sweeper cannot start (no Secret, no URL): it held the queue for good, swept
    by no one, and the newer policy said only that the claim "cannot be told"."""
    ns = kube_namespace
    core, apps, custom = apis(control_plane, kube_api)
    core.create_namespaced_secret(ns, redis_secret("redis", redis_server.url))
    kubeconfig = operator_kubeconfig(control_plane, kube_api, namespaced=True)
    process = OperatorProcess(kubeconfig, tmp_path / "operator.log", "--namespace", ns)
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                               policy_manifest("typo", queue_name, secret="redis-typo"))
        wait_for(lambda: (lambda c: c if c and c["reason"] == "SecretNotFound" else None)(condition(
            custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "typo"), "Ready")),
            "the older policy's Ready=False SecretNotFound")
        time.sleep(1.1)  # creationTimestamp has seconds: the second policy is the newer
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                               policy_manifest("good", queue_name, secret="redis"))
        sweeper = wait_for(lambda: read_deployment(apps, ns, "good-sweeper"), "the newer policy's sweeper")
        assert sweeper.spec.replicas == 1
        time.sleep(3)  # a few status refreshes: it keeps the queue
        ready = condition(custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "good"), "Ready")
        assert ready is None or ready["reason"] != "QueueClaimed", ready
        assert read_deployment(apps, ns, "good-sweeper").spec.replicas == 1
    finally:
        assert process.stop() == 0, process.log()[-3000:]
