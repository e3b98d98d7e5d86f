"""EchoMQ's consumer loop as modelled (devenv.consumers), on a real server: it
reaps on every loop, so a poison job whose worker dies holding it cycles
uncounted and never reaches the morgue (the problem issue 21 is about); a dead
worker restarts at once; a pool stops within a beat; no job is lost."""

from __future__ import annotations

import time

import pytest

from stalledpolicy.devenv.consumers import (
    COMPLETE,
    DIE,
    RETRY,
    Consumer,
    ConsumerPool,
    ConsumerStats,
    die_on,
)
from stalledpolicy.devenv.echomq import EchoMQ

pytestmark = pytest.mark.redis


@pytest.fixture
def mq(r, queue_name):
    return EchoMQ(r, queue_name)


@pytest.fixture
def connect(redis_server):
    """A consumer's connection: its socket timeout outlasts every beat here."""
    return lambda: redis_server.client(decode_responses=True, socket_timeout=10)


def _until(check, timeout: float, every: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(every)
    return check()


@pytest.mark.parametrize("group", [None, "GRPpoison"])
def test_a_poison_job_cycles_through_the_reaper_uncounted_and_never_reaches_the_morgue(mq, r, connect, group):
    """Two consumers, nothing else: every death's lapsed lease is reaped back
    (stalled never written, attempts climbing), so the job is claimed again
    and again; no budget ever applies."""
    poison = mq.enqueue("poison", group=group)
    pool = ConsumerPool(connect, mq.queue, die_on({poison}), 2, ledger=mq.ledger, lease_ms=300, beat_ms=100)
    with pool:
        assert _until(lambda: pool.stats.claims[poison] >= 3, timeout=5), pool.stats.totals()
    stats = pool.stats.snapshot()
    assert stats.deaths[poison] == stats.claims[poison] >= 3
    assert stats.reaped[poison] >= stats.claims[poison] - 1
    row = r.hgetall(mq.keys.job(poison))
    assert "stalled" not in row and int(row["attempts"]) == stats.claims[poison]
    assert r.zcard(mq.keys.dead) == 0 and not r.exists(mq.keys.metrics_failed)
    # a death at the moment of the stop is not restarted
    assert stats.errors == [] and stats.deaths[poison] - 1 <= stats.restarts <= stats.deaths[poison]
    assert mq.audit() == []


def test_a_worker_that_dies_restarts_at_once_with_a_reap(mq, r, connect):
    """The beat is long; the next job is served right after the death, by a
    fresh loop that reaped first (and found the dead worker's lease live)."""
    poison, good = mq.enqueue("poison"), mq.enqueue("good")
    consumer = Consumer(connect, mq.queue, die_on({poison}), ledger=mq.ledger, lease_ms=10_000, beat_ms=5_000)
    started = time.monotonic()
    consumer.start()
    try:
        assert _until(lambda: consumer.stats.completions[good] == 1, timeout=2)
        assert time.monotonic() - started < 2
        stats = consumer.stats.snapshot()
        assert (stats.deaths[poison], stats.restarts, stats.reaps, stats.reaped) == (1, 1, 2, {})
        assert mq.where_is(poison).places == ["active"]  # abandoned: its lease lapses later
    finally:
        consumer.stop()
        r.lpush(mq.keys.wake, "1")  # ends the park now rather than at the end of the beat
        assert consumer.join(timeout=10)
    assert mq.audit() == []


def test_stopping_a_pool_is_prompt_and_closes_its_connections(mq, r, connect):
    baseline = len(r.client_list())
    pool = ConsumerPool(connect, mq.queue, count=4, ledger=mq.ledger, beat_ms=500).start()
    assert _until(lambda: pool.stats.totals()["reaps"] >= 4, timeout=5)
    assert pool.alive() == 4
    started = time.monotonic()
    assert pool.stop() is True
    assert time.monotonic() - started < 0.5 + 0.5
    assert pool.alive() == 0
    assert _until(lambda: len(r.client_list()) == baseline, timeout=2)


def test_an_enqueue_wakes_a_parked_consumer_before_its_beat(mq, r, connect):
    with ConsumerPool(connect, mq.queue, count=1, ledger=mq.ledger, beat_ms=5_000) as pool:
        assert _until(lambda: pool.stats.reaps >= 1, timeout=2)
        time.sleep(0.1)  # parked now
        job = mq.enqueue("x", group="a")
        assert _until(lambda: pool.stats.completions[job] == 1, timeout=2)
        assert pool.stats.wakes >= 1
        pool.stop_event.set()
        r.lpush(mq.keys.wake, "1")  # ends the park now rather than at the end of the beat
    assert mq.audit() == []


def test_a_raising_handler_retries_and_max_attempts_dead_letters(mq, r, connect):
    job = mq.enqueue("x")

    def broken(claim):
        raise RuntimeError("no good")

    with ConsumerPool(connect, mq.queue, broken, 1, ledger=mq.ledger, beat_ms=50, retry_delay_ms=0,
                      max_attempts=2) as pool:
        assert _until(lambda: pool.stats.dead_lettered[job] == 1, timeout=5)
    assert pool.stats.retries[job] == 2 and pool.stats.claims[job] == 2
    row = r.hgetall(mq.keys.job(job))
    assert (row["state"], row["last_error"]) == ("dead", "RuntimeError: no good")
    assert mq.audit() == []


def test_a_verdict_that_is_none_of_the_three_crashes_the_loop_which_restarts(mq, r, connect):
    job = mq.enqueue("x")
    verdicts = iter(["maybe"])
    with ConsumerPool(connect, mq.queue, lambda claim: next(verdicts, COMPLETE), 1, ledger=mq.ledger,
                      lease_ms=200, beat_ms=50) as pool:
        assert _until(lambda: pool.stats.completions[job] == 1, timeout=5)
    stats = pool.stats.snapshot()
    assert len(stats.errors) == 1 and "'maybe'" in stats.errors[0]
    assert stats.restarts == 1 and stats.reaped[job] == 1 and stats.claims[job] == 2
    assert mq.audit() == []


def test_no_job_is_lost_under_deaths_retries_and_completions(mq, r, connect):
    """Flat and lane work, a lane at a limit, four consumers: some workers die
    on a job's first claim, some handlers retry it; every job ends completed."""
    mq.set_lane_limit("GRPslow", 1)
    ids = mq.enqueue_many(60) + mq.enqueue_many(30, group="GRPa") + mq.enqueue_many(20, group="GRPslow")

    def handler(claim):
        if claim.token == 1 and int(claim.id[-2:]) % 7 == 0:
            return DIE
        if claim.token == 1 and int(claim.id[-2:]) % 5 == 0:
            return RETRY
        return COMPLETE

    with ConsumerPool(connect, mq.queue, handler, 4, ledger=mq.ledger, lease_ms=300, beat_ms=100,
                      retry_delay_ms=50, max_attempts=5) as pool:
        assert _until(lambda: len(mq.ledger.completed) == len(ids), timeout=30), pool.stats.totals()
        assert mq.audit() == []
    stats = pool.stats.snapshot()
    assert set(stats.completions) == set(ids) and set(stats.completions.values()) == {1}
    assert sum(stats.deaths.values()) > 0 and sum(stats.retries.values()) > 0
    assert set(stats.deaths) <= set(stats.reaped)
    assert stats.errors == [] and stats.stale == 0
    assert r.hget(mq.keys.metrics_completed, "count") == str(len(ids))
    assert mq.audit() == []


def test_a_socket_timeout_that_would_cut_the_park_short_is_refused(mq, redis_server):
    consumer = Consumer(lambda: redis_server.client(), mq.queue, beat_ms=5_000)  # redis-py's 5 s
    with pytest.raises(ValueError, match="socket_timeout=5"):
        consumer.start()
    assert consumer.thread is None


def test_stats_snapshot_and_totals():
    stats = ConsumerStats()
    stats._count("claims", "JOB1")
    stats._count("claims", "JOB1")
    stats._reaped(["JOB1", "JOB2"])
    copy = stats.snapshot()
    stats._count("claims", "JOB1")
    assert copy.claims["JOB1"] == 2 and stats.claims["JOB1"] == 3
    assert copy.totals() == {"claims": 2, "deaths": 0, "completions": 0, "retries": 0, "dead_lettered": 0,
                             "reaped": 2, "reaps": 1, "stale": 0, "restarts": 0, "wakes": 0, "errors": 0}
