"""End to end on the real node: the chart installed with helm, the operator and
the sweepers run as real pods of `make image`'s image, by the real kubelet,
in namespaces that enforce the restricted Pod Security Standard.

The tests run in file order on one release (module fixtures):
- the chart's operator pod: admitted, started (its startup probe passed), its
  liveness probe, `kubectl logs` JSON, and inside the container uid 65532, a
  read-only root, no capabilities, no_new_privs and seccomp (`kubectl exec`);
- a policy whose Redis URL is in a Secret (password-protected): Ready, the
  sweeper pod Ready (its readiness probe), a poison job dead-lettered and shown
  in the status, a budget change (maxStalled) rolled out to a new pod, a replay;
- a Redis outage: the sweeper's /readyz answers 503 to the kubelet, the pod
  goes unready, and ready again once Redis is back;
- helm uninstall: the operator's pod goes, the CRD stays.

The operator alone (its logic, RBAC, leases, status writes) is tested in
tests/kube with the pod runner, which is faster; these are what only a node shows.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid

import pytest
import realnode

from stalledpolicy.devenv.echomq import EchoMQ
from stalledpolicy.devenv.redis_server import start_redis
from stalledpolicy.keyspace import QueueKeys
from stalledpolicy.policy.builder import READINESS_PATH, sweeper_name, sweeper_selector
from tests.kube.operator_harness import condition, redis_secret, wait_for
from tests.kube_fixtures import CHART, Helm

RELEASE, RELEASE_NS = "spo", "stalledpolicy-system"
PASSWORD = "node-s3cret-pw"
LANE = "imports"
OPERATOR_SELECTOR = "app.kubernetes.io/component=operator"
# a pod starts in seconds here; the deadlines allow for a loaded machine
POD_DEADLINE = 180
SECURITY_PROBE = (
    "import os\n"
    "s = open('/proc/self/status').read()\n"
    "f = lambda k: s.split(k + ':')[1].split()[0]\n"
    "w = 'writable'\n"
    "try:\n    open('/x', 'w')\nexcept OSError:\n    w = 'read-only'\n"
    "print(os.getuid(), os.getgid(), f('CapEff'), f('NoNewPrivs'), f('Seccomp'), w)\n")
CONFINED = "65532 65532 0000000000000000 1 2 read-only"


def restricted_namespace(control_plane, name: str) -> str:
    control_plane.kubectl("create", "namespace", name)
    control_plane.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")
    return name


def get_json(control_plane, *args: str) -> dict:
    return json.loads(control_plane.kubectl("get", *args, "-o", "json").stdout)


def pods(control_plane, namespace: str, selector: str) -> list[dict]:
    return [pod for pod in get_json(control_plane, "pods", "-n", namespace, "-l", selector)["items"]
            if not pod["metadata"].get("deletionTimestamp")]


def ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


def one_ready_pod(control_plane, namespace: str, selector: str) -> dict | None:
    found = pods(control_plane, namespace, selector)
    return found[0] if len(found) == 1 and ready(found[0]) else None


def json_lines(text: str) -> list[dict]:
    lines = []
    for line in text.splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def pod_logs(control_plane, namespace: str, pod: str) -> str:
    done = control_plane.kubectl("logs", "-n", namespace, pod, check=False)
    return done.stdout if done.returncode == 0 else ""


def env_of(pod: dict) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env") or []}


def selector_of(policy: str) -> str:
    return ",".join(f"{k}={v}" for k, v in sweeper_selector(policy).items())


@pytest.fixture(scope="module")
def pod_redis():
    """Redis with a password, on the namespace's loopback and on the node's address,
    which pods reach through the CNI bridge's gateway."""
    server = start_redis(["--requirepass", PASSWORD, "--bind", "127.0.0.1", realnode.NODE_IP,
                          "--protected-mode", "no"])
    yield server
    server.stop()


def url_for_pods(server) -> str:
    return f"redis://:{PASSWORD}@{realnode.NODE_IP}:{server.port}/0"


@pytest.fixture(scope="module")
def helm(control_plane, tmp_path_factory) -> Helm:
    return Helm(control_plane, tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="module")
def release(helm, control_plane):
    """The chart, installed as a user would: its operator is a pod of the default image."""
    restricted_namespace(control_plane, RELEASE_NS)
    helm("install", RELEASE, str(CHART), "--namespace", RELEASE_NS, "--wait", f"--timeout={POD_DEADLINE}s")
    yield RELEASE
    helm("uninstall", RELEASE, "--namespace", RELEASE_NS, "--wait", check=False)


def policy_manifest(name: str, queue: str, max_stalled: int) -> str:
    return json.dumps({
        "apiVersion": "queues.emq.dev/v1alpha1", "kind": "StalledPolicy", "metadata": {"name": name},
        "spec": {"queue": queue, "maxStalled": max_stalled, "sweepInterval": "1s", "lanes": [{"name": LANE}],
                 "redis": {"secretRef": {"name": "queue-redis", "key": "url"}}}})


def ready_policy(control_plane, pod_redis, name: str) -> tuple[str, str, dict]:
    """A restricted namespace with the Secret and a policy (maxStalled 1) whose sweeper pod is Ready:
    (namespace, queue, the sweeper pod)."""
    namespace = restricted_namespace(control_plane, f"work-{uuid.uuid4().hex[:6]}")
    queue = f"q-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("apply", "-n", namespace, "-f", "-",
                          input=json.dumps(redis_secret("queue-redis", url_for_pods(pod_redis))))
    control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=policy_manifest(name, queue, 1))
    done = control_plane.kubectl("wait", "-n", namespace, "--for=condition=Ready", f"stalledpolicy/{name}",
                                 f"--timeout={POD_DEADLINE}s", check=False)
    assert done.returncode == 0, done.stderr
    pod = wait_for(lambda: one_ready_pod(control_plane, namespace, selector_of(name)),
                   "the sweeper pod Ready (its readiness probe, run by the kubelet)", timeout=POD_DEADLINE)
    return namespace, queue, pod


def test_the_chart_operator_is_a_real_pod_admitted_restricted_started_and_confined(release, control_plane):
    [pod] = wait_for(lambda: [p for p in pods(control_plane, RELEASE_NS, OPERATOR_SELECTOR) if ready(p)],
                     "the operator pod Ready", timeout=POD_DEADLINE)
    name = pod["metadata"]["name"]
    assert pod["spec"]["nodeName"] == realnode.NODE_NAME
    assert pod["spec"]["containers"][0]["image"] == realnode.imagerecipe.image_reference()
    [status] = pod["status"]["containerStatuses"]
    # started: the kubelet's startup probe of /healthz passed; the liveness probe runs from then on
    assert status["started"] is True and status["ready"] is True and status["restartCount"] == 0
    container = pod["spec"]["containers"][0]
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["status"]["podIP"].startswith(realnode.POD_SUBNET.rsplit(".", 2)[0])

    lines = wait_for(lambda: json_lines(pod_logs(control_plane, RELEASE_NS, name)), "the operator's JSON log lines")
    assert all(isinstance(line, dict) for line in lines)

    inside = control_plane.kubectl("exec", "-n", RELEASE_NS, name, "--", "python3", "-c", SECURITY_PROBE).stdout
    assert inside.strip() == CONFINED


def test_a_policy_runs_its_sweeper_as_a_real_pod_poison_budget_and_replay(release, control_plane, pod_redis):
    namespace, queue, pod = ready_policy(control_plane, pod_redis, "orders")
    assert env_of(pod)["STALLEDPOLICY_MAX_STALLED"] == "1"
    assert PASSWORD not in json.dumps(get_json(control_plane, "deployment", sweeper_name("orders"), "-n", namespace))
    # the URL reached the sweeper through secretKeyRef, resolved by the kubelet
    assert any(e.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == "queue-redis"
               for e in pod["spec"]["containers"][0]["env"])
    inside = control_plane.kubectl("exec", "-n", namespace, pod["metadata"]["name"], "--",
                                   "python3", "-c", SECURITY_PROBE).stdout
    assert inside.strip() == CONFINED
    starts = wait_for(lambda: [line for line in json_lines(pod_logs(control_plane, namespace, pod["metadata"]["name"]))
                               if "sweeper started" in json.dumps(line)],
                      "'sweeper started' in kubectl logs")
    assert starts[0]["max_stalled"] == 1 and starts[0]["queue"] == queue
    assert PASSWORD not in json.dumps(starts)

    # A poison job: claimed, and its worker dies (the lease lapses).
    client = pod_redis.client(password=PASSWORD, decode_responses=True)
    mq, keys = EchoMQ(client, queue), QueueKeys(queue)
    job = mq.enqueue(group=LANE)
    claim = mq.claim(lease_ms=60_000, group_mode="grouped")
    assert claim is not None and claim.id == job
    mq.expire(claim)
    wait_for(lambda: client.zscore(keys.dead, job) is not None, "the sweeper pod to dead-letter the job",
             timeout=POD_DEADLINE)

    def status() -> dict:
        return get_json(control_plane, "stalledpolicy", "orders", "-n", namespace).get("status") or {}

    wait_for(lambda: status().get("deadLetters") == 1, "status.deadLetters 1 (the operator pod read the morgue)",
             timeout=POD_DEADLINE)

    # The budget is raised: the Deployment rolls out a pod with the new budget, the old one goes.
    control_plane.kubectl("patch", "-n", namespace, "stalledpolicy/orders", "--type=merge",
                          "-p", '{"spec":{"maxStalled":3}}')

    def rolled_out() -> dict | None:
        found = pods(control_plane, namespace, selector_of("orders"))
        if len(found) != 1 or not ready(found[0]) or env_of(found[0])["STALLEDPOLICY_MAX_STALLED"] != "3":
            return None
        return found[0]

    new = wait_for(rolled_out, "one Ready sweeper pod with maxStalled 3, the old one gone", timeout=POD_DEADLINE)
    assert new["metadata"]["name"] != pod["metadata"]["name"]
    started = wait_for(lambda: [line for line in json_lines(pod_logs(control_plane, namespace, new["metadata"]["name"]))
                                if "sweeper started" in json.dumps(line)], "the new pod's 'sweeper started'")
    assert started[0]["max_stalled"] == 3

    # A replay brings the job back to its lane.
    control_plane.kubectl("annotate", "-n", namespace, "stalledpolicy/orders", "queues.emq.dev/replay=fix-1")
    wait_for(lambda: client.zscore(keys.lane_pending(LANE), job) is not None, "the job back in its lane",
             timeout=POD_DEADLINE)
    replay = wait_for(lambda: status().get("lastReplay"), "status.lastReplay", timeout=POD_DEADLINE)
    assert replay["token"] == "fix-1" and replay["replayed"] == 1
    wait_for(lambda: status().get("deadLetters") == 0, "status.deadLetters 0", timeout=POD_DEADLINE)
    client.close()


def readyz(pod: dict) -> int:
    """The sweeper's readiness answer, asked from here (inside the namespace) as the kubelet asks it."""
    url = f"http://{pod['status']['podIP']}:9090{READINESS_PATH}"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def test_a_redis_outage_makes_the_sweeper_pod_unready_then_ready_again(release, control_plane, pod_redis):
    namespace, _queue, pod = ready_policy(control_plane, pod_redis, "outage")
    assert readyz(pod) == 200
    pod_redis.stop()
    try:
        wait_for(lambda: readyz(pod) == 503, "the sweeper's /readyz to answer 503", timeout=POD_DEADLINE)
        wait_for(lambda: not ready(get_json(control_plane, "pod", pod["metadata"]["name"], "-n", namespace)),
                 "the kubelet to mark the pod unready", timeout=POD_DEADLINE)
    finally:
        pod_redis.restart()
    back = wait_for(lambda: ready(get_json(control_plane, "pod", pod["metadata"]["name"], "-n", namespace)),
                    "the pod Ready again after Redis is back", timeout=POD_DEADLINE)
    assert back and readyz(pod) == 200
    # the same container throughout: the liveness probe did not restart it for an outage
    current = get_json(control_plane, "pod", pod["metadata"]["name"], "-n", namespace)
    assert current["status"]["containerStatuses"][0]["restartCount"] == 0
    wait_for(lambda: (condition(get_json(control_plane, "stalledpolicy", "outage", "-n", namespace),
                                "RedisReachable") or {}).get("status") == "True",
             "the operator pod to see Redis again (RedisReachable True)", timeout=POD_DEADLINE)


def test_helm_uninstall_removes_the_operator_pod_and_keeps_the_crd(release, helm, control_plane):
    assert pods(control_plane, RELEASE_NS, OPERATOR_SELECTOR)
    helm("uninstall", RELEASE, "--namespace", RELEASE_NS, "--wait", f"--timeout={POD_DEADLINE}s")
    assert control_plane.kubectl("get", "deployment", "-n", RELEASE_NS, "-o", "name").stdout.strip() == ""
    wait_for(lambda: pods(control_plane, RELEASE_NS, OPERATOR_SELECTOR) == [] or None, "the operator pod gone",
             timeout=POD_DEADLINE)
    assert control_plane.kubectl("get", "crd", "stalledpolicies.queues.emq.dev", check=False).returncode == 0
