#!/usr/bin/env python3
"""A real node, once, end to end (issue 22, step 2; not run by `make test`).

Run as root: python3 hack/node/smoke.py [--keep SECONDS]

1. A network namespace of our own (`spnode<pid>`) with a veth pair whose two
   ends are both inside it (this kernel has no dummy links): the node's address
   is 10.213.0.1. This process enters it (setns) before it starts anything, so
   every server and every client below (the control plane, containerd, the
   kubelet, the scheduler, kubectl) is inside it. Nothing is ever addressed
   from the host's namespace.
2. The control plane (stalledpolicy.devenv.controlplane) on the namespace's
   loopback; kube-scheduler; Debian's containerd (CRI, runc, restrict_oom_score_adj)
   with Debian's CNI plugins (a bridge with a /24 for pods, no masquerade, no
   way out); the kubelet (cgroup v1 allowed, cgroupfs, its cgroups under a
   root of its own), every state directory in one temporary directory.
3. The pause image (hack/node/pause_image.py) and the product's image (`make
   image`) are imported into containerd; the node must register Ready.
4. A pod of the product's image in a namespace that enforces the restricted
   Pod Security Standard, the sweeper's security context: it must run, and
   `kubectl logs` must show uid 65532, no capabilities, no_new_privs and
   seccomp.
5. Teardown: the pod deleted, the kubelet, the scheduler, containerd (its
   shims) and the control plane stopped, then whatever is left is swept and
   reported: mounts under the state directory, pod network namespaces,
   processes, cgroups, the three sysctls the kubelet changes (restored), and
   the network namespace itself.

Binaries: the control plane's (hack/control-plane/build.sh, or
$STALLEDPOLICY_K8S_BIN), the node's (hack/node/build.sh), Debian's containerd,
runc, containernetworking-plugins and iptables (installed when missing).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "operator"))
sys.path.insert(0, str(REPO / "hack" / "image"))
sys.path.insert(0, str(HERE))

import imagerecipe  # noqa: E402
import pause_image  # noqa: E402

from stalledpolicy.devenv import controlplane  # noqa: E402

NODE_IP = "10.213.0.1"
POD_SUBNET = "10.213.1.0/24"
NODE_NAME = "spnode"
SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
CLONE_NEWNET = 0x40000000
DEBIAN = {"containerd": "containerd", "runc": "runc", "/usr/lib/cni/bridge": "containernetworking-plugins",
          "iptables": "iptables"}

_t0 = time.monotonic()


def log(message: str) -> None:
    print(f"node [{time.monotonic() - _t0:6.1f}s]: {message}", file=sys.stderr, flush=True)


class NodeError(RuntimeError):
    pass


def sh(*argv: str, check: bool = True, capture: bool = True, timeout: float = 120) -> str:
    done = subprocess.run(list(argv), capture_output=capture, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise NodeError(f"{' '.join(argv)} exited {done.returncode}: {(done.stderr or '')[-600:]}")
    return done.stdout if capture else ""


def setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise NodeError(f"setns {path}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def mounts_under(*prefixes: str) -> list[str]:
    found = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            point = line.split()[4]
            if any(point == p or point.startswith(p.rstrip("/") + "/") for p in prefixes):
                found.append(point)
    return found


def processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


class Node:
    def __init__(self, work: Path, netns: str):
        self.work = work
        self.netns = netns
        self.procs: dict[str, subprocess.Popen] = {}
        self.plane: controlplane.ControlPlane | None = None
        self.sysctls = {name: Path("/proc/sys", name).read_text().strip() for name in SYSCTLS}
        self.host_netns_before = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
        self.cgroup_root = f"/stalledpolicy-{netns}"
        # paths containerd (shim sockets, fifos) and the kubelet (device plugins) use whatever
        # their configured directories: removed at teardown when they were not there before
        self.fixed_dirs = [p for p in (Path("/run/containerd"), Path("/var/lib/kubelet")) if not p.exists()]
        self.sock = work / "containerd" / "containerd.sock"
        self.kubeconfig: Path | None = None

    # -- start -------------------------------------------------------------------
    def spawn(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        logs = self.work / "logs"
        logs.mkdir(exist_ok=True)
        with open(logs / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=env)
        self.procs[name] = proc
        return proc

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self.work / "logs" / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def network(self) -> None:
        ns = self.netns
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "link", "add", "spn0", "type", "veth", "peer", "name", "spn1")
        sh("ip", "-n", ns, "addr", "add", f"{NODE_IP}/24", "dev", "spn0")
        sh("ip", "-n", ns, "link", "set", "spn0", "up")
        sh("ip", "-n", ns, "link", "set", "spn1", "up")
        setns(f"/run/netns/{ns}")
        log(f"network namespace {ns}: node address {NODE_IP} (veth, both ends inside); this process is in it")

    def control_plane(self, bin_dir: Path) -> None:
        self.plane = controlplane.ControlPlane(state_dir=self.work / "plane", bin_dir=bin_dir).start()
        self.kubeconfig = self.plane.kubeconfig
        log(f"control plane: {self.plane.server_url} (inside the namespace)")

    def containerd(self) -> None:
        d = self.work / "containerd"
        cni = self.work / "cni"
        cni.mkdir()
        (cni / "10-spnode.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": "spnode",
            "plugins": [
                {"type": "bridge", "bridge": "spcni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ]}))
        d.mkdir()
        (d / "config.toml").write_text(f"""version = 2
root = "{d}/root"
state = "{d}/state"
[grpc]
  address = "{self.sock}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image.TAG}"
  # root here lacks CAP_SYS_RESOURCE: without this, the pause container's
  # oom_score_adj -998 fails every sandbox
  restrict_oom_score_adj = true
  disable_tcp_service = true
  netns_mounts_under = "{self.work}/netns"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
""")
        self.spawn("containerd", ["containerd", "--config", str(d / "config.toml")])
        deadline = time.monotonic() + 30
        while not self.sock.exists():
            if self.procs["containerd"].poll() is not None or time.monotonic() > deadline:
                raise NodeError(f"containerd did not start:\n{self.log_tail('containerd')}")
            time.sleep(0.2)
        log("containerd: up")

    def ctr(self, *args: str, timeout: float = 300) -> str:
        return sh("ctr", "--address", str(self.sock), "--namespace", "k8s.io", *args, timeout=timeout)

    def images(self, image: Path) -> None:
        pause = pause_image.build(self.work / "pause.tar")
        t = time.monotonic()
        self.ctr("images", "import", str(pause))
        self.ctr("images", "import", str(image))
        log(f"images imported in {time.monotonic() - t:.1f}s: {pause_image.TAG}, {imagerecipe.image_reference()}")

    def kubelet(self, node_bin: Path) -> None:
        kubelet_dir = self.work / "kubelet"
        kubelet_dir.mkdir()
        # the kubelet's cgroup root must exist in every v1 hierarchy (removed at teardown)
        for controller in Path("/sys/fs/cgroup").iterdir():
            if controller.name == "unified" or not (controller / "cgroup.procs").exists():
                continue
            root = controller / self.cgroup_root.lstrip("/")
            root.mkdir(exist_ok=True)
            if controller.name == "cpuset":
                for name in ("cpuset.cpus", "cpuset.mems"):
                    (root / name).write_text((controller / name).read_text())
        (self.work / "resolv.conf").write_text("")
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,  # this host is cgroup v1 (hybrid); 1.37 refuses it by default
            "cgroupDriver": "cgroupfs",  # PID 1 is not systemd
            "cgroupRoot": self.cgroup_root,
            "containerRuntimeEndpoint": f"unix://{self.sock}",
            "address": NODE_IP,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(self.plane.pki.ca_cert)}},
            "authorization": {"mode": "AlwaysAllow"},
            "failSwapOn": False,
            "resolvConf": str(self.work / "resolv.conf"),
            "enforceNodeAllocatable": [],
            "podLogsDir": str(self.work / "pod-logs"),
            "podCIDR": POD_SUBNET,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
        }
        (kubelet_dir / "config.json").write_text(json.dumps(config, indent=1))
        self.spawn("kubelet", [str(node_bin / "kubelet"), f"--config={kubelet_dir / 'config.json'}",
                               f"--kubeconfig={self.kubeconfig}", f"--hostname-override={NODE_NAME}",
                               f"--node-ip={NODE_IP}", f"--root-dir={kubelet_dir}",
                               f"--cert-dir={kubelet_dir / 'pki'}", "--v=1"])
        self.spawn("kube-scheduler", [str(node_bin / "kube-scheduler"), f"--kubeconfig={self.kubeconfig}",
                                      f"--authentication-kubeconfig={self.kubeconfig}",
                                      f"--authorization-kubeconfig={self.kubeconfig}",
                                      "--bind-address=127.0.0.1", "--secure-port=0", "--leader-elect=false"])

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None, timeout: float = 60) -> str:
        done = subprocess.run([str(self.plane.binary("kubectl")), f"--kubeconfig={self.kubeconfig}", *args],
                              input=stdin, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise NodeError(f"kubectl {' '.join(args)}: {done.stderr.strip()[-600:]}")
        return done.stdout

    def wait(self, what: str, test, timeout: float, tail: str = "kubelet") -> float:
        start = time.monotonic()
        while True:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise NodeError(f"{name} exited {proc.returncode} while waiting for {what}:\n{self.log_tail(name)}")
            if test():
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise NodeError(f"{what}: not after {timeout:.0f}s\n{self.log_tail(tail, 25)}")
            time.sleep(1)

    def node_ready(self) -> bool:
        out = self.kubectl("get", "node", NODE_NAME, "-o",
                           "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False)
        return out.strip() == "True"

    def smoke_pod(self) -> dict:
        image = imagerecipe.image_reference()
        probe = ("import os, time\n"
                 "s = open('/proc/self/status').read()\n"
                 "f = lambda k: s.split(k + ':')[1].split()[0]\n"
                 "w = 'writable'\n"
                 "try:\n    open('/x', 'w')\nexcept OSError:\n    w = 'read-only'\n"
                 "print('uid', os.getuid(), 'gid', os.getgid(), 'CapEff', f('CapEff'), 'NoNewPrivs', f('NoNewPrivs'),"
                 " 'Seccomp', f('Seccomp'), 'root', w, flush=True)\n"
                 "time.sleep(3600)\n")
        manifest = {
            "apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": "smoke", "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}},
                {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "image", "namespace": "smoke"},
                 "spec": {
                     "automountServiceAccountToken": False,
                     "terminationGracePeriodSeconds": 2,
                     "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [{
                         "name": "smoke", "image": image, "imagePullPolicy": "Never",
                         "command": ["python3", "-c", probe],
                         "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                             "capabilities": {"drop": ["ALL"]}},
                     }]}},
            ]}
        self.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))

        def running() -> bool:
            return self.kubectl("get", "pod", "-n", "smoke", "image", "-o", "jsonpath={.status.phase}",
                                check=False).strip() == "Running"

        seconds = self.wait("the smoke pod Running", running, 120)
        logs, deadline = "", time.monotonic() + 30
        while not logs:  # kubectl logs: the API server asks the kubelet (10.213.0.1:10250)
            done = subprocess.run([str(self.plane.binary("kubectl")), f"--kubeconfig={self.kubeconfig}", "logs",
                                   "-n", "smoke", "image"], capture_output=True, text=True, timeout=30)
            logs = done.stdout.strip()
            if not logs and time.monotonic() > deadline:
                raise NodeError(f"kubectl logs: nothing after 30 s ({done.stderr.strip()[-300:]})")
            time.sleep(0.5)
        want = "uid 65532 gid 65532 CapEff 0000000000000000 NoNewPrivs 1 Seccomp 2 root read-only"
        if logs != want:
            raise NodeError(f"the smoke pod says {logs!r}, not {want!r}")
        ip = self.kubectl("get", "pod", "-n", "smoke", "image", "-o", "jsonpath={.status.podIP}").strip()
        return {"running_after_s": round(seconds, 1), "logs": logs, "pod_ip": ip}

    # -- stop --------------------------------------------------------------------
    def teardown(self) -> list[str]:
        """Stop everything; sweep and report what was left (and remove it)."""
        left: list[str] = []
        if self.plane is not None and "kubelet" in self.procs and self.procs["kubelet"].poll() is None:
            try:
                self.kubectl("delete", "namespace", "smoke", "--ignore-not-found", "--wait=false", check=False)
                self.kubectl("delete", "pod", "--all", "-A", "--grace-period=1", "--wait=true", "--timeout=60s",
                             check=False, timeout=90)
            except (subprocess.TimeoutExpired, NodeError) as exc:
                left.append(f"pod deletion: {exc}")
        for name in ("kubelet", "kube-scheduler"):
            self._stop(name)
        if self.sock.exists() and self.procs.get("containerd") and self.procs["containerd"].poll() is None:
            try:
                for task in self.ctr("tasks", "ls", "--quiet").split():
                    left.append(f"containerd task {task} still running: killed")
                    self.ctr("tasks", "kill", "--signal", "SIGKILL", task)
            except NodeError as exc:
                left.append(str(exc))
        self._stop("containerd")
        shim_pids = processes_mentioning(str(self.sock))
        for pid in shim_pids:
            left.append(f"process {pid} ({Path(f'/proc/{pid}/cmdline').read_bytes()[:60]!r}) left: killed")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.plane is not None:
            self.plane.stop(keep_logs_in=self.work / "logs" / "plane")
        time.sleep(0.5)
        for pid in processes_mentioning(str(self.work)):
            left.append(f"process {pid} mentioning {self.work}: killed")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for point in sorted(mounts_under(str(self.work)), key=len, reverse=True):
            # the kubelet bind-mounts its root directory onto itself (to make it shared): expected
            if point != str(self.work / "kubelet"):
                left.append(f"mount {point}: unmounted")
            subprocess.run(["umount", "-l", point], check=False)
        if os.path.isdir("/run/netns"):
            for name in set(os.listdir("/run/netns")) - self.host_netns_before - {self.netns}:
                left.append(f"network namespace {name}: removed")
                subprocess.run(["ip", "netns", "del", name], check=False)
        for controller in Path("/sys/fs/cgroup").iterdir():
            root = controller / self.cgroup_root.lstrip("/")
            if root.is_dir():
                dirs = sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
                for d in [*dirs, root]:
                    try:
                        d.rmdir()
                    except OSError as exc:
                        left.append(f"cgroup {d}: {exc}")
        for name, value in self.sysctls.items():
            now = Path("/proc/sys", name).read_text().strip()
            if now != value:
                Path("/proc/sys", name).write_text(value)
                log(f"sysctl {name.replace('/', '.')}: {now} -> {value} (restored)")
        for top in self.fixed_dirs:
            if top.exists():
                # sockets (the kubelet's device-plugin socket) are expected; anything else is reported
                files = [p for p in top.rglob("*") if not p.is_dir() and not p.is_socket()]
                if files:
                    left.append(f"{top}: files left (removed): {[str(p) for p in files[:5]]}")
                shutil.rmtree(top)
        subprocess.run(["ip", "netns", "del", self.netns], check=False)
        if os.path.exists(f"/run/netns/{self.netns}"):
            left.append(f"network namespace {self.netns} still there")
        return left

    def _stop(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def ensure_packages() -> None:
    missing = [pkg for tool, pkg in DEBIAN.items() if not (shutil.which(tool) or os.path.exists(tool))]
    if missing:
        log(f"installing Debian packages: {' '.join(missing)}")
        sh("apt-get", "install", "-y", "-qq", *missing, timeout=600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A real node, once, end to end (issue 22 step 2).")
    parser.add_argument("--keep", type=float, default=0, help="seconds to keep it up after the smoke pod")
    parser.add_argument("--image", help="image tarball (default: make image's)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda signum, _f: sys.exit(128 + signum))
    ensure_packages()
    image = Path(args.image) if args.image else (
        REPO / "build" / "image" / f"stalledpolicy-operator-{imagerecipe.project_version()}.tar")
    if not image.is_file():
        print(f"no image {image}: run make image first", file=sys.stderr)
        return 2
    node_bin = Path(sh("bash", str(HERE / "build.sh")).strip().splitlines()[-1])
    bin_dir = controlplane.ensure_binaries()
    work = Path(tempfile.mkdtemp(prefix="spnode-"))
    node = Node(work, f"spnode{os.getpid()}")
    result: dict = {}
    code = 1
    try:
        node.network()
        node.control_plane(bin_dir)
        node.containerd()
        node.images(image)
        node.kubelet(node_bin)
        result["node_ready_after_s"] = round(node.wait("node Ready", node.node_ready, 120), 1)
        log(f"node {NODE_NAME} Ready after {result['node_ready_after_s']}s")
        # The control plane runs no node-lifecycle controller, which is what lifts the
        # not-ready taint the kubelet registers with once the node is Ready: lift it here.
        node.kubectl("taint", "node", NODE_NAME, "node.kubernetes.io/not-ready:NoSchedule-", check=False)
        result.update(node.smoke_pod())
        log(f"smoke pod Running after {result['running_after_s']}s at {result['pod_ip']}; "
            f"kubectl logs: {result['logs']}")
        if args.keep:
            log(f"keeping it up {args.keep:.0f}s; KUBECONFIG={node.kubeconfig} (nsenter --net=/run/netns/{node.netns})")
            time.sleep(args.keep)
        code = 0
    except NodeError as exc:
        log(f"error: {exc}")
        if node.plane is not None:  # what the cluster says, beside the logs kept below
            for args in (("get", "nodes,pods", "-A", "-o", "wide"), ("describe", "pods", "-A"),
                         ("get", "events", "-A")):
                try:
                    out = node.kubectl(*args, check=False, timeout=20)
                except subprocess.TimeoutExpired:
                    out = "(timed out)"
                (work / "logs" / f"kubectl-{args[0]}-{args[1].replace(',', '-')}.txt").write_text(out)
    finally:
        t = time.monotonic()
        left = node.teardown()
        for item in left:
            log(f"teardown: {item}")
        swept = 'nothing was left' if not left else f'{len(left)} things swept'
        log(f"teardown in {time.monotonic() - t:.1f}s; {swept}")
        if code != 0 and (work / "logs").is_dir():
            kept = REPO / "build" / "node" / "logs"
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(work / "logs", kept)
            log(f"logs kept in {kept}")
        subprocess.run(["rm", "-rf", "--one-file-system", str(work)], check=False)
    print(json.dumps(result))
    return code


if __name__ == "__main__":
    sys.exit(main())
