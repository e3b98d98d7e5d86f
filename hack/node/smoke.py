#!/usr/bin/env python3
"""A real node, once, end to end, by hand (the tests are tests/node/, run by
`make test` through run_tests.py).

Run as root: python3 hack/node/smoke.py [--keep SECONDS]

1. A network namespace of our own (`spnode<pid>`, realnode.create_namespace);
   this process enters it (setns) before it starts anything, so every server
   and every client (the control plane, containerd, the kubelet, the
   scheduler, kubectl) is inside it. Nothing is ever addressed from the host's
   namespace (realnode.NetworkGuard refuses it in this process).
2. realnode.Node: the control plane, containerd, the kubelet and the scheduler;
   the pause image and the product's image (`make image`) imported; the node
   must register Ready.
3. A pod of the product's image in a namespace that enforces the restricted
   Pod Security Standard, the sweeper's security context: it must run, and
   `kubectl logs` must show uid 65532, no capabilities, no_new_privs and
   seccomp.
4. Teardown (Node.teardown), which reports anything it had to sweep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import realnode
from realnode import NODE_IP, Node, NodeError, log

from stalledpolicy.devenv import controlplane


def smoke_pod(node: Node) -> dict:
    image = realnode.imagerecipe.image_reference()
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
    node.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))

    def running() -> bool:
        return node.kubectl("get", "pod", "-n", "smoke", "image", "-o", "jsonpath={.status.phase}",
                            check=False).strip() == "Running"

    seconds = node.wait("the smoke pod Running", running, 120)
    logs, deadline = "", time.monotonic() + 30
    while not logs:  # kubectl logs: the API server asks the kubelet (NODE_IP:10250)
        logs = node.kubectl("logs", "-n", "smoke", "image", check=False, timeout=30).strip()
        if not logs and time.monotonic() > deadline:
            raise NodeError("kubectl logs: nothing after 30 s")
        time.sleep(0.5)
    want = "uid 65532 gid 65532 CapEff 0000000000000000 NoNewPrivs 1 Seccomp 2 root read-only"
    if logs != want:
        raise NodeError(f"the smoke pod says {logs!r}, not {want!r}")
    ip = node.kubectl("get", "pod", "-n", "smoke", "image", "-o", "jsonpath={.status.podIP}").strip()
    return {"running_after_s": round(seconds, 1), "logs": logs, "pod_ip": ip}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A real node, once, end to end.")
    parser.add_argument("--keep", type=float, default=0, help="seconds to keep it up after the smoke pod")
    parser.add_argument("--image", help="image tarball (default: make image's)")
    args = parser.parse_args(argv)
    problems = realnode.host_problems()
    if problems:
        print("this host cannot run a node: " + "; ".join(problems), file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda signum, _f: sys.exit(128 + signum))
    realnode.ensure_packages()
    image = Path(args.image) if args.image else realnode.default_image()
    if not image.is_file():
        print(f"no image {image}: run make image first", file=sys.stderr)
        return 2
    node_bin = realnode.node_binaries()
    bin_dir = controlplane.ensure_binaries()
    netns = f"spnode{os.getpid()}"
    guard = realnode.NetworkGuard.install(netns)
    work = Path(tempfile.mkdtemp(prefix="spnode-"))
    realnode.create_namespace(netns)
    realnode.setns(f"/run/netns/{netns}")
    log(f"network namespace {netns}: node address {NODE_IP}; this process is in it")
    node = Node(work, netns)
    result: dict = {}
    code = 1
    try:
        node.start(image, node_bin, bin_dir)
        result.update(smoke_pod(node))
        log(f"smoke pod Running after {result['running_after_s']}s at {result['pod_ip']}; "
            f"kubectl logs: {result['logs']}")
        if args.keep:
            log(f"keeping it up {args.keep:.0f}s; KUBECONFIG={node.kubeconfig} (nsenter --net=/run/netns/{netns})")
            time.sleep(args.keep)
        code = 0
    except NodeError as exc:
        log(f"error: {exc}")
    finally:
        t = time.monotonic()
        left = node.teardown()
        realnode.delete_namespace(netns)
        for item in left:
            log(f"teardown: {item}")
        swept = 'nothing was left' if not left else f'{len(left)} things swept'
        log(f"teardown in {time.monotonic() - t:.1f}s; {swept}; refused by the network guard: {guard.refused}")
        if code != 0 and (work / "logs").is_dir():
            kept = realnode.REPO / "build" / "node" / "logs"
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(work / "logs", kept)
            log(f"logs kept in {kept}")
        subprocess.run(["rm", "-rf", "--one-file-system", str(work)], check=False)
    print(json.dumps(result))
    return code


if __name__ == "__main__":
    sys.exit(main())
