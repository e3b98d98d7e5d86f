"""`stalledpolicy operator --kubeconfig FILE --leader-election-lease NS/NAME`: checking
the lease imports the kubernetes client while the arguments are parsed, and the
client reads KUBECONFIG once, at import. The operator then looked for
~/.kube/config and refused to start ("no Kubernetes credentials"), which failed
tests/kube/test_leader_election.py and the chart's installed tests. Run in a
child process with an empty HOME: the client must not be imported yet."""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHILD = r"""
import argparse, json, sys
from stalledpolicy.controller import cli
parser = argparse.ArgumentParser()
cli.add_arguments(parser)
args = parser.parse_args(["--namespace", "x", "--kubeconfig", sys.argv[1], "--leader-election-lease", "x/op"])
imported_while_parsing = "kubernetes.config.kube_config" in sys.modules
cli.use_kubeconfig(args.kubeconfig)
print(json.dumps({"imported_while_parsing": imported_while_parsing, "problem": cli.credentials_problem()}))
"""

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: not-a-real-token}}]
contexts: [{name: ctx, context: {cluster: c, user: u}}]
current-context: ctx
"""


def test_the_kubeconfig_given_is_used_even_when_the_lease_check_imported_the_client(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG" and not k.startswith("KUBERNETES_")}
    env["HOME"] = str(home)  # no ~/.kube/config to fall back on
    done = subprocess.run([sys.executable, "-c", CHILD, str(kubeconfig)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["imported_while_parsing"] is True  # the situation this guards; else the test proves nothing
    assert result["problem"] is None
