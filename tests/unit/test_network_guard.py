"""The network rule's guard (hack/node/realnode.NetworkGuard), from the host's
namespace: with it installed as hack/node/run_tests.py installs it, every
client the environment's helpers use (a socket, redis-py, urllib) is refused
an address outside loopback before anything is sent, and loopback still
works. It runs in a child process (an audit hook cannot be removed), in an
empty network namespace of its own, so that a broken guard sends nothing.

The helpers' own choices are checked too: what the host-side helpers address
(the control plane's URL, a Redis server's URL) is loopback. On the real node,
tests/node/test_network_rule.py checks the same guard from inside the
namespace, where the node's addresses are allowed."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

from stalledpolicy.devenv.controlplane import ControlPlane
from stalledpolicy.devenv.redis_server import RedisServer

REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, socket, sys, urllib.request
sys.path.insert(0, sys.argv[1])
import realnode
import redis

realnode.NetworkGuard.install(None)
outcome = {}

def attempt(name, call):
    try:
        call()
        outcome[name] = "sent"
    except BaseException as exc:  # what refused it, and why
        chain = [exc, getattr(exc, "reason", None), exc.__cause__, exc.__context__]
        outcome[name] = [type(e).__name__ + ": " + str(e) for e in chain if e is not None]

def tcp(host, port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(3)
        sock.connect((host, port))

def udp(host, port):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"x", (host, port))

with socket.socket() as closed:
    closed.bind(("127.0.0.1", 0))
    loopback_port = closed.getsockname()[1]

attempt("node tcp", lambda: tcp(realnode.NODE_IP, 10250))
attempt("service tcp", lambda: tcp(realnode.API_SERVICE_IP, 443))
attempt("pod tcp", lambda: tcp("10.213.1.5", 9090))
attempt("node udp", lambda: udp(realnode.NODE_IP, 53))
attempt("pod http", lambda: urllib.request.urlopen("http://10.213.1.5:9090/readyz", timeout=3))
attempt("node redis", lambda: redis.Redis(host=realnode.NODE_IP, port=6379, socket_connect_timeout=3).ping())
attempt("loopback tcp", lambda: tcp("127.0.0.1", loopback_port))
print(json.dumps({"outcome": outcome, "refused": realnode.NetworkGuard.installed().refused}))
"""


def in_an_empty_namespace(argv: list[str]) -> list[str]:
    """argv in a fresh network namespace with only loopback: were the guard broken, the
    refused addresses would be unreachable there, never sent out of the host."""
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]


def test_the_guard_refuses_every_client_outside_loopback_from_the_hosts_namespace():
    done = subprocess.run(in_an_empty_namespace([sys.executable, "-c", CHILD, str(REPO / "hack" / "node")]),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    outcome = result["outcome"]
    for name in ("node tcp", "service tcp", "pod tcp", "node udp", "pod http", "node redis"):
        assert outcome[name] != "sent", name
        assert any("network rule: refused" in reason for reason in outcome[name]), (name, outcome[name])
    # loopback is allowed: the connection was tried (and refused by the kernel, the port being closed)
    assert any(reason.startswith("ConnectionRefusedError") for reason in outcome["loopback tcp"])
    assert not any("network rule" in reason for reason in outcome["loopback tcp"])
    assert len(result["refused"]) >= 6 and not any(r.startswith("127.") for r in result["refused"])


def test_the_host_side_helpers_address_only_loopback():
    plane_url = ControlPlane(ports={"apiserver": 6443}).server_url
    redis_url = RedisServer(port=6379, workdir=Path("/nonexistent"), process=None).url  # type: ignore[arg-type]  # never started
    for url in (plane_url, redis_url):
        assert ipaddress.ip_address(urlsplit(url).hostname).is_loopback, url
