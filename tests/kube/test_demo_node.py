"""`make demo` on a real node (hack/node/demo.py), run as a user runs it. Where
the host can run a node: `up` shows real pods (`kubectl get pods`: the
operator and the sweepers Running 1/1 on the node), a sweeper's `kubectl
logs`, and DEAD > 0; `down` leaves no namespace, process or state behind.
Where it cannot: `check` says why, plainly, and that the pod runner is used
instead (the Makefile then runs stalledpolicy.devenv.demo, tests/kube/test_demo.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "node"))

import realnode  # noqa: E402

pytestmark = [pytest.mark.slow]

DEMO = REPO / "hack" / "node" / "demo.py"


def demo(state: Path, command: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "STALLEDPOLICY_DEMO_NODE_DIR": str(state)}
    env.pop("KUBECONFIG", None)
    return subprocess.run([sys.executable, str(DEMO), command], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_make_demo_shows_real_pods_or_says_why_not(tmp_path):
    state = tmp_path / "demo-node"
    problems = realnode.host_problems()
    if problems:
        done = demo(state, "check")
        assert done.returncode == 1
        assert "This host cannot run a real node" in done.stderr and "pod runner" in done.stderr
        assert problems[0] in done.stderr
        return
    if not realnode.default_image().is_file():
        pytest.fail(f"no image {realnode.default_image()}: `make image` builds it (make test does, first)")
    up = demo(state, "up")
    try:
        recorded = json.loads((state / "state.json").read_text())
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        assert "DEMO READY" in up.stdout
        pods = up.stdout.split("$ kubectl get pods -A -o wide\n", 1)[1].split("\n\n", 1)[0].splitlines()
        header = pods[0].split()  # NAMESPACE NAME READY STATUS RESTARTS AGE IP NODE NOMINATED NODE ...
        name, ready, status, node = (header.index(column) for column in ("NAME", "READY", "STATUS", "NODE"))
        rows = [line.split() for line in pods[1:]]
        running = {row[name].rsplit("-", 2)[0] for row in rows
                   if row[ready] == "1/1" and row[status] == "Running" and row[node] == realnode.NODE_NAME}
        assert {"emails-sweeper", "tenants-sweeper", "demo-stalledpolicy-operator"} <= running, pods
        logs = up.stdout.split("$ kubectl logs -n demo ", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
        assert logs and all(json.loads(line)["logger"].startswith("stalledpolicy") for line in logs)
        table = up.stdout.split("$ kubectl get stalledpolicies -n demo\n", 1)[1].splitlines()
        emails = dict(zip(table[0].split(), next(line for line in table if line.startswith("emails ")).split()))
        assert int(emails["DEAD"]) >= 1 and emails["READY"] == "True"
        assert f"nsenter --net=/run/netns/{recorded['netns']}" in up.stdout
    finally:
        down = demo(state, "down", timeout=400)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "nothing was left behind" in down.stdout, down.stdout
    assert not (realnode.NETNS_DIR / recorded["netns"]).exists()
    assert realnode.processes_mentioning(recorded["work"]) == []
    assert not state.exists()
