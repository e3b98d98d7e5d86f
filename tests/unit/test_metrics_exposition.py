"""What /metrics lists, in a process of its own for each side: prometheus_client's
*_created series are switched off process-wide, so a test in this (shared) process
would pass for one side because the other side's module was imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

EXPOSE = {
    "sweeper": "from stalledpolicy.sweeper.metrics import SweeperMetrics as M; m = M('orders', ('acme',))",
    "operator": "from stalledpolicy.controller.metrics import OperatorMetrics as M; m = M()",
}


@pytest.mark.parametrize("side", sorted(EXPOSE))
def test_metrics_list_no_created_series(side):
    code = EXPOSE[side] + "; import sys; sys.stdout.write(m.exposition().decode())"
    text = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert any(name.endswith("_total") for name in names), text[:500]  # counters are there
    assert not [name for name in names if name.endswith("_created")], sorted(names)
