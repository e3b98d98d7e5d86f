"""The local demo: the product's main job on the local control plane, in one command.

    python -m stalledpolicy.devenv.demo up       # what `make demo` runs
    python -m stalledpolicy.devenv.demo status
    python -m stalledpolicy.devenv.demo down     # what `make demo-down` runs

``up`` starts the control plane (etcd, kube-apiserver, kube-controller-manager),
a local Redis, installs the StalledPolicy CRD, starts the operator and the pod
runner (which plays the kubelet for the sweeper pods) in the background,
applies the examples pointed at the local Redis, and runs an EchoMQ workload
with EchoMQ's consumer loop as the model runs it (devenv/consumers.py): each
consumer reaps lapsed leases uncounted on every loop, as EchoMQ's do, claims and
completes, some die mid-job and restart at once, and one poison job kills every
consumer that claims it. It ends by showing
``kubectl get stalledpolicies`` with the poison job (and the lane's casualties)
counted under DEAD.

Everything lives in one state directory (``.demo/`` in a source checkout,
else ``~/.cache/stalledpolicy/demo``; ``--state-dir`` or
``$STALLEDPOLICY_DEMO_DIR`` to move it): pids in ``demo.json``, logs in
``logs/``. ``down`` stops every process it recorded (and their children) and
removes the directory.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import yaml

from stalledpolicy.devenv.consumers import COMPLETE, DIE, ConsumerPool, Handler, die_on
from stalledpolicy.devenv.controlplane import ControlPlane, ControlPlaneError, ensure_binaries, wait_crd_established
from stalledpolicy.devenv.echomq import EchoMQ
from stalledpolicy.devenv.ports import free_port
from stalledpolicy.devenv.redis_server import redis_server_binary
from stalledpolicy.engine import queue_snapshot
from stalledpolicy.keyspace import QueueKeys
from stalledpolicy.policy.crd import CRD_NAME, crd_path

REPO = Path(__file__).resolve().parents[3]
STATE_DIR_ENV = "STALLEDPOLICY_DEMO_DIR"
NAMESPACE = "demo"
SECRET = "demo-redis"
SWEEP_INTERVAL = "2s"
STATUS_INTERVAL = "2s"
LEASE_MS = 3_000
CONSUMERS_PER_QUEUE = 4
WORKLOAD_TIMEOUT_S = 150.0

# queue -> lanes the workload enqueues into (None = the flat queue)
FLAT_QUEUE = "emails"
LANED_QUEUE = "tenants"
LANES = ("imports", "billing", "analytics")


def default_state_dir() -> Path:
    override = os.environ.get(STATE_DIR_ENV)
    if override:
        return Path(override)
    if (REPO / "pyproject.toml").is_file() and (REPO / "examples").is_dir():
        return REPO / ".demo"
    return Path.home() / ".cache" / "stalledpolicy" / "demo"


# --------------------------------------------------------------------------- progress


class Progress:
    """Step lines with the seconds elapsed since ``up`` began."""

    def __init__(self, out=sys.stdout) -> None:
        self.started = time.monotonic()
        self.out = out

    def line(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {text}", file=self.out, flush=True)

    @contextmanager
    def step(self, text: str) -> Iterator[Callable[[str], None]]:
        began = time.monotonic()
        self.line(f"{text} ...")
        details: list[str] = []
        yield details.append
        took = time.monotonic() - began
        suffix = f": {details[-1]}" if details else ""
        self.line(f"{text}: done in {took:.1f}s{suffix}")


class DemoError(Exception):
    pass


# --------------------------------------------------------------------------- processes


@dataclass
class Proc:
    """A background process of the demo, recognised by its pid and start time
    (a recycled pid has another start time, so it is never signalled)."""

    name: str
    pid: int
    started: int  # /proc/<pid>/stat field 22, clock ticks since boot
    log: str

    def alive(self) -> bool:
        stat = _stat_of(self.pid)
        return stat is not None and stat[0] != "Z" and int(stat[19]) == self.started

    def children(self) -> list[int]:
        return [pid for pid in _all_pids() if (_stat_of(pid) or [None, None])[1] == str(self.pid)]

    def stop(self, grace: float = 20.0) -> bool:
        """SIGTERM, then SIGKILL after ``grace`` seconds; True if it had to be killed."""
        if not self.alive():
            return False
        os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
            while self.alive():
                time.sleep(0.05)
            return True
        return False

    @classmethod
    def of(cls, name: str, pid: int, log: str = "") -> Proc | None:
        stat = _stat_of(pid)
        return None if stat is None else cls(name=name, pid=pid, started=int(stat[19]), log=log)


def _stat_of(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name: [state, ppid, ...]."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
        return None


def _all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _environ_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


def spawn(name: str, argv: list[str], log: Path, env: dict[str, str] | None = None) -> Proc:
    """Start ``argv`` in its own session (it outlives this command), output to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True, env=env, cwd=log.parent)
    proc = Proc.of(name, process.pid, str(log))
    if proc is None:
        raise DemoError(f"{name} exited at once; see {log}:\n{_tail(str(log))}")
    return proc


# --------------------------------------------------------------------------- state


@dataclass
class DemoState:
    dir: Path
    plane_dir: str = ""
    bin_dir: str = ""
    kubeconfig: str = ""
    redis_url: str = ""
    operator_metrics: str = ""  # the operator's /metrics URL
    processes: dict[str, Proc] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.dir / "demo.json"

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    def save(self) -> None:
        record = {"plane_dir": self.plane_dir, "bin_dir": self.bin_dir, "kubeconfig": self.kubeconfig,
                  "redis_url": self.redis_url, "operator_metrics": self.operator_metrics,
                  "processes": {k: vars(p) for k, p in self.processes.items()}}
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(record, indent=2))

    @classmethod
    def load(cls, directory: Path) -> DemoState | None:
        path = directory / "demo.json"
        if not path.is_file():
            return None
        record = json.loads(path.read_text())
        return cls(dir=directory, plane_dir=record["plane_dir"], bin_dir=record["bin_dir"],
                   kubeconfig=record["kubeconfig"], redis_url=record["redis_url"],
                   operator_metrics=record.get("operator_metrics", ""),
                   processes={k: Proc(**p) for k, p in record["processes"].items()})

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        env = {**os.environ, "KUBECONFIG": self.kubeconfig}
        done = subprocess.run([str(Path(self.bin_dir) / "kubectl"), *args], env=env, input=input,
                              capture_output=True, text=True)
        if check and done.returncode != 0:
            raise DemoError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done


# --------------------------------------------------------------------------- the manifests


def example_policies(redis_secret: str) -> list[dict]:
    """The repository's examples, in the demo namespace, pointed at the local Redis,
    sweeping every 2s so the demo moves fast."""
    policies = []
    for name in ("flat-queue.yaml", "lanes.yaml", "suspended.yaml"):
        for doc in yaml.safe_load_all((REPO / "examples" / name).read_text()):
            if not doc or doc.get("kind") != "StalledPolicy":
                continue
            doc["metadata"]["namespace"] = NAMESPACE
            doc["spec"]["redis"] = {"secretRef": {"name": redis_secret, "key": "url"}}
            doc["spec"]["sweepInterval"] = SWEEP_INTERVAL
            policies.append(doc)
    return policies


def secret_manifest(url: str) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": SECRET, "namespace": NAMESPACE}, "stringData": {"url": url}}


# --------------------------------------------------------------------------- the workload


POISON_PAYLOAD = '{"kind":"report","poison":true}'


def is_poison(claim) -> bool:
    return '"poison":true' in claim.payload


def flaky_worker(die_rate: float, seed: int) -> Handler:
    """A consumer's handler: it crashes holding the lease on the poison job, or by
    bad luck with probability ``die_rate`` per job (an OOM kill, a node going
    away); otherwise it works a few ms and completes."""
    rng, lock = random.Random(seed), threading.Lock()

    def otherwise(claim) -> str:
        with lock:
            unlucky, pause = rng.random() < die_rate, rng.uniform(0.005, 0.05)
        if unlucky:
            return DIE
        time.sleep(pause)
        return COMPLETE

    return die_on(is_poison, otherwise)


def run_workload(redis_url: str, progress: Progress) -> dict[str, Any]:
    """Seed both queues and serve them with EchoMQ's consumer loop as the model
    runs it (devenv/consumers.py: each loop reaps lapsed leases uncounted, as
    EchoMQ's do; a crashed consumer restarts at once), until the work is done and
    the poison job is in the morgue; returns numbers for the summary."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    flat, laned = EchoMQ(client, FLAT_QUEUE), EchoMQ(client, LANED_QUEUE)
    enqueued = len(flat.enqueue_many(300, payload='{"kind":"email"}'))
    poison = flat.enqueue(POISON_PAYLOAD)
    enqueued += 1
    for lane in LANES:
        enqueued += len(laned.enqueue_many(80, group=lane, payload=json.dumps({"kind": lane})))
    progress.line(f"workload: {enqueued} jobs enqueued ({FLAT_QUEUE}: 300 + 1 poison; "
                  f"{LANED_QUEUE}: 80 in each lane {', '.join(LANES)})")

    def connect():
        return redis.Redis.from_url(redis_url, decode_responses=True)

    pools = [
        ConsumerPool(connect, FLAT_QUEUE, flaky_worker(0.03, seed=1), CONSUMERS_PER_QUEUE,
                     lease_ms=LEASE_MS, claim_mode="flat"),
        ConsumerPool(connect, LANED_QUEUE, flaky_worker(0.04, seed=2), CONSUMERS_PER_QUEUE,
                     lease_ms=LEASE_MS, claim_mode="grouped"),
    ]

    def settled() -> tuple[bool, str]:
        a = queue_snapshot(client, FLAT_QUEUE)
        b = queue_snapshot(client, LANED_QUEUE, LANES)
        b_pending = b.pending + sum(lane.pending for lane in b.lanes)
        stalls = int(client.hget(QueueKeys(FLAT_QUEUE).job(poison), "stalled") or 0)
        in_morgue = client.zscore(QueueKeys(FLAT_QUEUE).dead, poison) is not None
        totals = [pool.stats.totals() for pool in pools]
        poison_claims = pools[0].stats.snapshot().claims[poison]
        text = (f"workload: {sum(t['completions'] for t in totals)} completed, "
                f"{sum(t['deaths'] for t in totals)} consumer deaths, "
                f"{sum(t['reaped'] for t in totals)} lapsed leases reaped by the consumers; "
                f"poison claimed {poison_claims}x, stalled {stalls}x; "
                f"{FLAT_QUEUE} pending {a.pending} active {a.active} dead {a.dead}, "
                f"{LANED_QUEUE} pending {b_pending} active {b.active} dead {b.dead}")
        done = in_morgue and a.pending == a.active == 0 and b_pending == b.active == 0
        return done, text

    for pool in pools:
        pool.start()
    deadline = time.monotonic() + WORKLOAD_TIMEOUT_S
    last_print = 0.0
    try:
        while True:
            done, text = settled()
            now = time.monotonic()
            if done or now >= deadline:
                progress.line(text)
                break
            if now - last_print >= 5.0:
                progress.line(text)
                last_print = now
            time.sleep(0.5)
    finally:
        for pool in pools:
            pool.stop()
    if not done:
        raise DemoError(f"the workload did not settle in {WORKLOAD_TIMEOUT_S:.0f}s ({text})")
    client.close()
    totals = [pool.stats.totals() for pool in pools]
    return {"poison": poison, "completed": sum(t["completions"] for t in totals),
            "deaths": sum(t["deaths"] for t in totals),
            "poison_claims": pools[0].stats.snapshot().claims[poison]}


# --------------------------------------------------------------------------- up


def _wait_http(url: str, proc: Proc, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise DemoError(f"{proc.name} exited; see {proc.log}:\n{_tail(proc.log)}")
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise DemoError(f"{proc.name} not answering on {url} after {timeout:.0f}s; see {proc.log}")


def _tail(path: str, lines: int = 20) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def _start_redis(state: DemoState) -> Proc:
    workdir = state.dir / "redis"
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(workdir), "--daemonize", "no"]
    proc = spawn("redis", argv, state.logs / "redis.log")
    probe = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.2)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if not proc.alive():
            raise DemoError(f"redis-server exited; see {proc.log}:\n{_tail(proc.log)}")
        try:
            probe.ping()
            state.redis_url = f"redis://127.0.0.1:{port}/0"
            return proc
        except redis.ConnectionError:
            time.sleep(0.05)
    raise DemoError(f"redis-server not answering on port {port}")


def _python_child_env() -> dict[str, str]:
    # The demo's own settings must not leak into the operator's (it reads STALLEDPOLICY_OPERATOR_*).
    env = {k: v for k, v in os.environ.items() if not k.startswith("STALLEDPOLICY_") and k != "KUBECONFIG"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def up(state_dir: Path) -> int:
    previous = DemoState.load(state_dir)
    if previous is not None:
        if all(p.alive() for p in previous.processes.values()) and _plane_running(previous):
            print(f"The demo is already running (state in {state_dir}).\n")
            show(previous)
            print(footer(previous))
            return 0
        print(f"Leftovers of an earlier demo in {state_dir}: stopping them first.")
        down(state_dir, quiet=True)
    elif state_dir.exists():
        down(state_dir, quiet=True)  # a half-started demo: start from a clean directory

    progress = Progress()
    state = DemoState(dir=state_dir)
    state.logs.mkdir(parents=True, exist_ok=True)
    try:
        with progress.step("control-plane binaries (built once into ~/.cache/stalledpolicy)") as note:
            bin_dir = ensure_binaries()
            state.bin_dir = str(bin_dir)
            note(str(bin_dir))
        with progress.step("control plane: etcd, kube-apiserver, kube-controller-manager") as note:
            plane = ControlPlane(state_dir=state_dir / "plane", bin_dir=bin_dir, detached=True).start()
            state.plane_dir, state.kubeconfig = str(plane.state_dir), str(plane.kubeconfig)
            state.save()
            note(plane.server_url)
        with progress.step("Redis") as note:
            state.processes["redis"] = _start_redis(state)
            state.save()
            note(state.redis_url)
        with progress.step("StalledPolicy CRD") as note:
            state.kubectl("apply", "--server-side", "-f", str(crd_path()))
            wait_crd_established(state.kubectl, CRD_NAME)
            state.kubectl("create", "namespace", NAMESPACE)
            # So that a plain `kubectl get stalledpolicies` with this kubeconfig shows the demo's.
            state.kubectl("config", "set-context", "--current", f"--namespace={NAMESPACE}")
            state.kubectl("apply", "-f", "-", input=json.dumps(secret_manifest(state.redis_url)))
            note(f"namespace {NAMESPACE}, Secret {SECRET} holding the Redis URL")
        with progress.step("operator and pod runner (background processes)") as note:
            liveness = f"http://127.0.0.1:{free_port()}/healthz"
            metrics_port = free_port()
            state.operator_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
            state.processes["operator"] = spawn("operator", [
                sys.executable, "-m", "stalledpolicy", "operator", "--kubeconfig", state.kubeconfig,
                "--namespace", NAMESPACE, "--sweeper-image", "stalledpolicy:demo",
                "--status-interval", STATUS_INTERVAL, "--max-backoff", "10s", "--liveness", liveness,
                "--metrics-port", str(metrics_port), "--metrics-address", "127.0.0.1",
            ], state.logs / "operator.log", env=_python_child_env())
            state.processes["podrunner"] = spawn("podrunner", [
                sys.executable, "-m", "stalledpolicy.devenv.podrunner", "--kubeconfig", state.kubeconfig,
                "--namespace", NAMESPACE, "--log-dir", str(state.logs / "pods"), "--poll-interval", "0.5",
            ], state.logs / "podrunner.log", env=_python_child_env())
            state.save()
            _wait_http(liveness, state.processes["operator"], timeout=60)
            note(f"logs in {state.logs}")
        policies = example_policies(SECRET)
        names = [p["metadata"]["name"] for p in policies]
        with progress.step(f"policies from examples/ ({', '.join(names)}), sweeping every {SWEEP_INTERVAL}") as note:
            state.kubectl("apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(p) for p in policies))
            done = state.kubectl("wait", "-n", NAMESPACE, "--for=condition=Ready", "--timeout=120s",
                                 *[f"stalledpolicy/{n}" for n in names], check=False)
            if done.returncode != 0:
                raise DemoError(f"policies not Ready: {done.stderr.strip()}\n"
                                f"operator log {state.processes['operator'].log}:\n"
                                f"{_tail(state.processes['operator'].log)}")
            note("Ready (sweepers running)")
        with progress.step(f"EchoMQ workload: {2 * CONSUMERS_PER_QUEUE} reaping consumers, some dying mid-job, "
                           "one poison job") as note:
            summary = run_workload(state.redis_url, progress)
            note(f"{summary['completed']} jobs completed, {summary['deaths']} consumers died; "
                 f"the poison job was claimed {summary['poison_claims']}x before the morgue")
        with progress.step("policy status (the operator reads each queue every "
                           f"{STATUS_INTERVAL})"):
            _wait_for_dead_column(state)
    except (DemoError, ControlPlaneError) as exc:
        progress.line(f"FAILED: {exc}")
        print(f"\nLogs: {state.logs}. Stop what was started with: make demo-down", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        progress.line("interrupted; stopping what was started")
        down(state_dir, quiet=True)
        return 130
    print()
    show(state)
    print(footer(state, workload_ran=True))
    return 0


def _plane_running(state: DemoState) -> bool:
    try:
        return ControlPlane.attach(Path(state.plane_dir)).running()
    except (ControlPlaneError, OSError, KeyError):
        return False


def _policies(state: DemoState) -> list[dict]:
    done = state.kubectl("get", "stalledpolicies", "-n", NAMESPACE, "-o", "json")
    return json.loads(done.stdout)["items"]


def _wait_for_dead_column(state: DemoState, timeout: float = 60.0) -> None:
    """Until the status shows what Redis holds: the morgue of every swept queue."""
    client = redis.Redis.from_url(state.redis_url, decode_responses=True)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            items = _policies(state)
            shown = {p["spec"]["queue"]: (p.get("status") or {}).get("deadLetters") for p in items}
            truth = {q: client.zcard(QueueKeys(q).dead) for q in shown}
            if shown.get(FLAT_QUEUE) and all(shown[q] == truth[q] for q in shown):
                return
            time.sleep(0.5)
    finally:
        client.close()
    raise DemoError(f"status.deadLetters not up to date after {timeout:.0f}s: shown {shown}, in Redis {truth}")


# --------------------------------------------------------------------------- status, footer


def show(state: DemoState) -> None:
    for extra in ((), ("-o", "wide")):
        command = " ".join(("kubectl get stalledpolicies -n", NAMESPACE, *extra))
        print(f"$ {command}")
        print(state.kubectl("get", "stalledpolicies", "-n", NAMESPACE, *extra).stdout)


def sweeper_metrics_urls(state: DemoState) -> dict[str, str]:
    """Policy -> the metrics URL of its sweeper process (the pod runner moved the port)."""
    runner = state.processes.get("podrunner")
    if runner is None or not runner.alive():
        return {}
    urls = {}
    for pid in runner.children():
        env = _environ_of(pid)
        policy, port = env.get("STALLEDPOLICY_POLICY"), env.get("STALLEDPOLICY_METRICS_PORT")
        if policy and port:
            urls[policy.split("/", 1)[-1]] = f"http://127.0.0.1:{port}/metrics"
    return dict(sorted(urls.items()))


def footer(state: DemoState, *, workload_ran: bool = False) -> str:
    """What to look at next; ``workload_ran``: just after the demo's workload (what
    it did is told then only: after an edit or a replay it no longer holds)."""
    # The package's own command, on the PATH exported below (the events name it bare).
    cli_dir = Path(sys.executable).parent
    path_dirs = [str(state.bin_dir)] + ([str(cli_dir)] if (cli_dir / "stalledpolicy").is_file() else [])
    metrics = sweeper_metrics_urls(state)
    metrics_lines = "\n".join(f"  curl -s {url} | grep ^stalledpolicy_   # sweeper of {policy}"
                              for policy, url in metrics.items()) or "  (no sweeper running)"
    operator_metrics_line = (f"Operator metrics:\n  curl -s {state.operator_metrics} | grep ^stalledpolicy_operator_"
                             if state.operator_metrics else "")
    story = """
The poison job killed every consumer that claimed it. The consumers reap lapsed
leases on every loop, as EchoMQ's do; the sweeper held each of the poison job's
leases in its last moments, counted the stall on the job at its deadline, and at
the budget (emails: maxStalled 3) moved it to the morgue. In the tenants queue, the imports lane (maxStalled 1) dead-letters at
the first stall, billing (maxStalled 0) never does.
""" if workload_ran else ""
    return f"""{story}
Look around:
  export KUBECONFIG={state.kubeconfig}
  export PATH={":".join(path_dirs)}:$PATH
  kubectl get stalledpolicies -n {NAMESPACE} -o wide
  kubectl describe stalledpolicy {FLAT_QUEUE} -n {NAMESPACE}      # conditions and events (DeadLettered)
  kubectl get deployments,pods -n {NAMESPACE}                # one sweeper per policy
  stalledpolicy morgue list --redis-url {state.redis_url} --queue {FLAT_QUEUE}
  stalledpolicy morgue stats --redis-url {state.redis_url} --queue {LANED_QUEUE}
  kubectl annotate --overwrite stalledpolicy {FLAT_QUEUE} -n {NAMESPACE} queues.emq.dev/replay=$(date +%s)   # replay the morgue

Sweeper metrics (a sweeper's port changes when it rolls out, after an edit of its
policy: make demo-status prints the current ones):
{metrics_lines}
{operator_metrics_line}

Logs: {state.logs} (operator.log, podrunner.log, pods/<pod>.log)
Stop everything: make demo-down
"""


def status(state_dir: Path) -> int:
    state = DemoState.load(state_dir)
    if state is None:
        print(f"No demo in {state_dir} (start one with: make demo)")
        return 1
    plane = _plane_running(state)
    print(f"control plane  {'running' if plane else 'NOT running'}  ({state.plane_dir})")
    for name, proc in state.processes.items():
        print(f"{name:<14} {'running' if proc.alive() else 'NOT running'}  pid {proc.pid}  log {proc.log}")
    print()
    down_parts = [name for name, proc in state.processes.items() if not proc.alive()]
    if plane:
        show(state)
    if not plane or down_parts:
        # The table above may still look healthy (statuses are last written values).
        print(f"The demo is broken: {', '.join(([] if plane else ['control plane']) + down_parts)} "
              "not running; the logs above say why. Start again: make demo-down && make demo")
        return 1
    print(footer(state))
    return 0


# --------------------------------------------------------------------------- down


def down(state_dir: Path, quiet: bool = False) -> int:
    state = DemoState.load(state_dir)
    if state is None:
        # An `up` that died before recording itself may still have left a control plane.
        orphan_plane = state_dir / "plane"
        if (orphan_plane / "plane.json").is_file():
            try:
                ControlPlane.attach(orphan_plane).stop()
            except ControlPlaneError:
                pass
        if state_dir.exists():
            shutil.rmtree(state_dir, ignore_errors=True)
        if not quiet:
            print(f"No demo running (nothing recorded in {state_dir}).")
        return 0
    say = (lambda text: None) if quiet else print
    # The pod runner stops the sweepers it started; any it could not stop are
    # stopped here, found by their parent before the runner goes.
    runner = state.processes.get("podrunner")
    sweepers = [Proc.of("sweeper", pid) for pid in
                (runner.children() if runner is not None and runner.alive() else [])]
    for name in ("operator", "podrunner"):
        proc = state.processes.get(name)
        if proc is not None and proc.alive():
            killed = proc.stop()
            say(f"{name} stopped{' (killed after the grace period)' if killed else ''}")
    for sweeper in sweepers:
        if sweeper is not None and sweeper.alive():
            sweeper.stop(grace=5)
            say(f"sweeper pid {sweeper.pid} stopped")
    redis_proc = state.processes.get("redis")
    if redis_proc is not None and redis_proc.alive():
        redis_proc.stop()
        say("Redis stopped")
    if state.plane_dir and Path(state.plane_dir).exists():
        try:
            ControlPlane.attach(Path(state.plane_dir)).stop()
            say("control plane stopped")
        except ControlPlaneError:
            pass
    shutil.rmtree(state_dir, ignore_errors=True)
    say(f"{state_dir} removed")
    return 0


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stalledpolicy.devenv.demo",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--state-dir", type=Path, default=None,
                        help=f"pids, logs and the control plane's state (default {default_state_dir()}; "
                             f"env {STATE_DIR_ENV})")
    args = parser.parse_args(argv)
    state_dir = (args.state_dir or default_state_dir()).resolve()
    if args.command == "up":
        return up(state_dir)
    if args.command == "status":
        return status(state_dir)
    return down(state_dir)


if __name__ == "__main__":
    sys.exit(main())
