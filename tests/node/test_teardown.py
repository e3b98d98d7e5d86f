"""The node's teardown (realnode.Node.teardown, the ``real_node`` fixture's): it
stops every process, and nothing is left to sweep: no process, mount, cgroup,
changed sysctl or CNI state. conftest.py runs this test last, since it stops
the node; hack/node/run_tests.py then checks the namespace is gone too."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pause_image
import realnode

NODE_PROCESSES = {"etcd", "kube-apiserver", "kube-controller-manager", "containerd", "kubelet", "kube-scheduler"}


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def nsfs_mounts_under(prefix: str) -> list[str]:
    with open("/proc/self/mountinfo") as info:
        return [line.split()[4] for line in info
                if " - nsfs " in line and line.split()[4].startswith(prefix.rstrip("/") + "/")]


def running_deployment(real_node, replicas: int = 2) -> None:
    """Pods to tear down, whatever ran before: a Deployment of the pause image (its
    ReplicaSet replaces a pod deleted alone, which teardown must not race)."""
    real_node.kubectl("create", "namespace", "teardown")
    real_node.kubectl("apply", "-n", "teardown", "-f", "-", stdin=json.dumps({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "pause"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "pause"}},
                 "template": {"metadata": {"labels": {"app": "pause"}}, "spec": {
                     "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "pause", "image": pause_image.TAG, "imagePullPolicy": "Never",
                                     "securityContext": {"runAsNonRoot": True, "runAsUser": 65535}}]}}}}))
    real_node.kubectl("rollout", "status", "-n", "teardown", "deployment/pause", "--timeout=180s", timeout=200)


def test_teardown_stops_everything_and_leaves_nothing(real_node):
    running_deployment(real_node)
    # the pods' network namespaces are under the node's work directory, where the
    # checks below look, and not among the host's (/run/netns)
    assert len(nsfs_mounts_under(str(real_node.work))) >= 2
    pids = real_node.server_pids()
    assert NODE_PROCESSES <= set(pids), pids
    # the kubelet holds mounts and cgroups while it runs: the checks below would find
    # them if teardown forgot them
    assert realnode.mounts_under(str(real_node.work))
    assert any((controller / real_node.cgroup_root.lstrip("/")).exists()
               for controller in Path("/sys/fs/cgroup").iterdir())

    swept = real_node.teardown()

    assert swept == [], f"teardown stopped things by sweeping, not cleanly: {swept}"
    assert [name for name, pid in pids.items() if alive(pid)] == []
    assert realnode.leftovers(real_node.work, real_node.netns, real_node.cgroup_root, real_node.cni_network,
                              real_node.sysctls, namespace_too=False) == []
    assert realnode.read_sysctls() == real_node.sysctls
    assert os.path.exists(realnode.NETNS_DIR / real_node.netns)  # run_tests.py removes it, after this session
