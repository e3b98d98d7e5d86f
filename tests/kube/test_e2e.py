"""End to end: operator, CRD, a Secret holding a password-protected Redis URL,
the pod runner running the real sweeper from the Deployment it was given, and
an EchoMQ poison job.

The job stalls past its budget and shows in `kubectl get stalledpolicies` under
DEAD; the budget is raised by a patch and the sweeper restarts with it; a
replay annotation brings the job back to its lane, where the new budget
recovers its next stall instead of dead-lettering it.

Pod runner, not real pods: this is about the operator's and the sweeper's logic,
which a pod runner shows in seconds. The same story on real pods of the image
(the chart's operator, the kubelet's probes, Pod Security, a Redis outage) is
tests/node/test_real_pods.py, in the real node's session of `make test`.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time

import pytest

from stalledpolicy.devenv.echomq import EchoMQ
from stalledpolicy.devenv.redis_server import start_redis
from stalledpolicy.keyspace import QueueKeys
from tests.kube.operator_harness import OperatorProcess, apply_crd, condition, events_for, operator_kubeconfig, wait_for

pytestmark = [pytest.mark.kube, pytest.mark.redis, pytest.mark.slow]

PASSWORD = "e2e-s3cret-pw"
LANE = "imports"


@pytest.fixture(scope="module")
def guarded_redis():
    server = start_redis(["--requirepass", PASSWORD])
    yield server
    server.stop()
    shutil.rmtree(server.workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def operator(control_plane, kube_api, tmp_path_factory):
    apply_crd(control_plane)
    kubeconfig = operator_kubeconfig(control_plane, kube_api)
    process = OperatorProcess(kubeconfig, tmp_path_factory.mktemp("e2e-operator") / "operator.log",
                              "--all-namespaces")
    yield process
    assert process.stop() == 0, process.log()[-3000:]


@pytest.fixture
def pod_runner(control_plane, kube_namespace, tmp_path):
    log_dir = tmp_path / "pods"
    with open(tmp_path / "podrunner.log", "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "stalledpolicy.devenv.podrunner", "--kubeconfig", str(control_plane.kubeconfig),
             "--namespace", kube_namespace, "--log-dir", str(log_dir), "--poll-interval", "0.3"],
            stdout=out, stderr=subprocess.STDOUT)
    yield log_dir
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0, (tmp_path / "podrunner.log").read_text()[-3000:]


def kubectl_json(control_plane, *args):
    return json.loads(control_plane.kubectl(*args, "-o", "json").stdout)


def dead_column(control_plane, namespace, name) -> str | None:
    table = control_plane.kubectl("get", "stalledpolicies", "-n", namespace).stdout.splitlines()
    header = table[0].split()
    for row in table[1:]:
        cells = row.split()
        if cells and cells[0] == name and len(cells) == len(header):
            return cells[header.index("DEAD")]
    return None


def sweeper_starts(log_dir) -> list[dict]:
    """Every 'sweeper started' line the sweeper processes logged (JSON logs)."""
    found = []
    for path in sorted(log_dir.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if '"sweeper started"' in line:
                found.append(json.loads(line))
    return found


def earlier_sweepers_stopped(log_dir, max_stalled: int) -> bool:
    """Whether every sweeper process started with another budget than ``max_stalled``
    has stopped (its pod deleted by the rollout, the pod runner's SIGTERM): one left
    running a moment after the rollout would still apply its budget."""
    for path in sorted(log_dir.glob("*.log")):
        text = path.read_text(errors="replace")
        starts = [json.loads(line) for line in text.splitlines() if '"sweeper started"' in line]
        if any(s["max_stalled"] != max_stalled for s in starts) and '"sweeper stopped"' not in text:
            return False
    return True


def test_poison_job_dead_lettered_budget_raised_then_replayed(
        operator, pod_runner, control_plane, kube_api, kube_namespace, guarded_redis, queue_name):
    ns = kube_namespace
    url = f"redis://:{PASSWORD}@127.0.0.1:{guarded_redis.port}/0"
    manifest = f"""
apiVersion: v1
kind: Secret
metadata: {{name: queue-redis}}
stringData: {{url: "{url}"}}
---
apiVersion: queues.emq.dev/v1alpha1
kind: StalledPolicy
metadata: {{name: orders}}
spec:
  queue: {queue_name}
  maxStalled: 1
  sweepInterval: 1s
  lanes: [{{name: {LANE}}}]
  redis: {{secretRef: {{name: queue-redis, key: url}}}}
"""
    control_plane.kubectl("apply", "-n", ns, "-f", "-", input=manifest)
    control_plane.kubectl("wait", "-n", ns, "--for=condition=Ready", "stalledpolicy/orders", "--timeout=120s")
    first = wait_for(lambda: sweeper_starts(pod_runner), "the sweeper process to start")
    assert first[0]["max_stalled"] == 1 and first[0]["queue"] == queue_name
    assert PASSWORD not in json.dumps(first)

    # A poison job: claimed, and its worker dies (the lease lapses).
    client = guarded_redis.client(password=PASSWORD, decode_responses=True)
    mq = EchoMQ(client, queue_name)
    keys = QueueKeys(queue_name)
    job = mq.enqueue(group=LANE)
    claim = mq.claim(lease_ms=60_000, group_mode="grouped")
    assert claim is not None and claim.id == job
    mq.expire(claim)
    wait_for(lambda: client.zscore(keys.dead, job) is not None, "the sweeper to dead-letter the job")
    assert client.hget(keys.job(job), "stalled") == "1"
    wait_for(lambda: dead_column(control_plane, ns, "orders") == "1", "kubectl get to show DEAD 1")
    grown = wait_for(lambda: [e for e in events_for(kube_api, ns, "orders") if e.reason == "DeadLettered"],
                     "a DeadLettered event")
    assert "1 job dead-lettered" in grown[0].message

    # GitOps raises the budget: the Deployment rolls, the sweeper restarts with the new budget.
    control_plane.kubectl("patch", "-n", ns, "stalledpolicy/orders", "--type=merge",
                          "-p", '{"spec":{"maxStalled":3}}')
    control_plane.kubectl("wait", "-n", ns, "--for=condition=Ready", "stalledpolicy/orders", "--timeout=120s")
    wait_for(lambda: any(s["max_stalled"] == 3 for s in sweeper_starts(pod_runner)),
             "a sweeper started with max_stalled 3")
    wait_for(lambda: earlier_sweepers_stopped(pod_runner, 3), "the sweeper with max_stalled 1 stopped")
    deployment = kubectl_json(control_plane, "get", "-n", ns, "deployment/orders-sweeper")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["STALLEDPOLICY_MAX_STALLED"] == "3"
    assert PASSWORD not in json.dumps(deployment)

    # A replay annotation brings the job back to its lane, once.
    control_plane.kubectl("annotate", "-n", ns, "stalledpolicy/orders", "queues.emq.dev/replay=fix-1")
    wait_for(lambda: client.zscore(keys.lane_pending(LANE), job) is not None, "the job back in its lane")
    assert client.zscore(keys.dead, job) is None
    policy = wait_for(lambda: (lambda p: p if (p.get("status") or {}).get("lastReplay") else None)(
        kubectl_json(control_plane, "get", "-n", ns, "stalledpolicy/orders")), "status.lastReplay")
    assert policy["status"]["lastReplay"]["token"] == "fix-1"
    assert policy["status"]["lastReplay"]["replayed"] == 1
    wait_for(lambda: dead_column(control_plane, ns, "orders") == "0", "kubectl get to show DEAD 0")
    wait_for(lambda: [e for e in events_for(kube_api, ns, "orders") if e.reason == "Replayed"], "a Replayed event")

    # The new budget is in force: the job's next stall is recovered, not dead-lettered.
    claim = mq.claim(lease_ms=60_000, group_mode="grouped")
    assert claim is not None and claim.id == job
    mq.expire(claim)
    wait_for(lambda: client.zscore(keys.lane_pending(LANE), job) is not None, "the stalled job recovered")
    assert client.zscore(keys.dead, job) is None
    assert client.hget(keys.job(job), "stalled") == "1"

    # The same token again does nothing; the job now dead-lettered by hand stays dead.
    client.zrem(keys.lane_pending(LANE), job)
    client.hset(keys.job(job), mapping={"state": "dead"})
    client.zadd(keys.dead, {job: 0})
    control_plane.kubectl("annotate", "--overwrite", "-n", ns, "stalledpolicy/orders",
                          "queues.emq.dev/replay=fix-1", "unrelated=touch")
    time.sleep(3)
    assert client.zscore(keys.dead, job) is not None

    # Nothing shown to users holds the password.
    everything = json.dumps(kubectl_json(control_plane, "get", "-n", ns, "stalledpolicy/orders"))
    everything += json.dumps([e.message for e in events_for(kube_api, ns, "orders")])
    everything += operator.log()
    assert PASSWORD not in everything
    assert condition(kubectl_json(control_plane, "get", "-n", ns, "stalledpolicy/orders"), "Ready")["status"] == "True"
