"""Operators started and stopped by the tests themselves: `--namespace` scoping, and
a restart (resume) that neither rewrites the sweepers nor replays a served token.
No other operator runs meanwhile: the module-scoped one of test_operator.py is gone."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from stalledpolicy.keyspace import QueueKeys
from tests.kube.operator_harness import (
    OperatorProcess,
    apply_crd,
    operator_kubeconfig,
    policy_manifest,
    read_deployment,
    redis_secret,
    resumed,
    wait_for,
)

pytestmark = [pytest.mark.kube, pytest.mark.redis]

GROUP, VERSION, PLURAL = "queues.emq.dev", "v1alpha1", "stalledpolicies"


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
        # Without NAMESPACE_RULES (rbac.create=false, only the per-namespace rules granted):
        # kopf falls back to the names it was given, after ~1 minute of refused lists.
        scoped = OperatorProcess(operator_kubeconfig(control_plane, kube_api), tmp_path / "scoped.log",
                                 "--namespace", other)
        try:
            create_policy(custom, other, policy_manifest("mine", queue_name))
            create_policy(custom, kube_namespace, policy_manifest("notmine", queue_name))
            wait_for(lambda: read_deployment(apps, other, "mine-sweeper"), "the sweeper in the watched namespace",
                     timeout=120)
            assert "Not enough permissions to list namespaces" in scoped.log()  # the fallback was the way in
            time.sleep(3)
            assert read_deployment(apps, kube_namespace, "notmine-sweeper") is None
        finally:
            assert scoped.stop() == 0, scoped.log()[-2000:]
    finally:
        core.delete_namespace(other)


def ours(deployment):
    return [(m.operation, m.time, m.fields_v1) for m in deployment.metadata.managed_fields
            if m.manager == "stalledpolicy-operator"]


def dead_letter(r, queue, job_id):
    keys = QueueKeys(queue)
    r.hset(keys.job(job_id), mapping={"state": "dead", "attempts": "1", "payload": "{}", "stalled": "1"})
    r.zadd(keys.dead, {job_id: 0})


def test_restart_resumes_without_rewriting_or_replaying_again(control_plane, kube_api, tmp_path, kube_namespace,
                                                              redis_server, r, queue_name):
    ns = kube_namespace
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    custom = client.CustomObjectsApi(kube_api)
    apply_crd(control_plane)
    kubeconfig = operator_kubeconfig(control_plane, kube_api)
    core.create_namespaced_secret(ns, redis_secret("redis", redis_server.url))
    dead_letter(r, queue_name, "JOB0001")

    first = OperatorProcess(kubeconfig, tmp_path / "first.log", "--all-namespaces")
    try:
        create_policy(custom, ns, policy_manifest("kept", queue_name,
                                                  annotations={"queues.emq.dev/replay": "once"}))
        wait_for(lambda: ((custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "kept").get("status")
                           or {}).get("lastReplay") or {}).get("token") == "once", "the replay to be recorded")
        assert r.zscore(QueueKeys(queue_name).dead, "JOB0001") is None
    finally:
        assert first.stop() == 0, first.log()[-2000:]

    before = read_deployment(apps, ns, "kept-sweeper")
    dead_letter(r, queue_name, "JOB0002")
    # Another queue: a second policy of "kept"'s queue and Redis would be QueueClaimed.
    create_policy(custom, ns, policy_manifest("while-down", f"{queue_name}-b"))

    second = OperatorProcess(kubeconfig, tmp_path / "second.log", "--all-namespaces")
    try:
        wait_for(lambda: read_deployment(apps, ns, "while-down-sweeper"), "the policy made while down")
        # "kept"'s resume and a status refresh of this process (JOB0002 dead-lettered
        # while down), then several more refreshes: what they could redo, they have
        wait_for(lambda: resumed(second, ns, "kept"), "the resume of kept")
        wait_for(lambda: (custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "kept").get("status")
                          or {}).get("deadLetters") == 1, "kept's status read by the restarted operator")
        time.sleep(3)
        after = read_deployment(apps, ns, "kept-sweeper")
        assert after.metadata.generation == before.metadata.generation
        # Our apply on resume was a no-op: our managed-fields entry was not touched.
        assert ours(after) == ours(before)
        assert r.zscore(QueueKeys(queue_name).dead, "JOB0002") is not None, "the served token replayed again"
        status = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "kept")["status"]
        assert status["lastReplay"]["token"] == "once" and status["deadLetters"] == 1
    finally:
        assert second.stop() == 0, second.log()[-2000:]
