"""The network rule on the real node: everything that addresses a pod, the node
or a Service runs inside the namespace hack/node/run_tests.py made, and
nothing can leave that namespace. tests/unit/test_network_guard.py checks the
guard itself from the host's namespace."""

from __future__ import annotations

import os
import socket
import threading

import pytest
import realnode
from run_tests import HOST_PID_ENV


def host_namespace() -> str:
    """The host's namespace: run_tests.py's, which stays there (PID 1's may not be readable)."""
    return f"/proc/{os.environ[HOST_PID_ENV]}/ns/net"


def namespace_of(pid: int) -> int:
    return realnode.namespace_inode(f"/proc/{pid}/ns/net")


def test_every_process_of_the_node_and_this_session_is_inside_the_namespace(real_node):
    ours = realnode.namespace_inode(str(realnode.NETNS_DIR / real_node.netns))
    host = realnode.namespace_inode(host_namespace())
    assert ours != host
    pids = real_node.server_pids()
    assert {"kube-apiserver", "kubelet", "containerd", "kube-scheduler"} <= set(pids)
    assert {name: namespace_of(pid) for name, pid in pids.items()} == {name: ours for name in pids}
    assert realnode.namespace_inode("/proc/self/ns/net") == ours


def test_nothing_can_leave_the_namespace(real_node):
    assert realnode.no_route_out() == []
    with socket.socket() as sock, pytest.raises(OSError) as refused:
        sock.connect(("192.0.2.1", 80))  # TEST-NET-1: no route, so refused before anything is sent
    assert "unreachable" in str(refused.value).lower()


def test_the_guard_refuses_the_node_address_from_a_thread_in_the_hosts_namespace(real_node):
    guard = realnode.NetworkGuard.installed()
    assert guard is not None and guard.allowed == real_node.netns
    outcome: dict[str, object] = {}

    def from_the_host() -> None:
        try:
            realnode.setns(host_namespace())  # this thread only
            with socket.socket() as sock:
                sock.settimeout(2)
                sock.connect((realnode.NODE_IP, 6443))
            outcome["connected"] = True
        except Exception as exc:  # noqa: BLE001 - recorded for the assertions below
            outcome["error"] = exc

    thread = threading.Thread(target=from_the_host)
    thread.start()
    thread.join(30)
    assert isinstance(outcome.get("error"), realnode.NetworkRuleError), outcome
    assert guard.refused[-1].startswith(realnode.NODE_IP)
    guard.refused.clear()  # the session must end with nothing refused (conftest.py fails it otherwise)
