#!/usr/bin/env python3
"""`make demo` on a real node, where the host allows it (root, network
namespaces, cgroups, overlayfs); `make demo` falls back to the pod runner's
demo (stalledpolicy.devenv.demo) where it does not, after saying why.

    python hack/node/demo.py check    # exit 0 when this host can run a node, else why not
    python hack/node/demo.py up       # what `make demo` runs here
    python hack/node/demo.py status
    python hack/node/demo.py down     # what `make demo-down` runs when a node demo is up

`up` creates a network namespace of our own (realnode.create_namespace) and
starts a keeper process inside it (`serve`, under nsenter), which stays up in
the background: the node (control plane, containerd, kubelet, scheduler),
Redis on the node's address, the chart installed with helm (its operator a
real pod of `make image`'s image), the examples applied in a namespace that
enforces the restricted Pod Security Standard (their sweepers real pods), and
the devenv demo's EchoMQ workload with its poison job. `up` relays its
progress, then shows `kubectl get pods` and `kubectl logs` of a sweeper.
Everything that talks to the node runs inside the namespace; the commands
printed for you start with `nsenter --net=...` for the same reason.

`down` sends the keeper SIGTERM: it tears the node down. Then the namespace
is deleted and whatever was left is swept and reported. State: `.demo-node/`
(or $STALLEDPOLICY_DEMO_NODE_DIR).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import realnode
from realnode import NODE_IP, Node

from stalledpolicy.devenv import demo as devdemo
from stalledpolicy.devenv.controlplane import ensure_binaries, wait_crd_established
from stalledpolicy.devenv.redis_server import start_redis
from stalledpolicy.policy.crd import CRD_NAME

STATE_DIR_ENV = "STALLEDPOLICY_DEMO_NODE_DIR"
STATE_DIR = Path(os.environ.get(STATE_DIR_ENV) or realnode.REPO / ".demo-node")
CHART = realnode.REPO / "charts" / "stalledpolicy-operator"
RELEASE, RELEASE_NS = "demo", "stalledpolicy-system"
READY_LINE, FAILED_LINE = "DEMO READY", "DEMO FAILED"
UP_TIMEOUT_S = 900


def load_state() -> dict | None:
    path = STATE_DIR / "state.json"
    return json.loads(path.read_text()) if path.is_file() else None


def save_state(state: dict) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    (STATE_DIR / "state.json").write_text(json.dumps(state, indent=1))


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def in_namespace(state: dict, *argv: str) -> list[str]:
    return ["nsenter", f"--net={realnode.NETNS_DIR / state['netns']}", "--", *argv]


def kubectl_command(state: dict, *args: str) -> list[str]:
    return in_namespace(state, state["kubectl"], f"--kubeconfig={state['kubeconfig']}", *args)


# --------------------------------------------------------------------------- check, up, status, down


def check() -> int:
    problems = realnode.host_problems()
    if problems:
        print("This host cannot run a real node: " + "; ".join(problems) + ".\n"
              "The demo runs on the pod runner instead: the sweepers are local processes, "
              "not pods (docs/development.md).", file=sys.stderr)
        return 1
    return 0


def up() -> int:
    state = load_state()
    if state is not None:
        if alive(state["keeper"]):
            print(f"The real-node demo is already running (state in {STATE_DIR}).\n")
            show(state)
            return 0
        print(f"Leftovers of an earlier real-node demo in {STATE_DIR}: cleaning them up first.")
        down(quiet=True)
    if check() != 0:
        return 3
    realnode.ensure_packages()
    image = realnode.default_image()
    if not image.is_file():
        print(f"no image {image}: `make image` builds it (make demo does, first)", file=sys.stderr)
        return 2
    netns = f"spdemo{os.getpid()}"
    work = Path(tempfile.mkdtemp(prefix=f"{netns}-"))
    logs = STATE_DIR / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    bin_dir = ensure_binaries()
    state = {"netns": netns, "work": str(work), "sysctls": realnode.read_sysctls(), "keeper": 0,
             "kubeconfig": str(work / "plane" / "kubeconfig"), "kubectl": str(bin_dir / "kubectl"),
             "log": str(logs / "keeper.log")}
    realnode.create_namespace(netns)
    with open(state["log"], "ab") as out:
        keeper = subprocess.Popen(in_namespace(state, sys.executable, str(Path(__file__).resolve()), "serve"),
                                  stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True, cwd=realnode.REPO,
                                  env={**os.environ, "STALLEDPOLICY_DEMO_NODE_STATE": json.dumps(state)})
    state["keeper"] = keeper.pid
    save_state(state)
    print(f"Real node demo: network namespace {netns}; the keeper (pid {keeper.pid}) runs inside it; "
          f"its log is {state['log']}")
    outcome = follow(state, keeper)
    if outcome != READY_LINE:
        print(f"\nThe real-node demo failed ({outcome}). Logs: {logs} and {work}/logs. "
              "Clean up with: make demo-down", file=sys.stderr)
        return 1
    print()
    show(state)
    return 0


def follow(state: dict, keeper: subprocess.Popen) -> str:
    """Relay the keeper's log until it says READY or FAILED, or exits."""
    deadline = time.monotonic() + UP_TIMEOUT_S
    position = 0
    while time.monotonic() < deadline:
        with open(state["log"], errors="replace") as log:
            log.seek(position)
            chunk = log.read()
            position = log.tell()
        for line in chunk.splitlines():
            print(line, flush=True)
            if line.startswith((READY_LINE, FAILED_LINE)):
                return line
        if keeper.poll() is not None:
            return f"the keeper exited {keeper.returncode}"
        time.sleep(0.5)
    return f"not ready after {UP_TIMEOUT_S}s"


def show(state: dict) -> None:
    for args in (("get", "pods", "-A", "-o", "wide"), ("get", "stalledpolicies", "-n", devdemo.NAMESPACE)):
        print(f"$ kubectl {' '.join(args)}")
        print(subprocess.run(kubectl_command(state, *args), capture_output=True, text=True).stdout)
    pods = subprocess.run(kubectl_command(state, "get", "pods", "-n", devdemo.NAMESPACE, "-o", "name"),
                          capture_output=True, text=True).stdout.split()
    if pods:
        print(f"$ kubectl logs -n {devdemo.NAMESPACE} {pods[0]} --tail=3")
        print(subprocess.run(kubectl_command(state, "logs", "-n", devdemo.NAMESPACE, pods[0], "--tail=3"),
                             capture_output=True, text=True).stdout)
    enter = f"sudo nsenter --net={realnode.NETNS_DIR / state['netns']}"
    print(f"""These are real pods: a kubelet ran them through containerd and runc, from the image
`make image` built, in a namespace that enforces the restricted Pod Security Standard.
Everything lives in the network namespace {state['netns']}: run kubectl inside it.

Look around:
  {enter} {state['kubectl']} --kubeconfig={state['kubeconfig']} get pods -A -o wide
  {enter} {state['kubectl']} --kubeconfig={state['kubeconfig']} logs -n {devdemo.NAMESPACE} deploy/emails-sweeper
  {enter} {state['kubectl']} --kubeconfig={state['kubeconfig']} get stalledpolicies -n {devdemo.NAMESPACE} -o wide
  {enter} bash    # a shell inside it, for anything else (KUBECONFIG={state['kubeconfig']})

Keeper log: {state['log']}
Stop everything: make demo-down
""")


def status() -> int:
    state = load_state()
    if state is None:
        print(f"No real-node demo in {STATE_DIR}")
        return 1
    running = alive(state["keeper"])
    print(f"keeper (the node, inside {state['netns']})  {'running' if running else 'NOT running'}  "
          f"pid {state['keeper']}  log {state['log']}")
    if running:
        show(state)
    return 0 if running else 1


def down(quiet: bool = False) -> int:
    state = load_state()
    if state is None:
        if not quiet:
            print(f"No real-node demo in {STATE_DIR}")
        return 0
    say = (lambda text: None) if quiet else print
    pid = state["keeper"]
    if pid and alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 240
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
            say(f"keeper {pid}: killed after 240 s")
        else:
            say("keeper stopped: the node is torn down")
    realnode.delete_namespace(state["netns"])
    work = Path(state["work"])
    node = Node(work, state["netns"], sysctls_before=state["sysctls"])
    left = node.sweep_after()
    for item in left:
        say(f"left behind (swept now): {item}")
    subprocess.run(["rm", "-rf", "--one-file-system", str(work), str(STATE_DIR)], check=False)
    say(f"network namespace {state['netns']} deleted; {STATE_DIR} removed"
        + (f"; {len(left)} things had to be swept" if left else "; nothing was left behind"))
    return 0


# --------------------------------------------------------------------------- the keeper, inside the namespace


class Stop(Exception):
    pass


def _stop(signum: int, _frame: object) -> None:
    raise Stop(signal.Signals(signum).name)


def serve() -> int:
    """The node and the demo on it, until SIGTERM; then teardown."""
    state = json.loads(os.environ["STALLEDPOLICY_DEMO_NODE_STATE"])
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    realnode.NetworkGuard.install(state["netns"])
    progress = devdemo.Progress()
    node = Node(Path(state["work"]), state["netns"], sysctls_before=state["sysctls"])
    redis_server = None
    code = 0
    try:
        with progress.step("real node: control plane, containerd, kubelet, scheduler, images") as note:
            node.start(realnode.default_image(), realnode.node_binaries(), ensure_binaries())
            note(f"node {realnode.NODE_NAME} Ready at {NODE_IP}")
        assert node.plane is not None
        with progress.step("Redis, on the namespace's loopback and the node's address") as note:
            (Path(state["work"]) / "redis").mkdir()
            redis_server = start_redis(["--bind", "127.0.0.1", NODE_IP, "--protected-mode", "no"],
                                       workdir=Path(state["work"]) / "redis")
            pods_url = f"redis://{NODE_IP}:{redis_server.port}/0"
            note(pods_url)
        helm_home = Path(state["work"]) / "helm"
        env = {**node.plane.env(), **{name: str(helm_home / name.lower()) for name in
                                      ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")}}
        with progress.step("helm install: the operator as a real pod (restricted Pod Security)") as note:
            for namespace in (RELEASE_NS, devdemo.NAMESPACE):
                node.kubectl("create", "namespace", namespace)
                node.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
            subprocess.run([str(node.plane.binary("helm")), "install", RELEASE, str(CHART), "--namespace",
                            RELEASE_NS, "--set", f"operator.statusInterval={devdemo.STATUS_INTERVAL}",
                            "--wait", "--timeout=300s"], env=env, check=True, capture_output=True, text=True)
            wait_crd_established(node.plane.kubectl, CRD_NAME)
            note(f"release {RELEASE} in {RELEASE_NS}")
        demo_state = devdemo.DemoState(dir=Path(state["work"]), bin_dir=str(node.plane.bin_dir),
                                       kubeconfig=str(node.kubeconfig), redis_url=pods_url)
        policies = devdemo.example_policies(devdemo.SECRET)
        names = [p["metadata"]["name"] for p in policies]
        with progress.step(f"policies from examples/ ({', '.join(names)}): their sweepers as real pods") as note:
            node.kubectl("apply", "-f", "-", stdin=json.dumps(devdemo.secret_manifest(pods_url)))
            node.kubectl("apply", "-f", "-", stdin="\n---\n".join(json.dumps(p) for p in policies))
            node.kubectl("wait", "-n", devdemo.NAMESPACE, "--for=condition=Ready", "--timeout=300s",
                         *[f"stalledpolicy/{n}" for n in names], timeout=320)
            node.kubectl("wait", "-n", devdemo.NAMESPACE, "--for=condition=Available", "--timeout=300s",
                         "deployment", "--all", timeout=320)
            note("Ready, the sweeper pods Available")
        with progress.step("EchoMQ workload: reaping consumers, some dying mid-job, one poison job") as note:
            summary = devdemo.run_workload(pods_url, progress)
            note(f"{summary['completed']} jobs completed, {summary['deaths']} consumers died; "
                 f"the poison job was claimed {summary['poison_claims']}x before the morgue")
        with progress.step("policy status, written by the operator pod"):
            devdemo._wait_for_dead_column(demo_state)
        print(READY_LINE, flush=True)
        while True:
            signal.pause()
    except Stop as stop:
        progress.line(f"{stop}: tearing the node down")
    except (realnode.NodeError, devdemo.DemoError, subprocess.CalledProcessError, OSError, RuntimeError) as exc:
        detail = getattr(exc, "stderr", "") or ""
        print(f"{FAILED_LINE}: {exc} {detail}".strip(), flush=True)
        code = 1
        try:
            while True:  # stay up for a look: make demo-down tears it down
                signal.pause()
        except Stop:
            pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        left = node.teardown()
        if redis_server is not None:
            redis_server.stop()
        progress.line(f"teardown: {'nothing was left' if not left else left}")
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="make demo on a real node")
    parser.add_argument("command", choices=("check", "up", "status", "down", "serve"))
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve()
    realnode.NetworkGuard.install(None)  # the host's namespace: loopback only
    return {"check": check, "up": up, "status": status, "down": down}[args.command]()


if __name__ == "__main__":
    sys.exit(main())
