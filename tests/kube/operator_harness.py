"""Shared by the operator's kube tests: the CRD, the operator as a real process
acting as a ServiceAccount bound to the RBAC rules the chart ships, the pod
runner, and waiting."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from stalledpolicy.devenv.controlplane import wait_crd_established
from stalledpolicy.policy.crd import CRD_NAME, crd_path

OPERATOR_NAMESPACE = "stalledpolicy-system"
OPERATOR_ACCOUNT = "stalledpolicy-operator"

# The operator's permissions (the chart's ClusterRole). The tests run the
# operator with exactly these, so a missing rule fails a test.
OPERATOR_RULES = [
    # kopf itself: discovering CRDs (cluster-wide it lists no namespaces).
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
     "verbs": ["list", "watch"]},
    # The policies: watched, annotated by kopf (progress, last handled spec), status written.
    {"apiGroups": ["queues.emq.dev"], "resources": ["stalledpolicies"],
     "verbs": ["get", "list", "watch", "patch"]},
    # The status: patched only (read with the policy, never through the subresource).
    {"apiGroups": ["queues.emq.dev"], "resources": ["stalledpolicies/status"],
     "verbs": ["patch"]},
    # The sweeper's owner reference blocks the policy's deletion until it is gone
    # (blockOwnerDeletion): clusters enforcing OwnerReferencesPermissionEnforcement
    # require this.
    {"apiGroups": ["queues.emq.dev"], "resources": ["stalledpolicies/finalizers"],
     "verbs": ["update"]},
    # The sweepers: server-side applied (create + patch), watched for availability.
    {"apiGroups": ["apps"], "resources": ["deployments"],
     "verbs": ["get", "list", "watch", "create", "patch"]},
    # The Redis URL of spec.redis.secretRef (read by name, never listed).
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
    # Events on the policies, core/v1 only (ours, and kopf's posting): created, and
    # patched when a repeat is counted on the same Event. Nothing posts events.k8s.io.
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
]


def read_deployment(apps, namespace: str, name: str):
    """The Deployment, or None when there is none."""
    from kubernetes.client.exceptions import ApiException

    try:
        return apps.read_namespaced_deployment(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def wait_for(predicate, what: str, timeout: float = 60.0, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def apply_crd(control_plane) -> None:
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd_path()))
    wait_crd_established(control_plane.kubectl, CRD_NAME)


# The chart's namespaced mode adds these to its ClusterRole: kopf, given namespace
# names, lists and watches namespaces. Without them it retries for ~1 minute, then
# serves the names it was given (an operator installed with rbac.create=false and
# only the per-namespace rules).
NAMESPACE_RULES = [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}]


# The chart's Role in the release namespace when leader election is on: the Lease.
LEASE_RULES = [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}]


def operator_kubeconfig(control_plane, kube_api, *, namespaced: bool = False, leases_in: str | None = None) -> Path:
    """A kubeconfig for a ServiceAccount holding exactly OPERATOR_RULES, cluster-wide,
    plus NAMESPACE_RULES when ``namespaced`` (an operator run with --namespace, as the
    chart grants it in that mode), and LEASE_RULES in the namespace ``leases_in``."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core, rbac = client.CoreV1Api(kube_api), client.RbacAuthorizationV1Api(kube_api)
    name = f"{OPERATOR_ACCOUNT}-namespaced" if namespaced else OPERATOR_ACCOUNT

    def create(call, *args):
        try:
            call(*args)
        except ApiException as exc:
            if exc.status != 409:
                raise

    create(core.create_namespace, {"metadata": {"name": OPERATOR_NAMESPACE}})
    create(core.create_namespaced_service_account, OPERATOR_NAMESPACE, {"metadata": {"name": name}})
    role = {"metadata": {"name": name}, "rules": OPERATOR_RULES + (NAMESPACE_RULES if namespaced else [])}
    try:
        rbac.create_cluster_role(role)
    except ApiException as exc:
        if exc.status != 409:
            raise
        rbac.replace_cluster_role(name, role)
    create(rbac.create_cluster_role_binding, {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": OPERATOR_NAMESPACE}],
    })
    if leases_in:
        create(rbac.create_namespaced_role, leases_in, {"metadata": {"name": "operator-leases"},
                                                        "rules": LEASE_RULES})
        create(rbac.create_namespaced_role_binding, leases_in, {
            "metadata": {"name": f"operator-leases-{name}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "operator-leases"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": OPERATOR_NAMESPACE}]})
    return control_plane.kubeconfig_for_service_account(OPERATOR_NAMESPACE, name)


def resumed(process, namespace, name) -> bool:
    """Whether ``process`` (an OperatorProcess logging JSON) has run kopf's resume
    handler for the policy ``name``: what it applies at start is in. A test acting on
    a policy that existed before the operator started waits for this (before it, the
    resume's own apply may undo what the test did)."""
    return any((entry.get("namespace"), entry.get("object")) == (namespace, f"StalledPolicy/{name}")
               and entry.get("msg", "").startswith("Resuming is processed") for entry in log_entries(process))


def log_entries(process) -> list[dict]:
    """The JSON log lines of ``process`` (an OperatorProcess), parsed; other lines skipped."""
    entries = []
    for line in process.log().splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    return entries


class OperatorProcess:
    """``python -m stalledpolicy operator`` as a child process, output in a log file."""

    def __init__(self, kubeconfig: Path, log_path: Path, *extra: str) -> None:
        self.log_path = log_path
        env = {k: v for k, v in os.environ.items() if not k.startswith("STALLEDPOLICY_OPERATOR_")}
        env.pop("KUBECONFIG", None)
        self.command = [sys.executable, "-m", "stalledpolicy", "operator", "--kubeconfig", str(kubeconfig),
                        "--status-interval", "1s", "--max-backoff", "4s", "--log-format", "json",
                        "--sweeper-image", "stalledpolicy:test", *extra]
        with open(log_path, "ab") as out:
            self.process = subprocess.Popen(self.command, env=env, stdout=out, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
                return -9
        return self.process.returncode


class PodRunnerThread:
    """The pod runner in this process, for one namespace."""

    def __init__(self, kube_api, namespace: str, log_dir: Path) -> None:
        from stalledpolicy.devenv.podrunner import PodRunner

        self.runner = PodRunner(kube_api, namespace, log_dir=log_dir, poll_interval=0.3)
        self.thread = threading.Thread(target=self.runner.run, name=f"podrunner-{namespace}", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.runner.request_stop()
        self.thread.join(30)


def policy_manifest(name: str, queue: str, *, secret: str = "redis", max_stalled: int = 1,
                    interval: str = "1s", lanes=(), annotations=None) -> dict:
    return {
        "apiVersion": "queues.emq.dev/v1alpha1",
        "kind": "StalledPolicy",
        "metadata": {"name": name, **({"annotations": annotations} if annotations else {})},
        "spec": {"queue": queue, "maxStalled": max_stalled, "sweepInterval": interval,
                 "lanes": [{"name": lane} for lane in lanes],
                 "redis": {"secretRef": {"name": secret, "key": "url"}}},
    }


def redis_secret(name: str, url: str) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "Opaque",
            "stringData": {"url": url}}


def condition(policy: dict, type_: str) -> dict | None:
    for item in (policy.get("status") or {}).get("conditions") or []:
        if item.get("type") == type_:
            return item
    return None


def events_for(kube_api, namespace: str, name: str) -> list:
    from kubernetes import client

    listed = client.CoreV1Api(kube_api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name},involvedObject.kind=StalledPolicy")
    return listed.items
