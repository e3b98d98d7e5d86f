"""bench/scale.py (also behind bench/peers/run.py --scale-pairs) pairs two sizes
of the shipped drain on one server; it must keep running against the engine as
it changes, and its ratio must be the pair's own rates."""

import importlib.util
import sys
from pathlib import Path

import pytest

from stalledpolicy.devenv.redis_server import start_redis

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def scale_module():
    # (scale.py puts bench/ on sys.path for its sibling modules; they are dropped afterwards)
    spec = importlib.util.spec_from_file_location("scale", BENCH / "scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    for name in ("sweep", "echomq_seed", "pinger", "redisstats"):
        sys.modules.pop(name, None)


def test_pairs_drain_both_sizes_and_report_each_pairs_ratio(scale_module):
    server = start_redis()  # its own: every run flushes the server
    try:
        lines: list[str] = []
        result = scale_module.alternate_sizes(server.client(), server.port, 300, 900, 2, lines.append)
    finally:
        server.stop()
    runs = result["runs"]
    assert [run["n"] for run in runs["300"]] == [300, 300] and [run["n"] for run in runs["900"]] == [900, 900]
    assert all(run["verified"] for mine in runs.values() for run in mine)
    expected = [big["jobs_per_s"] / small["jobs_per_s"] for small, big in zip(runs["300"], runs["900"])]
    assert result["ratios"] == pytest.approx(expected)
    assert min(expected) <= result["median_ratio"] <= max(expected)
    # the order alternates: the second pair starts with the larger size
    assert "pair 2: N=      900" in next(line for line in lines if line.startswith("pair 2:"))
