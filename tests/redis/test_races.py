"""Concurrency and crashes: racing sweepers never move a job twice, and a
sweeper killed with SIGKILL in the middle of a large drain loses nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from stalledpolicy import engine
from stalledpolicy.devenv.echomq import EchoMQ, Seeded, StaleToken, audit, read_state
from stalledpolicy.keyspace import QueueKeys

pytestmark = pytest.mark.redis

GROUPS = ["a", "b", "c", "d"]
LANE_BUDGETS = {"c": 0, "d": 1}
BUDGETS = engine.Budgets(default=3, lanes=LANE_BUDGETS)
LANE_FLAGS = [arg for lane, budget in LANE_BUDGETS.items() for arg in ("--lane", f"{lane}={budget}")]
SWEEPER = [sys.executable, "-m", "stalledpolicy", "sweep"]


class EventCounter:
    """Counts every event of a queue's channel, per (event, job), from a thread."""

    def __init__(self, client, queue: str):
        channel = QueueKeys(queue).events
        self.client = client  # keeps the connection pool of the pubsub open
        self.counts: Counter[tuple[str, str]] = Counter()
        self.pubsub = client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(**{channel: self._handle})
        self.thread = self.pubsub.run_in_thread(sleep_time=0.01, daemon=True)
        deadline = time.monotonic() + 5
        while client.pubsub_numsub(channel)[0][1] == 0:
            if time.monotonic() > deadline:
                raise TimeoutError("event subscriber never registered")
            time.sleep(0.02)

    def _handle(self, message) -> None:
        data = message["data"]
        event = json.loads(data if isinstance(data, str) else data.decode())
        self.counts[(event["event"], event["job"])] += 1

    def wait_for(self, total: int, timeout: float = 30.0) -> Counter:
        deadline = time.monotonic() + timeout
        while sum(self.counts.values()) < total and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # room for a duplicate to show up
        self.thread.stop()
        self.thread.join(timeout=5)
        self.pubsub.close()
        self.client.close()
        return self.counts


def assert_each_job_moved_exactly_once(r, mq: EchoMQ, seeded: Seeded) -> None:
    """The final placement proves one move per job: stalled went up by exactly
    one, the job sits where its budget sends it, counters add up."""
    k = mq.keys
    state = read_state(r, mq.queue)
    assert state.active == {}, f"{len(state.active)} jobs still in active"
    assert audit(r, mq.queue, ledger=mq.ledger, state=state) == []
    assert set(state.dead) == seeded.at_budget
    for job_id in seeded.ids:
        row = state.rows[job_id]
        assert int(row.stalled) == seeded.stalled_before[job_id] + 1, job_id
        group = seeded.groups[job_id]
        if job_id in seeded.at_budget:
            assert row.state == "dead"
        elif group is None:
            assert row.state == "pending"
        else:
            assert row.state == "pending" and row.group == group
    recovered = len(seeded.ids) - len(seeded.at_budget)
    assert sum(len(m) for m in state.lanes.values()) + len(state.pending) == recovered
    snap = engine.queue_snapshot(r, mq.queue, lanes=GROUPS)
    assert (snap.recovered_total, snap.dead_lettered_total) == (recovered, len(seeded.at_budget))
    assert int(r.hget(k.metrics_failed, "count")) == len(seeded.at_budget)
    for lane in snap.lanes:
        grouped = [j for j, g in seeded.groups.items() if g == lane.name]
        dead = [j for j in grouped if j in seeded.at_budget]
        assert (lane.recovered_total, lane.dead_lettered_total) == (len(grouped) - len(dead), len(dead))
    assert state.gactive == {}
    assert sorted(state.ring) == sorted(g for g, members in state.lanes.items() if members)


def _seed(mq: EchoMQ, n: int) -> Seeded:
    return mq.seed_stalled(n, groups=GROUPS, grouped_fraction=0.6, budget=BUDGETS.default,
                           lane_budgets=LANE_BUDGETS, at_budget_fraction=0.2, lease_past_ms=10_000)


def test_two_sweeper_threads_racing_never_move_a_job_twice(redis_server, r, queue_name):
    n = 20_000
    mq = EchoMQ(r, queue_name)
    seeded = _seed(mq, n)
    events = EventCounter(redis_server.client(decode_responses=True), queue_name)
    start = threading.Barrier(2)
    results: list[engine.SweepResult] = [engine.SweepResult(), engine.SweepResult()]

    def sweeper(slot: int) -> None:
        client = redis_server.client(decode_responses=slot == 0)  # both reply modes
        start.wait()
        while True:
            result = engine.sweep_batch(client, queue_name, BUDGETS, 7)
            results[slot] = results[slot].merge(result)
            if not result.more and result.moved == 0:
                break
        client.close()

    threads = [threading.Thread(target=sweeper, args=(slot,)) for slot in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads)

    both = results[0].merge(results[1])
    assert (both.recovered, both.dead_lettered, both.orphans, both.quarantined) == (
        n - len(seeded.at_budget), len(seeded.at_budget), 0, 0)
    assert results[0].moved > 0 and results[1].moved > 0, "one sweeper never got a turn"
    counts = events.wait_for(n)
    assert sum(counts.values()) == n
    assert {job for _, job in counts} == set(seeded.ids)
    assert set(counts.values()) == {1}
    dead_events = {job for (event, job) in counts if event == "failed"}
    assert dead_events == seeded.at_budget
    assert_each_job_moved_exactly_once(r, mq, seeded)


def _sweeper_process(url: str, queue: str, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STALLEDPOLICY_")}
    return subprocess.Popen(
        [*SWEEPER, "--redis-url", url, "--queue", queue, "--once", "--max-stalled",
         str(BUDGETS.default), *LANE_FLAGS, "--log-level", "warning", *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_two_sweeper_processes_racing_never_move_a_job_twice(redis_server, r, queue_name):
    n = 20_000
    mq = EchoMQ(r, queue_name)
    seeded = _seed(mq, n)
    events = EventCounter(redis_server.client(decode_responses=True), queue_name)
    procs = [_sweeper_process(redis_server.url, queue_name, "--batch-size", "5") for _ in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    counts = events.wait_for(n)
    assert sum(counts.values()) == n and set(counts.values()) == {1}
    assert_each_job_moved_exactly_once(r, mq, seeded)


def test_a_sweeper_killed_mid_drain_loses_nothing(redis_server, r, queue_name):
    n = 60_000
    mq = EchoMQ(r, queue_name)
    seeded = _seed(mq, n)
    k = mq.keys
    proc = _sweeper_process(redis_server.url, queue_name, "--batch-size", "100")
    try:
        deadline = time.monotonic() + 120
        while r.zcard(k.active) > n * 0.8 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1]
            time.sleep(0.005)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    left = r.zcard(k.active)
    if left == 0:
        pytest.fail(f"the drain of {n} jobs ended before the kill: raise n to test a crash mid-drain")
    assert left < n, "the sweeper was killed before it moved anything"
    swept_before_kill = n - left
    totals = engine.queue_snapshot(r, queue_name)
    assert totals.recovered_total + totals.dead_lettered_total == swept_before_kill
    # a fresh sweeper finishes the job; nothing was lost, nothing is moved twice
    finished = engine.drain(r, queue_name, BUDGETS, 1_000)
    assert finished.recovered + finished.dead_lettered == left
    assert_each_job_moved_exactly_once(r, mq, seeded)


@pytest.mark.parametrize("group", [None, "a"])
def test_a_zombie_heartbeat_after_a_recovery_is_refused_and_a_stray_lease_is_not_a_second_stall(
        r, queue_name, group):
    """EchoMQ's lease extension re-adds an id to ``active`` whenever the token
    matches. After our recovery the stalled worker's heartbeat is refused (the
    recovery moved the token on). A token can still match a waiting job by
    EchoMQ's own moves (retry, then promote, keep it): that heartbeat leaves
    the id both waiting and in ``active``. When such a stray lease lapses, the
    sweep must drop the stray entry, not count a second stall (which would
    dead-letter a waiting job into two places, or free a lane slot twice)."""
    mq = EchoMQ(r, queue_name)
    k = mq.keys
    if group:
        mq.set_lane_limit(group, 2)
    zombie_job, busy_job = mq.enqueue_many(2, group=group)
    zombie = mq.claim(60_000, "any")
    busy = mq.claim(60_000, "any")  # a healthy worker keeps the other job in flight
    assert (zombie.id, busy.id) == (zombie_job, busy_job)
    mq.expire(zombie)
    assert engine.sweep_batch(r, queue_name, engine.Budgets(2), 10).recovered == 1
    with pytest.raises(StaleToken):
        mq.extend(zombie, 60_000)  # EchoMQ's own extension: fenced off
    assert mq.audit() == []

    again = mq.claim(60_000, "any")
    assert again.id == zombie_job
    assert mq.fail(again, error="boom", delay_ms=0, max_attempts=9) == "scheduled"
    assert mq.promote() == 1
    if group:
        mq.pause(group)  # nobody re-claims it before the stray lease lapses
    assert mq.extend(again, 60_000) is True  # token unchanged by retry + promote
    mq.expire(again)
    result = engine.sweep_batch(r, queue_name, engine.Budgets(2), 10)

    assert (result.recovered, result.dead_lettered, result.quarantined) == (0, 0, 0)
    assert result.orphans == 1  # an active entry with no job in flight behind it
    assert mq.where_is(zombie_job).places == ([f"lane:{group}"] if group else ["pending"])
    assert r.hget(k.job(zombie_job), "stalled") == "1"  # one real stall, counted once
    assert mq.audit() == []
    if group:
        assert r.hget(k.gactive, group) == "1"  # the busy job's slot is still held
    assert mq.complete(busy) is True
    assert mq.audit() == []


def test_workers_sweepers_and_replays_all_at_once_keep_every_job(redis_server, r, queue_name):
    """Two sweepers, a morgue replayer and three EchoMQ workers (that complete,
    fail, die holding jobs and come back late) hammer one queue at once."""
    import random

    mq = EchoMQ(r, queue_name)
    for group in (None, "a", "b", "c", "d"):
        mq.enqueue_many(400, group=group)
    mq.set_lane_limit("a", 2)
    budgets = engine.Budgets(default=2, lanes={"c": 0, "d": 1})
    stop = threading.Event()
    swept: list[engine.SweepResult] = []
    replayed: list[int] = []
    errors: list[BaseException] = []

    def guarded(body):
        def run(*args):
            try:
                body(*args)
            except BaseException as exc:  # noqa: BLE001 - reported by the test thread
                errors.append(exc)
                stop.set()
        return run

    @guarded
    def sweeper() -> None:
        client = redis_server.client(decode_responses=True)
        total = engine.SweepResult()
        while not stop.is_set():
            total = total.merge(engine.sweep_batch(client, queue_name, budgets, 5))
        swept.append(total)
        client.close()

    @guarded
    def replayer() -> None:
        client = redis_server.client()
        count = 0
        while not stop.is_set():
            count += engine.morgue_replay(client, queue_name, limit=3).replayed
            time.sleep(0.002)
        replayed.append(count)
        client.close()

    @guarded
    def worker(seed: int, turns: int) -> None:
        rng = random.Random(seed)
        me = mq.sibling(redis_server.client(decode_responses=True))
        zombies = []
        for _ in range(turns):
            if stop.is_set():
                break
            claim = me.claim(60_000, rng.choice(["flat", "grouped", "any"]))
            if claim is None:
                continue
            roll = rng.random()
            if roll < 0.55:
                me.complete(claim)
            elif roll < 0.65:
                try:
                    me.fail(claim, error="boom", delay_ms=0, max_attempts=3)
                except StaleToken:
                    pass
            else:
                me.expire(claim)
                zombies.append(claim)
            if zombies and rng.random() < 0.3:  # a dead worker's late report
                late = zombies.pop(rng.randrange(len(zombies)))
                try:
                    me.complete(late)
                except StaleToken:
                    pass
            if rng.random() < 0.05:
                me.promote()
        me.client.close()

    threads = [threading.Thread(target=sweeper) for _ in range(2)]
    threads.append(threading.Thread(target=replayer))
    workers = [threading.Thread(target=worker, args=(seed, 1500)) for seed in range(3)]
    for thread in threads + workers:
        thread.start()
    for thread in workers:
        thread.join(timeout=300)
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []

    # settle: the last stalls swept, and the books balance
    rest = engine.drain(r, queue_name, budgets, 100)
    snap = engine.queue_snapshot(r, queue_name)
    total = rest
    for result in swept:
        total = total.merge(result)
    assert (snap.recovered_total, snap.dead_lettered_total, snap.orphans_total) == (
        total.recovered, total.dead_lettered, total.orphans)
    assert total.recovered > 0 and total.dead_lettered > 0 and sum(replayed) > 0
    assert total.quarantined == 0
    assert mq.audit() == []
    assert len(mq.ledger.completed) > 0


def test_the_fence_survives_a_replay_and_a_purge(r, queue_name):
    """The stalled worker of a dead-lettered job stays fenced after an operator
    replays the job (a live job again) or purges it (gone for good)."""
    mq = EchoMQ(r, queue_name)
    replayed_job, purged_job = mq.enqueue_many(2, group="a")
    zombies = [mq.claim(60_000, "grouped"), mq.claim(60_000, "grouped")]
    for zombie in zombies:
        mq.expire(zombie)
    assert engine.sweep_batch(r, queue_name, engine.Budgets(1), 10).dead_lettered == 2
    assert engine.morgue_replay(r, queue_name, ids=[replayed_job]).replayed == 1
    purged = engine.morgue_purge(r, queue_name, ids=[purged_job])
    assert purged.ids == [purged_job]
    mq.ledger.retire(purged.ids)
    with pytest.raises(StaleToken):
        mq.extend(zombies[0], 60_000)
    with pytest.raises(StaleToken):
        mq.complete(zombies[0])
    # row gone: nothing to extend or retire, nothing left dangling
    assert mq.extend(zombies[1], 60_000) is False
    assert mq.complete(zombies[1]) is False
    assert mq.where_is(replayed_job).places == ["lane:a"]
    assert mq.audit() == []
    fresh = mq.claim(60_000, "grouped")
    assert fresh.id == replayed_job and mq.complete(fresh) is True
    assert mq.audit() == []
