"""Property: whatever the interleaving of EchoMQ workers, expiring leases,
EchoMQ's reaper, sweeps, morgue replays and purges, on a real server from
several connections at once, no job is ever lost, duplicated or misplaced, and
the lanes stay consistent. Lease extensions are EchoMQ's own
(``strict=False``: the id is re-added to ``active`` whenever the token
matches) as often as the strict kind, at any moment, by any worker still
holding a claim: the sweep's fence (``attempts`` bumped on every move) must
refuse a stalled worker's.

EchoMQ's reaper (every consumer's first call of its loop) races all of it: it
returns lapsed leases to pending uncounted, keeping the token, so the worker
whose lease it reaped may still complete or fail the job while it waits there.
Its heartbeat would put the job in two places (EchoMQ's extension after
EchoMQ's reap: their defect, shown in test_echomq_model), so a job once reaped
is heartbeaten the strict way only, and so is every job in a step where the
reaper runs. Run alone, the reap is checked field by field.

Each hypothesis step fires a handful of operations at the same instant from
separate connections (threads released by one barrier), then the whole queue
is audited atomically (``devenv.echomq.audit``): every id in exactly one place
or completed, rows matching places, ``gactive`` equal to the jobs in flight,
every serviceable lane on the ring and no unserviceable one.

The morgue is worked on from both sides. Ours: replays, and purges by ids
(some in the morgue, some live, some never minted), by lane, of everything, and
by age (``engine.morgue_purge(older_than_s=...)``, which dates undated entries
with ``dead_at`` / ``dead_attempts``). EchoMQ's: its retry at ``max_attempts``
(to ``dead`` with its own ``last_error`` and no ``dead_at``) and its reprocess
(``dead`` -> the flat ``pending``, grouped jobs included, ``attempts`` and our
``dead_at`` / ``dead_attempts`` kept). EchoMQ's reprocess is its known defect:
a grouped job in the flat ``pending`` is allowed for the ids it reprocessed,
and a lane where such a job was claimed flat (no slot taken, one freed on the
way out) may have ``gactive`` below its jobs in flight, never above, and (EchoMQ
ringing it with a count of -1) sit on the ring at a limit of 0, until the lane
has nothing in flight and is off the ring.

Also checked after every step: a purged job is gone for good (no row, in no
set, no longer followed by the model), the totals count every purge. The model
follows each dead job's latest death (its ``attempts`` at death, and a lower
bound of its server time); an age purge must never delete a job whose latest
death is younger than the age asked. A purge run alone is compared with the
whole queue before and after: exactly the selected entries are gone, an age
purge deletes what is old enough and keeps what is too young, and nothing else
changed but the dates it stamps on the undated entries.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections import Counter
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
from stalledpolicy.devenv.echomq import Claim, EchoMQ, StaleToken, audit, read_state, server_now_ms

pytestmark = pytest.mark.redis

WORKERS = 4
GROUPS = ["a", "b", "c"]
BUDGETS = engine.Budgets(default=2, lanes={"b": 0, "c": 1})
LONG_LEASE_MS = 600_000

groups = st.sampled_from([None, *GROUPS])
lane_names = st.sampled_from(GROUPS)
pick = st.integers(min_value=0, max_value=1_000)
#: ages an age purge asks for, in seconds: the deaths of one example are milliseconds
#: to a few seconds old, so some entries are old enough and some are not
AGES_S = [0, 0.001, 0.01, 0.03, 0.1, 3600]
purge_spec = st.one_of(  # hypothesis favours the first branches: the age purges first
    st.tuples(st.just("age"), st.sampled_from(AGES_S), st.none() | st.sampled_from(["", *GROUPS])),
    # an age at the edge of one dead job's: the time since its death's floor, give or take
    st.tuples(st.just("age_of"), pick, st.integers(-20, 20), st.none() | st.sampled_from(["", *GROUPS])),
    st.tuples(st.just("lane"), st.sampled_from(["", *GROUPS])),   # "" = flat jobs
    st.tuples(st.just("all")),
    # ids: picks among the dead seen at the last check, and extra ids not in the morgue
    st.tuples(st.just("ids"), st.lists(pick, min_size=1, max_size=4), st.integers(0, 2)),
)
NEVER_MINTED = "JOB-never-minted"
_COUNTER = re.compile(r"0|[1-9][0-9]{0,14}")


def time_of_death(row: dict, now_ms: int) -> int | None:
    """docs/scripts.md, "The time of death": ``dead_at`` while ``dead_attempts``
    is the row's ``attempts`` (absent read as ''), a counter, not later than now."""
    dead_at, mark = row.get("dead_at"), row.get("dead_attempts")
    if dead_at is None or mark is None or mark != row.get("attempts", ""):
        return None
    if not _COUNTER.fullmatch(dead_at) or int(dead_at) > now_ms:
        return None
    return int(dead_at)

# (strategy, weight): the transitions that race with a sweep are drawn most
OPERATIONS = [  # the first entries are drawn a little more often: the racy ones
    (st.tuples(st.just("claim"), st.sampled_from(["flat", "grouped", "any"]), st.integers(1, 3)), 4),
    (st.tuples(st.just("sweep"), st.integers(1, 4)), 3),
    (st.tuples(st.just("expire"), pick), 3),
    (st.tuples(st.just("reap"),), 2),                      # EchoMQ's, every consumer's
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
    (st.tuples(st.just("purge"), purge_spec), 2),
    (st.tuples(st.just("reprocess"), pick), 2),            # EchoMQ's, not ours
    (st.tuples(st.just("die"), pick), 1),                  # EchoMQ's retry at max_attempts
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
        self.group_of: dict[str, str | None] = {}  # every id enqueued -> its lane (None = flat)
        self.flat_claims: list[Claim] = []         # flat claims since the last check
        self.grouped_in_flat: set[str] = set()     # grouped ids EchoMQ reprocessed to flat pending
        self.undercounted: set[str] = set()        # lanes where such a job was claimed flat
        #: dead id -> (its attempts at its latest death, a server ms at or before that death)
        self.deaths: dict[str, tuple[str | None, int]] = {}
        self.floor = server_now_ms(self.clients[0])  # read before the last check's snapshot
        self.purged_ids: set[str] = set()
        self.purged_total = 0
        self.reaped_ids: set[str] = set()  # every id EchoMQ's reaper returned
        self.reaping = False               # the reaper runs in this step

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
            # a job purged meanwhile is followed no more (its row is gone: the
            # extension answers "gone", not EMQSTALE)
            if (drop or claim.id in self.purged_ids) and claim in self.held:
                self.held.remove(claim)

    def _enqueued(self, ids, group) -> None:
        with self.lock:
            for job_id in ids:
                self.group_of[job_id] = group

    def _hold(self, claim: Claim | None) -> None:
        if claim is None:
            return
        with self.lock:
            self.held.append(claim)
            if claim.group is None:
                # which lane it belongs to is looked up at the next check (its
                # enqueue may not have returned yet)
                self.flat_claims.append(claim)

    def _reaped(self, claim: Claim) -> bool:
        """EchoMQ's heartbeat after EchoMQ's reap double-places the job (see
        the module's docstring): such a claim, and any in a step where the
        reaper runs, is extended strictly."""
        with self.lock:
            return self.reaping or claim.id in self.reaped_ids

    def _dead_pick(self, index: int) -> str | None:
        with self.lock:
            dead = sorted(self.deaths)
        return dead[index % len(dead)] if dead else None

    def _purge_ids(self, picks: list[int], extra: int) -> list[str]:
        """Dead ids seen at the last check, and ``extra`` ids not in the morgue
        (a live job, one never minted)."""
        with self.lock:
            dead = sorted(self.deaths)
            live = sorted(set(self.group_of) - set(self.deaths) - self.purged_ids)
        ids = [dead[i % len(dead)] for i in picks] if dead else []
        others = [live[picks[0] % len(live)]] if live else []
        return ids + (others + [NEVER_MINTED])[:extra]

    def _purge(self, mq: EchoMQ, spec: tuple
               ) -> tuple[engine.PurgeResult, float | None, int, list[str] | None]:
        """One purge through the engine API the CLI uses; returns it, the age
        asked (seconds), a server ms read after it and the ids asked."""
        kind, older, asked = spec[0], None, None
        if kind == "ids":
            asked = self._purge_ids(spec[1], spec[2])
            result = engine.morgue_purge(mq.client, self.queue, ids=asked)
        elif kind == "lane":
            result = engine.morgue_purge(mq.client, self.queue, lane=spec[1])
        elif kind == "all":
            result = engine.morgue_purge(mq.client, self.queue)
        else:
            older = spec[1]
            if kind == "age_of":
                job_id = self._dead_pick(spec[1])
                with self.lock:
                    floor = self.deaths[job_id][1] if job_id in self.deaths else self.floor
                older = max(0, server_now_ms(mq.client) - floor + spec[2]) / 1000
            result = engine.morgue_purge(mq.client, self.queue, older_than_s=older, lane=spec[-1])
        after = server_now_ms(mq.client)
        mq.ledger.retire(result.ids)
        with self.lock:
            self.purged_ids.update(result.ids)
            self.purged_total += result.purged
            gone = set(result.ids)
            self.held = [c for c in self.held if c.id not in gone or c in self.busy]
            if older is not None:
                # the time-of-death invariant: a purged job's latest death (at or
                # after its floor) is at least `older` old when it was purged
                # (at or before `after`). A job that died in this very step is
                # not in `deaths` yet: it died after the last check's floor.
                for job_id in result.ids:
                    floor = self.deaths[job_id][1] if job_id in self.deaths else self.floor
                    assert after - floor >= int(older * 1000), (
                        f"{job_id}: purged by an age purge of {older} s, but it died at "
                        f"{floor} ms or later and was purged by {after} ms")
            for job_id in gone:  # no longer followed
                self.deaths.pop(job_id, None)
        return result, older, after, asked

    def _apply(self, mq: EchoMQ, op: tuple) -> None:
        kind = op[0]
        if kind == "enqueue":
            for _ in range(op[2]):
                self._enqueued([mq.enqueue("p", group=op[1])], op[1])
        elif kind == "claim":
            for _ in range(op[2]):
                self._hold(mq.claim(LONG_LEASE_MS, op[1]))
        elif kind == "reprocess":
            job_id = self._dead_pick(op[1])
            if job_id is not None and mq.reprocess(job_id) and self.group_of.get(job_id):
                with self.lock:
                    self.grouped_in_flat.add(job_id)
        elif kind == "die":
            claim = self._checkout(op[1], done=True)
            if claim is not None:
                try:  # attempts >= 1 = max_attempts: to dead
                    mq.fail(claim, error="exhausted", delay_ms=0, max_attempts=1)
                except StaleToken:
                    pass
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
                    mq.extend(claim, LONG_LEASE_MS, strict=op[2] or self._reaped(claim))
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
        elif kind == "reap":
            reaped = mq.reap()
            with self.lock:
                self.reaped_ids.update(reaped)
        elif kind == "sweep":
            result = engine.sweep_batch(mq.client, self.queue, BUDGETS, op[1])
            with self.lock:
                self.swept = self.swept.merge(result)
        elif kind == "replay":
            done = engine.morgue_replay(mq.client, self.queue, lane=op[1], limit=op[2])
            with self.lock:
                self.replayed += done.replayed
        elif kind == "purge":
            self._purge(mq, op[1])
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

    def _kill(self, count: int, how: str, group: str | None) -> None:
        """``count`` new jobs (the claims take whatever comes first), claimed
        and dead at once: by EchoMQ's retry at ``max_attempts`` (no
        ``dead_at``) or by a sweep whose budget is 1."""
        mq = self.workers[2]
        self._enqueued(mq.enqueue_many(count, group=group), group)
        claims = [c for c in (mq.claim(LONG_LEASE_MS, "any") for _ in range(count)) if c is not None]
        for claim in claims:
            self._hold(claim)
            if how == "echomq":
                with self.lock:
                    self.held.remove(claim)
                mq.fail(claim, error="exhausted", delay_ms=0, max_attempts=1)
            else:
                mq.expire(claim)
        if how == "sweep" and claims:
            self.swept = self.swept.merge(engine.drain(mq.client, self.queue, engine.Budgets(default=1), 10))

    @initialize(flat=st.integers(0, 4), per_lane=st.integers(0, 3), claimed=st.integers(0, 6),
                limit_a=st.none() | st.integers(0, 2), dead=st.integers(1, 5),
                how=st.sampled_from(["echomq", "sweep"]), dead_group=groups)
    def some_work_in_flight(self, flat, per_lane, claimed, limit_a, dead, how, dead_group):
        mq = self.workers[0]
        if limit_a is not None:
            mq.set_lane_limit("a", limit_a)
        self._enqueued(mq.enqueue_many(flat), None)
        for group in GROUPS:
            self._enqueued(mq.enqueue_many(per_lane, group=group), group)
        self._kill(dead, how, dead_group)
        for _ in range(claimed):
            self._hold(mq.claim(LONG_LEASE_MS, "any"))

    @rule(count=st.integers(1, 3), how=st.sampled_from(["echomq", "sweep"]), group=groups)
    def jobs_die(self, count, how, group):
        self._kill(count, how, group)

    @rule(seconds=st.sampled_from([0.005, 0.02, 0.05]))
    def time_passes(self, seconds):
        """The dead grow older (the age purges see old and young deaths)."""
        time.sleep(seconds)

    @rule(index=pick, mode=st.sampled_from(["flat", "grouped", "any"]))
    def a_worker_dies_holding_a_job(self, index, mode):
        mq = self.workers[2]
        claim = mq.claim(LONG_LEASE_MS, mode)
        if claim is not None:
            self._hold(claim)
            mq.expire(claim)

    @rule(ops=st.lists(operation, min_size=2, max_size=WORKERS))
    def at_once(self, ops):
        barrier = threading.Barrier(len(ops))
        self.reaping = any(op[0] == "reap" for op in ops)

        def run(slot: int, op: tuple) -> None:
            barrier.wait(timeout=10)
            self._apply(self.workers[slot], op)

        futures = [self.pool.submit(run, slot, op) for slot, op in enumerate(ops)]
        try:
            for future in futures:
                future.result(timeout=60)
        finally:
            self.reaping = False

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
            mq.extend(claim, LONG_LEASE_MS, strict=self._reaped(claim))
        except StaleToken:
            self.held.remove(claim)

    @rule(lapse=st.none() | pick)
    def the_reaper_alone(self, lapse):
        """EchoMQ's reap with nothing else running (after one held lease lapsed,
        unless ``lapse`` is None; the sweeps take most lapsed leases first):
        every lease lapsed before it (up to 100) is back in pending or its
        lane, ``state=pending``, its other fields as they were; nothing else
        changed but the lanes' slots, the ring and the wake list."""
        client, k = self.clients[0], self.workers[0].keys
        if lapse is not None and self.held:
            self.workers[3].expire(self.held[lapse % len(self.held)], past_ms=1_000)
        before = read_state(client, self.queue, atomic=True)
        floor = server_now_ms(client)
        rows = {job_id: client.hgetall(k.job(job_id)) for job_id in before.active}
        reaped = self.workers[3].reap()
        ceiling = server_now_ms(client)
        after = read_state(client, self.queue, atomic=True)
        self.reaped_ids.update(reaped)
        lapsed = {job_id for job_id, deadline in before.active.items() if deadline <= floor}
        assert len(reaped) == len(set(reaped)) <= 100
        assert lapsed <= set(reaped) or len(reaped) == 100, (lapsed, reaped)
        assert all(before.active[job_id] <= ceiling for job_id in reaped)
        where = after.places()
        for job_id in reaped:
            group = rows[job_id].get("group")
            assert where[job_id] == [f"lane:{group}" if group else "pending"], (job_id, where[job_id])
            assert client.hgetall(k.job(job_id)) == {**rows[job_id], "state": "pending"}
        untouched = {job_id: places for job_id, places in before.places().items() if job_id not in reaped}
        assert {job_id: where[job_id] for job_id in untouched} == untouched
        assert {j: r for j, r in after.rows.items() if j not in reaped} == {
            j: r for j, r in before.rows.items() if j not in reaped}
        assert (after.schedule, after.dead, after.glimit, after.paused) == (
            before.schedule, before.dead, before.glimit, before.paused)

    @rule(group=groups, count=st.integers(2, 6))
    def burst_of_work(self, group, count):
        self._enqueued(self.workers[0].enqueue_many(count, group=group), group)

    @rule(limit=st.integers(1, 10))
    def sweeper_pass(self, limit):
        result = engine.drain(self.workers[1].client, self.queue, BUDGETS, limit)
        self.swept = self.swept.merge(result)

    def _picture(self) -> dict:
        """The whole queue with every row in full (run while nothing else writes)."""
        client, k = self.clients[0], self.workers[0].keys
        state = read_state(client, self.queue, atomic=True)
        ids = sorted(state.rows)
        pipe = client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(k.job(job_id))
        pipe.hgetall(k.metrics_failed)
        pipe.hgetall(k.metrics_completed)
        pipe.hgetall(k.sweeper_totals)
        *rows, failed, completed, totals = pipe.execute()
        places = {job_id: sorted(where) for job_id, where in state.places().items()}
        return {
            "places": places, "rows": dict(zip(ids, rows)), "dead": set(state.dead),
            "shared": (state.ring, state.gactive, state.glimit, state.paused, state.wake_len,
                       failed, completed, {f: v for f, v in totals.items() if f != "purged"}),
            "purged_total": int(totals.get("purged", 0)),
        }

    @rule(spec=purge_spec)
    def a_purge_alone(self, spec):
        """A purge with nothing else running: exactly what it selects is gone,
        and nothing else changed but the dates an age purge stamps."""
        before = self._picture()
        started = server_now_ms(self.clients[0])
        result, older, after, asked = self._purge(self.workers[1], spec)
        now = self._picture()
        dead, rows = before["dead"], before["rows"]
        lane = None
        if spec[0] == "ids":
            assert sorted(result.missing) == sorted(i for i in asked if i not in dead), result
            selected = {i for i in asked if i in dead}
        else:
            lane = spec[1] if spec[0] == "lane" else (spec[-1] if spec[0].startswith("age") else None)
            selected = {i for i in dead if lane is None or rows[i].get("group", "") == lane}
        assert result.kept == {}, result.kept  # the model's dead rows all say state=dead
        purged = set(result.ids)
        assert len(purged) == len(result.ids) == result.purged
        undated = set()
        if older is None:
            assert purged == selected, (purged, selected)
        else:
            for job_id in sorted(selected):
                died = time_of_death(rows[job_id], started)
                if died is None:
                    undated.add(job_id)
                    assert job_id not in purged, f"{job_id}: purged without a time of death"
                elif started - died >= older * 1000:
                    assert job_id in purged, f"{job_id}: died {started - died} ms ago, kept by a purge of {older} s"
                elif after - died < older * 1000:
                    assert job_id not in purged, f"{job_id}: died {after - died} ms ago, purged by one of {older} s"
            assert purged <= selected
            assert (result.undated, result.undatable) == (len(undated), 0), result
        # purged: gone everywhere; everything else exactly as it was, but the
        # dates stamped on the undated entries the age purge kept
        for job_id in purged:
            assert job_id not in now["places"] and job_id not in now["rows"], job_id
        assert now["places"] == {i: p for i, p in before["places"].items() if i not in purged}
        assert set(now["rows"]) == set(rows) - purged
        for job_id, row in now["rows"].items():
            was = rows[job_id]
            if job_id in undated:
                stamped = {f: v for f, v in row.items() if f not in ("dead_at", "dead_attempts")}
                assert stamped == {f: v for f, v in was.items() if f not in ("dead_at", "dead_attempts")}
                assert started <= int(row["dead_at"]) <= after, (job_id, row)
                assert row["dead_attempts"] == row.get("attempts", ""), (job_id, row)
            else:
                assert row == was, (job_id, was, row)
        assert now["shared"] == before["shared"]
        assert now["purged_total"] == before["purged_total"] + len(purged)

    @rule(index=pick)
    def echomq_reprocesses_alone(self, index):
        """EchoMQ's reprocess, checked field by field."""
        job_id = self._dead_pick(index)
        if job_id is None:
            return
        k = self.workers[0].keys
        was = self.clients[0].hgetall(k.job(job_id))
        assert self.workers[2].reprocess(job_id)
        row = self.clients[0].hgetall(k.job(job_id))
        expected = {f: v for f, v in was.items() if f != "last_error"}
        expected["state"] = "pending"
        assert row == expected
        assert self.workers[0].where_is(job_id).places == ["pending"]
        if was.get("group"):
            self.grouped_in_flat.add(job_id)

    @rule(index=pick, how=st.sampled_from(["echomq", "sweep"]))
    def a_reprocessed_job_dies_again(self, index, how):
        """EchoMQ reprocesses a dead job (our ``dead_at`` kept), a worker claims
        it from the flat ``pending`` and it dies again: EchoMQ's death writes no
        ``dead_at``, so the one kept is an earlier death's (the time-of-death
        invariant: no age purge may take it for this one)."""
        job_id = self._dead_pick(index)
        mq = self.workers[2]
        if job_id is None or not mq.reprocess(job_id):
            return
        if self.group_of.get(job_id):
            self.grouped_in_flat.add(job_id)
        claim = mq.claim(LONG_LEASE_MS, "flat")
        self._hold(claim)
        if claim is None or claim.id != job_id:
            return
        if how == "echomq":
            self.held.remove(claim)
            assert mq.fail(claim, error="exhausted", delay_ms=0, max_attempts=1) == "dead"
        else:
            mq.expire(claim)
            self.swept = self.swept.merge(engine.drain(mq.client, self.queue, engine.Budgets(default=1), 10))

    # -- checked after every step ----------------------------------------------

    @invariant()
    def queue_is_sound(self):
        client = self.clients[0]
        floor = server_now_ms(client)  # before the snapshot: every later death is after it
        state = read_state(client, self.queue, atomic=True)
        for claim in self.flat_claims:
            if self.group_of.get(claim.id):
                self.undercounted.add(self.group_of[claim.id])
        self.flat_claims.clear()
        problems = audit(client, self.queue, ledger=self.workers[0].ledger, state=state,
                         grouped_in_flat=self.grouped_in_flat, undercounted_lanes=self.undercounted)
        assert problems == [], "\n".join(problems)
        # a purged job is gone for good, and the model follows it no more
        where = state.places()
        for job_id in self.purged_ids:
            assert job_id not in where and job_id not in state.rows, f"{job_id}: purged but back"
            assert job_id not in self.deaths and all(c.id != job_id for c in self.held)
        # the deaths: a dead id whose attempts changed since the last check (or
        # new in the morgue) died again since that check's floor
        for job_id in list(self.deaths):
            if job_id not in state.dead:
                del self.deaths[job_id]
        for job_id in state.dead:
            attempts = state.rows[job_id].attempts
            if job_id not in self.deaths or self.deaths[job_id][0] != attempts:
                self.deaths[job_id] = (attempts, self.floor)
        self.floor = floor
        # a lane counted short heals once nothing of it is in flight and
        # EchoMQ's ring entry at a limit of 0 (see audit) is gone
        in_flight = Counter(state.rows[j].group for j in state.active if j in state.rows)
        self.undercounted = {g for g in self.undercounted if in_flight[g] or g in state.gactive
                             or (g in state.ring and state.glimit.get(g) == "0")}

    @invariant()
    def totals_match_what_the_sweeps_reported(self):
        snap = engine.queue_snapshot(self.clients[0], self.queue)
        assert (snap.recovered_total, snap.dead_lettered_total, snap.orphans_total,
                snap.quarantined_total) == (self.swept.recovered, self.swept.dead_lettered,
                                            self.swept.orphans, self.swept.quarantined)
        assert self.swept.quarantined == 0  # the model never writes a malformed row
        purged = self.clients[0].hget(self.workers[0].keys.sweeper_totals, "purged")
        assert int(purged or 0) == self.purged_total


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
