"""A queue left exactly as EchoMQ workers leave it comes out of one
``stalledpolicy sweep --once`` (the real CLI, in its own process) exactly as
the contract (shared/echomq-wire.md) says, key by key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from stalledpolicy import engine
from stalledpolicy.devenv.echomq import EchoMQ, StaleToken, read_state, server_now_ms

pytestmark = pytest.mark.redis

SWEEP_COMMAND = [sys.executable, "-m", "stalledpolicy", "sweep"]


def run_sweep_cli(url: str, queue: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``stalledpolicy sweep`` in a child process, with no inherited settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STALLEDPOLICY_")}
    return subprocess.run(
        [*SWEEP_COMMAND, "--redis-url", url, "--queue", queue, *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )


class EventTap:
    """Subscribed before the sweep starts (pub/sub is fire-and-forget)."""

    def __init__(self, r, channel: str):
        self.pubsub = r.pubsub()
        self.pubsub.subscribe(channel)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            message = self.pubsub.get_message(timeout=0.5)
            if message and message["type"] == "subscribe":
                return
        raise TimeoutError(f"no subscribe confirmation on {channel}")

    def collect(self, expected: int, timeout: float = 10.0) -> list[dict]:
        """At least ``expected`` events if they come, plus any extra (a duplicate)."""
        events: list[dict] = []
        deadline = time.monotonic() + timeout
        quiet_until = None
        while time.monotonic() < deadline:
            message = self.pubsub.get_message(timeout=0.1)
            if message and message["type"] == "message":
                data = message["data"]
                events.append(json.loads(data if isinstance(data, str) else data.decode()))
            elif len(events) >= expected:
                quiet_until = quiet_until or time.monotonic() + 0.3
                if time.monotonic() >= quiet_until:
                    break
        return events

    def close(self) -> None:
        self.pubsub.close()


def _claim_until(mq: EchoMQ, job_id: str, mode: str):
    claim = mq.claim(600_000, mode)
    assert claim is not None and claim.id == job_id, (claim, job_id)
    return claim


@pytest.fixture
def prepared(r, queue_name):
    """Every shape the contract names. Budgets: default 3, lane slow=0, fast=1."""
    mq = EchoMQ(r, queue_name)
    k = mq.keys
    jobs: dict[str, str] = {}

    # flat: under budget, at budget, lease still running, untouched pending,
    # a scheduled retry and an older dead letter
    jobs["flat_fresh"] = mq.enqueue("flat-1")
    jobs["flat_at_budget"] = mq.enqueue("flat-2")
    jobs["flat_running"] = mq.enqueue("flat-3")
    claims = {name: _claim_until(mq, jobs[name], "flat")
              for name in ("flat_fresh", "flat_at_budget", "flat_running")}
    jobs["flat_retry"] = mq.enqueue("flat-4")
    mq.fail(_claim_until(mq, jobs["flat_retry"], "flat"), error="boom", delay_ms=3_600_000, max_attempts=5)
    jobs["flat_old_dead"] = mq.enqueue("flat-5")
    mq.fail(_claim_until(mq, jobs["flat_old_dead"], "flat"), error="poison", max_attempts=1)
    jobs["flat_waiting"] = mq.enqueue("flat-6")

    # lane a: limit 1, its one job stalled under budget, backlog behind it
    mq.set_lane_limit("a", 1)
    jobs["a_stalled"] = mq.enqueue("a-1", group="a")
    jobs["a_backlog"] = mq.enqueue("a-2", group="a")
    # lane b: limit 1, its one job stalled at budget, backlog behind it
    mq.set_lane_limit("b", 1)
    jobs["b_at_budget"] = mq.enqueue("b-1", group="b")
    jobs["b_backlog"] = mq.enqueue("b-2", group="b")
    # lane c: unlimited, one stalled and one still running
    jobs["c_stalled"] = mq.enqueue("c-1", group="c")
    jobs["c_running"] = mq.enqueue("c-2", group="c")
    # lane p: paused after its job was claimed, backlog waiting
    jobs["p_stalled"] = mq.enqueue("p-1", group="p")
    jobs["p_backlog"] = mq.enqueue("p-2", group="p")
    # lane slow (budget 0: never dead-letter) and fast (budget 1: no recovery)
    jobs["slow_stalled"] = mq.enqueue("s-1", group="slow")
    jobs["fast_stalled"] = mq.enqueue("f-1", group="fast")
    grouped = ("a_stalled", "b_at_budget", "c_stalled", "c_running", "p_stalled",
               "slow_stalled", "fast_stalled")
    wanted = {jobs[name]: name for name in grouped}
    while wanted:
        claim = mq.claim(600_000, "grouped")
        assert claim is not None, f"could not claim {sorted(wanted.values())}"
        assert claim.id in wanted, f"rotation served {claim.id} before the jobs under test"
        claims[wanted.pop(claim.id)] = claim
    mq.pause("p")
    # lane d: untouched work already on the ring
    jobs["d_waiting"] = mq.enqueue("d-1", group="d")

    # earlier sweeps' marks, as they sit on the rows
    r.hset(k.job(jobs["flat_at_budget"]), "stalled", 2)
    r.hset(k.job(jobs["b_at_budget"]), "stalled", 2)
    r.hset(k.job(jobs["slow_stalled"]), "stalled", 50)
    r.hset(k.job(jobs["c_stalled"]), "stalled", 0)

    for name in ("flat_fresh", "flat_at_budget", "a_stalled", "b_at_budget", "c_stalled",
                 "p_stalled", "slow_stalled", "fast_stalled"):
        assert mq.expire(claims[name], past_ms=5_000)

    # an orphan: listed in active, row already retired
    jobs["orphan"] = "JOB00000000000000000001"
    r.zadd(k.active, {jobs["orphan"]: 1})

    return mq, jobs, claims


RECOVERED = {"flat_fresh": None, "a_stalled": "a", "c_stalled": "c", "p_stalled": "p",
             "slow_stalled": "slow"}
DEAD = {"flat_at_budget": None, "b_at_budget": "b", "fast_stalled": "fast"}


def test_sweep_once_leaves_the_queue_exactly_as_the_contract_says(r, redis_server, prepared):
    mq, jobs, claims = prepared
    k = mq.keys
    before = read_state(r, mq.queue)
    rows_before = {job: r.hgetall(k.job(job)) for job in jobs.values()}
    failed_before = int(r.hget(k.metrics_failed, "count") or 0)
    completed_before = r.hgetall(k.metrics_completed)
    tap = EventTap(r, k.events)
    t0 = server_now_ms(r)

    done = run_sweep_cli(redis_server.url, mq.queue, "--once", "--max-stalled", "3",
                         "--lane", "slow=0", "--lane", "fast=1", "--batch-size", "3")

    t1 = server_now_ms(r)
    assert done.returncode == 0, done.stderr
    events = tap.collect(expected=len(RECOVERED) + len(DEAD))
    tap.close()
    after = read_state(r, mq.queue)
    id_of = jobs.__getitem__

    # active: the expired and the orphan are gone, running leases keep their score
    assert after.active == {id_of("flat_running"): before.active[id_of("flat_running")],
                            id_of("c_running"): before.active[id_of("c_running")]}
    # pending: the recovered flat job joins the untouched waiting one
    assert sorted(after.pending) == sorted([id_of("flat_waiting"), id_of("flat_fresh")])
    # lanes: each recovered grouped job back in its own lane, score 0, backlog kept
    assert sorted(after.lanes["a"]) == sorted([id_of("a_stalled"), id_of("a_backlog")])
    assert after.lanes["b"] == [id_of("b_backlog")]
    assert after.lanes["c"] == [id_of("c_stalled")]
    assert sorted(after.lanes["p"]) == sorted([id_of("p_stalled"), id_of("p_backlog")])
    assert after.lanes["slow"] == [id_of("slow_stalled")]
    assert after.lanes["d"] == [id_of("d_waiting")]
    assert "fast" not in after.lanes or after.lanes["fast"] == []
    for group in ("a", "c", "p", "slow"):
        assert all(score == 0 for _, score in r.zrange(k.lane_pending(group), 0, -1, withscores=True))
    assert r.zscore(k.pending, id_of("flat_fresh")) == 0
    # the morgue: the three at budget join the older dead letter, score 0
    assert after.dead == {id_of("flat_old_dead"): 0, id_of("flat_at_budget"): 0,
                          id_of("b_at_budget"): 0, id_of("fast_stalled"): 0}
    assert after.schedule == before.schedule == [id_of("flat_retry")]
    # gactive: freed slots, fields at 0 deleted; c keeps its running job
    assert after.gactive == {"c": "1"}
    assert after.glimit == before.glimit == {"a": "1", "b": "1"}
    assert after.paused == before.paused == {"p"}
    # ring: d kept, a (freed under its limit), b (freed by a death: the fixed
    # defect), c and slow (work again) join; p stays out (paused); no duplicate
    assert after.ring[: len(before.ring)] == before.ring == ["d"]
    assert sorted(after.ring[len(before.ring):]) == ["a", "b", "c", "slow"]
    assert after.wake_len == before.wake_len + 4 or after.wake_len == 64

    # rows, field by field
    for name, group in RECOVERED.items():
        row_before, row = rows_before[id_of(name)], r.hgetall(k.job(id_of(name)))
        expected = dict(row_before, state="pending",
                        stalled=str(int(row_before.get("stalled", 0)) + 1),
                        attempts=str(int(row_before["attempts"]) + 1))  # the fence
        assert row == expected, name
        assert row.get("group") == group
    for name, group in DEAD.items():
        row_before, row = rows_before[id_of(name)], r.hgetall(k.job(id_of(name)))
        assert row["state"] == "dead" and row["last_error"] == "stalled", name
        assert row["stalled"] == str(int(row_before.get("stalled", 0)) + 1)
        assert row["attempts"] == str(int(row_before["attempts"]) + 1)  # the fence
        assert row["payload"] == row_before["payload"] and row.get("group") == group
        assert t0 <= int(row["dead_at"]) <= t1
        assert row["dead_attempts"] == row["attempts"]  # the attempts that dead_at belongs to
        assert set(row) - set(row_before) <= {"stalled", "last_error", "dead_at", "dead_attempts"}
    for name in ("flat_running", "c_running", "flat_retry", "flat_old_dead", "flat_waiting",
                 "a_backlog", "b_backlog", "p_backlog", "d_waiting"):
        assert r.hgetall(k.job(id_of(name))) == rows_before[id_of(name)], name
    assert not r.exists(k.job(id_of("orphan")))  # no ghost row

    # counters: stall deaths count as failures for EchoMQ; completions untouched
    assert int(r.hget(k.metrics_failed, "count")) == failed_before + len(DEAD)
    assert r.hgetall(k.metrics_completed) == completed_before
    snap = engine.queue_snapshot(r, mq.queue, lanes=["a", "b", "fast"])
    assert (snap.recovered_total, snap.dead_lettered_total, snap.orphans_total) == (5, 3, 1)
    assert {lane.name: (lane.recovered_total, lane.dead_lettered_total) for lane in snap.lanes} == {
        "a": (1, 0), "b": (0, 1), "fast": (0, 1)}

    # events: one per moved job, in EchoMQ's JSON shape
    announced = sorted((e["event"], e["job"], e.get("reason")) for e in events)
    assert announced == sorted(
        [("stalled", id_of(n), None) for n in RECOVERED]
        + [("failed", id_of(n), "stalled") for n in DEAD])

    # the queue is sound, and workers find what they expect
    assert mq.audit() == []
    for name in [*DEAD, *RECOVERED]:  # the stalled worker of every moved job is fenced off
        with pytest.raises(StaleToken):
            mq.complete(claims[name])
        with pytest.raises(StaleToken):
            mq.extend(claims[name], 1_000)  # EchoMQ's own: would re-add the id to active
        with pytest.raises(StaleToken):
            mq.fail(claims[name], error="late", delay_ms=0, max_attempts=9)
    assert mq.audit() == []
    reclaimed = {}
    for _ in range(len(after.ring)):  # one rotation serves each ringed lane once
        claim = mq.claim(60_000, "grouped")
        reclaimed[claim.group] = claim
    assert set(reclaimed) == {"d", "a", "b", "c", "slow"}
    assert reclaimed["a"].id == id_of("a_stalled") and reclaimed["a"].token == 3  # claim, fence, claim
    assert mq.audit() == []


def test_sweep_once_on_an_empty_queue_changes_nothing(r, redis_server, queue_name):
    mq = EchoMQ(r, queue_name)
    mq.enqueue("waiting")
    before = read_state(r, queue_name)
    done = run_sweep_cli(redis_server.url, queue_name, "--once", "--max-stalled", "1")
    assert done.returncode == 0, done.stderr
    assert read_state(r, queue_name) == before
