"""A real node inside a network namespace of our own (issue 22): the library
that `smoke.py`, `run_tests.py` (the `make test` launcher) and the real-node
tests (tests/node/) share.

- `create_namespace(name)` (host side: `ip` commands only, no traffic) makes
  the namespace: loopback up, and a veth pair whose two ends are both inside it
  (this kernel has no dummy links), giving the node its address NODE_IP. The
  namespace has no route out: an address outside it is unreachable from inside.
- `Node` is started by a process that is already inside that namespace
  (`nsenter --net=/run/netns/NAME`, or `setns`): the control plane
  (stalledpolicy.devenv.controlplane) on the namespace's loopback,
  kube-scheduler, Debian's containerd (CRI, runc, restrict_oom_score_adj) with
  Debian's CNI plugins (a bridge with a /24 for pods, IPAM state in the work
  directory), the kubelet (cgroup v1 allowed, cgroupfs, cgroups under a root of
  its own), and one DNAT rule from the `kubernetes` Service (API_SERVICE_IP:443)
  to the API server, so that pods (the chart's operator) reach the API.
- `Node.teardown()` stops everything, sweeps what is left and returns it:
  mounts, pod network namespaces, processes, cgroups, the three sysctls the
  kubelet changes (restored), CNI state. `leftovers()` reports without removing.
- `NetworkGuard`: an audit hook that refuses (raises `NetworkRuleError`, before
  anything is sent) a connection or datagram to an address outside loopback
  unless the calling thread is inside the allowed namespace.

Binaries: the control plane's (hack/control-plane/build.sh, or
$STALLEDPOLICY_K8S_BIN), the node's (hack/node/build.sh), Debian's containerd,
runc, containernetworking-plugins, iptables, and gcc with libc6-dev for the pause
image (`ensure_packages`).
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for _path in (REPO / "operator", REPO / "hack" / "image", HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import imagerecipe  # noqa: E402
import pause_image  # noqa: E402

from stalledpolicy.devenv import controlplane  # noqa: E402

NODE_IP = "10.213.0.1"
POD_SUBNET = "10.213.1.0/24"
NODE_NAME = "spnode"
# The `kubernetes` Service's cluster IP: the first address of the control plane's range.
API_SERVICE_IP = str(next(ipaddress.ip_network(controlplane.SERVICE_CLUSTER_IP_RANGE).hosts()))
SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
CNI_STATE = Path("/var/lib/cni")
DEBIAN = {"containerd": "containerd", "runc": "runc", "/usr/lib/cni/bridge": "containernetworking-plugins",
          "iptables": "iptables", "nsenter": "util-linux",
          # the pause image's static binary (pause_image.py): gcc and the static libc
          "gcc": "gcc", "/usr/lib/x86_64-linux-gnu/libc.a": "libc6-dev"}
NETNS_ENV = "STALLEDPOLICY_NODE_NETNS"
"""Set by run_tests.py for the pytest session it starts inside the namespace: its name."""

_t0 = time.monotonic()


def log(message: str) -> None:
    print(f"node [{time.monotonic() - _t0:6.1f}s]: {message}", file=sys.stderr, flush=True)


class NodeError(RuntimeError):
    pass


class NetworkRuleError(PermissionError):
    """A connection to an address outside loopback from outside our namespace: refused."""


def sh(*argv: str, check: bool = True, capture: bool = True, timeout: float = 120) -> str:
    done = subprocess.run(list(argv), capture_output=capture, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise NodeError(f"{' '.join(argv)} exited {done.returncode}: {(done.stderr or '')[-600:]}")
    return done.stdout if capture else ""


# --------------------------------------------------------------------------- namespaces


def host_problems() -> list[str]:
    """Why this host cannot run a node (empty when it can): root, network namespaces,
    cgroups and overlayfs are needed."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not root (the kubelet, containerd and network namespaces need root)")
    if not Path("/proc/self/ns/net").exists() or shutil.which("ip") is None:
        problems.append("no network namespaces (/proc/self/ns/net or the ip command is missing)")
    cgroups = Path("/sys/fs/cgroup")
    if not cgroups.is_dir() or not os.access(cgroups, os.W_OK) or not any(cgroups.iterdir()):
        problems.append("no writable cgroup hierarchy under /sys/fs/cgroup")
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        filesystems = ""
    if "overlay" not in filesystems.split():
        problems.append("no overlayfs in /proc/filesystems (containerd's snapshotter needs it)")
    return problems


def namespace_inode(path: str) -> int:
    return os.stat(path).st_ino


def thread_in_namespace(name: str) -> bool:
    """Whether the calling thread's network namespace is NETNS_DIR/name."""
    try:
        return namespace_inode("/proc/thread-self/ns/net") == namespace_inode(str(NETNS_DIR / name))
    except OSError:
        return False


def create_namespace(name: str) -> None:
    """The node's namespace (host side; `ip` commands only, nothing is sent anywhere)."""
    sh("ip", "netns", "add", name)
    try:
        sh("ip", "-n", name, "link", "set", "lo", "up")
        sh("ip", "-n", name, "link", "add", "spn0", "type", "veth", "peer", "name", "spn1")
        sh("ip", "-n", name, "addr", "add", f"{NODE_IP}/24", "dev", "spn0")
        sh("ip", "-n", name, "link", "set", "spn0", "up")
        sh("ip", "-n", name, "link", "set", "spn1", "up")
    except NodeError:
        delete_namespace(name)
        raise


def delete_namespace(name: str) -> None:
    subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def setns(path: str) -> None:
    """Move the calling thread (the whole process, when it has one thread) into a network namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise NodeError(f"setns {path}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


class NetworkGuard:
    """The network rule, enforced in this process: an audit hook on `socket.connect`,
    `socket.sendto` and `socket.sendmsg` (every Python client goes through them, redis-py,
    urllib and the kubernetes client included). An IP address outside loopback is
    refused unless the calling thread is inside the namespace `allowed` (None: none
    is). The hook cannot be removed; `install` is idempotent per process."""

    _installed: NetworkGuard | None = None

    def __init__(self, allowed: str | None) -> None:
        self.allowed = allowed
        self.refused: list[str] = []

    @classmethod
    def install(cls, allowed: str | None) -> NetworkGuard:
        if cls._installed is None:
            cls._installed = cls(allowed)
            sys.addaudithook(cls._installed._hook)
        cls._installed.allowed = allowed
        return cls._installed

    @classmethod
    def installed(cls) -> NetworkGuard | None:
        return cls._installed

    def check(self, address: object) -> None:
        if not (isinstance(address, tuple) and address and isinstance(address[0], str)):
            return  # a Unix socket's path, or a raw address this rule has no opinion on
        host = address[0]
        if is_loopback(host):
            return
        try:
            ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return  # a name: connect() is given the resolved address, checked then
        if self.allowed is not None and thread_in_namespace(self.allowed):
            return
        where = f"outside namespace {self.allowed}" if self.allowed else "in the host's namespace"
        self.refused.append(f"{host}:{address[1] if len(address) > 1 else '?'}")
        raise NetworkRuleError(f"network rule: refused to address {host} {where} (only loopback is allowed there)")

    def _hook(self, event: str, args: tuple) -> None:
        if event in ("socket.connect", "socket.sendto") and len(args) >= 2:
            self.check(args[1])
        elif event == "socket.sendmsg" and len(args) >= 2 and args[1] is not None:
            self.check(args[1])


def no_route_out() -> list[str]:
    """The routes of the calling process's namespace that lead anywhere but its own
    links (a default route, or a gateway): empty when nothing can leave it."""
    routes = sh("ip", "-4", "route", "show").splitlines() + sh("ip", "-6", "route", "show").splitlines()
    return [r for r in routes if r.startswith("default") or " via " in r]


# --------------------------------------------------------------------------- leftovers


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


def read_sysctls() -> dict[str, str]:
    return {name: Path("/proc/sys", name).read_text().strip() for name in SYSCTLS}


class Node:
    """One node: start it from inside its namespace (`netns`), then `teardown()`."""

    def __init__(self, work: Path, netns: str, *, sysctls_before: dict[str, str] | None = None):
        self.work = work
        self.netns = netns
        self.procs: dict[str, subprocess.Popen] = {}
        self.plane: controlplane.ControlPlane | None = None
        self.sysctls = sysctls_before or read_sysctls()
        self.cgroup_root = f"/stalledpolicy-{netns}"
        self.cni_network = netns
        # paths containerd (shim sockets, fifos) and the kubelet (device plugins) use whatever
        # their configured directories: removed at teardown when they were not there before
        self.fixed_dirs = [p for p in (Path("/run/containerd"), Path("/var/lib/kubelet")) if not p.exists()]
        self.cni_state_existed = CNI_STATE.exists()
        self.sock = work / "containerd" / "containerd.sock"
        self.kubeconfig: Path | None = None
        self.torn_down = False

    # -- start -------------------------------------------------------------------
    def start(self, image: Path, node_bin: Path, bin_dir: Path, *, ready_timeout: float = 180) -> Node:
        """Everything, from inside the namespace, until the node is Ready and schedulable."""
        if not thread_in_namespace(self.netns):
            raise NodeError(f"not inside the network namespace {self.netns}: run under "
                            f"nsenter --net={NETNS_DIR / self.netns}")
        self.control_plane(bin_dir)
        self.service_route()
        self.containerd()
        self.images(image)
        self.kubelet(node_bin)
        seconds = self.wait("node Ready", self.node_ready, ready_timeout)
        log(f"node {NODE_NAME} Ready after {seconds:.1f}s")
        # The control plane runs no node-lifecycle controller, which is what lifts the
        # not-ready taint the kubelet registers with once the node is Ready: lift it here.
        self.kubectl("taint", "node", NODE_NAME, "node.kubernetes.io/not-ready:NoSchedule-", check=False)
        return self

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

    def control_plane(self, bin_dir: Path) -> None:
        self.plane = controlplane.ControlPlane(state_dir=self.work / "plane", bin_dir=bin_dir).start()
        self.kubeconfig = self.plane.kubeconfig
        log(f"control plane: {self.plane.server_url} (inside the namespace)")

    @property
    def api_port(self) -> int:
        assert self.plane is not None
        return self.plane.ports["apiserver"]

    def service_route(self) -> None:
        """The `kubernetes` Service for pods, without kube-proxy: API_SERVICE_IP:443 is
        DNATed to the API server on the namespace's loopback. route_localnet lets the
        namespace route the pods' packets to 127.0.0.1 (both live and die with it)."""
        Path("/proc/sys/net/ipv4/conf/all/route_localnet").write_text("1")
        sh("iptables", "-t", "nat", "-A", "PREROUTING", "-d", f"{API_SERVICE_IP}/32", "-p", "tcp",
           "--dport", "443", "-j", "DNAT", "--to-destination", f"127.0.0.1:{self.api_port}")
        log(f"service route: {API_SERVICE_IP}:443 -> 127.0.0.1:{self.api_port} (DNAT inside the namespace)")

    def containerd(self) -> None:
        d = self.work / "containerd"
        cni = self.work / "cni"
        cni.mkdir()
        (cni / "10-spnode.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": self.cni_network,
            "plugins": [
                {"type": "bridge", "bridge": "spcni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                          "dataDir": str(self.work / "cni-ipam"), "routes": [{"dst": "0.0.0.0/0"}]}},
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
  # the pods' network namespaces under the state directory, not /run/netns: teardown
  # unmounts them with the rest, and other nodes' are never touched
  netns_mounts_under_state_dir = true
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
        assert self.plane is not None and self.kubeconfig is not None
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
        assert self.plane is not None
        done = subprocess.run([str(self.plane.binary("kubectl")), f"--kubeconfig={self.kubeconfig}", *args],
                              input=stdin, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise NodeError(f"kubectl {' '.join(args)}: {done.stderr.strip()[-600:]}")
        return done.stdout

    def wait(self, what: str, test: Callable[[], bool], timeout: float, tail: str = "kubelet") -> float:
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

    def server_pids(self) -> dict[str, int]:
        """Every long-running process of the node and its control plane, by name."""
        pids = {name: proc.pid for name, proc in self.procs.items() if proc.poll() is None}
        if self.plane is not None:
            pids.update({c.name: c.pid for c in self.plane.components if c.alive()})
        return pids

    # -- stop --------------------------------------------------------------------
    def teardown(self) -> list[str]:
        """Stop everything; sweep and report what was left (and remove it). Idempotent."""
        if self.torn_down:
            return []
        self.torn_down = True
        left: list[str] = []
        if self.plane is not None and "kubelet" in self.procs and self.procs["kubelet"].poll() is None:
            try:
                # the Deployments first, waiting for their ReplicaSets and pods to go: deleted
                # alone, a pod is replaced by its ReplicaSet, and the replacement's sandbox
                # could be made while the kubelet stops, then never torn down
                self.kubectl("delete", "deployments", "--all", "-A", "--cascade=foreground", "--wait=true",
                             "--timeout=90s", check=False, timeout=120)
                self.kubectl("delete", "pod", "--all", "-A", "--grace-period=1", "--wait=true", "--timeout=90s",
                             check=False, timeout=120)
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
        for pid in processes_mentioning(str(self.sock)):
            left.append(f"process {pid} ({_cmdline(pid)}) left: killed")
            _kill(pid)
        if self.plane is not None:
            self.plane.stop(keep_logs_in=self.work / "logs" / "plane")
        left.extend(self.sweep_after())
        return left

    def sweep_after(self) -> list[str]:
        """`sweep` with this node's names and the state recorded when it was made; a
        process that did not start the node (run_tests.py) can call it after one that did."""
        return sweep(self.work, self.netns, self.cgroup_root, self.cni_network, self.sysctls,
                     fixed_dirs=self.fixed_dirs,
                     cni_state_existed=self.cni_state_existed)

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


def _cmdline(pid: int) -> str:
    try:
        return repr(Path(f"/proc/{pid}/cmdline").read_bytes()[:60])
    except OSError:
        return "?"


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def sweep(work: Path, netns: str, cgroup_root: str, cni_network: str, sysctls: dict[str, str], *,
          fixed_dirs: list[Path], cni_state_existed: bool) -> list[str]:
    """Remove what a stopped node left behind, and report each thing found. The kubelet's
    bind mount of its own root directory onto itself and the restored sysctls are
    expected and logged, not reported. Safe to call again (finds nothing)."""
    left: list[str] = []
    deadline = time.monotonic() + 10
    while processes_mentioning(str(work)) and time.monotonic() < deadline:
        time.sleep(0.2)  # processes sent SIGTERM a moment ago
    for pid in processes_mentioning(str(work)):
        left.append(f"process {pid} mentioning {work} ({_cmdline(pid)}): killed")
        _kill(pid)
    for point in sorted(mounts_under(str(work)), key=len, reverse=True):
        if point != str(work / "kubelet"):
            left.append(f"mount {point}: unmounted")
        subprocess.run(["umount", "-l", point], check=False)
    # the pods' network namespaces are mounted under the work directory (containerd's
    # netns_mounts_under_state_dir), so the unmounting above removed them; NETNS_DIR,
    # where other nodes' (other sessions') may be, is left alone
    for controller in Path("/sys/fs/cgroup").iterdir():
        root = controller / cgroup_root.lstrip("/")
        if root.is_dir():
            # a container whose shim was killed lives on, reparented: found by its cgroup
            for procs in root.rglob("cgroup.procs"):
                for pid in procs.read_text().split():
                    left.append(f"process {pid} in cgroup {procs.parent} ({_cmdline(int(pid))}): killed")
                    _kill(int(pid))
            deadline = time.monotonic() + 10
            while any(p.read_text().strip() for p in root.rglob("cgroup.procs")) and time.monotonic() < deadline:
                time.sleep(0.2)  # killed a moment ago: gone once reaped
            dirs = sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
            for d in [*dirs, root]:
                try:
                    d.rmdir()
                except OSError as exc:
                    left.append(f"cgroup {d}: {exc}")
    for name, value in sysctls.items():
        now = Path("/proc/sys", name).read_text().strip()
        if now != value:
            Path("/proc/sys", name).write_text(value)
            log(f"sysctl {name.replace('/', '.')}: {now} -> {value} (restored)")
    for top in fixed_dirs:
        if top.exists():
            # sockets (the kubelet's device-plugin socket) are expected; anything else is reported
            files = [p for p in top.rglob("*") if not p.is_dir() and not p.is_socket()]
            if files:
                left.append(f"{top}: files left (removed): {[str(p) for p in files[:5]]}")
            shutil.rmtree(top)
    results = CNI_STATE / "results"
    if results.is_dir():
        for cached in results.glob(f"{cni_network}-*"):
            left.append(f"CNI result {cached}: removed")
            cached.unlink()
    if not cni_state_existed and CNI_STATE.is_dir() and not any(p.is_file() for p in CNI_STATE.rglob("*")):
        shutil.rmtree(CNI_STATE)  # containerd's libcni made its empty cache directories
    return left


def leftovers(work: Path, netns: str, cgroup_root: str, cni_network: str, sysctls: dict[str, str], *,
              namespace_too: bool) -> list[str]:
    """What a node's teardown should have removed and did not (removes nothing): processes
    or mounts under its work directory, cgroups under its root, changed sysctls, its CNI
    state, and (``namespace_too``) its network namespace."""
    found = [f"process {pid} ({_cmdline(pid)})" for pid in processes_mentioning(str(work))]
    found += [f"mount {point}" for point in mounts_under(str(work))]
    found += [f"cgroup {controller / cgroup_root.lstrip('/')}" for controller in Path("/sys/fs/cgroup").iterdir()
              if (controller / cgroup_root.lstrip("/")).exists()]
    found += [f"sysctl {name}: {now} (was {sysctls[name]})" for name, now in read_sysctls().items()
              if now != sysctls[name]]
    found += [f"CNI result {p}" for p in (CNI_STATE / "results").glob(f"{cni_network}-*")]
    if namespace_too and (NETNS_DIR / netns).exists():
        found.append(f"network namespace {netns}")
    return found


def ensure_packages() -> None:
    missing = [pkg for tool, pkg in DEBIAN.items() if not (shutil.which(tool) or os.path.exists(tool))]
    if missing:
        log(f"installing Debian packages: {' '.join(missing)}")
        sh("apt-get", "install", "-y", "-qq", *missing, timeout=600)


def node_binaries() -> Path:
    """hack/node/build.sh's bin directory (built when its cache is not complete)."""
    return Path(sh("bash", str(HERE / "build.sh"), timeout=1800).strip().splitlines()[-1])


def default_image() -> Path:
    return REPO / "build" / "image" / f"stalledpolicy-operator-{imagerecipe.project_version()}.tar"
