"""Property: whatever the interleaving of EchoMQ workers, expiring leases,
sweeps, morgue replays and purges, on a real server from several connections
at once, no job is ever lost, duplicated or misplaced, and the lanes stay
consistent. Lease extensions are EchoMQ's own (``strict=False``: the id is
re-added to ``active`` whenever the token matches) as often as the strict
kind, at any moment, by any worker still holding a claim: the sweep's fence
(``attempts`` bumped on every move) must refuse a stalled worker's.

Each hypothesis step fires a handful of operations at the same instant from
separate connections (threads released by one barrier), then the whole queue
is audited atomically (``devenv.echomq.audit``): every id in exactly one place
or completed, rows matching places, ``gactive`` equal to the jobs in flight,
every serviceable lane on the ring and no unserviceable one.
"""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from stalledpolicy import engine
from stalledpolicy.devenv.echomq import Claim, EchoMQ, StaleToken

pytestmark = pytest.mark.redis

WORKERS = 4
GROUPS = ["a", "b", "c"]
BUDGETS = engine.Budgets(default=2, lanes={"b": 0, "c": 1})
LONG_LEASE_MS = 600_000

groups = st.sampled_from([None, *GROUPS])
lane_names = st.sampled_from(GROUPS)
pick = st.integers(min_value=0, max_value=1_000)

# (strategy, weight): the transitions that race with a sweep are drawn most
OPERATIONS = [  # the first entries are drawn a little more often: the racy ones
    (st.tuples(st.just("claim"), st.sampled_from(["flat", "grouped", "any"]), st.integers(1, 3)), 4),
    (st.tuples(st.just("sweep"), st.integers(1, 4)), 3),
    (st.tuples(st.just("expire"), pick), 3),
    (st.tuples(st.just("complete"), pick), 3),
    (st.tuples(st.just("replay"), st.one_of(st.none(), lane_names), st.integers(1, 3)), 2),
    (st.tuples(st.just("enqueue"), groups, st.integers(1, 3)), 2),
    (st.tuples(st.just("extend"), pick, st.booleans()), 2),
    (st.tuples(st.just("fail"), pick, st.integers(1, 4)), 1),
    (st.tuples(st.just("expire_all")), 1),
    (st.tuples(st.just("limit"), lane_names, st.integers(0, 3)), 1),
    (st.tuples(st.just("pause"), lane_names), 1),
    (st.tuples(st.just("resume"), lane_names), 1),
    (st.tuples(st.just("promote")), 1),
    (st.tuples(st.just("purge"), st.one_of(st.none(), lane_names)), 1),
]
# weight by repetition (hypothesis still favours early entries, hence the order)
operation = st.sampled_from(
    [strategy for strategy, weight in OPERATIONS for _ in range(weight)]
).flatmap(lambda strategy: strategy)


class ConcurrentQueue(RuleBasedStateMachine):
    def __init__(self, server) -> None:
        super().__init__()
        self.queue = f"prop-{uuid.uuid4().hex[:10]}"
        self.clients = [server.client(decode_responses=True) for _ in range(WORKERS)]
        first = EchoMQ(self.clients[0], self.queue)
        self.workers = [first] + [first.sibling(c) for c in self.clients[1:]]
        self.held: list[Claim] = []       # claims whose workers may still act on them
        self.busy: set[Claim] = set()     # claims a worker is acting on right now
        self.lock = threading.Lock()
        self.swept = engine.SweepResult()
        self.replayed = 0
        self.pool = ThreadPoolExecutor(WORKERS)

    def teardown(self) -> None:
        self.pool.shutdown(wait=True)
        for client in self.clients:
            client.close()

    # -- one operation on one connection ------------------------------------

    def _checkout(self, index: int, done: bool) -> Claim | None:
        """A held claim no other operation is acting on, now its worker's own:
        a worker serialises its calls on one claim (it never heartbeats a job
        it has already reported). ``done``: the worker reports it (complete,
        fail), so the claim leaves ``held`` before the call."""
        with self.lock:
            free = [c for c in self.held if c not in self.busy]
            if not free:
                return None
            claim = free[index % len(free)]
            if done:
                self.held.remove(claim)
            else:
                self.busy.add(claim)
            return claim

    def _checkin(self, claim: Claim, drop: bool) -> None:
        with self.lock:
            self.busy.discard(claim)
            if drop and claim in self.held:
                self.held.remove(claim)

    def _apply(self, mq: EchoMQ, op: tuple) -> None:
        kind = op[0]
        if kind == "enqueue":
            for _ in range(op[2]):
                mq.enqueue("p", group=op[1])
        elif kind == "claim":
            for _ in range(op[2]):
                claim = mq.claim(LONG_LEASE_MS, op[1])
                if claim is not None:
                    with self.lock:
                        self.held.append(claim)
        elif kind == "expire":
            # the lease lapses on the server: no call of the worker, races with anything
            with self.lock:
                claim = self.held[op[1] % len(self.held)] if self.held else None
            if claim is not None:
                mq.expire(claim, past_ms=1_000)
        elif kind in ("extend", "complete", "fail"):
            # late or not, a worker that completes or fails is done with its claim
            claim = self._checkout(op[1], done=kind != "extend")
            if claim is None:
                return
            stale = False
            try:
                if kind == "extend":
                    # EchoMQ's own extension (strict=False) re-adds the id to
                    # active whenever the token matches: the fence of every
                    # sweep move must refuse a stalled worker's heartbeat
                    mq.extend(claim, LONG_LEASE_MS, strict=op[2])
                elif kind == "complete":
                    mq.complete(claim)
                else:
                    mq.fail(claim, error="boom", delay_ms=0, max_attempts=op[2])
            except StaleToken:
                stale = True
            finally:
                if kind == "extend":
                    self._checkin(claim, drop=stale)
        elif kind == "expire_all":
            mq.expire_all(past_ms=1_000)
        elif kind == "sweep":
            result = engine.sweep_batch(mq.client, self.queue, BUDGETS, op[1])
            with self.lock:
                self.swept = self.swept.merge(result)
        elif kind == "replay":
            done = engine.morgue_replay(mq.client, self.queue, lane=op[1], limit=op[2])
            with self.lock:
                self.replayed += done.replayed
        elif kind == "purge":
            purged = engine.morgue_purge(mq.client, self.queue, lane=op[1])
            mq.ledger.retire(purged.ids)
        elif kind == "limit":
            mq.set_lane_limit(op[1], op[2])
        elif kind == "pause":
            mq.pause(op[1])
        elif kind == "resume":
            mq.resume(op[1])
        elif kind == "promote":
            mq.promote()
        else:  # pragma: no cover - the strategy only draws the kinds above
            raise AssertionError(kind)

    # -- rules ----------------------------------------------------------------

    @initialize(flat=st.integers(0, 4), per_lane=st.integers(0, 3), claimed=st.integers(0, 6),
                limit_a=st.none() | st.integers(0, 2))
    def some_work_in_flight(self, flat, per_lane, claimed, limit_a):
        mq = self.workers[0]
        if limit_a is not None:
            mq.set_lane_limit("a", limit_a)
        mq.enqueue_many(flat)
        for group in GROUPS:
            mq.enqueue_many(per_lane, group=group)
        for _ in range(claimed):
            claim = mq.claim(LONG_LEASE_MS, "any")
            if claim is not None:
                self.held.append(claim)

    @rule(index=pick, mode=st.sampled_from(["flat", "grouped", "any"]))
    def a_worker_dies_holding_a_job(self, index, mode):
        mq = self.workers[2]
        claim = mq.claim(LONG_LEASE_MS, mode)
        if claim is not None:
            self.held.append(claim)
            mq.expire(claim)

    @rule(ops=st.lists(operation, min_size=2, max_size=WORKERS))
    def at_once(self, ops):
        barrier = threading.Barrier(len(ops))

        def run(slot: int, op: tuple) -> None:
            barrier.wait(timeout=10)
            self._apply(self.workers[slot], op)

        futures = [self.pool.submit(run, slot, op) for slot, op in enumerate(ops)]
        for future in futures:
            future.result(timeout=60)

    @rule(index=pick, finish=st.sampled_from(["complete", "fail"]))
    def a_stalled_worker_finishes_late(self, index, finish):
        """The worker of a job the sweep already moved comes back and reports."""
        mq = self.workers[3]
        late = [c for c in self.held if c not in self.busy and "active" not in mq.where_is(c.id).places]
        if not late:
            return
        claim = late[index % len(late)]
        self.held.remove(claim)
        try:
            if finish == "complete":
                mq.complete(claim)
            else:
                mq.fail(claim, error="late", delay_ms=0, max_attempts=2)
        except StaleToken:
            pass

    @rule(index=pick)
    def a_stalled_worker_heartbeats_late(self, index):
        """The worker of a job the sweep already moved sends EchoMQ's heartbeat
        (re-adds the id to active if its token still matched)."""
        mq = self.workers[3]
        late = [c for c in self.held if "active" not in mq.where_is(c.id).places]
        if not late:
            return
        claim = late[index % len(late)]
        try:
            mq.extend(claim, LONG_LEASE_MS, strict=False)
        except StaleToken:
            self.held.remove(claim)

    @rule(group=groups, count=st.integers(2, 6))
    def burst_of_work(self, group, count):
        self.workers[0].enqueue_many(count, group=group)

    @rule(limit=st.integers(1, 10))
    def sweeper_pass(self, limit):
        result = engine.drain(self.workers[1].client, self.queue, BUDGETS, limit)
        self.swept = self.swept.merge(result)

    # -- checked after every step ----------------------------------------------

    @invariant()
    def queue_is_sound(self):
        problems = self.workers[0].audit()
        assert problems == [], "\n".join(problems)

    @invariant()
    def totals_match_what_the_sweeps_reported(self):
        snap = engine.queue_snapshot(self.clients[0], self.queue)
        assert (snap.recovered_total, snap.dead_lettered_total, snap.orphans_total,
                snap.quarantined_total) == (self.swept.recovered, self.swept.dead_lettered,
                                            self.swept.orphans, self.swept.quarantined)
        assert self.swept.quarantined == 0  # the model never writes a malformed row


def test_no_interleaving_loses_or_duplicates_a_job(redis_server):
    redis_server.client().flushall()
    run_state_machine_as_test(
        lambda: ConcurrentQueue(redis_server),
        settings=settings(
            max_examples=50,
            stateful_step_count=25,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
