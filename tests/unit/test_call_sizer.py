"""The sweep's call sizing: each call aimed at about 1 ms, within batchSize."""

from __future__ import annotations

import pytest

from stalledpolicy.engine import CallSizer


def settled_at_250(floor: int) -> CallSizer:
    """A sizer after five full calls at 4 us a job: 250 jobs fill its 1 ms."""
    sizer = CallSizer(1000, target_s=0.001, floor=floor)
    for _ in range(5):
        sizer.observe(sizer.size, sizer.size * 4e-6)
    assert sizer.size == 250
    return sizer


def test_full_fast_calls_grow_at_most_twofold_up_to_the_cost_of_the_target():
    sizer = CallSizer(1000, target_s=0.001, floor=25)
    assert sizer.size == 25
    sizes = []
    for _ in range(10):
        # 4 us a job, no overhead: 250 jobs fill 1 ms
        sizer.observe(sizer.size, sizer.size * 4e-6)
        sizes.append(sizer.size)
    assert sizes[:4] == [50, 100, 200, 250]
    assert set(sizes[4:]) == {250}


def test_the_cap_is_never_exceeded():
    sizer = CallSizer(60, target_s=0.001, floor=25)
    for _ in range(5):
        sizer.observe(sizer.size, 1e-6)
    assert sizer.size == 60


def test_slow_calls_shrink_but_never_below_the_floor():
    sizer = settled_at_250(floor=25)
    # the machine got loaded: 4 ms for the same call, twice in a row
    sizer.observe(250, 0.004)
    sizer.observe(250, 0.004)
    assert sizer.size == 62
    for _ in range(3):
        sizer.observe(sizer.size, 0.5)
    assert sizer.size == 25


def test_one_stretched_call_does_not_shrink_the_next():
    # a call the scheduler stretched (the host, not its size) says nothing of the
    # next one: the median of the last calls' cost of a job sizes it
    sizer = settled_at_250(floor=25)
    sizer.observe(250, 0.010)
    assert sizer.size == 250
    sizer.observe(250, 250 * 4e-6)
    sizer.observe(250, 250 * 4e-6)
    sizer.observe(250, 0.010)  # one in three, again
    assert sizer.size == 250


def test_a_lasting_change_in_cost_is_followed_both_ways():
    sizer = settled_at_250(floor=10)
    for _ in range(3):
        sizer.observe(sizer.size, sizer.size * 8e-6)  # jobs now cost twice as much
    assert sizer.size == 125
    for _ in range(3):
        sizer.observe(sizer.size, sizer.size * 2e-6)  # and then half
    assert sizer.size == 500


def test_short_slow_calls_still_shrink_the_next():
    sizer = CallSizer(1000, target_s=0.001, floor=10)
    for _ in range(4):
        sizer.observe(sizer.size, sizer.size * 1e-6)
    assert sizer.size == 160
    sizer.observe(100, 0.01)  # fewer jobs than the limit, yet 10 ms
    sizer.observe(100, 0.01)
    assert sizer.size == 10


def test_a_cap_below_the_floor_is_the_floor():
    sizer = CallSizer(5)
    assert sizer.size == 5
    sizer.observe(5, 1e-6)
    assert sizer.size == 5


@pytest.mark.parametrize("cap", [0, -1, True, 2.5, "10"])
def test_a_bad_cap_is_refused_naming_the_batch_size(cap):
    with pytest.raises(ValueError, match="batch size: must be a whole number >= 1"):
        CallSizer(cap)
