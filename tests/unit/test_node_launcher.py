"""hack/node/run_tests.py on a host that cannot run a node: it fails (exit 2),
naming what is missing, and runs no test. A skip would read as a pass in CI.
Here the host lacks root: the launcher runs as an unprivileged user (setpriv)
when this session is root, as itself otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOBODY = "65534"


def test_the_node_session_fails_loudly_without_root():
    command = [sys.executable, str(REPO / "hack" / "node" / "run_tests.py")]
    if os.geteuid() == 0:
        command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *command]
    env = {**os.environ, "HOME": "/nonexistent", "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "FAILED: the real-node tests (tests/node) cannot run on this host" in done.stderr
    assert "not root" in done.stderr and "not a skip" in done.stderr
    assert "passed" not in done.stdout
