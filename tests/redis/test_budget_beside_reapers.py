"""The budget holds beside EchoMQ's consumers, which reap every lapsed lease
uncounted on each loop (issue 21). The sweeper runs as it does in its pod (the
loop, its own thread); eight model consumers (devenv.consumers) serve the
queue, and a poison job kills every worker that claims it.

The control is the sweeper of before: a drain every interval, holding nothing.
Beside the reapers it counts almost no lapse, so the poison cycles on."""

from __future__ import annotations

import threading
import time

import pytest

from stalledpolicy import engine
from stalledpolicy.devenv.consumers import ConsumerPool, die_on
from stalledpolicy.devenv.echomq import EchoMQ
from stalledpolicy.sweeper import loop
from stalledpolicy.sweeper.config import SweeperConfig
from stalledpolicy.sweeper.metrics import SweeperMetrics

pytestmark = pytest.mark.redis

BUDGET = 3
CONSUMERS = 8
LEASE_MS, BEAT_MS = 1_000, 500


@pytest.fixture
def mq(r, queue_name):
    return EchoMQ(r, queue_name)


@pytest.fixture
def connect(redis_server):
    return lambda: redis_server.client(decode_responses=True, socket_timeout=10)


def _until(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def _sweeper(redis_server, queue: str) -> loop.Sweeper:
    config = SweeperConfig(queue=queue, redis_url=redis_server.url, interval=1.0, max_stalled=BUDGET)
    return loop.Sweeper(config, SweeperMetrics(queue, ()))


def _fixed_interval_sweep(client, queue: str, stop: threading.Event) -> None:
    """The sweeper before issue 21: one drain a second, no holds."""
    while not stop.is_set():
        engine.drain(client, queue, engine.Budgets(BUDGET, {}), 100, holds=engine.NO_HOLDS)
        stop.wait(1.0)


def _reaping_every_millisecond(mq: EchoMQ, connect, stop: threading.Event, reaped: list[str]) -> None:
    """A reaper at its most eager: EchoMQ's consumers, busy, reap within a few
    ms of a lapse; a sweep that only wakes at the deadline then loses half
    the races."""
    reaper = EchoMQ(connect(), mq.queue, ledger=mq.ledger)
    while not stop.is_set():
        reaped += reaper.reap()
        time.sleep(0.001)


@pytest.mark.parametrize("group", [None, "GRPpoison"])
@pytest.mark.parametrize("eager_reaper", [False, True], ids=["consumers", "and-an-eager-reaper"])
def test_the_poison_job_reaches_the_morgue_at_its_budget_beside_reaping_consumers(redis_server, r, mq, connect,
                                                                                   group, eager_reaper):
    poison = mq.enqueue("poison", group=group)
    healthy = mq.enqueue_many(50, group=group)
    sweeper = _sweeper(redis_server, mq.queue)
    stop_reaping, eagerly_reaped = threading.Event(), []
    threads = [threading.Thread(target=sweeper.run_forever, name="sweeper")]
    if eager_reaper:
        threads.append(threading.Thread(target=_reaping_every_millisecond, name="eager-reaper",
                                        args=(mq, connect, stop_reaping, eagerly_reaped)))
    pool = ConsumerPool(connect, mq.queue, die_on({poison}), CONSUMERS, ledger=mq.ledger, lease_ms=LEASE_MS,
                        beat_ms=BEAT_MS)
    for thread in threads:
        thread.start()
    try:
        with pool:
            dead = _until(lambda: r.zscore(mq.keys.dead, poison) is not None, timeout=30)
    finally:
        sweeper.stop.set()
        stop_reaping.set()
        for thread in threads:
            thread.join(timeout=10)
    stats = pool.stats.snapshot()
    assert dead, f"the poison job is not in the morgue: {stats.totals()}, {r.hgetall(mq.keys.job(poison))}"
    row = r.hgetall(mq.keys.job(poison))
    assert row["stalled"] == str(BUDGET) and row["last_error"] == "stalled"
    # every lapse counted: claimed once per stall, the last one dead-lettered;
    # a pass delayed past the whole hold by a loaded machine may lose one
    # (it is then counted as uncounted, never silently)
    uncounted = int(r.hget(mq.keys.sweeper_totals, "uncounted") or 0)
    assert stats.claims[poison] == BUDGET + uncounted <= BUDGET + 1
    assert stats.reaped.get(poison, 0) + eagerly_reaped.count(poison) == uncounted
    assert all(stats.completions[job] == 1 for job in healthy)
    assert mq.audit() == []


def test_control_the_fixed_interval_sweep_lets_the_poison_cycle(r, mq, connect):
    """What the test above guards against: the sweep of before, beside the same
    consumers, loses the race to their reaps; the poison outlives its budget."""
    poison = mq.enqueue("poison")
    stop = threading.Event()
    sweeping = threading.Thread(target=_fixed_interval_sweep, args=(r, mq.queue, stop), name="fixed-sweep")
    pool = ConsumerPool(connect, mq.queue, die_on({poison}), CONSUMERS, ledger=mq.ledger, lease_ms=LEASE_MS,
                        beat_ms=BEAT_MS)
    sweeping.start()
    try:
        with pool:
            assert _until(lambda: pool.stats.claims[poison] >= BUDGET + 3, timeout=30), pool.stats.totals()
    finally:
        stop.set()
        sweeping.join(timeout=10)
    assert r.zscore(mq.keys.dead, poison) is None
    assert pool.stats.reaped[poison] >= 2  # lapses nobody counted
    assert mq.audit() == []
