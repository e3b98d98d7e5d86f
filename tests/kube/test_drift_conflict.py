"""Another field manager fighting the operator over a sweeper's fields, on the real
control plane: a bounded number of reverts, then a DriftConflict on the policy's
status; both the revert budget and the conflict outlive an operator restart.
Operators started and stopped here, scoped to the test's namespace."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from stalledpolicy.controller.drift import DRIFT_MAX_REVERTS, DRIFT_REVERTS_ANNOTATION
from tests.kube.operator_harness import (
    OperatorProcess,
    apply_crd,
    condition,
    events_for,
    operator_kubeconfig,
    policy_manifest,
    read_deployment,
    redis_secret,
    resumed,
    wait_for,
)

pytestmark = [pytest.mark.kube, pytest.mark.redis]

GROUP, VERSION, PLURAL = "queues.emq.dev", "v1alpha1", "stalledpolicies"
RIVAL = "rival-operator"


def rival_scales_to_zero(apps, namespace, name):
    """A second controller's server-side apply, forced: it takes spec.replicas from us."""
    apps.patch_namespaced_deployment(
        name, namespace, {"apiVersion": "apps/v1", "kind": "Deployment",
                          "metadata": {"name": name, "namespace": namespace}, "spec": {"replicas": 0}},
        field_manager=RIVAL, force=True, _content_type="application/apply-patch+yaml")


def recorded_reverts(apps, namespace, name) -> int:
    value = (read_deployment(apps, namespace, name).metadata.annotations or {}).get(DRIFT_REVERTS_ANNOTATION)
    return len(value.split(",")) if value else 0


def reverted(apps, namespace, name, recorded: int):
    """The policy's one replica put back, and the revert recorded on the sweeper
    (``recorded`` reverts in all): the rival's next change comes after both."""
    wait_for(lambda: read_deployment(apps, namespace, name).spec.replicas == 1,
             "the operator to put the policy's one replica back", timeout=30)
    wait_for(lambda: recorded_reverts(apps, namespace, name) == recorded,
             f"{recorded} revert(s) recorded on the sweeper", timeout=30)


def left_alone(apps, namespace, name):
    time.sleep(3)
    assert read_deployment(apps, namespace, name).spec.replicas == 0, "reverted during a conflict"


def started(kubeconfig, log, namespace, apps, custom, queue, marker, *, resuming=()):
    """An operator process, once it watches (a policy created now got its sweeper) and
    has resumed the policies named in ``resuming``; stopped if it never gets there."""
    process = OperatorProcess(kubeconfig, log, "--namespace", namespace)
    try:
        # A queue of its own: a second policy of the fought one's queue and Redis would be QueueClaimed.
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                               policy_manifest(marker, f"{queue}-{marker}"))
        wait_for(lambda: read_deployment(apps, namespace, f"{marker}-sweeper"), f"the operator up ({marker})")
        for name in resuming:
            wait_for(lambda: resumed(process, namespace, name), f"the operator to resume {name} ({marker})")
    except BaseException:
        process.stop()
        raise
    return process


def prepared(control_plane, kube_api, namespace, redis_server):
    """The CRD, a namespaced operator's kubeconfig and the policies' Redis Secret."""
    apply_crd(control_plane)
    client.CoreV1Api(kube_api).create_namespaced_secret(namespace, redis_secret("redis", redis_server.url))
    kubeconfig = operator_kubeconfig(control_plane, kube_api, namespaced=True)
    return client.AppsV1Api(kube_api), client.CustomObjectsApi(kube_api), kubeconfig


def test_a_rival_field_manager_meets_a_bounded_budget_and_a_conflict_condition_across_restarts(
        control_plane, kube_api, tmp_path, kube_namespace, redis_server, queue_name):
    ns, name = kube_namespace, "fought-sweeper"
    apps, custom, kubeconfig = prepared(control_plane, kube_api, ns, redis_server)

    def policy():
        return custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "fought")

    first = started(kubeconfig, tmp_path / "first.log", ns, apps, custom, queue_name, "marker-1")
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, policy_manifest("fought", queue_name))
        wait_for(lambda: read_deployment(apps, ns, name), "the sweeper")
        wait_for(lambda: (policy().get("status") or {}).get("observedGeneration"), "a first status")
        for done in range(1, DRIFT_MAX_REVERTS):
            rival_scales_to_zero(apps, ns, name)
            reverted(apps, ns, name, recorded=done)
    finally:
        assert first.stop() == 0, first.log()[-2000:]

    # Restarted: the last revert of the budget, then the conflict (a fresh budget
    # in memory would have reverted this change too).
    second = started(kubeconfig, tmp_path / "second.log", ns, apps, custom, queue_name, "marker-2",
                     resuming=["fought"])
    try:
        rival_scales_to_zero(apps, ns, name)
        reverted(apps, ns, name, recorded=DRIFT_MAX_REVERTS)
        rival_scales_to_zero(apps, ns, name)
        in_sync = wait_for(lambda: (lambda c: c if c and c["status"] == "False" else None)(
            condition(policy(), "SweeperInSync")), "SweeperInSync=False")
        assert in_sync["reason"] == "DriftConflict" and repr(RIVAL) in in_sync["message"]
        ready = condition(policy(), "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "DriftConflict")
        left_alone(apps, ns, name)
        assert [e for e in events_for(kube_api, ns, "fought") if e.reason == "DriftConflict"]
        printed = control_plane.kubectl("-n", ns, "get", "stalledpolicy", "fought").stdout
        assert "False" in printed.splitlines()[1], printed  # READY column
    finally:
        assert second.stop() == 0, second.log()[-2000:]

    # Restarted during the conflict: it holds. kopf's resume handler applies nothing
    # while the status records the conflict (it would put the policy's spec back, a
    # revert counted nowhere), and the rival's next change stays too.
    third = started(kubeconfig, tmp_path / "third.log", ns, apps, custom, queue_name, "marker-3",
                    resuming=["fought"])
    try:
        wait_for(lambda: "is not applied at start" in third.log(), "the resume to hold the sweeper", timeout=30)
        left_alone(apps, ns, name)
        rival_scales_to_zero(apps, ns, name)
        left_alone(apps, ns, name)
        assert condition(policy(), "SweeperInSync")["reason"] == "DriftConflict"
        sweeper = wait_for(lambda: (lambda c: c if c and "stopped reverting" in c["message"] else None)(
            condition(policy(), "SweeperAvailable")), "SweeperAvailable to say reverts are stopped")
        assert "re-applies" not in sweeper["message"], sweeper

        # An edit of the policy applies it at once and ends the conflict: SweeperInSync
        # True, the revert budget refilled, Ready no longer DriftConflict, for the
        # new generation (before, the conflict stayed ~5 minutes after the edit).
        edited = custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "fought",
                                                       {"spec": {"maxStalled": 2}})
        generation = edited["metadata"]["generation"]
        in_sync = wait_for(lambda: (lambda c: c if c and c["status"] == "True" else None)(
            condition(policy(), "SweeperInSync")), "SweeperInSync=True after the edit", timeout=30)
        assert in_sync["reason"] == "InSync" and in_sync["observedGeneration"] == generation
        assert policy()["status"]["observedGeneration"] == generation
        assert condition(policy(), "Ready")["reason"] != "DriftConflict"
        assert read_deployment(apps, ns, name).spec.replicas == 1
        # the budget's record is cleared just after the apply, the condition may come first
        wait_for(lambda: recorded_reverts(apps, ns, name) == 0, "the recorded reverts cleared", timeout=30)
        rival_scales_to_zero(apps, ns, name)
        reverted(apps, ns, name, recorded=1)  # a fresh budget: reverted again
    finally:
        assert third.stop() == 0, third.log()[-2000:]


def test_a_change_made_while_no_operator_ran_is_reverted_and_counted_at_the_start(
        control_plane, kube_api, tmp_path, kube_namespace, redis_server, queue_name):
    """kopf's resume apply puts the replica back: a revert like any other, with its
    event and its record in the budget (it was counted nowhere)."""
    ns, name = kube_namespace, "downtime-sweeper"
    apps, custom, kubeconfig = prepared(control_plane, kube_api, ns, redis_server)

    first = started(kubeconfig, tmp_path / "first.log", ns, apps, custom, queue_name, "marker-1")
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, policy_manifest("downtime", queue_name))
        wait_for(lambda: (custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "downtime").get("status")
                          or {}).get("observedGeneration"), "a first status")
    finally:
        assert first.stop() == 0, first.log()[-2000:]

    rival_scales_to_zero(apps, ns, name)
    second = started(kubeconfig, tmp_path / "second.log", ns, apps, custom, queue_name, "marker-2",
                     resuming=["downtime"])
    try:
        reverted(apps, ns, name, recorded=1)
        told = wait_for(lambda: [e for e in events_for(kube_api, ns, "downtime") if e.reason == "DriftReverted"],
                        "the DriftReverted event")
        assert "while the operator was not running" in told[0].message
    finally:
        assert second.stop() == 0, second.log()[-2000:]
    # the marker policies' own starts (created by each process) were no reverts
    assert not [e for e in events_for(kube_api, ns, "marker-1") if e.reason == "DriftReverted"]
