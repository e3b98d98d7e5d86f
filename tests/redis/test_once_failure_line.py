"""``sweep --once`` prints its one JSON line when the pass fails too, so a
pipe into jq gets a document: the error and the counts so far (none here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.redis


def test_sweep_once_against_an_unreachable_server_prints_a_line_with_the_error():
    from stalledpolicy.devenv.ports import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("STALLEDPOLICY_")}
    swept = subprocess.run([sys.executable, "-m", "stalledpolicy", "sweep", "--once", "--queue", "emails",
                            "--redis-url", f"redis://:secret@127.0.0.1:{free_port()}/0"],
                           env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert swept.returncode == 1, swept.stderr
    summary = json.loads(swept.stdout)
    assert summary["error"].startswith("redis unreachable: ")
    assert "secret" not in swept.stdout
    assert {key: summary[key] for key in ("queue", "recovered", "dead_lettered", "orphans", "quarantined",
                                          "calls", "lanes", "stopped_early")} == {
        "queue": "emails", "recovered": 0, "dead_lettered": 0, "orphans": 0, "quarantined": 0, "calls": 0,
        "lanes": {}, "stopped_early": False}
    assert "sweeping once" in swept.stderr and "metrics_port" not in swept.stderr
