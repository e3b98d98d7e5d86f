"""The status loop's writes on the real API server: a write for a policy that was
deleted never lands on a policy created since under its name."""

from __future__ import annotations

import pytest
from kubernetes import client

from stalledpolicy.controller.config import OperatorConfig
from stalledpolicy.controller.status import ReconcileOutcome, condition_of
from stalledpolicy.controller.wiring import build_controller
from stalledpolicy.policy.crd import API_VERSION, GROUP, KIND, PLURAL, VERSION
from tests.kube.operator_harness import apply_crd

pytestmark = pytest.mark.kube


def manifest(redis_url: str) -> dict:
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "p"},
            "spec": {"queue": "emails", "redis": {"url": redis_url}}}


def test_a_status_write_for_a_deleted_policy_never_lands_on_its_successor(control_plane, kube_api,
                                                                          kube_namespace, redis_server):
    apply_crd(control_plane)
    custom = client.CustomObjectsApi(kube_api)
    ctl = build_controller(OperatorConfig(), api_client=kube_api)
    try:
        first = custom.create_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL,
                                                       manifest(redis_server.url))
        ctl.observe_policy(first, "ADDED")
        ctl.record_outcome(first, ReconcileOutcome(1, True, "Applied", "applied"))
        # Deleted and created again before the operator hears of it: its status
        # worker is still at work on the first policy.
        custom.delete_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "p")
        second = custom.create_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL,
                                                        manifest(redis_server.url))
        ctl.sync((kube_namespace, "p"))

        stored = custom.get_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "p")
        assert stored["metadata"]["uid"] == second["metadata"]["uid"]
        assert not stored.get("status"), "the deleted policy's status landed on its successor"
        assert (kube_namespace, "p") not in ctl.policies  # the deleted policy is forgotten

        # The successor's own writes go through: its status created whole, then patched.
        key = (kube_namespace, "p")
        ctl.observe_policy(second, "ADDED")
        ctl.record_outcome(second, ReconcileOutcome(1, True, "Applied", "applied"))
        ctl.sync(key)
        seen = custom.get_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "p")
        assert condition_of(seen["status"], "RedisReachable")["status"] == "True"
        ctl.observe_policy(seen, "MODIFIED")
        ctl.record_outcome(seen, ReconcileOutcome(1, False, "ApplyFailed", "refused"))
        ctl.sync(key)
        seen = custom.get_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "p")
        assert condition_of(seen["status"], "Ready")["reason"] == "ApplyFailed"
        assert condition_of(seen["status"], "RedisReachable")["status"] == "True"

        # Its status removed behind the operator's back (no watch event here): the
        # patch of its members is refused, the status read back, then written whole.
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, kube_namespace, PLURAL, "p",
                                                     {"status": None})
        ctl.record_outcome(seen, ReconcileOutcome(1, True, "Applied", "applied"))
        ctl.sync(key)
        assert not custom.get_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "p").get("status")
        ctl.sync(key)
        status = custom.get_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "p")["status"]
        assert condition_of(status, "Ready")["reason"] == "DeploymentMissing"
        assert status["observedGeneration"] == 1 and status["sweeperDeployment"] == "p-sweeper"
    finally:
        ctl.stop()


def test_another_redis_drops_the_old_figures_from_the_stored_status(control_plane, kube_api, kube_namespace,
                                                                    redis_server):
    """spec.redis.url changed to a Redis that does not answer: the figures read from
    the old Redis are removed from the stored status (JSON patch ``remove``), not
    shown for the new generation (before: DEAD 1 stayed)."""
    import redis

    from stalledpolicy.keyspace import QueueKeys

    apply_crd(control_plane)
    custom = client.CustomObjectsApi(kube_api)
    r = redis.Redis.from_url(redis_server.url)
    r.zadd(QueueKeys("emails").dead, {"job-1": 1})
    ctl = build_controller(OperatorConfig(), api_client=kube_api)
    key = (kube_namespace, "p")
    try:
        first = custom.create_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL,
                                                       manifest(redis_server.url))
        ctl.observe_policy(first, "ADDED")
        ctl.record_outcome(first, ReconcileOutcome(1, True, "Applied", "applied"))
        ctl.sync(key)
        seen = custom.get_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "p")
        assert seen["status"]["deadLetters"] == 1

        edited = custom.patch_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "p",
                                                       {"spec": {"redis": {"url": "redis://127.0.0.1:1/0"}}})
        ctl.observe_policy(edited, "MODIFIED")
        ctl.record_outcome(edited, ReconcileOutcome(2, True, "Applied", "applied"))
        ctl.sync(key)
        status = custom.get_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "p")["status"]
        assert status["observedGeneration"] == 2
        assert condition_of(status, "RedisReachable")["reason"] == "RedisUnreachable"
        assert not {"deadLetters", "pending", "active", "recoveredTotal", "lanes"} & set(status), status
        printed = control_plane.kubectl("-n", kube_namespace, "get", "stalledpolicy", "p").stdout
        assert printed.splitlines()[1].split()[4] != "1", printed  # the DEAD column
    finally:
        ctl.stop()
        r.delete(QueueKeys("emails").dead)
