"""Property: the sweep's holds never count a stall that did not happen, and
never count one twice, whatever the timing of the worker, the sweeps and
EchoMQ's reaper around a lease's deadline (on the server's clock).

Each example claims one job with a short lease and plays a timeline drawn by
hypothesis, in milliseconds from the lease's deadline D: sweeps (holding, as
the sweeper does), reaps (EchoMQ's, every consumer's) and at most one act of
the worker (extend, complete, retry) or none (it died). Then it waits out the
hold, reaps and sweeps once more, and checks:

- a worker whose act succeeded had no stall counted (an extension, complete or
  retry just before its deadline, or while the sweep held it, is no stall);
- at most one stall is counted, or one lapse said uncounted, never both;
- a worker that died holding the job after the sweep took hold of its lease
  has its lapse accounted: counted, or uncounted when no sweep came between D
  and D + hold (the reaper then returned it);
- every job is in exactly one place (the model's audit).
"""

from __future__ import annotations

import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stalledpolicy import engine
from stalledpolicy.devenv.echomq import EchoMQ, StaleToken, server_now_ms

pytestmark = pytest.mark.redis

HOLDS = engine.Holds(lead_ms=120, hold_ms=200)
BUDGETS = engine.Budgets(default=2)
LEASE_MS = 250
# offsets from the deadline: before the lead, in it, around D, in the hold, after it
offsets = st.integers(min_value=-HOLDS.lead_ms - 60, max_value=HOLDS.hold_ms + 60)
timeline = st.tuples(
    st.lists(offsets, max_size=5),                                     # sweeps
    st.lists(offsets, max_size=4),                                     # reaps
    st.none() | st.tuples(st.sampled_from(["extend", "complete", "retry"]), offsets),
)


def _wait_for(client, at_ms: int) -> None:
    while (left := at_ms - server_now_ms(client)) > 0:
        time.sleep(min(left, 20) / 1000)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=timeline)
def test_holds_never_count_a_stall_that_did_not_happen(r, plan):
    sweeps, reaps, act = plan
    mq = EchoMQ(r, f"hold-{uuid.uuid4().hex[:10]}")
    job = mq.enqueue("x")
    claim = mq.claim(lease_ms=LEASE_MS)
    deadline = int(r.zscore(mq.keys.active, job))
    events = sorted([(at, "sweep") for at in sweeps] + [(at, "reap") for at in reaps]
                    + ([(act[1], act[0])] if act else []), key=lambda e: e[0])
    took_hold = False
    worker_ok = None
    reaped_before_act = False
    for at, what in events:
        _wait_for(r, deadline + at)
        if what == "sweep":
            took_hold |= engine.drain(r, mq.queue, BUDGETS, 10, holds=HOLDS).held > 0
        elif what == "reap":
            reaped_before_act |= job in mq.reap()
        else:
            try:
                if what == "extend":
                    # EchoMQ's own extension re-adds a reaped job (its defect,
                    # test_echomq_model): strict once the reaper returned it
                    worker_ok = mq.extend(claim, lease_ms=60_000, strict=reaped_before_act)
                elif what == "complete":
                    worker_ok = mq.complete(claim)
                else:
                    worker_ok = mq.fail(claim, delay_ms=60_000) in ("schedule", "dead")
            except StaleToken:
                worker_ok = False
    _wait_for(r, deadline + HOLDS.hold_ms + 5)
    mq.reap()
    engine.drain(r, mq.queue, BUDGETS, 10, holds=HOLDS)

    row = r.hgetall(mq.keys.job(job))
    stalled = int(row.get("stalled", 0))
    uncounted = int(r.hget(mq.keys.sweeper_totals, "uncounted") or 0)
    assert stalled + uncounted <= 1, (row, uncounted)
    if worker_ok:
        assert stalled == 0, f"a stall counted for a worker that {act[0]}d at D{act[1]:+d}: {row}"
    if act is None and took_hold:
        assert stalled + uncounted == 1, (row, uncounted)
    assert r.zcard(mq.keys.sweeper_holds) == 0 and r.hlen(mq.keys.sweeper_hold_tokens) == 0
    assert mq.audit() == []
