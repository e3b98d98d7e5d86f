"""A policy deleted and created again from its own export, annotations kept (as
`kubectl get -o json`, Velero or a GitOps export keeps them), with the operator
running: it is reconciled as a new policy, not ignored because kopf's copied
last-handled configuration equals its spec (controller/kopf_storage.py). And the
upgrade: values the previous version wrote (no uid) resume as before, without a
creation or a write, while a copy made before the upgrade is handled as new.

Each test runs its own operator (no other runs meanwhile: module fixtures of
other files are torn down at their module's end)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.kube.operator_harness import (
    OperatorProcess,
    apply_crd,
    condition,
    operator_kubeconfig,
    policy_manifest,
    redis_secret,
    wait_for,
)

pytestmark = [pytest.mark.kube, pytest.mark.redis]

GROUP, VERSION, PLURAL = "queues.emq.dev", "v1alpha1", "stalledpolicies"
DIFFBASE = "operator.queues.emq.dev/last-handled-configuration"
UID_MARK = "operator.queues.emq.dev/handled-uid"
# What kubectl get shows and an export drops (the user's steps).
DROPPED = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation")


@pytest.fixture
def env(control_plane, kube_api, kube_namespace, redis_server):
    apply_crd(control_plane)
    client.CoreV1Api(kube_api).create_namespaced_secret(kube_namespace,
                                                        redis_secret("redis", redis_server.url))
    return operator_kubeconfig(control_plane, kube_api)


def kubectl_json(control_plane, *args) -> dict:
    return json.loads(control_plane.kubectl(*args, "-o", "json").stdout)


def get_policy(control_plane, ns, name, *, managed=False) -> dict:
    extra = ("--show-managed-fields",) if managed else ()
    return kubectl_json(control_plane, "get", "stp", name, "-n", ns, *extra)


def export(control_plane, ns, name, path: Path, *, keep_managed_fields: bool = False) -> Path:
    """`kubectl get stp NAME -o json`, uid/resourceVersion/creationTimestamp/
    managedFields/status stripped, annotations kept (managedFields too, as a
    backup tool may keep them, with ``keep_managed_fields``)."""
    body = get_policy(control_plane, ns, name, managed=keep_managed_fields)
    for key in DROPPED:
        if not (keep_managed_fields and key == "managedFields"):
            body["metadata"].pop(key, None)
    body.pop("status", None)
    assert DIFFBASE in body["metadata"]["annotations"], body["metadata"]
    path.write_text(json.dumps(body))
    return path


def sweeper_owner(apps, ns, name) -> str | None:
    try:
        deployment = apps.read_namespaced_deployment(f"{name}-sweeper", ns)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return deployment.metadata.owner_references[0].uid


def reconciled(control_plane, apps, ns, name) -> dict | None:
    """The policy once the operator handled it: its own sweeper, a status of its
    generation, and kopf's diff base written."""
    policy = get_policy(control_plane, ns, name)
    status = policy.get("status") or {}
    if (sweeper_owner(apps, ns, name) == policy["metadata"]["uid"]
            and condition(policy, "Ready") is not None
            and status.get("observedGeneration") == policy["metadata"]["generation"]
            and DIFFBASE in (policy["metadata"].get("annotations") or {})):
        return policy
    return None


def handled_uid(policy: dict) -> str | None:
    """The uid kopf's diff base says it was written for."""
    stored = json.loads(policy["metadata"]["annotations"][DIFFBASE])
    return ((stored.get("metadata") or {}).get("annotations") or {}).get(UID_MARK)


def kopf_lines(operator, ns, name) -> list[str]:
    found = []
    for line in operator.log().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("namespace") == ns and (entry.get("object") == f"StalledPolicy/{name}"
                                             or entry.get("policy") == name):
            found.append(entry.get("msg", ""))
    return found


def recreate_from_export(control_plane, ns, name, path: Path, *, field_manager: str | None = None) -> dict:
    """Delete, create from ``path``; the object as created (managed fields shown)."""
    control_plane.kubectl("delete", "stp", name, "-n", ns)  # waits until it is gone
    manager = (f"--field-manager={field_manager}",) if field_manager else ()
    return json.loads(control_plane.kubectl("create", "-n", ns, "-f", str(path), *manager,
                                            "-o", "json", "--show-managed-fields").stdout)


def test_a_policy_created_again_from_its_own_export_is_reconciled_as_new(
        control_plane, kube_api, kube_namespace, env, tmp_path, queue_name):
    ns, apps = kube_namespace, client.AppsV1Api(kube_api)
    operator = OperatorProcess(env, tmp_path / "operator.log", "--all-namespaces")
    try:
        manifest = tmp_path / "nc.yaml"
        manifest.write_text(json.dumps(policy_manifest("nc", queue_name)))
        control_plane.kubectl("create", "-n", ns, "-f", str(manifest))
        first = wait_for(lambda: reconciled(control_plane, apps, ns, "nc"), "the policy reconciled")

        exported = export(control_plane, ns, "nc", tmp_path / "nc.json")
        assert (json.loads(exported.read_text())["metadata"]["annotations"][DIFFBASE]
                == first["metadata"]["annotations"][DIFFBASE])  # the copy claims to be handled
        recreate_from_export(control_plane, ns, "nc", exported)
        copy = get_policy(control_plane, ns, "nc")
        assert copy["metadata"]["uid"] != first["metadata"]["uid"]

        # The user waited 25 s and saw nothing; the old sweeper's garbage collection comes first.
        second = wait_for(lambda: reconciled(control_plane, apps, ns, "nc"),
                          "the re-created policy reconciled: its sweeper and status", timeout=60)
        assert second["metadata"]["uid"] == copy["metadata"]["uid"]
        assert handled_uid(first) == first["metadata"]["uid"]
        wait_for(lambda: handled_uid(get_policy(control_plane, ns, "nc")) == copy["metadata"]["uid"],
                 "kopf's diff base written for the new uid")
        lines = kopf_lines(operator, ns, "nc")
        assert any(first["metadata"]["uid"] in line and "handled as a new one" in line for line in lines), lines
        assert sum("Creation is processed" in line for line in lines) >= 2, lines
    finally:
        assert operator.stop() == 0, operator.log()[-3000:]


def test_upgrade_old_values_resume_bound_once_and_an_old_copy_is_new(
        control_plane, kube_api, kube_namespace, env, tmp_path, queue_name):
    """A policy the previous version handled (its diff base has no uid, set by
    kopf): the upgraded operator resumes it and creates nothing; its only write
    is that diff base again with the policy's uid (once). A copy of it made
    before the upgrade (set by kubectl create) is a new policy, and so is, now,
    an export made after the upgrade with its managed fields kept (before: no
    sweeper until a restart, kopf named as the annotation's manager)."""
    ns, apps = kube_namespace, client.AppsV1Api(kube_api)
    custom = client.CustomObjectsApi(kube_api)
    first = OperatorProcess(env, tmp_path / "first.log", "--all-namespaces")
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, policy_manifest("kept", queue_name))
        wait_for(lambda: reconciled(control_plane, apps, ns, "kept"), "the policy reconciled")
    finally:
        assert first.stop() == 0, first.log()[-3000:]

    # As the previous version left it: kopf's essence without a uid, patched by kopf.
    stored = json.loads(get_policy(control_plane, ns, "kept")["metadata"]["annotations"][DIFFBASE])
    stored.pop("metadata", None)  # the uid this version records
    old_value = json.dumps(stored, separators=(",", ":")) + "\n"
    custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "kept",
                                          {"metadata": {"annotations": {DIFFBASE: old_value}}},
                                          field_manager="kopf")
    before = get_policy(control_plane, ns, "kept", managed=True)
    sweeper_before = apps.read_namespaced_deployment("kept-sweeper", ns)
    # An export made before the upgrade (the previous version's value).
    exported = export(control_plane, ns, "kept", tmp_path / "kept.json")
    assert json.loads(exported.read_text())["metadata"]["annotations"][DIFFBASE] == old_value

    second = OperatorProcess(env, tmp_path / "second.log", "--all-namespaces")
    try:
        wait_for(lambda: any("Resuming is processed" in line for line in kopf_lines(second, ns, "kept")),
                 "the resume of the old policy")
        uid = before["metadata"]["uid"]
        wait_for(lambda: handled_uid(get_policy(control_plane, ns, "kept")) == uid,
                 "the old diff base bound to the policy's uid")
        bound = get_policy(control_plane, ns, "kept", managed=True)
        time.sleep(3)  # status refreshes, and any further write kopf would make
        after = get_policy(control_plane, ns, "kept", managed=True)
        # once: nothing wrote the annotations after the binding
        assert after["metadata"]["annotations"] == bound["metadata"]["annotations"]
        changed = {key for key in set(before["metadata"]["annotations"]) | set(after["metadata"]["annotations"])
                   if before["metadata"]["annotations"].get(key) != after["metadata"]["annotations"].get(key)}
        assert changed == {DIFFBASE}, changed
        rebound = json.loads(after["metadata"]["annotations"][DIFFBASE])
        assert rebound.pop("metadata") == {"annotations": {UID_MARK: uid}}
        assert rebound == stored  # the essence itself unchanged
        lines = kopf_lines(second, ns, "kept")
        assert not [line for line in lines if "Creation" in line or "Updating" in line
                    or "handled as a new one" in line], lines
        assert sum("bound to this policy's uid" in line for line in lines) == 1, lines
        sweeper_after = apps.read_namespaced_deployment("kept-sweeper", ns)
        assert sweeper_after.metadata.generation == sweeper_before.metadata.generation

        # Exported now and created again with kopf named as the diff base's
        # manager: new. The API server gives every field of a create to its
        # creator, managed fields sent or not, so kopf is named the way a
        # restore tool keeping kopf's name would (read from the create's own
        # answer: the operator rewrites the annotation as kopf soon after).
        with_fields = export(control_plane, ns, "kept", tmp_path / "kept-fields.json", keep_managed_fields=True)
        restored = recreate_from_export(control_plane, ns, "kept", with_fields, field_manager="kopf")
        assert restored["metadata"]["uid"] != uid
        assert "kopf" in {entry["manager"] for entry in restored["metadata"]["managedFields"]
                          if f"f:{DIFFBASE}" in ((entry.get("fieldsV1") or {}).get("f:metadata") or {})
                          .get("f:annotations", {})}, restored["metadata"]["managedFields"]
        wait_for(lambda: reconciled(control_plane, apps, ns, "kept"),
                 "the policy restored with its managed fields reconciled", timeout=60)
        wait_for(lambda: handled_uid(get_policy(control_plane, ns, "kept")) == restored["metadata"]["uid"],
                 "kopf's diff base written for the restored uid")
        uid = restored["metadata"]["uid"]

        # The export made before the upgrade, created again: new.
        recreate_from_export(control_plane, ns, "kept", exported)
        copy = get_policy(control_plane, ns, "kept")
        assert copy["metadata"]["uid"] != uid
        wait_for(lambda: reconciled(control_plane, apps, ns, "kept"),
                 "the re-created policy reconciled: its sweeper and status", timeout=60)
        wait_for(lambda: handled_uid(get_policy(control_plane, ns, "kept")) == copy["metadata"]["uid"],
                 "kopf's diff base written for the new uid")
        assert any("set by kubectl-create" in line for line in kopf_lines(second, ns, "kept"))
    finally:
        assert second.stop() == 0, second.log()[-3000:]
