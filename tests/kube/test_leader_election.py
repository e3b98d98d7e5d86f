"""Several operator replicas with leader election (--leader-election-lease) on the
real control plane: one acts, the others wait healthy; the leader's SIGTERM hands
over at once (the Lease released), its SIGKILL once the Lease lapses; a leader whose
Lease another took stops (exit 1)."""

from __future__ import annotations

import datetime
import signal
import time
import urllib.error
import urllib.request

import pytest
from kubernetes import client

from stalledpolicy.devenv.ports import free_port
from tests.kube.operator_harness import (
    OperatorProcess,
    apply_crd,
    log_entries,
    operator_kubeconfig,
    policy_manifest,
    read_deployment,
    redis_secret,
    wait_for,
)

pytestmark = [pytest.mark.kube, pytest.mark.redis]

GROUP, VERSION, PLURAL = "queues.emq.dev", "v1alpha1", "stalledpolicies"
LEASE_SECONDS = 9  # renewed every 2 s, judged lost after 6: room for a loaded machine


def lines(process, message: str) -> list[dict]:
    return [entry for entry in log_entries(process) if entry.get("msg", "").startswith(message)]


def liveness(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def test_one_replica_acts_and_another_takes_over_when_it_stops_or_dies(
        control_plane, kube_api, tmp_path, kube_namespace, redis_server, queue_name):
    ns = kube_namespace
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    custom = client.CustomObjectsApi(kube_api)
    apply_crd(control_plane)
    kubeconfig = operator_kubeconfig(control_plane, kube_api, namespaced=True, leases_in=ns)
    core.create_namespaced_secret(ns, redis_secret("redis", redis_server.url))
    coordination = client.CoordinationV1Api(kube_api)
    ports = {name: free_port() for name in "abcd"}

    def replica(name):
        return OperatorProcess(kubeconfig, tmp_path / f"{name}.log", "--namespace", ns,
                               "--leader-election-lease", f"{ns}/operator",
                               "--leader-election-duration", f"{LEASE_SECONDS}s",
                               "--liveness", f"http://127.0.0.1:{ports[name]}/healthz")

    def holder() -> str | None:
        return coordination.read_namespaced_lease("operator", ns).spec.holder_identity

    def create(name):
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                               policy_manifest(name, f"{queue_name}-{name}"))

    replicas = {"a": replica("a")}
    try:
        wait_for(lambda: lines(replicas["a"], "leader lease acquired"), "a to lead")
        replicas["b"] = replica("b")
        wait_for(lambda: lines(replicas["b"], "waiting for the leader lease"), "b to wait")
        [waiting] = lines(replicas["b"], "waiting for the leader lease")
        assert waiting["holder"] == holder() == lines(replicas["a"], "leader lease acquired")[0]["identity"]
        assert liveness(ports["b"]) == 200  # waiting is healthy: the kubelet must not restart it

        create("first")
        wait_for(lambda: read_deployment(apps, ns, "first-sweeper"), "the leader to apply a sweeper")
        time.sleep(2)
        assert not lines(replicas["b"], "sweeper Deployment applied") and \
            not lines(replicas["b"], "policy reconciled"), "the waiting replica acted"

        # SIGTERM: a releases the Lease on its way out, b takes it at its next try
        stopped = time.monotonic()
        assert replicas.pop("a").stop() == 0
        wait_for(lambda: lines(replicas["b"], "leader lease acquired"), "b to lead", timeout=30)
        assert time.monotonic() - stopped < LEASE_SECONDS, "b waited for the Lease to lapse: a did not release it"
        create("second")
        wait_for(lambda: read_deployment(apps, ns, "second-sweeper"), "b to apply a sweeper")

        # SIGKILL: no release; c takes over once b's Lease lapsed
        replicas["c"] = replica("c")
        wait_for(lambda: lines(replicas["c"], "waiting for the leader lease"), "c to wait")
        replicas["b"].process.send_signal(signal.SIGKILL)
        replicas["b"].process.wait(10)
        killed = time.monotonic()
        del replicas["b"]
        wait_for(lambda: lines(replicas["c"], "leader lease acquired"), "c to lead", timeout=60)
        assert time.monotonic() - killed >= LEASE_SECONDS - 1.5, "c took a Lease that had not lapsed"
        create("third")
        wait_for(lambda: read_deployment(apps, ns, "third-sweeper"), "c to apply a sweeper")

        # the Lease taken from under the leader (another holder, renewed now): it stops acting, exit 1
        lease = coordination.read_namespaced_lease("operator", ns)
        lease.spec.holder_identity = "intruder"
        lease.spec.renew_time = datetime.datetime.now(datetime.UTC)
        coordination.replace_namespaced_lease("operator", ns, lease)
        assert replicas["c"].process.wait(LEASE_SECONDS * 2) == 1
        assert lines(replicas.pop("c"), "leader lease lost")

        # a waiting replica stops at once on SIGTERM
        replicas["d"] = replica("d")
        wait_for(lambda: lines(replicas["d"], "waiting for the leader lease"), "d to wait")
        started = time.monotonic()
        waiting = replicas.pop("d")
        assert waiting.stop() == 0 and time.monotonic() - started < 10
        assert lines(waiting, "stopping while waiting for the leader lease")
        assert [e for e in log_entries(waiting) if e.get("level") in ("warning", "error", "critical")] == []
        # a Lease the ServiceAccount may not use (no grant in that namespace): the replica
        # ends (exit 2) with the API's words, where it had waited healthy for ever
        refused = OperatorProcess(kubeconfig, tmp_path / "refused.log", "--namespace", ns,
                                  "--leader-election-lease", "default/operator")
        assert refused.process.wait(60) == 2
        [error] = lines(refused, "leader lease: the API server refuses this replica the Lease")
        assert "forbidden" in error["msg"] and "leases create, get and update in namespace default" in error["msg"]
    finally:
        for process in replicas.values():
            process.stop()
