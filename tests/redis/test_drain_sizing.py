"""A drain with the sweeper's call sizer: every job moved once, no call over
batchSize, the first at the floor, each at most twice the one before, each
call's own server time in its reply."""

from __future__ import annotations

import pytest

from stalledpolicy import engine
from stalledpolicy.engine import Budgets, CallSizer

pytestmark = pytest.mark.redis

N = 3_000


def _stall(r, keys, n: int) -> None:
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        job = f"JOB{i:06d}"
        pipe.hset(keys.job(job), mapping={"state": "active", "attempts": "1", "payload": "p"})
        pipe.zadd(keys.active, {job: 1_000 + i})
    pipe.execute()


@pytest.mark.parametrize("cap", [40, 400])
def test_a_sized_drain_moves_every_job_once_within_the_cap(r, keys, cap):
    _stall(r, keys, N)
    sizer = CallSizer(cap, floor=25)
    moved: list[int] = []
    took: list[int] = []
    result = engine.drain(r, keys.queue, Budgets(default=5), sizer,
                          on_call=lambda call, seconds: (moved.append(call.moved), took.append(call.server_us)))
    assert result.recovered == N and sum(moved) == N
    assert moved[0] == 25 and max(moved) <= cap
    # the script measures its own server time, what the sizer learns from
    # (Valkey's TIME stands still within a script: 0, and the sizer takes the wall time)
    if r.info("server").get("server_name") == "valkey":
        assert set(took) == {0}
    else:
        assert all(0 < us < 10_000_000 for us in took)
    assert result.server_us == sum(took)
    assert all(later <= 2 * earlier for earlier, later in zip(moved, moved[1:]))
    assert r.zcard(keys.active) == 0 and r.zcard(keys.pending) == N
    assert {r.hget(keys.job(f"JOB{i:06d}"), "stalled") for i in range(N)} == {"1"}


def test_a_whole_number_is_still_a_fixed_batch(r, keys):
    _stall(r, keys, 100)
    moved: list[int] = []
    engine.drain(r, keys.queue, Budgets(default=5), 30, on_call=lambda call, seconds: moved.append(call.moved))
    assert moved == [30, 30, 30, 10]
