"""Recovery is fenced: the stalled worker of a recovered job, still alive, can
no longer touch it.

EchoMQ's lease extension re-adds an id to ``active`` whenever the caller's
token matches the row's ``attempts``, and its ``complete`` / ``retry`` need no
``active`` entry either. Were a recovery to keep the token, the stalled worker
could extend (the id then waits in pending, or its lane, *and* sits in
``active``), then complete: ``gactive`` freed a second time, the row deleted,
a dangling id left waiting; or a second worker claims it too (a duplicate
run). So the sweep bumps ``attempts`` on recovery as on dead-letter, and each
of those calls is refused with ``EMQSTALE``.
"""

from __future__ import annotations

import pytest

from stalledpolicy import engine
from stalledpolicy.devenv.echomq import EchoMQ, StaleToken

pytestmark = pytest.mark.redis

LEASE_MS = 60_000


def _stale_call(mq: EchoMQ, claim, call: str):
    if call == "extend":
        return mq.extend(claim, LEASE_MS, strict=False)  # EchoMQ's own, not the strict variant
    if call == "complete":
        return mq.complete(claim)
    return mq.fail(claim, error="late", delay_ms=0, max_attempts=5)


def _recovered(r, queue_name, group):
    """A job claimed, its worker stalled, its lease lapsed, the sweep recovered
    it. Grouped: a healthy worker keeps a second job of the lane in flight, so
    gactive must stay exactly 1 whatever the stalled worker tries."""
    mq = EchoMQ(r, queue_name)
    if group:
        mq.set_lane_limit(group, 2)
    stalled_job, busy_job = mq.enqueue_many(2, group=group)
    zombie = mq.claim(LEASE_MS, "any")
    busy = mq.claim(LEASE_MS, "any")
    assert (zombie.id, busy.id) == (stalled_job, busy_job) and zombie.token == 1
    assert mq.expire(zombie)
    result = engine.sweep_batch(r, queue_name, engine.Budgets(3), 10)
    assert (result.recovered, result.dead_lettered, result.orphans) == (1, 0, 0)
    return mq, zombie, busy


@pytest.mark.parametrize("group", [None, "a"])
@pytest.mark.parametrize("call", ["extend", "complete", "retry"])
def test_the_stalled_worker_of_a_recovered_job_is_refused(r, queue_name, group, call):
    mq, zombie, busy = _recovered(r, queue_name, group)
    home = [f"lane:{group}"] if group else ["pending"]
    assert r.hget(mq.keys.job(zombie.id), "attempts") == "2"  # the fence

    with pytest.raises(StaleToken):
        _stale_call(mq, zombie, call)

    # exactly one place, the row untouched, the lane slot of the busy job kept
    assert mq.where_is(zombie.id).places == home
    row = r.hgetall(mq.keys.job(zombie.id))
    assert (row["state"], row["attempts"], row["stalled"]) == ("pending", "2", "1")
    assert "last_error" not in row
    assert r.zrange(mq.keys.active, 0, -1) == [busy.id]
    assert r.hgetall(mq.keys.gactive) == ({group: "1"} if group else {})
    assert r.hget(mq.keys.metrics_completed, "count") is None
    assert mq.audit() == []

    # the job runs again, once, for the next worker; the busy one finishes too
    assert mq.complete(busy) is True
    again = mq.claim(LEASE_MS, "any")
    assert again.id == zombie.id and again.token == 3
    with pytest.raises(StaleToken):
        _stale_call(mq, zombie, call)
    assert mq.complete(again) is True
    assert mq.claim(LEASE_MS, "any") is None
    assert r.hget(mq.keys.metrics_completed, "count") == "2"
    assert r.hgetall(mq.keys.gactive) == {}
    assert mq.audit() == []


@pytest.mark.parametrize("group", [None, "a"])
def test_the_stalled_worker_tries_everything_in_turn_and_nothing_lands(r, queue_name, group):
    """Extend, then complete, then retry: the interleaving of the review
    finding, each step refused, the queue sound after each."""
    mq, zombie, busy = _recovered(r, queue_name, group)
    for call in ("extend", "complete", "retry"):
        with pytest.raises(StaleToken):
            _stale_call(mq, zombie, call)
        assert mq.where_is(zombie.id).places == ([f"lane:{group}"] if group else ["pending"])
        assert mq.audit() == []
    # a second sweep finds nothing of the zombie's in active: no second stall
    mq.expire(busy)
    result = engine.sweep_batch(r, mq.queue, engine.Budgets(3), 10)
    assert (result.recovered, result.orphans) == (1, 0)
    assert r.hget(mq.keys.job(zombie.id), "stalled") == "1"
    assert mq.audit() == []


def test_a_fenced_recovery_costs_one_echomq_attempt(r, queue_name):
    """Documented cost: attempts is also EchoMQ's retry counter."""
    mq = EchoMQ(r, queue_name)
    job = mq.enqueue("x")
    mq.expire(mq.claim(LEASE_MS, "flat"))
    engine.sweep_batch(r, queue_name, engine.Budgets(3), 10)
    claim = mq.claim(LEASE_MS, "flat")
    assert claim.id == job and claim.token == 3  # claim 1, the fence, claim 2
    # with max_attempts 3, this first real failure is the last one
    assert mq.fail(claim, error="boom", delay_ms=0, max_attempts=3) == "dead"
    assert mq.audit() == []

