"""The loop's look for new leases between passes (engine.lease_due_sooner,
sweeper/loop.py): an idle queue costs one ZCOUNT a look and no script call,
yet a lease claimed while the loop waits for a far pass is held and its lapse
counted; where the ACL refuses ZCOUNT, passes look instead."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from stalledpolicy import engine
from stalledpolicy.engine import Budgets, Holds
from stalledpolicy.sweeper import loop
from stalledpolicy.sweeper.config import SweeperConfig
from stalledpolicy.sweeper.metrics import SweeperMetrics
from tests.redis.engine_rows import put_active, restricted_user, server_ms

pytestmark = pytest.mark.redis

HOLDS = Holds()  # the loop's defaults: lead 250 ms, hold 1 s


def _until(check, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return check()


def _sweep(r, keys):
    return engine.sweep_batch(r, keys.queue, Budgets(3, {}), 100, HOLDS)


def test_only_a_lease_due_before_the_planned_pass_is_news(r, keys):
    idle = _sweep(r, keys)
    assert idle.next_at_ms is None
    assert not engine.lease_due_sooner(r, keys.queue, idle, HOLDS)
    # a job left due (its pass answered) is not news: the look starts after that call's now
    put_active(r, keys, "STUCK", score=idle.server_now_ms)
    assert not engine.lease_due_sooner(r, keys.queue, idle, HOLDS)
    r.delete(keys.active)

    # nothing planned: any lease claimed since is news
    put_active(r, keys, "JOB1", score=server_ms(r) + 60_000)
    assert engine.lease_due_sooner(r, keys.queue, idle, HOLDS)

    planned = _sweep(r, keys)
    assert planned.next_at_ms == r.zscore(keys.active, "JOB1") - HOLDS.lead_ms
    assert not engine.lease_due_sooner(r, keys.queue, planned, HOLDS)
    put_active(r, keys, "LATER", score=server_ms(r) + 120_000)
    assert not engine.lease_due_sooner(r, keys.queue, planned, HOLDS)  # the planned pass comes first
    put_active(r, keys, "SHORTER", score=server_ms(r) + 2_000)
    assert engine.lease_due_sooner(r, keys.queue, planned, HOLDS)


def _loop(redis_server, queue: str, url: str | None = None) -> loop.Sweeper:
    config = SweeperConfig(queue=queue, redis_url=url or redis_server.url, interval=60.0, max_stalled=3)
    return loop.Sweeper(config, SweeperMetrics(queue, ()))


def _command_calls(r, command: str) -> int:
    return int(r.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def _running(sweeper: loop.Sweeper) -> threading.Thread:
    thread = threading.Thread(target=sweeper.run_forever, name="sweeper")
    thread.start()
    return thread


def test_an_idle_queue_costs_one_zcount_a_look_and_no_script_call(redis_server, r, keys):
    sweeper = _loop(redis_server, keys.queue)
    thread = _running(sweeper)
    try:
        assert _until(lambda: sweeper.passes == 1)
        evalsha, zcount = _command_calls(r, "evalsha"), _command_calls(r, "zcount")
        assert _until(lambda: sweeper.lease_watch_reads >= 5)
        looks = sweeper.lease_watch_reads
        assert sweeper.passes == 1  # the next pass is the interval's, a minute away
        assert _command_calls(r, "evalsha") == evalsha
        assert _command_calls(r, "zcount") - zcount >= 4 and looks >= 5
    finally:
        sweeper.stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()


def _claimed_while_waiting_is_counted(r, keys, sweeper: loop.Sweeper) -> None:
    thread = _running(sweeper)
    try:
        assert _until(lambda: sweeper.passes >= 1)
        deadline = server_ms(r) + 1_500
        put_active(r, keys, "JOB1", score=deadline, attempts=1)
        # held before its deadline (a score with a half), counted at it; the
        # interval's pass is a minute away
        assert _until(lambda: (r.zscore(keys.active, "JOB1") or 0) % 1 != 0 or r.hget(keys.job("JOB1"), "stalled"))
        assert _until(lambda: r.hget(keys.job("JOB1"), "stalled") == "1")
        assert r.zscore(keys.pending, "JOB1") is not None
    finally:
        sweeper.stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_a_lease_claimed_while_the_loop_waits_is_held_and_its_lapse_counted(redis_server, r, keys):
    sweeper = _loop(redis_server, keys.queue)
    _claimed_while_waiting_is_counted(r, keys, sweeper)
    assert sweeper.passes <= 4  # the first, the look's, the hold's deadline (and one more at most)
    assert sweeper.lease_watch_reads >= 1


def test_where_the_acl_refuses_zcount_passes_look_instead(redis_server, r, keys, caplog):
    with restricted_user(redis_server, r, "no-zcount", "-zcount"):
        url = redis_server.url.replace("redis://", "redis://no-zcount:unused@", 1)
        sweeper = _loop(redis_server, keys.queue, url)
        with caplog.at_level(logging.WARNING, logger="stalledpolicy.sweeper"):
            _claimed_while_waiting_is_counted(r, keys, sweeper)
    assert sweeper.lease_watch_reads == 1 and sweeper.passes >= 3
    refusals = [rec for rec in caplog.records if "ZCOUNT" in rec.getMessage()]
    assert len(refusals) == 1 and "docs/redis.md" in refusals[0].getMessage()
