"""The morgue scripts (scan, replay, purge) through the engine, on a real redis-server."""

from __future__ import annotations

import contextlib
import re

import pytest
import redis

from stalledpolicy import engine
from stalledpolicy.devenv.echomq import EchoMQ
from stalledpolicy.engine import Budgets, DeadJob
from tests.redis.engine_rows import dump, echomq_reprocess, put_active, put_dead, reclaim, restricted_user, server_ms

pytestmark = pytest.mark.redis


@pytest.fixture
def small_batches(monkeypatch):
    """Force several bounded script calls per engine call."""
    monkeypatch.setattr(engine.morgue, "MORGUE_BATCH", 2)
    monkeypatch.setattr(engine.morgue, "MORGUE_STATS_BATCH", 2)


def morgue_ids(r, keys):
    return r.zrange(keys.dead, 0, -1)


# ----------------------------------------------------------------- stats and list


def test_stats_of_an_empty_morgue(r, keys):
    assert engine.morgue_stats(r, keys.queue) == engine.MorgueStats(size=0, lanes={}, oldest_dead_at_ms=None)


def test_stats_counts_lanes_and_finds_the_oldest_death(r, keys, small_batches):
    put_dead(r, keys, "JOB1", dead_at=5000)
    put_dead(r, keys, "JOB2", group="a", dead_at=3000)
    put_dead(r, keys, "JOB3", group="a", dead_at=9000)
    put_dead(r, keys, "JOB4", group="b")  # dead-lettered by EchoMQ itself: no dead_at
    r.zadd(keys.dead, {"JOB5": 0})  # row gone
    r.rpush(keys.job("JOB6"), "x")  # wrong type
    r.zadd(keys.dead, {"JOB6": 0})
    stats = engine.morgue_stats(r, keys.queue)
    # the rows without a lane are counted apart, not as flat jobs: `--lane ''` never selects them
    assert stats == engine.MorgueStats(size=6, lanes={"": 1, "a": 2, "b": 1}, oldest_dead_at_ms=3000,
                                       unreadable=2)
    assert [j.id for j in engine.morgue_list(r, keys.queue, lane="")] == ["JOB1"]


def test_one_lane_rule_for_stats_list_replay_and_purge(r, keys, small_batches):
    """A row that is missing or not a hash is in no lane (engine.lane_of): stats
    count it apart, no lane filter (flat included) lists, replays or purges it,
    and a purge that takes it (by id or all) reports it in no lane, never flat."""
    put_dead(r, keys, "JOB1")
    put_dead(r, keys, "JOB2", group="g")
    r.zadd(keys.dead, {"JOB3": 0})  # row gone
    r.set(keys.job("JOB4"), "x")  # not a hash
    r.zadd(keys.dead, {"JOB4": 0})
    lanes = {job.id: engine.lane_of(job) for job in engine.morgue_list(r, keys.queue)}
    assert lanes == {"JOB1": "", "JOB2": "g", "JOB3": None, "JOB4": None}
    assert engine.morgue_stats(r, keys.queue).lanes == {"": 1, "g": 1}
    for lane, ids in (("", ["JOB1"]), ("g", ["JOB2"])):
        assert [job.id for job in engine.morgue_list(r, keys.queue, lane=lane)] == ids
        assert engine.morgue_replay(r, keys.queue, lane=lane, dry_run=True).ids == ids
        assert engine.morgue_purge(r, keys.queue, lane=lane, dry_run=True).ids == ids
    purged = engine.morgue_purge(r, keys.queue, dry_run=True)
    assert (purged.ids, purged.lanes) == (["JOB1", "JOB2", "JOB3", "JOB4"], {"": 1, "g": 1, None: 2})
    assert engine.morgue_purge(r, keys.queue, ids=["JOB3", "JOB2"]).lanes == {None: 1, "g": 1}


def test_list_pages_in_id_order_with_every_field(r, keys, small_batches):
    for i in range(5):
        put_dead(r, keys, f"JOB{i}", group="g" if i % 2 else None, stalled=i + 1, attempts=i + 2,
                 dead_at=1000 + i)
    page = engine.morgue_list(r, keys.queue, limit=3, offset=1)
    assert page == [
        DeadJob("JOB1", "g", 2, 3, "stalled", 1001, "dead"),
        DeadJob("JOB2", None, 3, 4, "stalled", 1002, "dead"),
        DeadJob("JOB3", "g", 4, 5, "stalled", 1003, "dead"),
    ]
    assert [j.id for j in engine.morgue_list(r, keys.queue, limit=10, offset=3)] == ["JOB3", "JOB4"]
    assert engine.morgue_list(r, keys.queue, offset=9) == []


def test_list_by_lane_with_offset_and_flat_as_empty_lane(r, keys, small_batches):
    for i in range(7):
        put_dead(r, keys, f"JOB{i}", group="g" if i % 2 else None)
    assert [j.id for j in engine.morgue_list(r, keys.queue, lane="g", limit=2, offset=1)] == ["JOB3", "JOB5"]
    assert [j.id for j in engine.morgue_list(r, keys.queue, lane="", limit=10)] == ["JOB0", "JOB2", "JOB4", "JOB6"]
    assert engine.morgue_list(r, keys.queue, lane="nope") == []


def test_list_copes_with_missing_wrong_type_and_malformed_rows(r, keys):
    r.zadd(keys.dead, {"JOBgone": 0})
    r.set(keys.job("JOBstr"), "x")
    r.zadd(keys.dead, {"JOBstr": 0})
    put_dead(r, keys, "JOBodd", stalled="x", attempts="y", dead_at="z")
    jobs = {j.id: j for j in engine.morgue_list(r, keys.queue)}
    assert jobs["JOBgone"] == DeadJob("JOBgone", None, None, None, None, None, None, problem="job row is missing")
    problem = "malformed: job row is a string, not a hash"
    # the row's own last_error is unknown: the diagnosis is the problem, not an error the job had
    assert jobs["JOBstr"] == DeadJob("JOBstr", None, None, None, None, None, None, problem=problem)
    assert jobs["JOBodd"] == DeadJob("JOBodd", None, None, None, "stalled", None, "dead")


def test_list_refuses_bad_paging(r, keys):
    with pytest.raises(ValueError, match="limit"):
        engine.morgue_list(r, keys.queue, limit=0)
    with pytest.raises(ValueError, match="offset"):
        engine.morgue_list(r, keys.queue, offset=-1)


def test_list_shows_what_the_sweep_quarantined(r, keys):
    put_active(r, keys, "JOBbad", stalled="many")
    r.set(keys.job("JOBwrong"), "x")
    r.zadd(keys.active, {"JOBwrong": 1})
    engine.sweep_batch(r, keys.queue, Budgets(3), 10)
    jobs = {j.id: j for j in engine.morgue_list(r, keys.queue)}
    assert jobs["JOBbad"].last_error == "malformed: stalled is not a non-negative integer: many"
    assert jobs["JOBbad"].dead_at_ms is not None and jobs["JOBbad"].problem is None
    assert jobs["JOBwrong"].problem == "malformed: job row is a string, not a hash"


@pytest.mark.parametrize("dead_at", [" 12", "1_0", "\u0661\u0662", "012", "1" * 16, "nan"])
def test_list_reads_counters_as_the_scripts_do(r, keys, dead_at):
    # purge takes such a dead_at for undated: list must not show it as a time
    r.hset(keys.job("JOB1"), mapping={"state": "dead", "dead_at": dead_at, "stalled": " 2", "attempts": "3"})
    r.zadd(keys.dead, {"JOB1": 0})
    (job,) = engine.morgue_list(r, keys.queue)
    assert (job.dead_at_ms, job.stalled, job.attempts) == (None, None, 3)


# ----------------------------------------------------------------- replay


def test_replay_returns_each_job_to_its_lane_with_the_stall_count_reset(r, keys):
    put_dead(r, keys, "JOBflat", stalled=3, dead_at=1)
    put_dead(r, keys, "JOBgrp", group="g", stalled=3, dead_at=1, last_error="boom")
    result = engine.morgue_replay(r, keys.queue)
    assert (result.replayed, sorted(result.ids), result.lanes, result.missing) == (
        2, ["JOBflat", "JOBgrp"], {"": 1, "g": 1}, [])
    assert morgue_ids(r, keys) == []
    assert r.zrange(keys.pending, 0, -1) == ["JOBflat"]
    assert r.zrange(keys.lane_pending("g"), 0, -1) == ["JOBgrp"]
    assert r.hgetall(keys.job("JOBgrp")) == {
        "state": "pending", "attempts": "2", "payload": "payload-JOBgrp", "group": "g",
        "previous_error": "boom",
    }
    assert r.lrange(keys.ring, 0, -1) == ["g"] and r.lrange(keys.wake, 0, -1) == ["1"]
    assert r.hget(keys.sweeper_totals, "replayed") == "2"


def test_a_replayed_job_gets_its_whole_budget_again(r, keys):
    put_active(r, keys, "JOB1", group="g")
    budgets = Budgets(2)
    engine.sweep_batch(r, keys.queue, budgets, 10)
    reclaim(r, keys, "JOB1", source=keys.lane_pending("g"))
    assert engine.sweep_batch(r, keys.queue, budgets, 10).dead_lettered == 1
    engine.morgue_replay(r, keys.queue, ids=["JOB1"])
    reclaim(r, keys, "JOB1", source=keys.lane_pending("g"))
    assert engine.sweep_batch(r, keys.queue, budgets, 10).recovered == 1
    assert r.hget(keys.job("JOB1"), "stalled") == "1"


@pytest.mark.parametrize("setup, ringed", [
    (lambda r, k: None, True),
    (lambda r, k: r.sadd(k.paused, "g"), False),
    (lambda r, k: (r.hset(k.glimit, "g", 1), r.hset(k.gactive, "g", 1)), False),
    (lambda r, k: (r.hset(k.glimit, "g", 2), r.hset(k.gactive, "g", 1)), True),
])
def test_replay_ring_rule(r, keys, setup, ringed):
    setup(r, keys)
    put_dead(r, keys, "JOB1", group="g")
    put_dead(r, keys, "JOB2", group="g")
    engine.morgue_replay(r, keys.queue)
    assert r.lrange(keys.ring, 0, -1) == (["g"] if ringed else [])
    assert r.llen(keys.wake) == (1 if ringed else 0)


@pytest.mark.parametrize("limit", [None, "1"])
def test_replay_leaves_a_corrupt_gactive_and_its_lane_off_the_ring_and_says_so(r, keys, limit):
    """Ringed (the value read as 0), the lane's jobs were claimed by EchoMQ, whose
    HINCRBY gactive then failed half-way: each job active with no worker, then
    dead-lettered by the next sweep as if it had stalled (reviewer's reproduction)."""
    r.hset(keys.gactive, "g", "many")
    if limit:
        r.hset(keys.glimit, "g", limit)
    put_dead(r, keys, "JOB1", group="g")
    result = engine.morgue_replay(r, keys.queue)
    assert result.ids == ["JOB1"] and r.zrange(keys.lane_pending("g"), 0, -1) == ["JOB1"]
    assert r.hget(keys.gactive, "g") == "many"
    assert r.lrange(keys.ring, 0, -1) == [] and r.llen(keys.wake) == 0
    assert result.problems == [
        f"{keys.gactive} field g is not a count (many): left as it is, and lane g not put back on the ring "
        "(EchoMQ's claim of a lane job fails half-way on it); set it to the number of the lane's jobs in flight"]


def test_replay_leaves_a_lane_whose_limit_is_not_a_number_off_the_ring_and_says_so(r, keys):
    r.hset(keys.glimit, "g", "ten")
    put_dead(r, keys, "JOB1", group="g")
    result = engine.morgue_replay(r, keys.queue)
    assert result.ids == ["JOB1"] and r.zrange(keys.lane_pending("g"), 0, -1) == ["JOB1"]
    assert r.lrange(keys.ring, 0, -1) == [] and r.llen(keys.wake) == 0
    assert result.problems == [
        f"{keys.glimit} field g is not a number (ten): left as it is, and lane g not put back on the ring "
        "(EchoMQ's claim of a lane job fails half-way on it); set it to the lane's limit, or delete the field "
        "for no limit"]


def test_replay_keeps_jobs_whose_lane_key_has_the_wrong_type(r, keys):
    r.set(keys.lane_pending("g"), "oops")
    put_dead(r, keys, "JOB1", group="g")
    put_dead(r, keys, "JOB2")
    result = engine.morgue_replay(r, keys.queue)
    assert result.ids == ["JOB2"]
    assert morgue_ids(r, keys) == ["JOB1"]
    assert r.hget(keys.job("JOB1"), "state") == "dead"
    assert r.get(keys.lane_pending("g")) == "oops"


def test_replay_refuses_a_pending_key_of_the_wrong_type_before_any_write(r, keys):
    r.set(keys.pending, "oops")
    put_dead(r, keys, "JOB1")
    with pytest.raises(redis.ResponseError, match="EMQWRONGTYPE"):
        engine.morgue_replay(r, keys.queue)
    assert morgue_ids(r, keys) == ["JOB1"] and r.hget(keys.job("JOB1"), "state") == "dead"


def test_replay_reports_a_ring_of_the_wrong_type_and_still_replays(r, keys):
    r.set(keys.ring, "oops")
    put_dead(r, keys, "JOB1", group="g")
    put_dead(r, keys, "JOB2")
    result = engine.morgue_replay(r, keys.queue)
    assert result.ids == ["JOB1", "JOB2"] and morgue_ids(r, keys) == []
    assert r.zrange(keys.lane_pending("g"), 0, -1) == ["JOB1"] and r.zrange(keys.pending, 0, -1) == ["JOB2"]
    assert result.problems == [f"{keys.ring} is a string, not a list: the replayed lanes were not (all) put "
                               "back on the ring; repair or delete that key"]
    assert r.hget(keys.sweeper_totals, "replayed") == "2"


def test_replay_and_purge_report_a_totals_hash_of_the_wrong_type(r, keys, small_batches):
    r.set(keys.sweeper_totals, "oops")
    for i in range(3):
        put_dead(r, keys, f"JOB{i}")
    replayed = engine.morgue_replay(r, keys.queue, ids=["JOB0", "JOB1"])
    assert replayed.replayed == 2
    assert replayed.problems == [f"{keys.sweeper_totals} is a string, not a hash: this call's replays were not "
                                 "counted; repair or delete that key"]
    purged = engine.morgue_purge(r, keys.queue)
    assert purged.ids == ["JOB2"] and morgue_ids(r, keys) == [] and not r.exists(keys.job("JOB2"))
    assert purged.problems == [f"{keys.sweeper_totals} is a string, not a hash: this call's purges were not "
                               "counted; repair or delete that key"]
    assert r.get(keys.sweeper_totals) == "oops"


def test_replay_does_not_ring_a_lane_twice(r, keys):
    r.rpush(keys.ring, "g")
    put_dead(r, keys, "JOB1", group="g")
    engine.morgue_replay(r, keys.queue)
    assert r.lrange(keys.ring, 0, -1) == ["g"] and r.llen(keys.wake) == 0


def test_replay_one_lane_or_only_flat_jobs(r, keys, small_batches):
    for i in range(6):
        put_dead(r, keys, f"JOB{i}", group=["a", "b", None][i % 3])
    by_lane = engine.morgue_replay(r, keys.queue, lane="a")
    assert (by_lane.ids, by_lane.lanes) == (["JOB0", "JOB3"], {"a": 2})
    flat = engine.morgue_replay(r, keys.queue, lane="")
    assert (flat.ids, flat.lanes) == (["JOB2", "JOB5"], {"": 2})
    assert morgue_ids(r, keys) == ["JOB1", "JOB4"]


def test_replay_by_ids_reports_the_missing_ones(r, keys, small_batches):
    put_dead(r, keys, "JOB1")
    put_dead(r, keys, "JOB2", group="g")
    put_dead(r, keys, "JOB3")
    put_active(r, keys, "JOBlive", score=server_ms(r) + 60_000)
    result = engine.morgue_replay(r, keys.queue, ids=["JOB2", "JOBnone", "JOB1", "JOB2", "JOBlive"])
    assert result.ids == ["JOB2", "JOB1"] and result.missing == ["JOBnone", "JOBlive"]
    assert morgue_ids(r, keys) == ["JOB3"]
    assert r.hget(keys.job("JOBlive"), "state") == "active"


def test_replay_by_ids_within_a_lane_refuses_other_lanes(r, keys):
    put_dead(r, keys, "JOB1", group="a")
    put_dead(r, keys, "JOB2", group="b")
    result = engine.morgue_replay(r, keys.queue, ids=["JOB1", "JOB2"], lane="a")
    assert result.ids == ["JOB1"]
    assert result.unreplayable == {"JOB2": "in lane b, not selected"}
    assert morgue_ids(r, keys) == ["JOB2"]


def laneless_morgue(r, keys):
    """JOB1 of lane imports; JOB2 whose row is gone; JOB3 whose row is a string."""
    put_dead(r, keys, "JOB1", group="imports")
    r.zadd(keys.dead, {"JOB2": 0})
    r.set(keys.job("JOB3"), "x")
    r.zadd(keys.dead, {"JOB3": 0})


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_lane_replay_never_selects_a_missing_or_non_hash_row(r, keys, small_batches, dry_run):
    """A row that is missing or not a hash has no lane: a lane filter passes
    over it as the purge does, instead of reporting it as unreplayable."""
    laneless_morgue(r, keys)
    result = engine.morgue_replay(r, keys.queue, lane="imports", dry_run=dry_run)
    assert (result.ids, result.lanes, result.unreplayable, result.missing) == (["JOB1"], {"imports": 1}, {}, [])
    flat = engine.morgue_replay(r, keys.queue, lane="", dry_run=dry_run)
    assert (flat.ids, flat.unreplayable) == ([], {})
    assert morgue_ids(r, keys) == (["JOB1", "JOB2", "JOB3"] if dry_run else ["JOB2", "JOB3"])
    assert r.get(keys.job("JOB3")) == "x" and r.exists(keys.job("JOB2")) == 0
    # the purge selects the same: no lane filter takes a laneless row
    assert engine.morgue_purge(r, keys.queue, lane="imports", dry_run=True).ids == (["JOB1"] if dry_run else [])
    assert engine.morgue_purge(r, keys.queue, lane="", dry_run=True).ids == []


def test_a_lane_replay_by_ids_says_a_laneless_row_is_not_selected(r, keys):
    laneless_morgue(r, keys)
    result = engine.morgue_replay(r, keys.queue, ids=["JOB1", "JOB2", "JOB3"], lane="imports")
    assert result.ids == ["JOB1"]
    assert result.unreplayable == {
        "JOB2": "in no lane (job row is missing), not selected",
        "JOB3": "in no lane (malformed: job row is a string, not a hash), not selected",
    }
    assert morgue_ids(r, keys) == ["JOB2", "JOB3"]


def test_the_operators_lane_replay_warns_of_nothing_outside_its_lane(r, keys):
    from stalledpolicy.controller.replay import ReplayRequest, run_replay

    laneless_morgue(r, keys)
    record, warning = run_replay(r, keys.queue, ReplayRequest(token="t1", lane="imports"), now="2024-01-01T00:00:00Z")
    assert (record["replayed"], warning) == (1, None)
    assert morgue_ids(r, keys) == ["JOB2", "JOB3"]


def test_replay_limit_spans_bounded_calls_and_resumes_correctly(r, keys, small_batches):
    for i in range(7):
        put_dead(r, keys, f"JOB{i}", group="a" if i in (1, 2) else None)
    first = engine.morgue_replay(r, keys.queue, lane="", limit=3)
    assert first.ids == ["JOB0", "JOB3", "JOB4"]
    rest = engine.morgue_replay(r, keys.queue, lane="")
    assert rest.ids == ["JOB5", "JOB6"]
    assert engine.morgue_replay(r, keys.queue, ids=["JOB1", "JOB2"], limit=1).ids == ["JOB1"]
    assert morgue_ids(r, keys) == ["JOB2"]


@pytest.mark.parametrize("change", [
    lambda r, q, **kw: engine.morgue_replay(r, q, **kw),
    lambda r, q, **kw: engine.morgue_replay(r, q, ids=[f"JOB{i}" for i in range(5)], **kw),
    lambda r, q, **kw: engine.morgue_purge(r, q, older_than_s=1, **kw),
    lambda r, q, **kw: engine.morgue_purge(r, q, ids=[f"JOB{i}" for i in range(5)], **kw),
], ids=["replay-scan", "replay-ids", "purge-age", "purge-ids"])
def test_should_stop_is_asked_between_calls_only(r, keys, small_batches, change):
    """Never after the last call (a caller told to stop then has nothing left
    to stop: the change is complete); once it says yes, no other call is sent."""
    for i in range(5):
        put_dead(r, keys, f"JOB{i}", dead_at=1000)
    calls, asked = [], []
    result = change(r, keys.queue, progress=lambda so_far: calls.append(len(so_far.ids)),
                    should_stop=lambda: asked.append(len(calls)) or False)
    assert len(result.ids) == 5 and morgue_ids(r, keys) == []
    assert asked == list(range(1, len(calls))) and len(calls) >= 3
    r.delete(keys.pending)  # the replayed jobs, claimed (else they would wait there and in dead)
    for i in range(5):
        put_dead(r, keys, f"JOB{i}", dead_at=1000)
    calls.clear()
    stopped = change(r, keys.queue, progress=lambda so_far: calls.append(len(so_far.ids)), should_stop=lambda: True)
    assert len(calls) == 1 and len(stopped.ids) == 2 and len(morgue_ids(r, keys)) == 3


def test_rows_that_cannot_be_replayed_stay_in_the_morgue_and_are_reported(r, keys):
    r.zadd(keys.dead, {"JOBgone": 0})
    r.sadd(keys.job("JOBset"), "x")
    r.zadd(keys.dead, {"JOBset": 0})
    put_dead(r, keys, "JOBlive", state="pending")
    put_dead(r, keys, "JOBatt", attempts="x")
    put_dead(r, keys, "JOBgrp", group="")
    put_dead(r, keys, "JOBok", stalled="junk")  # a bad stall count is reset by the replay
    before = {k: v for k, v in dump(r).items() if k != keys.job("JOBok")}
    result = engine.morgue_replay(r, keys.queue)
    assert result.ids == ["JOBok"]
    assert result.unreplayable == {
        "JOBgone": "job row is missing",
        "JOBset": "malformed: job row is a set, not a hash",
        "JOBlive": "state is 'pending', not dead",
        "JOBatt": "malformed: attempts is not a non-negative integer: x",
        "JOBgrp": "malformed: group is empty",
    }
    assert morgue_ids(r, keys) == ["JOBatt", "JOBgone", "JOBgrp", "JOBlive", "JOBset"]
    after = dump(r)
    for key, value in before.items():
        if key not in (keys.dead, keys.pending, keys.sweeper_totals):
            assert after[key] == value


def test_replay_dry_run_reports_and_changes_nothing(r, keys):
    put_dead(r, keys, "JOB1", group="g")
    put_dead(r, keys, "JOB2")
    r.zadd(keys.dead, {"JOBgone": 0})
    before = dump(r)
    result = engine.morgue_replay(r, keys.queue, dry_run=True)
    assert (result.ids, result.lanes, result.unreplayable) == (
        ["JOB1", "JOB2"], {"g": 1, "": 1}, {"JOBgone": "job row is missing"})
    by_ids = engine.morgue_replay(r, keys.queue, ids=["JOB2", "JOBx"], dry_run=True)
    assert (by_ids.ids, by_ids.missing) == (["JOB2"], ["JOBx"])
    assert dump(r) == before


def test_replay_refuses_bad_arguments(r, keys):
    with pytest.raises(ValueError, match="limit"):
        engine.morgue_replay(r, keys.queue, limit=0)
    with pytest.raises(ValueError, match="ids"):
        engine.morgue_replay(r, keys.queue, ids=[""])


# ----------------------------------------------------------------- purge


def test_purge_everything_deletes_entries_and_rows_of_any_shape(r, keys, small_batches):
    put_dead(r, keys, "JOB1")
    put_dead(r, keys, "JOB2", group="g")
    r.zadd(keys.dead, {"JOBgone": 0})
    r.set(keys.job("JOBstr"), "x")
    r.zadd(keys.dead, {"JOBstr": 0})
    put_active(r, keys, "JOBlive", score=server_ms(r) + 60_000)
    result = engine.morgue_purge(r, keys.queue)
    assert sorted(result.ids) == ["JOB1", "JOB2", "JOBgone", "JOBstr"] and result.purged == 4
    assert morgue_ids(r, keys) == []
    assert r.exists(keys.job("JOB1"), keys.job("JOB2"), keys.job("JOBstr")) == 0
    assert r.hget(keys.job("JOBlive"), "state") == "active"
    assert r.hget(keys.sweeper_totals, "purged") == "4"


def test_morgue_totals_that_are_not_counters_start_again(r, keys):
    r.hset(keys.sweeper_totals, mapping={"replayed": "junk", "purged": "-3"})
    put_dead(r, keys, "JOB1")
    put_dead(r, keys, "JOB2")
    engine.morgue_replay(r, keys.queue, ids=["JOB1"])
    engine.morgue_purge(r, keys.queue)
    assert r.hmget(keys.sweeper_totals, "replayed", "purged") == ["1", "1"]
    assert morgue_ids(r, keys) == []


def test_purge_by_age_uses_dead_at_on_the_server_clock(r, keys):
    now = server_ms(r)
    put_dead(r, keys, "JOBold", dead_at=now - 120_000)
    put_dead(r, keys, "JOBedge", dead_at=now - 61_000)
    put_dead(r, keys, "JOByoung", dead_at=now - 5_000)
    result = engine.morgue_purge(r, keys.queue, older_than_s=60)
    assert sorted(result.ids) == ["JOBedge", "JOBold"] and (result.undated, result.undatable) == (0, 0)
    assert morgue_ids(r, keys) == ["JOByoung"]
    assert r.exists(keys.job("JOByoung")) == 1 and r.exists(keys.job("JOBold")) == 0


@pytest.mark.parametrize("ahead", [60_000, None])
def test_age_purge_takes_a_time_of_death_in_the_future_for_none(r, keys, ahead):
    """A dead_at later than now (a clock stepped back, a failover to a server
    that is behind, a bad write) cannot be true: the job died by now at the
    latest. It is undated: kept and stamped with now, so its age counts from
    there; left alone, 999999999999999 would outlive every age purge."""
    dead_at = "999999999999999" if ahead is None else str(server_ms(r) + ahead)
    put_dead(r, keys, "JOBfuture", dead_at=dead_at)
    assert engine.morgue_list(r, keys.queue)[0].dead_at_ms is None  # list reads it as the purge does
    dry = engine.morgue_purge(r, keys.queue, older_than_s=0, dry_run=True)
    assert (dry.ids, dry.undated, dry.undatable) == ([], 1, 0)
    assert r.hget(keys.job("JOBfuture"), "dead_at") == dead_at
    before = server_ms(r)
    first = engine.morgue_purge(r, keys.queue, older_than_s=0)
    assert (first.ids, first.undated, first.undatable) == ([], 1, 0)
    assert before <= int(r.hget(keys.job("JOBfuture"), "dead_at")) <= server_ms(r)
    assert engine.morgue_purge(r, keys.queue, older_than_s=3600).undated == 0  # dated: too young for an hour
    assert engine.morgue_purge(r, keys.queue, older_than_s=0).ids == ["JOBfuture"]


def test_age_purge_keeps_undated_entries_and_starts_their_clock(r, keys):
    put_dead(r, keys, "JOBechomq")  # EchoMQ's own dead-letter records no time of death
    put_dead(r, keys, "JOBjunk", dead_at="yesterday")
    r.zadd(keys.dead, {"JOBgone": 0})
    r.set(keys.job("JOBstr"), "x")
    r.zadd(keys.dead, {"JOBstr": 0})
    dry = engine.morgue_purge(r, keys.queue, older_than_s=0, dry_run=True)
    assert (dry.purged, dry.undated, dry.undatable) == (0, 2, 2)
    assert r.hget(keys.job("JOBechomq"), "dead_at") is None
    before = server_ms(r)
    result = engine.morgue_purge(r, keys.queue, older_than_s=0)
    assert (result.purged, result.undated, result.undatable) == (0, 2, 2)
    assert len(morgue_ids(r, keys)) == 4
    for job_id in ("JOBechomq", "JOBjunk"):
        assert before <= int(r.hget(keys.job(job_id), "dead_at")) <= server_ms(r)
    assert r.get(keys.job("JOBstr")) == "x"
    later = engine.morgue_purge(r, keys.queue, older_than_s=0)
    assert sorted(later.ids) == ["JOBechomq", "JOBjunk"] and (later.undated, later.undatable) == (0, 2)


def test_an_age_purge_counts_missing_and_non_hash_rows_as_undatable_every_time(r, keys, small_batches):
    """Nothing can be stamped on a row that is missing or not a hash: such an
    entry is never counted as dated, however many age purges run; only a purge
    without an age removes it."""
    r.zadd(keys.dead, {"JOBgone": 0})
    r.set(keys.job("JOBstr"), "x")
    r.lpush(keys.job("JOBlist"), "x")
    r.zadd(keys.dead, {"JOBstr": 0, "JOBlist": 0})
    before = dump(r)
    for _ in range(2):
        result = engine.morgue_purge(r, keys.queue, older_than_s=0)
        assert (result.ids, result.undated, result.undatable) == ([], 0, 3)
        assert dump(r) == before
    by_id = engine.morgue_purge(r, keys.queue, ids=["JOBgone", "JOBstr"], older_than_s=0)
    assert (by_id.ids, by_id.undated, by_id.undatable) == ([], 0, 2)
    assert sorted(engine.morgue_purge(r, keys.queue, ids=["JOBgone", "JOBstr"]).ids) == ["JOBgone", "JOBstr"]
    assert engine.morgue_purge(r, keys.queue).ids == ["JOBlist"]
    assert morgue_ids(r, keys) == [] and r.exists(keys.job("JOBstr"), keys.job("JOBlist")) == 0


@pytest.mark.parametrize("dead_at", ["nan", "inf", "-inf", "0x1F", " 12", "12 ", "1e3", "-5", "+5", "12.0",
                                     "012", "1" * 16])
def test_age_purge_reads_only_a_plain_counter_as_a_time_of_death(r, keys, dead_at):
    """dead_at follows the counter rule of the scripts (digits only, no sign,
    no leading zero, at most 15 digits): anything else is undated, kept, and
    stamped so a later purge can age it."""
    put_dead(r, keys, "JOBodd", dead_at=dead_at)
    before = server_ms(r)
    result = engine.morgue_purge(r, keys.queue, older_than_s=60)
    assert (result.ids, result.undated) == ([], 1)
    assert morgue_ids(r, keys) == ["JOBodd"]
    assert before <= int(r.hget(keys.job("JOBodd"), "dead_at")) <= server_ms(r)
    # dated now: too young for this age, gone for a purge of any age
    assert engine.morgue_purge(r, keys.queue, older_than_s=60).undated == 0
    assert engine.morgue_purge(r, keys.queue, older_than_s=0).ids == ["JOBodd"]


def test_age_purge_reads_a_plain_counter_dead_at(r, keys):
    put_dead(r, keys, "JOBepoch", dead_at="0")
    put_dead(r, keys, "JOBold", dead_at=str(server_ms(r) - 120_000))
    put_dead(r, keys, "JOBnan", dead_at="nan")
    result = engine.morgue_purge(r, keys.queue, older_than_s=60)
    assert (sorted(result.ids), result.undated) == (["JOBepoch", "JOBold"], 1)
    assert morgue_ids(r, keys) == ["JOBnan"]


@pytest.mark.parametrize("fields", [
    {"payload": "p"},
    {"attempts": "3", "last_error": "boom"},
    {"stalled": "2"},
])
def test_age_purge_stamps_any_hash_row_without_a_time_of_death(r, keys, fields):
    r.hset(keys.job("JOBbare"), mapping=fields)
    r.zadd(keys.dead, {"JOBbare": 0})
    before = server_ms(r)
    first = engine.morgue_purge(r, keys.queue, older_than_s=0)
    assert (first.ids, first.undated) == ([], 1)
    assert before <= int(r.hget(keys.job("JOBbare"), "dead_at")) <= server_ms(r)
    # dated with the attempts it belongs to ('' for a row without attempts)
    assert r.hgetall(keys.job("JOBbare")) == {**fields, "dead_at": r.hget(keys.job("JOBbare"), "dead_at"),
                                               "dead_attempts": fields.get("attempts", "")}
    later = engine.morgue_purge(r, keys.queue, older_than_s=0)
    assert (later.ids, later.undated) == (["JOBbare"], 0)
    assert morgue_ids(r, keys) == [] and r.exists(keys.job("JOBbare")) == 0


@contextlib.contextmanager
def over_maxmemory(r):
    """The server over its maxmemory (noeviction) for the duration."""
    r.config_set("maxmemory", "1")
    try:
        yield
    finally:
        r.config_set("maxmemory", "0")


def test_an_age_purge_over_maxmemory_still_frees_what_it_may(r, keys):
    """Over maxmemory (noeviction), Redis refuses a command that may grow
    memory only as a script's first write: the purge deletes before it dates,
    so an age purge still frees memory when it also meets undated entries (it
    dated the first one met first: when that came before the first old one,
    the whole purge was refused with OOM)."""
    put_dead(r, keys, "JOB1")  # undated: the purge dates it
    put_dead(r, keys, "JOB2", dead_at=server_ms(r) - 3_600_000)
    with over_maxmemory(r):
        result = engine.morgue_purge(r, keys.queue, older_than_s=60)
    assert result.ids == ["JOB2"] and result.undated == 1
    assert morgue_ids(r, keys) == ["JOB1"] and r.hget(keys.job("JOB1"), "dead_at") is not None


def test_an_age_purge_over_maxmemory_goes_past_a_window_it_cannot_date(r, keys, small_batches):
    """A window with only undated entries cannot date them over maxmemory (its
    first write would grow memory): it says so and the purge goes on to the
    old entries of the next windows instead of stopping there."""
    put_dead(r, keys, "JOB1")
    put_dead(r, keys, "JOB2")
    put_dead(r, keys, "JOB3", dead_at=server_ms(r) - 3_600_000)
    with over_maxmemory(r):
        result = engine.morgue_purge(r, keys.queue, older_than_s=60)
    assert result.ids == ["JOB3"] and result.undated == 2
    [problem] = result.problems
    assert problem.startswith("entries without a time of death were not dated (OOM ")
    assert morgue_ids(r, keys) == ["JOB1", "JOB2"]
    assert r.hget(keys.job("JOB1"), "dead_at") is None


def test_age_purge_dry_run_stamps_nothing(r, keys):
    r.hset(keys.job("JOBbare"), "payload", "p")
    r.zadd(keys.dead, {"JOBbare": 0})
    put_dead(r, keys, "JOBnan", dead_at="nan")
    r.zadd(keys.dead, {"JOBgone": 0})
    before = dump(r)
    result = engine.morgue_purge(r, keys.queue, older_than_s=0, dry_run=True)
    assert (result.ids, result.undated, result.undatable) == ([], 2, 1)
    assert dump(r) == before


# ----------------------------------------------------------------- the time of death

HOUR_MS = 3_600_000


def dead_lettered_an_hour_ago(r, keys, job_id):
    """Dead-lettered by our sweep; its dead_at then set back an hour by hand
    (its dead_attempts as the sweep wrote it)."""
    put_active(r, keys, job_id, attempts=1)
    assert engine.sweep_batch(r, keys.queue, Budgets(1), 10).dead_lettered == 1
    died = server_ms(r) - HOUR_MS
    r.hset(keys.job(job_id), "dead_at", str(died))
    return died


def test_our_own_dead_letter_ages_and_purges_as_before(r, keys):
    died = dead_lettered_an_hour_ago(r, keys, "JOB1")
    (job,) = engine.morgue_list(r, keys.queue)
    assert job.dead_at_ms == died and engine.morgue_stats(r, keys.queue).oldest_dead_at_ms == died
    assert engine.morgue_purge(r, keys.queue, older_than_s=2 * 3600).undated == 0  # dated: too young
    result = engine.morgue_purge(r, keys.queue, older_than_s=60)
    assert (result.ids, result.undated) == (["JOB1"], 0)
    assert morgue_ids(r, keys) == [] and r.exists(keys.job("JOB1")) == 0


def test_a_job_that_died_again_after_echomqs_reprocess_is_not_purged_for_its_first_death(r, keys):
    """EchoMQ's reprocess keeps dead_at; the job is claimed again (attempts + 1)
    and dies through EchoMQ's retry, which writes no dead_at. The dead_at an
    hour old is its first death, not this one (seconds ago): a purge of jobs
    dead for a minute must keep it, and list it without an age, until a purge
    dates it now."""
    first_death = dead_lettered_an_hour_ago(r, keys, "JOB1")
    # before the reprocess, that dead_at is the job's time of death (the test can tell)
    assert engine.morgue_purge(r, keys.queue, older_than_s=60, dry_run=True).ids == ["JOB1"]
    echomq_reprocess(r, keys, "JOB1")
    mq = EchoMQ(r, keys.queue)
    claim = mq.claim(group_mode="flat")
    assert (claim.id, claim.token) == ("JOB1", 3)
    assert mq.fail(claim, error="boom", max_attempts=3) == "dead"
    row = r.hgetall(keys.job("JOB1"))
    assert (row["state"], row["last_error"], row["dead_at"], row["attempts"]) == ("dead", "boom", str(first_death), "3")

    dry = engine.morgue_purge(r, keys.queue, older_than_s=60, dry_run=True)
    assert (dry.ids, dry.undated) == ([], 1)
    (job,) = engine.morgue_list(r, keys.queue)
    assert job.dead_at_ms is None  # age unknown, as a purge reads it
    assert engine.morgue_stats(r, keys.queue).oldest_dead_at_ms is None
    before = server_ms(r)
    result = engine.morgue_purge(r, keys.queue, older_than_s=60)
    assert (result.ids, result.undated, result.undatable) == ([], 1, 0)
    assert morgue_ids(r, keys) == ["JOB1"]
    dated = int(r.hget(keys.job("JOB1"), "dead_at"))
    assert before <= dated <= server_ms(r)
    assert r.hget(keys.job("JOB1"), "dead_attempts") == "3"  # dated for this death
    (job,) = engine.morgue_list(r, keys.queue)
    assert job.dead_at_ms == dated
    again = engine.morgue_purge(r, keys.queue, older_than_s=60)
    assert (again.ids, again.undated) == ([], 0)  # dated now: a minute not yet passed
    assert engine.morgue_purge(r, keys.queue, older_than_s=0).ids == ["JOB1"]


def test_an_entry_dated_before_the_attempts_were_recorded_is_undated_not_purged(r, keys):
    """A dead_at without dead_attempts (written before the scripts recorded it)
    may be a stale one: it is dated again now, so the purge comes later, never
    earlier."""
    put_dead(r, keys, "JOBold", attempts=4, dead_at=server_ms(r) - HOUR_MS, dead_attempts=None)
    (job,) = engine.morgue_list(r, keys.queue)
    assert job.dead_at_ms is None
    before = server_ms(r)
    result = engine.morgue_purge(r, keys.queue, older_than_s=60)
    assert (result.ids, result.undated) == ([], 1)
    assert before <= int(r.hget(keys.job("JOBold"), "dead_at")) <= server_ms(r)
    assert r.hget(keys.job("JOBold"), "dead_attempts") == "4"
    assert engine.morgue_purge(r, keys.queue, older_than_s=60).undated == 0


@pytest.mark.parametrize("attempts, mark", [("5", "4"), ("5", ""), (None, "0"), ("x", "y")])
def test_a_time_of_death_of_other_attempts_is_no_time(r, keys, attempts, mark):
    row = {"state": "dead", "dead_at": str(server_ms(r) - HOUR_MS), "dead_attempts": mark}
    if attempts is not None:
        row["attempts"] = attempts
    r.hset(keys.job("JOB1"), mapping=row)
    r.zadd(keys.dead, {"JOB1": 0})
    assert engine.morgue_list(r, keys.queue)[0].dead_at_ms is None
    result = engine.morgue_purge(r, keys.queue, older_than_s=60)
    assert (result.ids, result.undated) == ([], 1)
    assert r.hget(keys.job("JOB1"), "dead_attempts") == (attempts or "")


@pytest.mark.parametrize("attempts", [None, "x"])
def test_a_time_of_death_of_a_row_without_a_valid_attempts_counts_while_the_field_is_unchanged(r, keys, attempts):
    died = server_ms(r) - HOUR_MS
    row = {"state": "dead", "dead_at": str(died), "dead_attempts": attempts or ""}
    if attempts is not None:
        row["attempts"] = attempts
    r.hset(keys.job("JOB1"), mapping=row)
    r.zadd(keys.dead, {"JOB1": 0})
    assert engine.morgue_list(r, keys.queue)[0].dead_at_ms == died
    assert engine.morgue_purge(r, keys.queue, older_than_s=60).ids == ["JOB1"]


def test_purge_by_lane_and_flat(r, keys, small_batches):
    for i in range(6):
        put_dead(r, keys, f"JOB{i}", group=["a", "b", None][i % 3])
    r.zadd(keys.dead, {"JOBgone": 0})
    assert engine.morgue_purge(r, keys.queue, lane="a").ids == ["JOB0", "JOB3"]
    assert engine.morgue_purge(r, keys.queue, lane="").ids == ["JOB2", "JOB5"]
    assert morgue_ids(r, keys) == ["JOB1", "JOB4", "JOBgone"]


def test_purge_by_ids_never_touches_jobs_outside_the_morgue(r, keys):
    put_dead(r, keys, "JOB1")
    put_dead(r, keys, "JOB2", group="g")
    put_active(r, keys, "JOBlive", score=server_ms(r) + 60_000)
    r.hset(keys.job("JOBwaiting"), mapping={"state": "pending", "attempts": "0"})
    r.zadd(keys.pending, {"JOBwaiting": 0})
    result = engine.morgue_purge(r, keys.queue, ids=["JOB2", "JOBlive", "JOBwaiting", "JOBnone"])
    assert result.ids == ["JOB2"] and result.missing == ["JOBlive", "JOBwaiting", "JOBnone"]
    assert r.exists(keys.job("JOBlive"), keys.job("JOBwaiting"), keys.job("JOB1")) == 3


def test_purge_by_ids_within_a_lane_keeps_other_lanes(r, keys):
    put_dead(r, keys, "JOB1", group="a")
    put_dead(r, keys, "JOB2", group="b")
    result = engine.morgue_purge(r, keys.queue, ids=["JOB1", "JOB2"], lane="a")
    assert result.ids == ["JOB1"] and result.kept == {"JOB2": "not in the selected lane"}


def test_purge_keeps_an_entry_whose_row_says_it_is_alive(r, keys):
    put_dead(r, keys, "JOB1", state="active")
    result = engine.morgue_purge(r, keys.queue)
    assert result.ids == [] and result.kept == {"JOB1": "state is 'active', not dead"}
    assert r.exists(keys.job("JOB1")) == 1 and morgue_ids(r, keys) == ["JOB1"]


def test_purge_deletes_a_purged_jobs_log_lines_as_echomqs_remove_job_does(r, keys):
    """EchoMQ's add_log keeps a job's lines in job:<id>:logs; its remove_job
    deletes them with the row: so does a purge, and only for what it purges."""
    put_dead(r, keys, "JOB1")
    put_dead(r, keys, "JOB2", state="active")  # kept: its row says it is alive
    for job in ("JOB1", "JOB2", "JOB3"):  # JOB3: not in the morgue at all
        r.rpush(keys.job(job) + ":logs", "line 1", "line 2")
    assert engine.morgue_purge(r, keys.queue, dry_run=True).ids == ["JOB1"]
    assert r.exists(keys.job("JOB1") + ":logs") == 1
    result = engine.morgue_purge(r, keys.queue, ids=["JOB1", "JOB2", "JOB3"])
    assert result.ids == ["JOB1"] and list(result.kept) == ["JOB2"] and result.missing == ["JOB3"]
    assert r.exists(keys.job("JOB1"), keys.job("JOB1") + ":logs") == 0
    assert r.exists(keys.job("JOB2") + ":logs", keys.job("JOB3") + ":logs") == 2


def test_a_user_who_may_not_delete_the_log_lines_still_purges(redis_server, r, keys):
    """Read-only log lines: the purge goes on and says what it left. Not even
    readable: the call stops with nothing changed, as for any key of the queue
    the user may not read (docs/redis.md: every key must be readable)."""
    put_dead(r, keys, "JOB1")
    r.rpush(keys.job("JOB1") + ":logs", "line 1")
    rows = ("resetkeys", f"~{keys.prefix}[^j]*", f"~{keys.job('JOB1')}")
    with restricted_user(redis_server, r, "no-logs", *rows) as client:
        with pytest.raises(engine.AclRefused, match="nothing was changed"):
            engine.morgue_purge(client, keys.queue)
    assert morgue_ids(r, keys) == ["JOB1"] and r.exists(keys.job("JOB1")) == 1
    with restricted_user(redis_server, r, "read-only-logs", *rows, f"%R~{keys.job('JOB1')}:logs") as client:
        result = engine.morgue_purge(client, keys.queue)
    assert result.ids == ["JOB1"]
    assert r.exists(keys.job("JOB1")) == 0 and morgue_ids(r, keys) == []
    assert r.lrange(keys.job("JOB1") + ":logs", 0, -1) == ["line 1"]
    [problem] = result.problems
    assert problem.startswith(f"the log lines ({keys.prefix}job:<id>:logs) of 1 purged job(s) were not deleted (")


def test_purge_dry_run_reports_and_changes_nothing(r, keys):
    now = server_ms(r)
    put_dead(r, keys, "JOB1", dead_at=now - 10_000)
    put_dead(r, keys, "JOB2", dead_at=now)
    before = dump(r)
    assert engine.morgue_purge(r, keys.queue, older_than_s=5, dry_run=True).ids == ["JOB1"]
    assert engine.morgue_purge(r, keys.queue, ids=["JOB2", "JOBx"], dry_run=True).missing == ["JOBx"]
    assert engine.morgue_purge(r, keys.queue, dry_run=True).purged == 2
    assert dump(r) == before


def test_purge_refuses_a_negative_age(r, keys):
    with pytest.raises(ValueError, match="older than"):
        engine.morgue_purge(r, keys.queue, older_than_s=-1)


@pytest.mark.parametrize("operation", ["stats", "replay", "lane replay", "purge"])
def test_a_bytes_client_walks_past_ids_that_are_not_utf8(r_bytes, keys, small_batches, operation):
    """The scan cursor is the last id seen, sent back as it came: decoded, JOB\\xff
    would become 'JOB\ufffd', which sorts elsewhere (windows skipped, or read for ever)."""
    ids = [b"JOB1", b"JOB\xe9", b"JOB\xea", b"JOB\xeb", b"JOB\xf0", b"JOB\xff"]
    for job_id in ids:
        r_bytes.hset(keys.prefix.encode() + b"job:" + job_id, mapping={"state": "dead", "attempts": "1", "group": "g"})
        r_bytes.zadd(keys.dead, {job_id: 0})
    if operation == "stats":
        assert engine.morgue_stats(r_bytes, keys.queue).lanes == {"g": len(ids)}
        return
    if operation == "purge":
        assert len(engine.morgue_purge(r_bytes, keys.queue).ids) == len(ids)
    else:
        result = engine.morgue_replay(r_bytes, keys.queue, lane="g" if operation == "lane replay" else None)
        assert result.replayed == len(ids)
        assert sorted(r_bytes.zrange(keys.lane_pending("g"), 0, -1)) == sorted(ids)
    assert r_bytes.zcard(keys.dead) == 0


def test_morgue_operations_with_a_bytes_client(r_bytes, keys):
    r_bytes.hset(keys.job("JOB1"), mapping={"state": "dead", "attempts": "2", "group": "g",
                                            "last_error": "stalled", "dead_at": "7", "dead_attempts": "2"})
    r_bytes.zadd(keys.dead, {"JOB1": 0, "JOB2": 0})
    r_bytes.hset(keys.job("JOB2"), mapping={"state": "dead", "attempts": "1"})
    assert engine.morgue_stats(r_bytes, keys.queue) == engine.MorgueStats(2, {"g": 1, "": 1}, 7)
    assert engine.morgue_list(r_bytes, keys.queue, lane="g") == [
        DeadJob("JOB1", "g", None, 2, "stalled", 7, "dead")]
    replay = engine.morgue_replay(r_bytes, keys.queue, ids=["JOB1", "JOB9"])
    assert (replay.ids, replay.lanes, replay.missing) == (["JOB1"], {"g": 1}, ["JOB9"])
    assert engine.morgue_purge(r_bytes, keys.queue).ids == ["JOB2"]


# ----------------------------------------------------------------- permissions (ACL)


@pytest.mark.parametrize("change, rule", [("replay", "-hdel"), ("replay", "-rpush"), ("purge", "-del")])
def test_a_user_that_may_not_make_the_change_changes_nothing(redis_server, r, keys, change, rule):
    """A write refused half-way would leave a job out of the morgue and in no
    other set (replay) or a row without its entry (purge): asked for first."""
    put_dead(r, keys, "JOB1")
    put_dead(r, keys, "JOB2", group="g", dead_at=1)
    before = dump(r)
    with restricted_user(redis_server, r, "no-" + change, rule) as client:
        with pytest.raises(redis.ResponseError, match=f"EMQNOPERM the Redis user may not run {rule[1:].upper()} "):
            if change == "replay":
                engine.morgue_replay(client, keys.queue)
            else:
                engine.morgue_purge(client, keys.queue)
    assert dump(r) == before


def test_a_lane_the_user_may_not_write_keeps_its_jobs_in_the_morgue(redis_server, r, keys):
    put_dead(r, keys, "JOB1")
    put_dead(r, keys, "JOB2", group="g")
    lanes_read_only = ("resetkeys", "%R~*", f"~{keys.prefix}[^g]*", f"~{keys.prefix}ga*", f"~{keys.prefix}gl*")
    with restricted_user(redis_server, r, "no-lanes", *lanes_read_only) as client:
        preview = engine.morgue_replay(client, keys.queue, dry_run=True)
        result = engine.morgue_replay(client, keys.queue)
    for outcome in (preview, result):
        assert outcome.ids == ["JOB1"]
        assert outcome.unreplayable == {"JOB2": f"the Redis user may not write lane {keys.prefix}g:g:pending (ACL)"}
    assert r.zrange(keys.pending, 0, -1) == ["JOB1"] and morgue_ids(r, keys) == ["JOB2"]
    assert r.hget(keys.job("JOB2"), "state") == "dead"


@pytest.mark.parametrize("operation", ["stats", "list", "replay", "replay ids", "purge"])
def test_a_morgue_key_of_the_wrong_type_is_named_and_nothing_changes(r, keys, operation):
    r.set(keys.dead, "x")
    put_active(r, keys, "JOB1")
    before = dump(r)
    with pytest.raises(redis.ResponseError, match=f"EMQWRONGTYPE {re.escape(keys.dead)} is a string"):
        if operation == "stats":
            engine.morgue_stats(r, keys.queue)
        elif operation == "list":
            engine.morgue_list(r, keys.queue)
        elif operation == "replay":
            engine.morgue_replay(r, keys.queue)
        elif operation == "replay ids":
            engine.morgue_replay(r, keys.queue, ids=["JOB1"])
        else:
            engine.morgue_purge(r, keys.queue, older_than_s=0)
    assert dump(r) == before


def test_a_purge_by_id_needs_no_right_to_date_rows(redis_server, r, keys):
    put_dead(r, keys, "JOB1")
    with restricted_user(redis_server, r, "no-hset", "-hset") as client:
        assert engine.morgue_purge(client, keys.queue, ids=["JOB1"]).ids == ["JOB1"]
    assert morgue_ids(r, keys) == [] and not r.exists(keys.job("JOB1"))



def test_stats_and_a_lane_list_read_the_same_over_many_calls_as_over_one(r, keys, monkeypatch):
    """Stats add up each call's counts (lanes, unreadable, the oldest death);
    a lane list skips its offset and stops at its limit across calls."""
    for n in range(1, 13):
        if n % 5 == 0:
            r.zadd(keys.dead, {f"JOB{n:02d}": 0})  # row gone
        else:
            put_dead(r, keys, f"JOB{n:02d}", group=(None, "a", "b")[n % 3], dead_at=10_000 - n * (n % 4))
    whole = engine.morgue_stats(r, keys.queue)
    pages = {lane: [j.id for j in engine.morgue_list(r, keys.queue, lane=lane, limit=100)] for lane in ("", "a", "b")}
    for batch in (1, 2, 3):
        monkeypatch.setattr(engine.morgue, "MORGUE_BATCH", batch)
        monkeypatch.setattr(engine.morgue, "MORGUE_STATS_BATCH", batch)
        assert engine.morgue_stats(r, keys.queue) == whole
        for lane, ids in pages.items():
            for offset in range(len(ids) + 1):
                for limit in (1, 2, 5):
                    got = [j.id for j in engine.morgue_list(r, keys.queue, lane=lane, limit=limit, offset=offset)]
                    assert got == ids[offset:offset + limit], (batch, lane, offset, limit)
    assert whole.unreadable == 2 and sum(whole.lanes.values()) == 10


def put_ghost(r, keys, job_id: str) -> None:
    """What EchoMQ's reference sweep leaves in `dead` for a job that completed
    while its id was still in `active`: a row recreated with `stalled` and
    `state`, dead-lettered at its default budget of 1 (the contract)."""
    r.hset(keys.job(job_id), mapping={"stalled": "1", "state": "dead", "last_error": "stalled"})
    r.zadd(keys.dead, {job_id: 0})


def test_a_ghost_row_of_a_completed_job_is_never_replayed(r, keys):
    """Replayed, a worker claimed the completed job again, with no payload."""
    put_ghost(r, keys, "JOBghost")
    put_dead(r, keys, "JOBreal")
    r.hdel(keys.job("JOBreal"), "attempts")  # no attempts but a payload: a job all the same
    for ids in (None, ["JOBghost"]):
        result = engine.morgue_replay(r, keys.queue, ids=ids, dry_run=True)
        assert "JOBghost" not in result.ids
        assert result.unreplayable["JOBghost"].startswith("ghost row: no attempts and no payload")
    result = engine.morgue_replay(r, keys.queue)
    assert result.ids == ["JOBreal"]
    assert r.zrange(keys.dead, 0, -1) == ["JOBghost"] and r.zcard(keys.pending) == 1
    assert r.hgetall(keys.job("JOBghost")) == {"stalled": "1", "state": "dead", "last_error": "stalled"}


def test_a_ghost_row_is_listed_as_flat_with_a_warning_and_purged_like_any_entry(r, keys):
    put_ghost(r, keys, "JOBghost")
    [job] = engine.morgue_list(r, keys.queue, lane="")
    assert (job.id, job.lane, job.problem) == ("JOBghost", None, None)
    assert job.warning.startswith("ghost row:") and "purge it" in job.warning
    assert engine.morgue_stats(r, keys.queue).lanes == {"": 1}
    assert engine.morgue_purge(r, keys.queue, lane="").ids == ["JOBghost"]
    assert r.exists(keys.job("JOBghost"), keys.dead) == 0


@pytest.mark.parametrize("name", ["morgue_replay", "morgue_purge"])
def test_an_id_given_twice_to_one_script_call_is_moved_and_counted_once(r, keys, name):
    """The engine sends each id once; a caller of the script itself may not."""
    from stalledpolicy.engine.morgue_change import _replay_keys
    from stalledpolicy.lua import script

    put_dead(r, keys, "JOB1", group="g")
    if name == "morgue_replay":
        reply = script(name)(r, _replay_keys(keys), [keys.prefix, "0", "", "ids", "", 500, 500, "JOB1", "JOB1"])
        assert reply[0] == ["JOB1", "g"] and r.zrange(keys.lane_pending("g"), 0, -1) == ["JOB1"]
        assert r.hget(keys.sweeper_totals, "replayed") == "1"
    else:
        reply = script(name)(r, [keys.dead, keys.sweeper_totals],
                             [keys.prefix, "0", "", "ids", "", "", 500, "JOB1", "JOB1"])
        assert (reply[0], reply[7]) == (["JOB1"], ["=g"]), reply
        assert r.hget(keys.sweeper_totals, "purged") == "1"
    assert r.zcard(keys.dead) == 0


# --------------------------------------------------------------------------- ids that also wait elsewhere


def waiting_twice(r, keys) -> dict[str, str]:
    """Dead jobs whose ids also wait where a worker claims them (no EchoMQ
    transition leaves a job so; a tool that copied an id does): id -> that key."""
    put_dead(r, keys, "JOB1")
    r.zadd(keys.pending, {"JOB1": 0})
    put_dead(r, keys, "JOB2", group="g")
    r.zadd(keys.lane_pending("g"), {"JOB2": 0})
    put_dead(r, keys, "JOB3", group="g")
    r.zadd(keys.pending, {"JOB3": 0})  # where EchoMQ's reference replay puts a grouped job
    put_dead(r, keys, "JOB4")
    r.zadd(keys.schedule, {"JOB4": 12345})
    put_dead(r, keys, "JOB5")  # only dead
    return {"JOB1": keys.pending, "JOB2": keys.lane_pending("g"), "JOB3": keys.pending, "JOB4": keys.schedule}


@pytest.mark.parametrize("how", [{}, {"ids": ["JOB1", "JOB2", "JOB3", "JOB4", "JOB5"]}, {"older_than_s": 0}])
def test_purge_keeps_an_id_that_also_waits_elsewhere(r, keys, how):
    """Purged, the row went and the next claim of the id recreated one without
    the payload: the job's data was lost (reviewer's reproduction)."""
    for i in range(1, 6):
        r.hset(keys.job(f"JOB{i}"), "dead_at", "1000")
        r.hset(keys.job(f"JOB{i}"), "dead_attempts", "2")
    elsewhere = waiting_twice(r, keys)
    result = engine.morgue_purge(r, keys.queue, **how)
    assert result.ids == ["JOB5"]
    assert sorted(result.kept) == sorted(elsewhere)
    for job, key in elsewhere.items():
        assert result.kept[job] == (f"also waits in {key}: purged, its row would go and a worker would claim the "
                                    f"id without it; to drop only the morgue entry: ZREM {keys.dead} <id>")
        assert r.hget(keys.job(job), "payload") == f"payload-{job}"
    assert morgue_ids(r, keys) == sorted(elsewhere)
    assert r.hget(keys.sweeper_totals, "purged") == "1"


@pytest.mark.parametrize("dry_run", [False, True])
def test_replay_keeps_an_id_that_also_waits_elsewhere(r, keys, dry_run):
    """Replayed, the job waited twice (JOB3: in its lane and the flat pending)
    and was claimed and run twice."""
    elsewhere = waiting_twice(r, keys)
    result = engine.morgue_replay(r, keys.queue, dry_run=dry_run)
    assert result.ids == ["JOB5"] and result.replayed == 1
    assert sorted(result.unreplayable) == sorted(elsewhere)
    for job, key in elsewhere.items():
        assert result.unreplayable[job] == (f"also waits in {key}: replayed, it would run twice; to drop only "
                                            f"the morgue entry: ZREM {keys.dead} <id>")
    assert r.zrange(keys.lane_pending("g"), 0, -1) == ["JOB2"]  # JOB3 not added beside its flat entry
    if dry_run:
        assert morgue_ids(r, keys) == ["JOB1", "JOB2", "JOB3", "JOB4", "JOB5"]
    else:
        assert morgue_ids(r, keys) == sorted(elsewhere)
        assert r.zrange(keys.pending, 0, -1) == ["JOB1", "JOB3", "JOB5"]
        assert r.hget(keys.sweeper_totals, "replayed") == "1"
        assert r.hget(keys.job("JOB3"), "state") == "dead"


def test_a_waiting_set_of_another_type_holds_no_job(r, keys):
    put_dead(r, keys, "JOB1")
    r.set(keys.schedule, "oops")
    assert engine.morgue_purge(r, keys.queue).ids == ["JOB1"]


def test_an_id_kept_because_it_waits_elsewhere_uses_up_no_place_of_the_limit(r, keys):
    """With ids and a limit, JOB1 (also in pending) counted toward the limit and
    JOB2, eligible, was neither replayed nor reported (reviewer's reproduction)."""
    put_dead(r, keys, "JOB1")
    r.zadd(keys.pending, {"JOB1": 0})
    put_dead(r, keys, "JOB2")
    put_dead(r, keys, "JOB3")
    by_ids = engine.morgue_replay(r, keys.queue, ids=["JOB1", "JOB2", "JOB3"], limit=1)
    assert by_ids.ids == ["JOB2"] and list(by_ids.unreplayable) == ["JOB1"]
    scan = engine.morgue_replay(r, keys.queue, limit=1)
    assert scan.ids == ["JOB3"]
    assert morgue_ids(r, keys) == ["JOB1"]
