"""bench/peers/run.py's like-for-like row drains the peers' mix (every job back
to its queue, no lane, none dead-lettered), its heard row drains beside a
subscriber that hears every event, and its PING client can be paced: each must
keep doing what the published figures say it did."""

import importlib.util
import sys
import time
from pathlib import Path

import pytest

from stalledpolicy.devenv.redis_server import start_redis
from stalledpolicy.keyspace import QueueKeys

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench_modules():
    # (sweep.py puts bench/ on sys.path for its sibling modules; they are dropped afterwards)
    spec = importlib.util.spec_from_file_location("sweep", BENCH / "sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    sys.modules["sweep"] = sweep  # (its dataclasses look their module up there)
    spec.loader.exec_module(sweep)
    yield sweep, sys.modules["echomq_seed"], sys.modules["pinger"]
    for name in ("sweep", "echomq_seed", "pinger", "redisstats", "listener"):
        sys.modules.pop(name, None)


@pytest.fixture
def server():
    server = start_redis()  # its own: every run flushes the server
    yield server
    server.stop()


def test_the_peers_mix_has_no_lane_and_no_death_and_drains_verified(bench_modules, server):
    sweep, echomq_seed, _ = bench_modules
    client = server.client()
    expected = echomq_seed.seed(client, "bench", 400, budget=3, **echomq_seed.SHAPES["peers"])
    assert (expected.dead, expected.flat_recovered, dict(expected.lanes_recovered)) == (0, 400, {})
    assert client.exists(QueueKeys("bench").gactive) == 0
    ours = echomq_seed.seed(client, "bench", 400, budget=3, **echomq_seed.SHAPES["ours"])
    assert ours.dead > 0 and ours.lanes_recovered

    run = sweep.run_one(client, server.port, 400, 1000, sized=True, shape="peers")
    assert run.verified and (run.recovered, run.dead_lettered) == (400, 0)


def test_the_heard_row_drains_beside_a_subscriber_that_hears_one_event_a_job(bench_modules, server):
    sweep, _, _ = bench_modules
    run = sweep.run_one(server.client(), server.port, 400, 1000, sized=True, shape="ours", heard=True)
    assert run.verified and run.recovered + run.dead_lettered == 400
    assert run.events_heard == 400  # each job's event, once: the sweep saw the subscriber


def test_a_paced_ping_client_samples_at_its_pace(bench_modules, server):
    _, _, pinger = bench_modules
    stats = {}
    for interval_s in (0.0, 0.005):
        with pinger.Pinger(server.port, interval_s=interval_s) as ping:
            time.sleep(0.3)
        stats[interval_s] = ping.stats
    # 0.3 s at one PING every 5 ms is at most ~60 samples (plus start and stop);
    # a tight loop on loopback makes thousands
    assert stats[0.005].samples <= 0.3 / 0.005 + 10
    assert stats[0.0].samples > 4 * stats[0.005].samples
