#!/usr/bin/env python3
"""The real-node test session of `make test` (tests/node/, marker `node`), run
inside a network namespace of our own.

Usage (root): python hack/node/run_tests.py [PYTEST ARGS...]

1. The host must run a node (root, network namespaces, cgroups, overlayfs):
   otherwise this FAILS (exit 2) naming what is missing; it never skips.
2. A namespace `sptest<pid>x<random>` (realnode.create_namespace: `ip`
   commands only). This process stays in the host's namespace and addresses
   nothing: realnode.NetworkGuard refuses any address outside loopback here.
3. `nsenter --net=/run/netns/NAME python -m pytest -m node tests/node ...`:
   the session (tests/node/conftest.py) brings the node up inside the
   namespace, so the control plane, Redis, containerd, the kubelet, the
   scheduler, helm, kubectl and the tests all share its loopback and bridge.
   SIGTERM and SIGINT are passed on to it, and it tears the node down.
4. After it: the namespace is deleted, then whatever the session's teardown
   left (processes, mounts, cgroups, changed sysctls, CNI state) is swept;
   anything found fails the run (exit 1), even when every test passed.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import realnode

SYSCTLS_ENV = "STALLEDPOLICY_NODE_SYSCTLS"
WORK_ENV = "STALLEDPOLICY_NODE_WORK"
HOST_PID_ENV = "STALLEDPOLICY_NODE_HOST_PID"
"""This process's pid: /proc/PID/ns/net is the host's namespace, for the session's tests."""


def main(argv: list[str]) -> int:
    guard = realnode.NetworkGuard.install(None)  # the host's namespace: loopback only
    problems = realnode.host_problems()
    if problems:
        print("FAILED: the real-node tests (tests/node) cannot run on this host: " + "; ".join(problems)
              + ". They need root, network namespaces, cgroups and overlayfs; run `make test` on such a host "
              "(CI must be one). This is a failure, not a skip.", file=sys.stderr)
        return 2
    realnode.ensure_packages()
    image = realnode.default_image()
    if not image.is_file():
        print(f"FAILED: no image {image}: `make image` builds it (make test does, first)", file=sys.stderr)
        return 2
    netns = f"sptest{os.getpid()}x{secrets.token_hex(2)}"
    work = Path(tempfile.mkdtemp(prefix=f"{netns}-"))
    sysctls = realnode.read_sysctls()
    # the names and the state before (directories, namespaces) the sweep below needs
    node = realnode.Node(work, netns, sysctls_before=sysctls)
    started = time.monotonic()
    realnode.create_namespace(netns)
    realnode.log(f"network namespace {netns}; work directory {work}")
    env = {**os.environ, realnode.NETNS_ENV: netns, WORK_ENV: str(work), SYSCTLS_ENV: json.dumps(sysctls),
           HOST_PID_ENV: str(os.getpid())}
    command = ["nsenter", f"--net={realnode.NETNS_DIR / netns}", "--", sys.executable, "-m", "pytest",
               "-m", "node", "-p", "no:cacheprovider", *(argv or [str(realnode.REPO / "tests" / "node")])]
    code = 1
    try:
        child = subprocess.Popen(command, cwd=realnode.REPO, env=env)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda s, _f: child.send_signal(s))
        code = child.wait()
    finally:
        realnode.delete_namespace(netns)
        left = node.sweep_after()
        left += realnode.leftovers(work, netns, node.cgroup_root, node.cni_network, sysctls, namespace_too=True)
        if (work / "logs").is_dir() and code != 0:
            kept = realnode.REPO / "build" / "node" / "logs"
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(work / "logs", kept, symlinks=True, ignore_dangling_symlinks=True)
            realnode.log(f"the node's logs kept in {kept}")
        subprocess.run(["rm", "-rf", "--one-file-system", str(work)], check=False)
    for item in left:
        realnode.log(f"left behind by the session (swept now): {item}")
    if guard.refused:
        realnode.log(f"the network guard refused: {guard.refused}")
    realnode.log(f"real-node session: exit {code} in {time.monotonic() - started:.0f}s"
                 + (f"; {len(left)} things left behind" if left else "; nothing left behind"))
    if code == 0 and (left or guard.refused):
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
