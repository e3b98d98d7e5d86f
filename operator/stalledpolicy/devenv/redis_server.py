"""Real ``redis-server`` processes on free loopback ports: one server, or a cluster."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from stalledpolicy.devenv.ports import free_port


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError("redis-server not found; install it with: apt-get install -y redis-server")
    return found


@dataclass
class RedisServer:
    port: int
    workdir: Path
    process: subprocess.Popen
    extra_args: list[str] = field(default_factory=list)

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

    def restart(self) -> None:
        """Start again on the same port (after :meth:`stop`), for outage tests."""
        self.process = _spawn(self.port, self.workdir, self.extra_args)
        _wait_ready(self.port, self.process)


def _spawn(port: int, workdir: Path, extra_args: list[str]) -> subprocess.Popen:
    args = [
        redis_server_binary(),
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
            raise RuntimeError(f"redis-server on port {port} exited with {process.returncode}")
        try:
            if probe.ping():
                return
        except redis.AuthenticationError:
            return  # up and answering, with --requirepass
        except redis.ConnectionError:
            time.sleep(0.05)
    raise TimeoutError(f"redis-server on port {port} not ready after {timeout}s")


def start_redis(extra_args: list[str] | None = None, workdir: Path | None = None) -> RedisServer:
    workdir = Path(workdir or tempfile.mkdtemp(prefix="stalledpolicy-redis-"))
    port = free_port()
    extra = list(extra_args or [])
    process = _spawn(port, workdir, extra)
    _wait_ready(port, process)
    return RedisServer(port=port, workdir=workdir, process=process, extra_args=extra)


@dataclass
class RedisCluster:
    nodes: list[RedisServer]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", n.port) for n in self.nodes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}/0"

    def client(self, **kwargs) -> "redis.RedisCluster":
        from redis.cluster import ClusterNode, RedisCluster as Client

        return Client(startup_nodes=[ClusterNode(h, p) for h, p in self.startup_nodes], **kwargs)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def start_cluster(masters: int = 3, extra_args: list[str] | None = None) -> RedisCluster:
    """``masters`` real cluster-enabled servers, slots split evenly, no replicas;
    ``extra_args`` are given to each."""
    nodes = [
        start_redis(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-node-timeout", "5000", *(extra_args or [])])
        for _ in range(masters)
    ]
    try:
        subprocess.run(
            ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in nodes],
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
            raise TimeoutError("redis cluster did not reach cluster_state:ok")
    except BaseException:
        for node in nodes:
            node.stop()
        raise
    return RedisCluster(nodes=nodes)
