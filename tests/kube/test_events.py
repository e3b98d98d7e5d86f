"""EventRecorder on the real API server, acting as the operator's ServiceAccount
(OPERATOR_RULES, the chart's rules): a repeat is counted on the same core/v1
Event (RBAC: events patch), and an Event deleted meanwhile is created anew."""

from __future__ import annotations

import logging

import pytest
from kubernetes import client

from stalledpolicy.controller.events import EventRecorder
from tests.kube.operator_harness import apply_crd, events_for, operator_kubeconfig, policy_manifest

pytestmark = [pytest.mark.kube]

GROUP, VERSION, PLURAL = "queues.emq.dev", "v1alpha1", "stalledpolicies"


@pytest.fixture
def recorder(control_plane, kube_api):
    """A recorder with the operator's identity: a missing RBAC verb fails the test."""
    api = control_plane.api_client(operator_kubeconfig(control_plane, kube_api))
    yield EventRecorder(client.CoreV1Api(api))
    api.close()


def test_two_identical_posts_leave_one_event_with_count_two(control_plane, kube_api, kube_namespace,
                                                          recorder, caplog):
    apply_crd(control_plane)
    policy = client.CustomObjectsApi(kube_api).create_namespaced_custom_object(
        GROUP, VERSION, kube_namespace, PLURAL, policy_manifest("evented", "q-events"))
    caplog.set_level(logging.WARNING, logger="stalledpolicy.controller.events")

    recorder.post(policy, "Warning", "RedisUnreachable", "cannot reach db:6379")
    recorder.post(policy, "Warning", "RedisUnreachable", "cannot reach db:6379")
    recorder.post(policy, "Warning", "RedisUnreachable", "cannot reach db:6380")

    listed = sorted(events_for(kube_api, kube_namespace, "evented"), key=lambda e: e.message)
    assert [(e.reason, e.message, e.count) for e in listed] == [
        ("RedisUnreachable", "cannot reach db:6379", 2),
        ("RedisUnreachable", "cannot reach db:6380", 1)]
    repeated = listed[0]
    assert repeated.involved_object.uid == policy["metadata"]["uid"]
    assert repeated.last_timestamp >= repeated.first_timestamp

    # Deleted (or expired) meanwhile: the patch gets a 404 and the Event is created anew.
    client.CoreV1Api(kube_api).delete_namespaced_event(repeated.metadata.name, kube_namespace)
    recorder.post(policy, "Warning", "RedisUnreachable", "cannot reach db:6379")
    again = [e for e in events_for(kube_api, kube_namespace, "evented") if e.message.endswith("6379")]
    assert [(e.count, e.metadata.name != repeated.metadata.name) for e in again] == [(1, True)]
    assert "could not post event" not in caplog.text  # a refusal (403) would only be logged
