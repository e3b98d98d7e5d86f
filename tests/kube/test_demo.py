"""`make demo`'s program, run as a user runs it: `up` ends with DEAD > 0 in
`kubectl get stalledpolicies`, a second `up` finds it running, and `down` leaves
no process behind (control plane, Redis, operator, pod runner, sweepers)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from stalledpolicy.devenv.demo import Proc

pytestmark = [pytest.mark.kube, pytest.mark.redis, pytest.mark.slow]


def demo(state: Path, command: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["STALLEDPOLICY_DEMO_DIR"] = str(state)
    return subprocess.run([sys.executable, "-m", "stalledpolicy.devenv.demo", command], env=env,
                          capture_output=True, text=True, timeout=timeout)


def table_after(output: str, command: str) -> dict[str, dict[str, str]]:
    """The kubectl table printed under ``$ <command>``, by NAME."""
    lines = output.split(f"$ {command}\n", 1)[1].splitlines()
    header = lines[0].split()
    rows = {}
    for line in lines[1:]:
        if not line.strip():
            break
        cells = line.split()
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def recorded_processes(state: Path) -> list[Proc]:
    record = json.loads((state / "demo.json").read_text())
    procs = [Proc(**p) for p in record["processes"].values()]
    plane = json.loads((Path(record["plane_dir"]) / "plane.json").read_text())
    procs += [Proc.of(c["name"], c["pid"]) for c in plane["components"]]
    runner = next(p for p in procs if p and p.name == "podrunner")
    procs += [Proc.of("sweeper", pid) for pid in runner.children()]
    return [p for p in procs if p is not None]


def test_demo_up_shows_dead_letters_and_down_stops_everything(tmp_path):
    state = tmp_path / "demo"
    up = demo(state, "up")
    processes = []
    try:
        assert up.returncode == 0, up.stdout[-4000:] + up.stderr[-4000:]
        rows = table_after(up.stdout, "kubectl get stalledpolicies -n demo")
        assert set(rows) == {"emails", "tenants", "reports"}
        assert int(rows["emails"]["DEAD"]) >= 1  # the poison job
        # beside consumers that reap lapsed leases on every loop, as EchoMQ's do, the
        # poison job reached the morgue at its budget (maxStalled 3), one claim spare
        [claims] = re.findall(r"the poison job was claimed (\d+)x before the morgue", up.stdout)
        assert 3 <= int(claims) <= 4, up.stdout[-4000:]
        assert re.search(r"\d+ lapsed leases reaped by the consumers", up.stdout), up.stdout[-4000:]
        assert all(row["READY"] == "True" for row in rows.values()), rows
        wide = table_after(up.stdout, "kubectl get stalledpolicies -n demo -o wide")
        assert "PENDING" in wide["emails"] and "ACTIVE" in wide["emails"]
        assert int(wide["emails"]["UNCOUNTED"] or 0) <= 1, wide  # lapses the consumers reaped first
        assert "make demo-down" in up.stdout and "morgue list --redis-url redis://127.0.0.1:" in up.stdout
        assert "/metrics" in up.stdout
        [operator_metrics] = re.findall(r"curl -s (http://\S+/metrics) \| grep \^stalledpolicy_operator_", up.stdout)
        with urllib.request.urlopen(operator_metrics, timeout=10) as response:
            assert "stalledpolicy_operator_reconciles_total" in response.read().decode()

        processes = recorded_processes(state)
        names = {p.name for p in processes}
        assert {"redis", "operator", "podrunner", "etcd", "kube-apiserver", "sweeper"} <= names
        again = demo(state, "up", timeout=120)
        assert again.returncode == 0 and "already running" in again.stdout, again.stdout + again.stderr
        assert demo(state, "status", timeout=120).returncode == 0
    finally:
        down = demo(state, "down", timeout=180)
    assert down.returncode == 0, down.stderr
    assert [p for p in processes if p.alive()] == []
    assert not state.exists()
    assert demo(state, "status", timeout=60).returncode == 1
