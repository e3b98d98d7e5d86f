"""The sweep script, branch by branch, on a real redis-server."""

from __future__ import annotations

import re

import pytest
import redis

from stalledpolicy import engine
from stalledpolicy.engine import Budgets
from tests.redis.engine_rows import (
    EXPIRED,
    EventTap,
    echomq_complete,
    put_active,
    reclaim,
    restricted_user,
    server_ms,
)

pytestmark = pytest.mark.redis


def sweep(r, keys, default=1, lanes=None, limit=100):
    return engine.sweep_batch(r, keys.queue, Budgets(default, lanes or {}), limit)


def where(r, keys, job_id, group=None):
    places = []
    for name, key in (("pending", keys.pending), ("active", keys.active), ("dead", keys.dead)):
        if r.zscore(key, job_id) is not None:
            places.append(name)
    if group is not None and r.zscore(keys.lane_pending(group), job_id) is not None:
        places.append("lane")
    return places


def sweep_announcing(r, keys, expected, raw=False, **budget):
    """Sweep with a subscriber on the events channel: (result, the events)."""
    tap = EventTap(r, keys)
    try:
        result = sweep(r, keys, **budget)
        return result, (tap.collect_raw(expected) if raw else tap.collect(expected))
    finally:
        tap.close()


# ----------------------------------------------------------------- the budget


@pytest.mark.parametrize("budget, recoveries", [(1, 0), (2, 1), (3, 2)])
def test_budget_counts_recoveries_then_dead_letters_on_the_stall_that_reaches_it(r, keys, budget, recoveries):
    put_active(r, keys, "JOB1")
    for stall in range(1, recoveries + 1):
        result = sweep(r, keys, default=budget)
        assert (result.recovered, result.dead_lettered) == (1, 0)
        assert where(r, keys, "JOB1") == ["pending"]
        assert r.hget(keys.job("JOB1"), "stalled") == str(stall)
        assert r.hget(keys.job("JOB1"), "state") == "pending"
        reclaim(r, keys, "JOB1", source=keys.pending)
    result = sweep(r, keys, default=budget)
    assert (result.recovered, result.dead_lettered) == (0, 1)
    assert where(r, keys, "JOB1") == ["dead"]
    row = r.hgetall(keys.job("JOB1"))
    assert row["state"] == "dead"
    assert row["last_error"] == "stalled"
    assert row["stalled"] == str(budget)
    assert row["payload"] == "payload-JOB1"


def test_budget_zero_never_dead_letters_but_still_counts(r, keys):
    put_active(r, keys, "JOB1")
    for stall in range(1, 6):
        result = sweep(r, keys, default=0)
        assert (result.recovered, result.dead_lettered) == (1, 0)
        assert r.hget(keys.job("JOB1"), "stalled") == str(stall)
        reclaim(r, keys, "JOB1", source=keys.pending)
    assert r.zcard(keys.dead) == 0


def test_existing_stall_count_on_the_row_is_honoured(r, keys):
    put_active(r, keys, "JOB1", stalled=2)
    result = sweep(r, keys, default=3)
    assert result.dead_lettered == 1
    assert r.hget(keys.job("JOB1"), "stalled") == "3"


def test_lane_budget_overrides_the_default(r, keys):
    put_active(r, keys, "JOBflat")
    put_active(r, keys, "JOBbulk", group="bulk")
    put_active(r, keys, "JOBother", group="other")
    result = sweep(r, keys, default=1, lanes={"bulk": 3})
    assert where(r, keys, "JOBflat") == ["dead"]
    assert where(r, keys, "JOBbulk", "bulk") == ["lane"]
    assert where(r, keys, "JOBother", "other") == ["dead"]
    assert result.lanes == {
        "bulk": engine.LaneCounts(recovered=1, dead_lettered=0),
        "other": engine.LaneCounts(recovered=0, dead_lettered=1),
    }


def test_lane_budget_zero_protects_one_lane(r, keys):
    put_active(r, keys, "JOBa", group="a", stalled=10)
    result = sweep(r, keys, default=1, lanes={"a": 0})
    assert result.recovered == 1 and where(r, keys, "JOBa", "a") == ["lane"]
    assert r.hget(keys.job("JOBa"), "stalled") == "11"


def test_budgets_refuse_bad_values_naming_the_field():
    with pytest.raises(ValueError, match="maxStalled"):
        Budgets(-1)
    with pytest.raises(ValueError, match=r"lanes\[a\]"):
        Budgets(1, {"a": "2"})
    with pytest.raises(ValueError, match="lane name"):
        Budgets(1, {"": 2})
    with pytest.raises(ValueError, match="batch size"):
        engine.sweep_batch(None, "q", Budgets(1), 0)


# ----------------------------------------------------------------- clock and limit


def test_only_leases_lapsed_on_the_server_clock_are_swept(r, keys):
    now = server_ms(r)
    put_active(r, keys, "JOBlive", score=now + 60_000)
    put_active(r, keys, "JOBlapsed", score=now - 1)
    result = sweep(r, keys, default=2)
    assert result.recovered == 1
    assert where(r, keys, "JOBlive") == ["active"]
    assert r.hgetall(keys.job("JOBlive")) == {"state": "active", "attempts": "1", "payload": "payload-JOBlive"}
    assert where(r, keys, "JOBlapsed") == ["pending"]


def test_limit_bounds_a_call_and_more_says_whether_expired_work_is_left(r, keys):
    for i in range(5):
        put_active(r, keys, f"JOB{i}")
    first = sweep(r, keys, default=2, limit=2)
    assert (first.recovered, first.more) == (2, True)
    assert r.zcard(keys.active) == 3
    second = sweep(r, keys, default=2, limit=3)
    assert (second.recovered, second.more) == (3, False)
    assert r.zcard(keys.active) == 0
    empty = sweep(r, keys, default=2, limit=3)
    assert (empty.recovered, empty.more, empty.lanes) == (0, False, {})


def test_more_ignores_leases_still_running(r, keys):
    put_active(r, keys, "JOB1")
    put_active(r, keys, "JOB2", score=server_ms(r) + 60_000)
    assert sweep(r, keys, default=2, limit=1).more is False


def test_drain_loops_bounded_calls_until_the_prefix_is_empty(r, keys):
    for i in range(7):
        put_active(r, keys, f"JOB{i}", group="g" if i % 2 else None)
    seen = []
    total = engine.drain(r, keys.queue, Budgets(2), 3, on_call=lambda res, secs: seen.append((res.moved, secs)))
    assert total.recovered == 7 and total.calls == 3 and total.more is False
    assert [moved for moved, _ in seen] == [3, 3, 1]
    assert all(secs >= 0 for _, secs in seen)
    assert total.lanes == {"g": engine.LaneCounts(recovered=3)}


def test_drain_stops_between_calls_when_asked(r, keys):
    # the stop is asked for while the first call is counted: the second call,
    # sent before that (the next call overlaps the last one's bookkeeping),
    # finishes and is counted; no third is sent
    for i in range(6):
        put_active(r, keys, f"JOB{i}")
    calls = []
    total = engine.drain(r, keys.queue, Budgets(2), 2, should_stop=lambda: len(calls) >= 1,
                         on_call=lambda res, secs: calls.append(res))
    assert len(calls) == 2 and total.calls == 2 and total.recovered == 4 and total.more is True
    assert r.zcard(keys.active) == 2


def test_drain_stopped_before_it_starts_makes_no_call(r, keys):
    put_active(r, keys, "JOB1")
    total = engine.drain(r, keys.queue, Budgets(2), 2, should_stop=lambda: True)
    assert total.calls == 0 and r.zcard(keys.active) == 1


# ----------------------------------------------------------------- orphans and malformed rows


def test_orphan_is_removed_counted_and_never_recreated(r, keys):
    r.zadd(keys.active, {"JOBgone": EXPIRED})
    put_active(r, keys, "JOBok")
    result = sweep(r, keys, default=2)
    assert (result.orphans, result.recovered) == (1, 1)
    assert r.exists(keys.job("JOBgone")) == 0
    assert where(r, keys, "JOBgone") == []
    assert r.hget(keys.sweeper_totals, "orphans") == "1"


def test_row_with_only_a_payload_is_still_a_job(r, keys):
    r.hset(keys.job("JOBbare"), "payload", "p")
    r.zadd(keys.active, {"JOBbare": EXPIRED})
    result = sweep(r, keys, default=2)
    assert result.recovered == 1 and result.orphans == 0
    # attempts: the fence, counted from 0 for a row without the field
    assert r.hgetall(keys.job("JOBbare")) == {"payload": "p", "stalled": "1", "state": "pending",
                                              "attempts": "1"}


@pytest.mark.parametrize("field, value, problem", [
    ("stalled", "abc", "stalled is not a non-negative integer: abc"),
    ("stalled", "-1", "stalled is not a non-negative integer: -1"),
    ("stalled", "1.5", "stalled is not a non-negative integer: 1.5"),
    ("stalled", "01", "stalled is not a non-negative integer: 01"),
    ("stalled", "9" * 16, "stalled is not a non-negative integer: " + "9" * 16),
    ("attempts", "x", "attempts is not a non-negative integer: x"),
    ("attempts", "7" * 100, "attempts is not a non-negative integer: " + "7" * 64 + "..."),
    ("group", "", "group is empty"),
])
def test_malformed_hash_row_is_quarantined_without_aborting_the_batch(r, keys, field, value, problem):
    put_active(r, keys, "JOB0")
    put_active(r, keys, "JOBbad", **{field: value})
    put_active(r, keys, "JOBz", group="g")
    result = sweep(r, keys, default=2)
    assert (result.recovered, result.quarantined, result.dead_lettered) == (2, 1, 0)
    assert where(r, keys, "JOB0") == ["pending"]
    assert where(r, keys, "JOBz", "g") == ["lane"]
    assert where(r, keys, "JOBbad") == ["dead"]
    row = r.hgetall(keys.job("JOBbad"))
    assert row["state"] == "dead"
    assert row["last_error"] == "malformed: " + problem
    assert row[field] == value  # the evidence is kept
    assert int(row["dead_at"]) > 0
    # the attempts that dead_at belongs to: fenced, or the bad value as it is
    assert row["dead_attempts"] == row["attempts"]
    assert r.hget(keys.metrics_failed, "count") == "1"
    assert r.hget(keys.sweeper_totals, "quarantined") == "1"


@pytest.mark.parametrize("kind", ["string", "list", "set", "zset", "stream"])
def test_row_of_the_wrong_type_goes_to_the_morgue_untouched(r, keys, kind):
    row = keys.job("JOBwrong")
    {"string": lambda: r.set(row, "v"), "list": lambda: r.rpush(row, "v"),
     "set": lambda: r.sadd(row, "v"), "zset": lambda: r.zadd(row, {"v": 1}),
     "stream": lambda: r.xadd(row, {"f": "v"})}[kind]()
    r.zadd(keys.active, {"JOBwrong": EXPIRED})
    put_active(r, keys, "JOBok")
    result, events = sweep_announcing(r, keys, 2, default=2)
    assert (result.quarantined, result.recovered) == (1, 1)
    assert where(r, keys, "JOBwrong") == ["dead"]
    assert r.type(row) == kind
    failed = [e for e in events if e["event"] == "failed"]
    assert failed == [{"event": "failed", "job": "JOBwrong",
                       "reason": f"malformed: job row is a {kind}, not a hash"}]


def test_malformed_grouped_row_frees_its_lane_slot_and_rings_the_lane(r, keys):
    r.hset(keys.glimit, "g", 1)
    put_active(r, keys, "JOBbad", group="g", stalled="oops")
    r.zadd(keys.lane_pending("g"), {"JOBnext": 0})
    result = sweep(r, keys, default=2)
    assert result.quarantined == 1
    assert r.hget(keys.gactive, "g") is None
    assert r.lrange(keys.ring, 0, -1) == ["g"]


def test_quarantine_fences_a_row_whose_token_is_an_integer(r, keys):
    put_active(r, keys, "JOBbad", attempts=4, stalled="nope")
    sweep(r, keys, default=2)
    with pytest.raises(redis.ResponseError, match="EMQSTALE"):
        echomq_complete(r, keys, "JOBbad", 4)
    assert r.hget(keys.job("JOBbad"), "attempts") == "5"


@pytest.mark.parametrize("token, fenced", [("-4", "-3"), ("1234567890123456", "1234567890123457"),
                                           ("9223372036854775806", "9223372036854775807")])
def test_quarantine_fences_an_integer_token_past_the_counter_rule(r, keys, token, fenced):
    """A claim's HINCRBY takes a negative or long attempts, so the worker holds
    it as its token: the quarantine left it unbumped, and that stalled worker's
    late complete deleted the row, leaving its id in dead with no row."""
    put_active(r, keys, "JOBbad", attempts=token)
    result = sweep(r, keys, default=2)
    assert result.quarantined == 1
    with pytest.raises(redis.ResponseError, match="EMQSTALE"):
        echomq_complete(r, keys, "JOBbad", int(token))
    row = r.hgetall(keys.job("JOBbad"))
    assert row["attempts"] == fenced and row["dead_attempts"] == fenced
    assert row["last_error"].startswith("malformed: attempts is not a non-negative integer")
    assert r.zrange(keys.dead, 0, -1) == ["JOBbad"]


def test_quarantine_leaves_an_attempts_at_the_int64_limit(r, keys):
    put_active(r, keys, "JOBbad", attempts="9223372036854775807")
    assert sweep(r, keys, default=2).quarantined == 1
    row = r.hgetall(keys.job("JOBbad"))
    assert row["attempts"] == row["dead_attempts"] == "9223372036854775807"


def test_corrupt_gactive_does_not_abort_the_batch(r, keys):
    put_active(r, keys, "JOB1", group="g", count_in_gactive=False)
    r.hset(keys.gactive, "g", "many")
    put_active(r, keys, "JOB2")
    result = sweep(r, keys, default=2)
    assert result.recovered == 2
    assert r.hget(keys.gactive, "g") == "many"


# ----------------------------------------------------------------- fencing


def test_dead_letter_fences_the_stalled_worker(r, keys):
    put_active(r, keys, "JOB1", attempts=3)
    sweep(r, keys, default=1)
    with pytest.raises(redis.ResponseError, match="EMQSTALE"):
        echomq_complete(r, keys, "JOB1", 3)
    assert r.exists(keys.job("JOB1")) == 1
    assert where(r, keys, "JOB1") == ["dead"]
    assert r.hget(keys.job("JOB1"), "attempts") == "4"
    assert r.hget(keys.metrics_completed, "count") is None


@pytest.mark.parametrize("group", [None, "g"])
def test_recovery_fences_the_stalled_worker(r, keys, group):
    """docs/scripts.md, "Fencing": a recovered job gets attempts + 1, so the
    stalled worker's late complete is refused; the job waits, in one place,
    for a new claim, whose token completes it."""
    put_active(r, keys, "JOB1", group=group, attempts=1)
    sweep(r, keys, default=3)
    assert r.hget(keys.job("JOB1"), "attempts") == "2"
    with pytest.raises(redis.ResponseError, match="EMQSTALE"):
        echomq_complete(r, keys, "JOB1", 1)
    assert where(r, keys, "JOB1", group) == (["lane"] if group else ["pending"])
    assert r.hget(keys.metrics_completed, "count") is None
    token = reclaim(r, keys, "JOB1", source=keys.lane_pending(group) if group else keys.pending)
    assert token == 3
    with pytest.raises(redis.ResponseError, match="EMQSTALE"):
        echomq_complete(r, keys, "JOB1", 1)
    assert echomq_complete(r, keys, "JOB1", token) == 1
    assert r.exists(keys.job("JOB1")) == 0 and r.hget(keys.gactive, group or "none") is None


def test_recovery_fence_of_a_15_digit_token_is_written_as_an_integer(r, keys):
    put_active(r, keys, "JOB1", attempts="999999999999999")
    sweep(r, keys, default=0)
    assert r.hget(keys.job("JOB1"), "attempts") == "1000000000000000"


# ----------------------------------------------------------------- lanes: gactive, ring, wake


def test_grouped_recovery_goes_to_its_lane_frees_the_slot_and_rings(r, keys):
    put_active(r, keys, "JOB1", group="g")
    result = sweep(r, keys, default=2)
    assert result.lanes == {"g": engine.LaneCounts(recovered=1)}
    assert where(r, keys, "JOB1", "g") == ["lane"]
    assert r.hget(keys.gactive, "g") is None
    assert r.lrange(keys.ring, 0, -1) == ["g"]
    assert r.lrange(keys.wake, 0, -1) == ["1"]


def test_gactive_is_decremented_not_deleted_while_others_run(r, keys):
    put_active(r, keys, "JOB1", group="g")
    put_active(r, keys, "JOB2", group="g", score=server_ms(r) + 60_000)
    sweep(r, keys, default=2)
    assert r.hget(keys.gactive, "g") == "1"


def test_dead_lettered_grouped_job_puts_a_lane_with_backlog_back_on_ring(r, keys):
    r.hset(keys.glimit, "g", 1)
    put_active(r, keys, "JOB1", group="g")
    r.zadd(keys.lane_pending("g"), {"JOB2": 0, "JOB3": 0})
    result = sweep(r, keys, default=1)
    assert result.lanes == {"g": engine.LaneCounts(dead_lettered=1)}
    assert where(r, keys, "JOB1", "g") == ["dead"]
    assert r.hget(keys.gactive, "g") is None
    assert r.lrange(keys.ring, 0, -1) == ["g"]
    assert r.lrange(keys.wake, 0, -1) == ["1"]


def test_dead_lettered_job_of_a_lane_without_work_is_not_ringed(r, keys):
    put_active(r, keys, "JOB1", group="g")
    sweep(r, keys, default=1)
    assert r.lrange(keys.ring, 0, -1) == [] and r.llen(keys.wake) == 0


@pytest.mark.parametrize("budget", [1, 2])  # dead-letter and recovery
def test_paused_lane_is_not_ringed(r, keys, budget):
    r.sadd(keys.paused, "g")
    put_active(r, keys, "JOB1", group="g")
    r.zadd(keys.lane_pending("g"), {"JOB2": 0})
    sweep(r, keys, default=budget)
    assert r.llen(keys.ring) == 0 and r.llen(keys.wake) == 0
    assert r.hget(keys.gactive, "g") is None


@pytest.mark.parametrize("budget", [1, 2])
def test_lane_still_at_its_limit_is_not_ringed(r, keys, budget):
    r.hset(keys.glimit, "g", 2)
    put_active(r, keys, "JOB1", group="g")
    put_active(r, keys, "JOB2", group="g", score=server_ms(r) + 60_000)
    put_active(r, keys, "JOB3", group="g", score=server_ms(r) + 60_000)
    r.zadd(keys.lane_pending("g"), {"JOB4": 0})
    sweep(r, keys, default=budget)
    assert r.hget(keys.gactive, "g") == "2"
    assert r.llen(keys.ring) == 0 and r.llen(keys.wake) == 0


def test_lane_under_its_limit_after_the_sweep_is_ringed(r, keys):
    r.hset(keys.glimit, "g", 2)
    put_active(r, keys, "JOB1", group="g")
    put_active(r, keys, "JOB2", group="g", score=server_ms(r) + 60_000)
    sweep(r, keys, default=2)
    assert r.hget(keys.gactive, "g") == "1"
    assert r.lrange(keys.ring, 0, -1) == ["g"]


def test_lane_already_on_ring_is_not_pushed_twice(r, keys):
    r.rpush(keys.ring, "other", "g")
    put_active(r, keys, "JOB1", group="g")
    put_active(r, keys, "JOB2", group="g")
    sweep(r, keys, default=2)
    assert r.lrange(keys.ring, 0, -1) == ["other", "g"]
    assert r.llen(keys.wake) == 0


def test_one_wake_per_lane_ringed_and_wake_trimmed_to_64(r, keys):
    r.rpush(keys.wake, *["1"] * 64)
    for lane in ("a", "b", "c"):
        put_active(r, keys, f"JOB{lane}1", group=lane)
        put_active(r, keys, f"JOB{lane}2", group=lane)
    sweep(r, keys, default=2)
    assert sorted(r.lrange(keys.ring, 0, -1)) == ["a", "b", "c"]
    assert r.llen(keys.wake) == 64


@pytest.mark.parametrize("corrupt", ["lots", "", "1,5", "0x"])
def test_a_lane_limit_that_is_not_a_number_keeps_the_lane_off_the_ring(r, keys, corrupt):
    """EchoMQ's claim compares gactive with tonumber(limit) after it popped the
    job: ringed, each claim of the lane failed half-way (the job active with no
    worker) and the sweep sent every job of the lane to the morgue unrun."""
    r.hset(keys.glimit, "g", corrupt)
    r.hset(keys.glimit, "h", "2.5")  # a number to Lua: a limit
    put_active(r, keys, "JOB1", group="g")
    put_active(r, keys, "JOB2", group="h")
    result = sweep(r, keys, default=2)
    assert result.recovered == 2 and r.zrange(keys.lane_pending("g"), 0, -1) == ["JOB1"]
    assert r.lrange(keys.ring, 0, -1) == ["h"]
    assert r.hget(keys.glimit, "g") == corrupt  # evidence, left as it is
    assert result.problems == [
        f"{keys.glimit} field g is not a number ({corrupt}): left as it is, and lane g not put back on the ring "
        "(EchoMQ's claim of a lane job fails half-way on it); set it to the lane's limit, or delete the field "
        "for no limit"]


def command_calls(r, *names):
    stats = r.info("commandstats")
    return {name: stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in names}


def test_a_short_ring_is_read_once_for_every_lane_of_the_call(r, keys):
    r.rpush(keys.ring, "a", "x")
    for lane in ("a", "b", "c"):
        put_active(r, keys, f"JOB{lane}", group=lane)
    before = command_calls(r, "lrange", "lpos")
    sweep(r, keys, default=2)
    after = command_calls(r, "lrange", "lpos")
    assert r.lrange(keys.ring, 0, -1) == ["a", "x", "b", "c"]
    assert r.llen(keys.wake) == 2
    assert (after["lrange"] - before["lrange"], after["lpos"] - before["lpos"]) == (1, 0)


def test_a_long_ring_is_searched_once_per_lane(r, keys):
    others = [f"other{i}" for i in range(40)]
    r.rpush(keys.ring, *others, "a")
    for lane in ("a", "b"):
        put_active(r, keys, f"JOB{lane}", group=lane)
    before = command_calls(r, "lrange", "lpos")
    sweep(r, keys, default=2)
    after = command_calls(r, "lrange", "lpos")
    assert r.lrange(keys.ring, 0, -1) == [*others, "a", "b"]
    assert r.llen(keys.wake) == 1
    assert (after["lrange"] - before["lrange"], after["lpos"] - before["lpos"]) == (0, 2)


@pytest.mark.parametrize("corrupt", ["007", "-0", "3.0", "1234567890123456", "", "-1234567890123456",
                                     "9223372036854775807", "-9223372036854775808"])
def test_gactive_that_hincrby_would_refuse_is_left_and_its_lane_not_ringed(r, keys, corrupt):
    put_active(r, keys, "JOB1", group="g", count_in_gactive=False)
    r.hset(keys.gactive, "g", corrupt)
    put_active(r, keys, "JOB2", group="h")
    result = sweep(r, keys, default=2)
    assert result.recovered == 2
    assert r.hget(keys.gactive, "g") == corrupt
    assert r.zrange(keys.lane_pending("g"), 0, -1) == ["JOB1"]
    assert r.lrange(keys.ring, 0, -1) == ["h"]
    assert len(result.problems) == 1 and result.problems[0].startswith(
        f"{keys.gactive} field g is not a count ({corrupt}): left as it is, and lane g not put back on the ring")


def test_negative_gactive_is_decremented_then_deleted_like_hincrby(r, keys):
    put_active(r, keys, "JOB1", group="g", count_in_gactive=False)
    r.hset(keys.gactive, "g", "-2")
    sweep(r, keys, default=2)
    assert r.hget(keys.gactive, "g") is None
    assert r.lrange(keys.ring, 0, -1) == ["g"]


def test_a_slot_count_deleted_below_zero_is_no_room_under_a_limit_of_zero(r, keys):
    """gactive had drifted below the jobs in flight (EchoMQ's complete frees a
    slot for a grouped job claimed from the flat pending); the sweep frees
    this job's slot, the field is deleted, and the lane now holds 0 slots:
    under a glimit of 0 it is at its limit. The ring rule compared the count
    before the deletion (-1) and put the lane on the ring, where EchoMQ's claim
    (which trusts the ring) admitted a job the limit forbids."""
    put_active(r, keys, "JOB1", group="g", count_in_gactive=False)
    r.zadd(keys.lane_pending("g"), {"JOB0": 0})
    r.hset(keys.glimit, "g", "0")
    result = sweep(r, keys, default=2)
    assert result.recovered == 1
    assert r.hget(keys.gactive, "g") is None
    assert r.lrange(keys.ring, 0, -1) == [] and r.llen(keys.wake) == 0


def test_more_than_64_lanes_ringed_push_64_wakes(r, keys):
    for i in range(70):
        put_active(r, keys, f"JOB{i:03d}", group=f"lane{i:03d}")
    sweep(r, keys, default=2)
    assert r.llen(keys.ring) == 70
    assert r.lrange(keys.wake, 0, -1) == ["1"] * 64


def test_lane_bookkeeping_crosses_the_read_chunk(r, keys):
    lanes = 4100
    pipe = r.pipeline(transaction=False)
    for i in range(lanes):
        pipe.hset(keys.job(f"JOB{i:05d}"), mapping={"state": "active", "attempts": "1",
                                                     "group": f"lane{i:05d}"})
    pipe.zadd(keys.active, {f"JOB{i:05d}": EXPIRED for i in range(lanes)})
    pipe.hset(keys.gactive, mapping={f"lane{i:05d}": 2 for i in range(lanes)})
    pipe.sadd(keys.paused, "lane04099")
    pipe.execute()
    result = sweep(r, keys, default=2, limit=lanes)
    assert result.recovered == lanes
    assert set(r.hvals(keys.gactive)) == {"1"} and r.hlen(keys.gactive) == lanes
    assert r.llen(keys.ring) == lanes - 1 and "lane04099" not in r.lrange(keys.ring, -5, -1)
    assert r.hget(keys.sweeper_totals, "lane:lane04099:recovered") == "1"


@pytest.mark.parametrize("corrupt", ["junk", "-3", "007", "1000000000000000", "99999999999999999999"])
def test_a_total_that_is_not_a_counter_starts_again_from_this_calls_count(r, keys, corrupt):
    """The counter rule of lib/counters (no sign, no leading zero, at most 15
    digits), also where HINCRBY would have taken the value (a minus, 16 to 19
    digits); a counter beside it is raised."""
    r.hset(keys.sweeper_totals, mapping={"recovered": corrupt, "lane:g:recovered": corrupt,
                                         "dead_lettered": "41", "lane:g:dead_lettered": "999999999999999"})
    put_active(r, keys, "JOB1", group="g")
    put_active(r, keys, "JOB2", group="g", stalled=1)
    result = sweep(r, keys, default=2)
    assert (result.recovered, result.dead_lettered, result.problems) == (1, 1, [])
    assert r.hmget(keys.sweeper_totals, "recovered", "lane:g:recovered", "dead_lettered",
                   "lane:g:dead_lettered") == ["1", "1", "42", "1000000000000000"]


def test_a_stall_count_of_15_digits_is_written_back_as_an_integer(r, keys):
    put_active(r, keys, "JOB1", stalled="999999999999999", attempts="999999999999999")
    sweep(r, keys, default=0)
    assert r.hget(keys.job("JOB1"), "stalled") == "1000000000000000"
    put_active(r, keys, "JOB2", stalled="999999999999999", attempts="999999999999999")
    sweep(r, keys, default=1)
    assert r.hmget(keys.job("JOB2"), "stalled", "attempts") == ["1000000000000000"] * 2


# ----------------------------------------------------------------- events, totals, metrics


def test_events_announce_each_recovery_and_death_in_echomq_shape(r, keys):
    put_active(r, keys, "JOBrec")
    put_active(r, keys, "JOBdead", stalled=1)
    put_active(r, keys, 'JOB"odd\\id')
    r.zadd(keys.active, {"JOBgone": EXPIRED})
    _, events = sweep_announcing(r, keys, 3, default=2)
    assert sorted(events, key=lambda e: e["job"]) == sorted([
        {"event": "stalled", "job": "JOBrec"},
        {"event": "failed", "job": "JOBdead", "reason": "stalled"},
        {"event": "stalled", "job": 'JOB"odd\\id'},
    ], key=lambda e: e["job"])


def test_events_escape_control_characters_and_quotes_only_where_needed(r, keys):
    put_active(r, keys, "JOB\tone\x01")
    put_active(r, keys, "JOBbad", stalled='1"x\\')
    _, raw = sweep_announcing(r, keys, 2, raw=True, default=2)
    assert sorted(raw) == sorted([
        '{"event":"stalled","job":"JOB\\u0009one\\u0001"}',
        '{"event":"failed","job":"JOBbad","reason":"malformed: stalled is not a non-negative integer: 1\\"x\\\\"}',
    ])
    put_active(r, keys, "JOBplain")
    assert sweep_announcing(r, keys, 1, raw=True, default=2)[1] == ['{"event":"stalled","job":"JOBplain"}']


def test_event_payload_starts_with_event_then_job_like_echomq(r, keys):
    put_active(r, keys, "JOB1")
    _, raw = sweep_announcing(r, keys, 1, raw=True, default=1)
    assert raw == ['{"event":"failed","job":"JOB1","reason":"stalled"}']


def test_totals_hash_and_metrics_failed_accumulate_across_calls(r, keys):
    put_active(r, keys, "JOB1")
    put_active(r, keys, "JOB2", stalled=1)
    put_active(r, keys, "JOB3", group="g")
    put_active(r, keys, "JOB4", group="g", stalled=1)
    put_active(r, keys, "JOB5", stalled="bad")
    r.zadd(keys.active, {"JOBgone": EXPIRED})
    r.hset(keys.metrics_failed, "count", 10)
    sweep(r, keys, default=2)
    put_active(r, keys, "JOB6", group="g")
    sweep(r, keys, default=2)
    assert r.hgetall(keys.sweeper_totals) == {
        "recovered": "3", "dead_lettered": "2", "orphans": "1", "quarantined": "1",
        "lane:g:recovered": "2", "lane:g:dead_lettered": "1",
    }
    assert r.hget(keys.metrics_failed, "count") == str(10 + 2 + 1)


def test_a_totals_field_that_is_not_a_counter_starts_again(r, keys):
    r.hset(keys.sweeper_totals, mapping={"recovered": "junk", "orphans": "7"})
    put_active(r, keys, "JOB1")
    r.zadd(keys.active, {"JOBgone": EXPIRED})
    sweep(r, keys, default=2)
    assert r.hgetall(keys.sweeper_totals) == {"recovered": "1", "orphans": "8"}


def test_a_corrupt_metrics_failed_is_left_and_the_call_still_reports(r, keys):
    r.hset(keys.metrics_failed, "count", "lots")
    put_active(r, keys, "JOB1")
    result = sweep(r, keys, default=1)
    assert result.dead_lettered == 1
    assert r.hget(keys.metrics_failed, "count") == "lots"
    assert r.hget(keys.sweeper_totals, "dead_lettered") == "1"
    assert result.problems == [f"{keys.metrics_failed} count was not incremented by this call's deaths "
                               "(ERR hash value is not an integer); repair or delete that key"]


@pytest.mark.parametrize("destination", ["pending", "dead"])
def test_a_destination_of_the_wrong_type_refuses_the_call_before_any_write(r, keys, destination):
    put_active(r, keys, "JOB1")
    put_active(r, keys, "JOB2", stalled=1)
    r.set(getattr(keys, destination), "oops")
    with pytest.raises(redis.ResponseError, match=rf"EMQWRONGTYPE {re.escape(getattr(keys, destination))} is a string"):
        sweep(r, keys, default=2)
    assert sorted(r.zrange(keys.active, 0, -1)) == ["JOB1", "JOB2"]
    assert r.hget(keys.job("JOB1"), "state") == "active" and r.hget(keys.job("JOB1"), "stalled") is None


@pytest.mark.parametrize("kind, make", [
    ("string", lambda r, key: r.set(key, "oops")),
    ("list", lambda r, key: r.rpush(key, "JOB1")),
    ("hash", lambda r, key: r.hset(key, "JOB1", "1")),
])
def test_an_active_of_the_wrong_type_is_named(r, keys, kind, make):
    """Redis' own WRONGTYPE names no key ('... on @user_script:NNN'): the
    refusal says which key is of which type, as for pending and dead."""
    put_active(r, keys, "JOB1", score=EXPIRED)
    r.delete(keys.active)
    make(r, keys.active)
    before = {key: r.dump(key) for key in r.keys("*")}
    with pytest.raises(redis.ResponseError) as refused:
        sweep(r, keys, default=1)
    assert str(refused.value).startswith(
        f"EMQWRONGTYPE {keys.active} is a {kind}, not a sorted set: nothing was moved; repair or delete that key")
    assert {key: r.dump(key) for key in r.keys("*")} == before


@pytest.mark.parametrize("row", ["grouped, in the flat pending", "empty group", "not a hash"])
def test_a_stray_lease_of_a_job_waiting_in_pending_is_an_orphan(r, keys, row):
    """The id waits in the flat `pending` and a stale `active` entry names it too:
    a grouped job put there by EchoMQ's own replay, a row whose group is empty,
    a row that is not a hash. Counted as a stall, it would sit in two sets (and
    a grouped one would free a lane slot it does not hold)."""
    r.hset(keys.gactive, "a", 1)  # the lane's one job in flight, elsewhere
    r.hset(keys.glimit, "a", 1)
    if row == "not a hash":
        r.set(keys.job("JOB9"), "x")
    else:
        r.hset(keys.job("JOB9"), mapping={"state": "pending", "attempts": "1", "payload": "{}",
                                          "group": "a" if row.startswith("grouped") else ""})
    r.zadd(keys.pending, {"JOB9": 0})
    r.zadd(keys.active, {"JOB9": EXPIRED})
    before = {key: r.dump(key) for key in r.keys("*") if key != keys.active}
    result = sweep(r, keys, default=1)
    assert (result.orphans, result.recovered, result.dead_lettered, result.quarantined) == (1, 0, 0, 0)
    assert r.zcard(keys.active) == 0 and r.zrange(keys.pending, 0, -1) == ["JOB9"]
    after = {key: r.dump(key) for key in r.keys("*") if key not in (keys.active, keys.sweeper_totals)}
    assert after == before  # no lane slot freed, nothing on the ring, the row untouched


@pytest.mark.parametrize("state, where", [("scheduled", "schedule"), ("pending", "lane")])
def test_a_stray_lease_check_on_a_key_of_the_wrong_type_counts_a_stall(r, keys, state, where):
    key = keys.schedule if where == "schedule" else keys.lane_pending("g")
    r.set(key, "oops")
    put_active(r, keys, "JOB0")
    put_active(r, keys, "JOB1", group="g", state=state)
    result = sweep(r, keys, default=3)
    assert result.orphans == 0 and result.recovered + result.quarantined == 2
    assert r.zcard(keys.active) == 0
    assert r.zscore(keys.pending, "JOB0") is not None
    assert r.zscore(keys.dead, "JOB1") is not None or r.zscore(keys.lane_pending("g"), "JOB1") is not None


def test_jobs_of_a_lane_whose_key_has_the_wrong_type_go_to_the_morgue(r, keys):
    r.set(keys.lane_pending("g"), "oops")
    put_active(r, keys, "JOB1", group="g")
    put_active(r, keys, "JOB2", group="h")
    put_active(r, keys, "JOB3")
    result, events = sweep_announcing(r, keys, 4, default=3)
    assert (result.recovered, result.quarantined) == (2, 1)
    assert r.zrange(keys.dead, 0, -1) == ["JOB1"]
    row = r.hgetall(keys.job("JOB1"))
    assert row["state"] == "dead" and row["attempts"] == "2" and row["stalled"] == "1"
    assert int(row["dead_at"]) > 0 and row["dead_attempts"] == "2"  # as the recovery fenced it
    assert row["last_error"] == f"malformed: lane {keys.lane_pending('g')} is a string, not a sorted set"
    assert r.get(keys.lane_pending("g")) == "oops"
    assert r.hget(keys.gactive, "g") is None and r.lrange(keys.ring, 0, -1) == ["h"]
    assert {"event": "failed", "job": "JOB1", "reason": row["last_error"]} in events
    assert r.hgetall(keys.sweeper_totals) == {"recovered": "2", "quarantined": "1", "lane:h:recovered": "1"}


# keys every job of the call was already placed without; each corrupted with a string
LANE_BOOKKEEPING = [("gactive", "a hash"), ("paused", "a set"), ("glimit", "a hash"),
                    ("ring", "a list"), ("wake", "a list")]


@pytest.mark.parametrize("name, should_be", LANE_BOOKKEEPING)
def test_lane_bookkeeping_of_the_wrong_type_is_reported_and_every_job_still_moves(r, keys, name, should_be):
    put_active(r, keys, "JOB1", group="g")
    put_active(r, keys, "JOB2", group="g", stalled=1)
    put_active(r, keys, "JOB3")
    r.delete(getattr(keys, name))
    r.set(getattr(keys, name), "oops")
    result = sweep(r, keys, default=2)
    assert (result.recovered, result.dead_lettered) == (2, 1)
    assert result.problems == [
        f"{getattr(keys, name)} is a string, not {should_be}: this call's lane slots, ring and wake "
        "were not (all) settled; repair or delete that key"]
    assert r.zcard(keys.active) == 0
    assert r.zrange(keys.lane_pending("g"), 0, -1) == ["JOB1"] and r.zrange(keys.dead, 0, -1) == ["JOB2"]
    assert r.zrange(keys.pending, 0, -1) == ["JOB3"]
    assert r.get(getattr(keys, name)) == "oops"
    # the steps after the lanes still ran
    assert r.hget(keys.metrics_failed, "count") == "1"
    assert r.hget(keys.sweeper_totals, "lane:g:recovered") == "1"


def test_a_totals_hash_of_the_wrong_type_is_reported_and_the_lanes_still_settle(r, keys):
    put_active(r, keys, "JOB1", group="g")
    r.set(keys.sweeper_totals, "oops")
    result = sweep(r, keys, default=2)
    assert result.recovered == 1
    assert result.problems == [f"{keys.sweeper_totals} is a string, not a hash: this call's totals were not "
                               "counted; repair or delete that key"]
    assert r.lrange(keys.ring, 0, -1) == ["g"] and r.hget(keys.gactive, "g") is None
    assert r.get(keys.sweeper_totals) == "oops"


def test_a_metrics_failed_of_the_wrong_type_is_reported(r, keys):
    put_active(r, keys, "JOB1")
    r.set(keys.metrics_failed, "oops")
    result = sweep(r, keys, default=1)
    assert result.dead_lettered == 1 and r.zrange(keys.dead, 0, -1) == ["JOB1"]
    [problem] = result.problems
    assert problem.startswith(f"{keys.metrics_failed} count was not incremented by this call's deaths (WRONGTYPE")
    assert r.hget(keys.sweeper_totals, "dead_lettered") == "1"


def test_problems_are_reported_once_per_drain(r, keys):
    for i in range(5):
        put_active(r, keys, f"JOB{i}", group="g")
    r.set(keys.ring, "oops")
    result = engine.drain(r, keys.queue, Budgets(3, {}), batch_size=2)
    assert result.calls == 3 and result.recovered == 5
    assert len(result.problems) == 1 and result.problems[0].startswith(f"{keys.ring} is a string")


def test_a_refused_step_after_the_moves_is_a_problem_not_a_lost_reply(redis_server, r, keys):
    """The scripts ask before their first write for every write they make, not
    for every read: a read of the ring refused (or any refusal on a Redis that
    cannot be asked) after the moves is reported, with the call's counts."""
    put_active(r, keys, "JOB1", group="g")
    put_active(r, keys, "JOB2")
    with restricted_user(redis_server, r, "no-lpos", "-lpos") as client:
        result = sweep(client, keys, default=2)
    assert result.recovered == 2
    [problem] = result.problems
    assert "lane slots, ring and wake were not (all) settled" in problem
    # the server's own words: Redis's, or Valkey's (which names the command)
    assert "can't run this command" in problem or "no permissions to run the 'lpos' command" in problem
    assert r.zcard(keys.active) == 0
    assert r.zrange(keys.lane_pending("g"), 0, -1) == ["JOB1"] and r.zrange(keys.pending, 0, -1) == ["JOB2"]
    assert r.hget(keys.gactive, "g") is None  # the slot was freed before the ring was read
    assert r.hget(keys.sweeper_totals, "recovered") == "2"


@pytest.mark.parametrize("refusal", [("-hset",), ("-zadd",), ("-lpush",), ("-hincrby",),
                                     ("resetkeys", "%R~*", "~{prefix}[^j]*"), ("-hmget",),
                                     ("-zremrangebyrank", "-zrem")],
                         ids=["no-hset", "no-zadd", "no-wake-push", "no-counters", "rows-read-only", "no-hmget",
                              "no-removal-from-active"])
def test_a_user_that_may_not_write_the_queue_moves_nothing(redis_server, r, keys, refusal):
    """Refused after the batch left `active`, the call would stop with its jobs in
    no set: every write is asked for first, on the real keys."""
    refusal = [rule.format(prefix=keys.prefix) for rule in refusal]
    put_active(r, keys, "JOB1", group="g")
    put_active(r, keys, "JOB2")
    before = {key: r.dump(key) for key in r.keys("*")}
    with restricted_user(redis_server, r, "read-mostly", *refusal) as client:
        with pytest.raises(redis.ResponseError, match="EMQNOPERM the Redis user may not run .*nothing was moved"):
            sweep(client, keys, default=2)
    assert {key: r.dump(key) for key in r.keys("*")} == before


def test_a_user_granted_zrem_but_not_removal_by_rank_still_recovers(redis_server, r, keys):
    """docs/scripts.md listed ZREM for `active` until the sweep removed its batch
    by rank: a user granted command by command from that list keeps working."""
    for i in range(5):
        put_active(r, keys, f"JOB{i}", group="g" if i % 2 else None)
    put_active(r, keys, "LATER", score=server_ms(r) + 60_000)  # a lease still running
    with restricted_user(redis_server, r, "zrem-only", "-zremrangebyrank") as client:
        result = sweep(client, keys, default=2, limit=3)
        assert (result.recovered, result.more) == (3, True)
        result = sweep(client, keys, default=2, limit=3)
    assert (result.recovered, result.more) == (2, False)
    assert r.zrange(keys.active, 0, -1) == ["LATER"]
    assert r.zrange(keys.pending, 0, -1) == ["JOB0", "JOB2", "JOB4"]
    assert r.zrange(keys.lane_pending("g"), 0, -1) == ["JOB1", "JOB3"]


def test_a_lane_the_user_may_not_write_sends_its_jobs_to_the_morgue(redis_server, r, keys):
    put_active(r, keys, "JOB1", group="g")
    put_active(r, keys, "JOB2")
    lanes_read_only = ("resetkeys", "%R~*", f"~{keys.prefix}[^g]*", f"~{keys.prefix}ga*", f"~{keys.prefix}gl*")
    with restricted_user(redis_server, r, "no-lanes", *lanes_read_only) as client:
        result = sweep(client, keys, default=5)
    assert (result.recovered, result.quarantined) == (1, 1)
    assert r.zrange(keys.pending, 0, -1) == ["JOB2"] and r.zrange(keys.dead, 0, -1) == ["JOB1"]
    reason = r.hget(keys.job("JOB1"), "last_error")
    assert reason.startswith(f"lane {keys.prefix}g:g:pending refused the job: ")
    assert "can't access" in reason or "No permissions to access a key" in reason  # Redis's words, Valkey's
    assert r.hmget(keys.job("JOB1"), "attempts", "dead_attempts") == ["2", "2"]


def test_without_the_events_channel_the_jobs_still_move(redis_server, r, keys):
    """Redis 7 gives a new user no channel (acl-pubsub-default resetchannels):
    the events are fire-and-forget, the recovery is not."""
    put_active(r, keys, "JOB1", group="g")
    put_active(r, keys, "JOB2", stalled=1)
    with restricted_user(redis_server, r, "no-channels", "resetchannels") as client:
        result = sweep(client, keys, default=2)
    assert (result.recovered, result.dead_lettered) == (1, 1)
    assert r.zrange(keys.lane_pending("g"), 0, -1) == ["JOB1"] and r.zrange(keys.dead, 0, -1) == ["JOB2"]
    [problem] = result.problems
    assert f"may not PUBLISH to {keys.events}" in problem and "are not sent" in problem


def test_dead_at_is_the_server_clock_in_ms(r, keys):
    before = server_ms(r)
    put_active(r, keys, "JOB1")
    sweep(r, keys, default=1)
    assert before <= int(r.hget(keys.job("JOB1"), "dead_at")) <= server_ms(r)
    # with the attempts it belongs to (fenced: 1 + 1), the mark of this death
    assert r.hmget(keys.job("JOB1"), "attempts", "dead_attempts") == ["2", "2"]


def test_works_with_a_bytes_client(r_bytes, keys):
    r_bytes.hset(keys.job("JOB1"), mapping={"state": "active", "attempts": "1", "group": "g"})
    r_bytes.zadd(keys.active, {"JOB1": EXPIRED})
    r_bytes.hset(keys.job("JOB2"), mapping={"state": "active", "attempts": "1"})
    r_bytes.zadd(keys.active, {"JOB2": EXPIRED})
    result = engine.sweep_batch(r_bytes, keys.queue, Budgets(1, {"g": 2}), 10)
    assert result.lanes == {"g": engine.LaneCounts(recovered=1)}
    assert (result.recovered, result.dead_lettered) == (1, 1)
    snap = engine.queue_snapshot(r_bytes, keys.queue, ["g"])
    assert (snap.dead, snap.recovered_total, snap.lanes[0].pending) == (1, 1, 1)


def test_large_batch_crosses_the_unpack_chunk(r, keys):
    pipe = r.pipeline(transaction=False)
    for i in range(9000):
        pipe.hset(keys.job(f"JOB{i:05d}"), mapping={"state": "active", "attempts": "1",
                                                     **({"group": "g"} if i % 2 else {})})
    pipe.zadd(keys.active, {f"JOB{i:05d}": EXPIRED for i in range(9000)})
    pipe.hset(keys.gactive, "g", 4500)
    pipe.execute()
    result = sweep(r, keys, default=2, limit=9000)
    assert result.recovered == 9000 and result.more is False
    assert r.zcard(keys.pending) == 4500 and r.zcard(keys.lane_pending("g")) == 4500
    assert r.hget(keys.gactive, "g") is None


# --------------------------------------------------------- lane names that are not UTF-8


def test_two_lanes_that_decode_to_one_name_add_up_instead_of_overwriting(redis_server, keys):
    """Lane names are EchoMQ's bytes; decoded for people, b'L\\xfe' and b'L\\xff'
    both read 'L\\ufffd'. The sweeper's client is not decoding: its counts for
    that name must be the sum of both lanes, not whichever came last."""
    raw = redis_server.client()  # bytes in, bytes out, as the sweeper's client
    raw.flushall()
    prefix = keys.prefix.encode()
    for job_id, lane in ((b"JOB1", b"L\xfe"), (b"JOB2", b"L\xff"), (b"JOB3", b"L\xff")):
        raw.hset(prefix + b"job:" + job_id, mapping={b"state": b"active", b"attempts": b"1",
                                                     b"payload": b"p", b"group": lane})
        raw.zadd(prefix + b"active", {job_id: EXPIRED})
        raw.hincrby(prefix + b"gactive", lane, 1)
    result = sweep(raw, keys, default=2, limit=100)
    assert (result.recovered, result.dead_lettered) == (3, 0)
    assert result.lanes == {"L\ufffd": engine.LaneCounts(recovered=3, dead_lettered=0)}
    raw.close()
