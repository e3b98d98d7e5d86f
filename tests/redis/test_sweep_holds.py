"""The sweep's hold on a lapsing lease (scripts/lib/holds.lua), on a real server
beside the EchoMQ model's reaper: a lease due within the lead is kept out of
the reaper's sight and counted at its deadline; a worker's extension, complete
or retry during the hold is no stall; a hold a reaper ended first is counted as
uncounted, once."""

from __future__ import annotations

import time

import pytest

from stalledpolicy import engine
from stalledpolicy.devenv.echomq import EchoMQ
from stalledpolicy.engine import Budgets, Holds
from tests.redis.engine_rows import put_active, restricted_user, server_ms

pytestmark = pytest.mark.redis

# short enough for a quick test, long enough for a loaded machine to act in
HOLDS = Holds(lead_ms=400, hold_ms=600)


@pytest.fixture
def mq(r, queue_name):
    return EchoMQ(r, queue_name)


def sweep(r, keys, holds=HOLDS, default=3, limit=100):
    return engine.sweep_batch(r, keys.queue, Budgets(default, {}), limit, holds)


def sleep_until_server_ms(r, at_ms: int) -> None:
    while server_ms(r) < at_ms:
        time.sleep(0.005)


def held(r, keys, job_id) -> bool:
    score = r.zscore(keys.active, job_id)
    return score is not None and score % 1 != 0


def test_a_lease_due_within_the_lead_is_held_from_the_reaper_and_counted_at_its_deadline(r, keys, mq):
    deadline = server_ms(r) + 200
    put_active(r, keys, "JOB1", score=deadline, attempts=4)
    put_active(r, keys, "LATER", score=deadline + 60_000)
    result = sweep(r, keys)
    assert (result.held, result.recovered, result.next_at_ms) == (1, 0, deadline)
    assert r.zscore(keys.active, "JOB1") == deadline + HOLDS.hold_ms + 0.5
    assert r.zscore(keys.sweeper_holds, "JOB1") == deadline and r.hget(keys.sweeper_hold_tokens, "JOB1") == "4"
    assert not held(r, keys, "LATER")

    sleep_until_server_ms(r, deadline + 1)
    assert mq.reap() == []  # lapsed, but out of the reaper's sight
    result = sweep(r, keys)
    assert (result.recovered, result.dead_lettered, result.uncounted) == (1, 0, 0)
    assert r.hget(keys.job("JOB1"), "stalled") == "1" and r.zscore(keys.pending, "JOB1") is not None
    assert r.zcard(keys.sweeper_holds) == 0 and r.hlen(keys.sweeper_hold_tokens) == 0
    # the next event is the other lease's last lead
    assert result.next_at_ms == deadline + 60_000 - HOLDS.lead_ms


def test_a_lease_further_off_than_the_lead_is_left_alone_and_named_as_the_next_event(r, keys):
    deadline = server_ms(r) + 5_000
    put_active(r, keys, "JOB1", score=deadline)
    result = sweep(r, keys)
    assert result.held == 0 and r.zscore(keys.active, "JOB1") == deadline
    assert result.next_at_ms == deadline - HOLDS.lead_ms
    assert 4.0 < result.seconds_to_next() <= 5.0


@pytest.mark.parametrize("ending", ["extend", "complete", "retry"])
def test_a_worker_that_acts_during_the_hold_is_no_stall(r, keys, mq, ending):
    """The worker's call lands in the last moments of its lease, after the hold
    was taken: it succeeds as it would have, and nothing is counted, then or
    after the hold."""
    job = mq.enqueue("x")
    claim = mq.claim(lease_ms=300)
    result = sweep(r, keys)
    assert result.held == 1 and held(r, keys, job)
    if ending == "extend":
        assert mq.extend(claim, lease_ms=10_000)
    elif ending == "complete":
        assert mq.complete(claim)
    else:
        assert mq.fail(claim, delay_ms=60_000) == "scheduled"
    deadline = int(r.zscore(keys.sweeper_holds, job))
    sleep_until_server_ms(r, deadline + HOLDS.hold_ms + 1)
    result = sweep(r, keys)
    assert (result.recovered, result.dead_lettered, result.uncounted) == (0, 0, 0)
    assert not r.hexists(keys.job(job), "stalled")
    assert r.zcard(keys.sweeper_holds) == 0 and r.hlen(keys.sweeper_hold_tokens) == 0
    assert r.hget(keys.sweeper_totals, "uncounted") is None
    expected = {"extend": ["active"], "complete": [], "retry": ["schedule"]}[ending]
    assert mq.where_is(job).places == expected
    assert mq.audit() == []


def test_an_extension_after_the_hold_ended_is_honoured_once_more(r, keys, mq):
    """A held lease extended, then lapsing again: held again and counted once."""
    job = mq.enqueue("x")
    claim = mq.claim(lease_ms=300)
    assert sweep(r, keys).held == 1
    assert mq.extend(claim, lease_ms=300)
    assert sweep(r, keys).held == 1  # the extension's new deadline is within the lead again
    deadline = int(r.zscore(keys.sweeper_holds, job))
    sleep_until_server_ms(r, deadline + 1)
    assert mq.reap() == []
    result = sweep(r, keys)
    assert (result.recovered, result.uncounted) == (1, 0)
    assert r.hget(keys.job(job), "stalled") == "1"
    assert mq.audit() == []


@pytest.mark.parametrize("then_claimed", [False, True])
def test_a_hold_the_reaper_ended_first_is_counted_uncounted_once(r, keys, mq, then_claimed):
    """The sweeper was late past the whole hold: the reaper returned the job
    (and a worker may have claimed it since). The lapse is lost to the budget,
    and said so, once."""
    job = mq.enqueue("x")
    mq.claim(lease_ms=300)
    assert sweep(r, keys).held == 1
    deadline = int(r.zscore(keys.sweeper_holds, job))
    sleep_until_server_ms(r, deadline + HOLDS.hold_ms + 1)
    assert mq.reap() == [job]
    if then_claimed:
        assert mq.claim(lease_ms=60_000).id == job
    result = sweep(r, keys)
    assert (result.recovered, result.uncounted) == (0, 1)
    assert r.hget(keys.sweeper_totals, "uncounted") == "1"
    assert engine.queue_snapshot(r, keys.queue).uncounted_total == 1
    assert sweep(r, keys).uncounted == 0  # never twice
    assert not r.hexists(keys.job(job), "stalled")
    assert mq.audit() == []


def test_holds_and_restored_leases_take_only_the_room_left_in_the_batch(r, keys):
    now = server_ms(r)
    put_active(r, keys, "OLD", score=1)  # lapsed long ago, never held
    for i in range(3):
        put_active(r, keys, f"JOB{i}", score=now + 200)
    result = sweep(r, keys, limit=2)
    assert (result.recovered, result.held) == (1, 2)
    assert result.seconds_to_next() == 0.0  # one lease is still to hold: call again at once
    assert sweep(r, keys, limit=2).held == 1
    # two lapses nobody held fill the batch when the held leases fall due
    put_active(r, keys, "LATE1", score=1)
    put_active(r, keys, "LATE2", score=1)
    sleep_until_server_ms(r, now + 201)
    replies = []
    while True:
        result = sweep(r, keys, limit=2)
        replies.append((result.recovered, result.more))
        if not result.more:
            break
    assert replies == [(2, True), (2, True), (1, False)]
    stalls = {job: r.hget(keys.job(job), "stalled") for job in ("OLD", "LATE1", "LATE2", "JOB0", "JOB1", "JOB2")}
    assert set(stalls.values()) == {"1"}  # each lapse counted once
    assert r.zcard(keys.active) == 0 and r.zcard(keys.sweeper_holds) == 0


def test_without_holds_nothing_is_held_and_the_next_deadline_is_named(r, keys):
    deadline = server_ms(r) + 100
    put_active(r, keys, "JOB1", score=deadline)
    result = sweep(r, keys, holds=engine.NO_HOLDS)
    assert (result.held, result.next_at_ms) == (0, deadline)
    assert r.zscore(keys.active, "JOB1") == deadline and not r.exists(keys.sweeper_holds)


def test_an_empty_queue_has_no_next_event(r, keys):
    result = sweep(r, keys)
    assert result.next_at_ms is None and result.seconds_to_next() is None and result.server_now_ms > 0


def test_a_user_who_may_not_hold_still_sweeps_and_is_told(redis_server, r, keys):
    put_active(r, keys, "JOB1")
    put_active(r, keys, "SOON", score=server_ms(r) + 100)
    with restricted_user(redis_server, r, "no-zcount", "-zcount") as client:
        result = sweep(client, keys)
    assert (result.recovered, result.held) == (1, 0)
    [problem] = result.problems
    assert "leases are not held" in problem and "ZCOUNT" in problem
    assert not held(r, keys, "SOON")


@pytest.mark.parametrize("lead_ms, hold_ms", [(-1, 1000), (250, 250), (250, 100), (1.5, 1000), (True, 1000)])
def test_bad_hold_settings_are_refused_by_name(lead_ms, hold_ms):
    with pytest.raises(ValueError, match="hold"):
        Holds(lead_ms=lead_ms, hold_ms=hold_ms)
