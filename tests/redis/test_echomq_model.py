"""The EchoMQ-shaped worker model behaves per the contract, and its audit is no
rubber stamp: every corruption it is meant to catch, it catches."""

from __future__ import annotations

import pytest

from stalledpolicy import engine
from stalledpolicy.devenv.echomq import EchoMQ, StaleToken, audit, read_state, server_now_ms
from stalledpolicy.keyspace import QueueKeys

pytestmark = pytest.mark.redis


@pytest.fixture
def mq(r, queue_name):
    return EchoMQ(r, queue_name)


def test_ids_sort_in_mint_order_and_flat_claims_follow_it(mq, r):
    ids = [mq.enqueue(f"p{i}") for i in range(5)] + mq.enqueue_many(5)
    assert ids == sorted(ids) and all(i.startswith("JOB") for i in ids)
    claimed = [mq.claim(5_000, "flat") for _ in ids]
    assert [c.id for c in claimed] == ids
    assert mq.claim(5_000, "flat") is None
    assert {c.token for c in claimed} == {1}
    assert claimed[0].payload == "p0"
    assert mq.audit() == []


def test_claim_leases_on_the_server_clock_and_counts_attempts(mq, r):
    job = mq.enqueue("x")
    before = server_now_ms(r)
    claim = mq.claim(7_000, "flat")
    after = server_now_ms(r)
    row = r.hgetall(mq.keys.job(job))
    assert (row["state"], row["attempts"]) == ("active", "1")
    assert before + 7_000 <= r.zscore(mq.keys.active, job) <= after + 7_000
    assert claim.token == 1 and claim.group is None


def test_grouped_claims_rotate_the_ring_round_robin(mq, r):
    for group, count in (("a", 3), ("b", 2), ("c", 1)):
        for _ in range(count):
            mq.enqueue(group, group=group)
    assert r.lrange(mq.keys.ring, 0, -1) == ["a", "b", "c"]
    served = [mq.claim(5_000, "grouped").group for _ in range(6)]
    assert served == ["a", "b", "c", "a", "b", "a"]
    assert mq.claim(5_000, "grouped") is None
    assert r.hgetall(mq.keys.gactive) == {"a": "3", "b": "2", "c": "1"}
    assert r.llen(mq.keys.ring) == 0  # emptied lanes leave the ring
    assert mq.audit() == []


def test_lane_limit_takes_a_lane_off_the_ring_and_completion_puts_it_back(mq, r):
    mq.set_lane_limit("a", 1)
    mq.enqueue_many(3, group="a")
    mq.enqueue_many(1, group="b")
    first = mq.claim(5_000, "grouped")
    assert first.group == "a"
    assert "a" not in r.lrange(mq.keys.ring, 0, -1)
    assert mq.claim(5_000, "grouped").group == "b"
    assert mq.claim(5_000, "grouped") is None  # a is at its limit, b is empty
    r.delete(mq.keys.wake)
    assert mq.complete(first) is True
    assert r.lrange(mq.keys.ring, 0, -1) == ["a"]
    assert r.lrange(mq.keys.wake, 0, -1) == ["1"]
    assert mq.audit() == []
    mq.set_lane_limit("a", 0)
    assert r.llen(mq.keys.ring) == 0
    mq.set_lane_limit("a", 5)
    assert r.lrange(mq.keys.ring, 0, -1) == ["a"]
    assert mq.audit() == []


def test_a_paused_lane_is_not_served_until_resumed(mq, r):
    mq.enqueue_many(2, group="a")
    mq.pause("a")
    assert r.llen(mq.keys.ring) == 0
    mq.enqueue("late", group="a")  # admission into a paused lane does not ring it
    assert r.llen(mq.keys.ring) == 0
    assert mq.claim(5_000, "grouped") is None
    assert mq.audit() == []
    mq.resume("a")
    assert r.lrange(mq.keys.ring, 0, -1) == ["a"]
    assert mq.claim(5_000, "grouped").group == "a"


def test_wake_is_pushed_for_a_lane_entering_the_ring_and_trimmed(mq, r):
    mq.enqueue("x", group="a")
    mq.enqueue("y", group="a")  # already on the ring: no second wake
    assert r.lrange(mq.keys.wake, 0, -1) == ["1"]
    for i in range(100):
        mq.enqueue("z", group=f"lane{i}")
    assert r.llen(mq.keys.wake) == 64
    assert mq.audit() == []


def test_stale_tokens_are_refused_and_a_gone_row_is_reported(mq, r):
    job = mq.enqueue("x")
    first = mq.claim(5_000, "flat")
    assert mq.fail(first, error="boom", delay_ms=0, max_attempts=5) == "scheduled"
    assert mq.where_is(job).places == ["schedule"]
    assert mq.promote() == 1
    second = mq.claim(5_000, "flat")
    assert second.token == 2
    with pytest.raises(StaleToken):
        mq.complete(first)
    with pytest.raises(StaleToken):
        mq.extend(first, 5_000)
    assert mq.extend(second, 9_000) is True
    assert mq.complete(second) is True
    assert mq.complete(second) is False  # row gone
    assert r.hget(mq.keys.metrics_completed, "count") == "1"
    assert mq.audit() == []


def test_fail_at_max_attempts_dead_letters_and_frees_the_lane(mq, r):
    mq.set_lane_limit("a", 1)
    job = mq.enqueue("x", group="a")
    mq.enqueue("y", group="a")
    claim = mq.claim(5_000, "grouped")
    assert claim.id == job
    assert mq.fail(claim, error="bad", max_attempts=1) == "dead"
    assert r.hgetall(mq.keys.job(job))["state"] == "dead"
    assert r.zscore(mq.keys.dead, job) == 0
    assert r.lrange(mq.keys.ring, 0, -1) == ["a"]
    assert r.hget(mq.keys.metrics_failed, "count") == "1"
    assert mq.audit() == []


def test_a_late_complete_after_a_recovery_is_refused_and_the_job_waits_for_a_new_claim(mq, r):
    """Our recovery fences (attempts += 1): the stalled worker that finishes
    after the sweep returned its job can no longer retire it; the job runs
    again, under a new claim."""
    mq.enqueue("x", group="a")
    claim = mq.claim(5_000, "grouped")
    mq.expire(claim)
    assert engine.sweep_batch(r, mq.queue, engine.Budgets(3), 10).recovered == 1
    assert mq.where_is(claim.id).places == ["lane:a"]
    with pytest.raises(StaleToken):
        mq.complete(claim)
    assert mq.where_is(claim.id).places == ["lane:a"]
    assert mq.audit() == []
    again = mq.claim(5_000, "grouped")
    assert again.id == claim.id and again.token == 3
    assert mq.complete(again) is True
    assert mq.audit() == []


def test_echomq_extend_double_places_a_waiting_job_whose_token_matches_strict_does_not(mq, r):
    """A hazard of EchoMQ's own extension: a job back in pending with its token
    unchanged (EchoMQ's retry, then promote) is re-added to active by a late
    heartbeat. The audit sees it; when that stray lease lapses our sweep drops
    it without counting a stall. After our recovery the same heartbeat is
    refused: the recovery moved the token on."""
    job = mq.enqueue("x")
    claim = mq.claim(5_000, "flat")
    assert mq.fail(claim, error="boom", delay_ms=0, max_attempts=5) == "scheduled"
    assert mq.promote() == 1
    assert mq.extend(claim, 5_000, strict=True) is False
    assert mq.audit() == []
    assert mq.extend(claim, 5_000) is True
    assert sorted(mq.where_is(job).places) == ["active", "pending"]
    assert any("several places" in p for p in mq.audit())
    mq.expire(claim)
    assert engine.sweep_batch(r, mq.queue, engine.Budgets(3), 10).orphans == 1
    assert mq.where_is(job).places == ["pending"]
    assert r.hget(mq.keys.job(job), "stalled") is None
    assert mq.audit() == []

    second = mq.claim(5_000, "flat")
    mq.expire(second)
    assert engine.sweep_batch(r, mq.queue, engine.Budgets(3), 10).recovered == 1
    for strict in (True, False):
        with pytest.raises(StaleToken):
            mq.extend(second, 5_000, strict=strict)
    assert mq.where_is(job).places == ["pending"]
    assert mq.audit() == []


def test_seed_stalled_leaves_what_a_dead_worker_leaves(r, queue_name):
    mq = EchoMQ(r, queue_name)
    seeded = mq.seed_stalled(2_000, groups=["a", "b"], budget=3, at_budget_fraction=0.25)
    keys = QueueKeys(queue_name)
    assert r.zcount(keys.active, "-inf", server_now_ms(r)) == 2_000
    grouped = [j for j, g in seeded.groups.items() if g]
    assert 0 < len(grouped) < 2_000
    assert sum(int(v) for v in r.hvals(keys.gactive)) == len(grouped)
    assert all(seeded.stalled_before[j] == 2 for j in seeded.at_budget)
    assert 0 < len(seeded.at_budget) < 2_000
    assert mq.audit() == []
    result = engine.drain(r, queue_name, engine.Budgets(3), 500)
    assert (result.recovered, result.dead_lettered) == (2_000 - len(seeded.at_budget), len(seeded.at_budget))
    assert set(r.zrange(keys.dead, 0, -1)) == seeded.at_budget
    assert mq.audit() == []


def test_the_model_works_without_decoded_responses(redis_server, queue_name):
    raw = redis_server.client()
    raw.flushall()
    mq = EchoMQ(raw, queue_name)
    mq.enqueue("x", group="a")
    claim = mq.claim(5_000)
    assert isinstance(claim.id, str) and claim.group == "a"
    assert mq.where_is(claim.id).places == ["active"]
    assert mq.audit() == []
    assert mq.complete(claim) is True
    raw.close()


# -- EchoMQ's reaper ------------------------------------------------------------

def _quiet_events(r, keys):
    """A subscriber to the queue's events channel, past its confirmation."""
    sub = r.pubsub()
    sub.subscribe(keys.events)
    assert sub.get_message(timeout=1)["type"] == "subscribe"
    return sub


def test_the_reaper_returns_an_expired_flat_job_uncounted(mq, r):
    job = mq.enqueue("x")
    claim = mq.claim(5_000, "flat")
    r.hset(mq.keys.job(job), "stalled", "1")  # an earlier stall a sweep counted
    assert mq.reap() == []  # the lease has not lapsed
    mq.expire(claim)
    events = _quiet_events(r, mq.keys)
    assert mq.reap() == [job]
    row = r.hgetall(mq.keys.job(job))
    assert (row["state"], row["attempts"], row["stalled"]) == ("pending", "1", "1")
    assert mq.where_is(job).places == ["pending"]
    assert events.get_message(timeout=0.2) is None  # nothing published
    events.close()
    assert r.exists(mq.keys.metrics_failed, mq.keys.sweeper_totals) == 0
    assert mq.audit() == []
    again = mq.claim(5_000, "flat")
    assert (again.id, again.token) == (job, 2)  # the next claim moves the token on


def test_the_reaper_releases_the_lane_slot_and_rings_the_lane_back(mq, r):
    mq.set_lane_limit("a", 1)
    first, second = mq.enqueue_many(2, group="a")
    claim = mq.claim(5_000, "grouped")
    assert claim.id == first and r.llen(mq.keys.ring) == 0  # at its limit: off the ring
    mq.expire(claim)
    r.delete(mq.keys.wake)
    assert mq.reap() == [first]
    assert r.hget(mq.keys.gactive, "a") is None  # the field is deleted at 0
    assert r.lrange(mq.keys.ring, 0, -1) == ["a"] and r.lrange(mq.keys.wake, 0, -1) == ["1"]
    assert mq.where_is(first).places == ["lane:a"]
    assert r.zrange(mq.keys.lane_pending("a"), 0, -1) == [first, second]
    assert (r.hget(mq.keys.job(first), "state"), r.hget(mq.keys.job(first), "attempts")) == ("pending", "1")
    assert mq.audit() == []


def test_the_reaper_rings_no_lane_already_on_the_ring_paused_or_still_at_its_limit(mq, r):
    mq.enqueue_many(3, group="open")             # keeps work on the ring after two claims
    mq.enqueue_many(1, group="held")
    mq.set_lane_limit("full", 1)
    mq.enqueue_many(1, group="full")
    claims = [mq.claim(5_000, "grouped") for _ in range(3)]
    assert sorted(c.group for c in claims) == ["full", "held", "open"]
    mq.pause("held")
    for claim in claims:
        mq.expire(claim)
    assert mq.claim(5_000, "grouped").group == "open"  # a live lease beside the lapsed one
    mq.set_lane_limit("full", 0)                 # its freed slot is still over the new limit
    assert r.lrange(mq.keys.ring, 0, -1) == ["open"]
    r.delete(mq.keys.wake)
    assert sorted(mq.reap()) == sorted(c.id for c in claims)
    assert r.lrange(mq.keys.ring, 0, -1) == ["open"] and r.llen(mq.keys.wake) == 0
    assert r.hgetall(mq.keys.gactive) == {"open": "1"}
    assert all(mq.where_is(c.id).places == [f"lane:{c.group}"] for c in claims)
    assert mq.audit() == []


def test_the_reaper_leaves_live_leases_alone(mq, r):
    live, lapsed = mq.enqueue_many(2)
    live_claim, lapsed_claim = mq.claim(60_000, "flat"), mq.claim(60_000, "flat")
    deadline = r.zscore(mq.keys.active, live)
    mq.expire(lapsed_claim, past_ms=1)
    assert mq.reap() == [lapsed]
    assert r.zscore(mq.keys.active, live) == deadline
    assert r.hget(mq.keys.job(live), "state") == "active"
    assert mq.complete(live_claim) is True
    assert mq.audit() == []


def test_the_reaper_takes_at_most_100_per_call_the_oldest_lease_first(mq, r):
    mq.seed_stalled(230, groups=["a", "b"], lease_past_ms=60_000)
    oldest = mq.enqueue("oldest")
    mq.expire(mq.claim(5_000, "flat"), past_ms=120_000)
    batches = [mq.reap() for _ in range(4)]
    assert [len(b) for b in batches] == [100, 100, 31, 0]
    assert batches[0][0] == oldest
    assert len(set().union(*batches)) == 231
    assert r.zcard(mq.keys.active) == 0 and not r.exists(mq.keys.gactive)
    assert mq.audit() == []


def test_a_reaped_job_can_still_be_settled_by_its_worker_with_the_old_token(mq, r):
    """EchoMQ's reaper keeps the token: the worker whose lease it reaped still
    completes (the job leaves pending), and its heartbeat puts the job in two
    places (EchoMQ's extension; the strict kind refuses). Only a new claim
    fences it off."""
    done, beat = mq.enqueue_many(2)
    late = [mq.claim(5_000, "flat"), mq.claim(5_000, "flat")]
    mq.expire_all()
    assert sorted(mq.reap()) == [done, beat]
    assert mq.complete(late[0]) is True
    assert mq.where_is(done).places == [] and not r.exists(mq.keys.job(done))
    assert mq.extend(late[1], 5_000, strict=True) is False
    assert mq.audit() == []
    assert mq.extend(late[1], 5_000) is True
    assert sorted(mq.where_is(beat).places) == ["active", "pending"]
    _only(mq.audit(), "several places")
    again = mq.claim(5_000, "flat")
    assert again.id == beat and mq.where_is(beat).places == ["active"]
    with pytest.raises(StaleToken):
        mq.complete(late[1])
    assert mq.complete(again) is True
    assert mq.audit() == []


def test_the_reaper_like_echomq_reads_no_row_and_leaves_a_ghost_for_a_rowless_id(mq, r):
    r.zadd(mq.keys.active, {"JOBrowless": 0})
    assert mq.reap() == ["JOBrowless"]
    assert r.hgetall(mq.keys.job("JOBrowless")) == {"state": "pending"}
    assert mq.where_is("JOBrowless").places == ["pending"]


# -- the audit catches what it must -------------------------------------------

def _only(problems: list[str], needle: str) -> None:
    assert problems, "the audit saw nothing"
    assert any(needle in p for p in problems), problems


def test_audit_flags_a_job_in_two_places(mq, r):
    job = mq.enqueue("x")
    r.zadd(mq.keys.dead, {job: 0})
    _only(mq.audit(), "several places")


def test_audit_flags_a_ghost_row_and_a_dangling_id(mq, r):
    r.hset(mq.keys.job("JOBghost"), mapping={"state": "pending", "stalled": "1"})
    _only(mq.audit(), "in no place")
    r.delete(mq.keys.job("JOBghost"))
    r.zadd(mq.keys.dead, {"JOBdangling": 0})
    _only(mq.audit(), "dangling")


def test_audit_flags_a_lost_job_against_the_ledger(mq, r):
    job = mq.enqueue("x")
    r.zrem(mq.keys.pending, job)
    r.delete(mq.keys.job(job))
    _only(mq.audit(), "lost")
    assert mq.audit(check_ledger=False) == []


def test_audit_flags_state_and_lane_mismatches(mq, r):
    flat = mq.enqueue("x")
    grouped = mq.enqueue("y", group="a")
    r.hset(mq.keys.job(flat), "state", "active")
    _only(mq.audit(), "want 'pending'")
    r.hset(mq.keys.job(flat), "state", "pending")
    r.zrem(mq.keys.lane_pending("a"), grouped)
    r.zadd(mq.keys.pending, {grouped: 0})
    _only(mq.audit(), "flat pending")


def test_audit_flags_gactive_drift(mq, r):
    mq.enqueue("x", group="a")
    mq.claim(5_000, "grouped")
    r.hincrby(mq.keys.gactive, "a", 1)
    _only(mq.audit(), "in flight")
    r.hset(mq.keys.gactive, "b", 0)
    _only(mq.audit(), "must be a count above 0")


def test_audit_flags_ring_faults(mq, r):
    mq.enqueue_many(2, group="a")
    r.delete(mq.keys.ring)
    _only(mq.audit(), "missing from the ring")
    r.rpush(mq.keys.ring, "a", "a")
    _only(mq.audit(), "2 times")
    r.delete(mq.keys.ring)
    r.sadd(mq.keys.paused, "a")
    r.rpush(mq.keys.ring, "a")
    _only(mq.audit(), "paused but on the ring")
    r.delete(mq.keys.ring, mq.keys.paused)
    r.hset(mq.keys.glimit, "a", 0)
    r.rpush(mq.keys.ring, "a")
    _only(mq.audit(), "at its limit")


def test_audit_flags_non_integer_counters_and_wrong_row_types(mq, r):
    job = mq.enqueue("x")
    r.hset(mq.keys.job(job), "stalled", "lots")
    _only(mq.audit(), "not an integer")
    r.delete(mq.keys.job(job))
    r.set(mq.keys.job(job), "oops")
    _only(audit(r, mq.queue), "not a hash")


def test_audit_flags_a_limit_that_is_not_a_number_and_such_a_lane_on_the_ring(mq, r):
    """EchoMQ's claim compares with the limit after popping the job: such a
    lane must stay off the ring (the sweep and the replay keep it off)."""
    mq.enqueue("x", group="a")
    r.hset(mq.keys.glimit, "a", "lots")
    problems = mq.audit()
    assert any("glimit='lots' is not a number" in p for p in problems), problems
    assert any("on the ring with a glimit that is not a number" in p for p in problems), problems
    r.delete(mq.keys.ring)
    problems = mq.audit()
    assert not any("missing from the ring" in p for p in problems) and len(problems) == 1, problems
    r.hset(mq.keys.glimit, "a", "2.5")  # a number to Lua's tonumber
    assert [p for p in mq.audit() if "missing from the ring" in p]


def test_the_chunked_read_of_a_big_queue_sees_what_the_atomic_read_sees(mq, r):
    mq.seed_stalled(300, groups=["a", "b"])
    mq.enqueue_many(5)
    mq.enqueue_many(5, group="c")
    mq.pause("c")
    mq.set_lane_limit("a", 1)
    mq.fail(mq.claim(5_000, "flat"), max_attempts=1)
    r.set(mq.keys.job("JOBnot-a-hash"), "x")
    r.zadd(mq.keys.dead, {"JOBnot-a-hash": 0})
    atomic = read_state(r, mq.queue, atomic=True)
    chunked = read_state(r, mq.queue, atomic=False)
    assert chunked == atomic
    assert atomic.rows["JOBnot-a-hash"].kind == "string"
    assert len(atomic.rows) == 300 + 10 + 1
