"""The sweep loop's timing and failure policy, on a fake clock (no Redis, no sleeping).

The engine is replaced by fakes here; the real engine and a real Redis are in
``tests/redis/test_sweeper_process.py``.
"""

from __future__ import annotations

import errno
import json
import logging
import socket
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest
import redis

from stalledpolicy import engine
from stalledpolicy.sweeper import loop
from stalledpolicy.sweeper.config import SweeperConfig
from stalledpolicy.sweeper.metrics import OTHER_LANES, Health, StatusServer, SweeperMetrics
from tests.unit.test_listen import has_ipv6_loopback, ipv4_only


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeStop:
    """A stop Event whose waits advance the fake clock instead of sleeping."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True

    def wait(self, timeout: float) -> bool:
        self.clock.now += timeout
        return self._set


SNAPSHOT = SimpleNamespace(dead=4, pending=5, active=6)


@pytest.fixture
def clock():
    return FakeClock()


def make_sweeper(clock, *, interval="10s", jitter=0.0, holds=engine.NO_HOLDS, **settings):
    """A sweeper on the fake clock; holding nothing by default, so the passes
    are the interval's alone (the lease-timed passes have their own tests)."""
    config = SweeperConfig(queue="orders", interval=interval, **settings)
    metrics = SweeperMetrics("orders", tuple(config.lanes))
    return loop.Sweeper(config, metrics, stop=FakeStop(clock), connect_fn=lambda url: object(),
                        clock=clock, jitter=lambda: jitter, holds=holds)


def script_engine(monkeypatch, clock, steps):
    """Each pass takes the next step: seconds the drain lasts, an exception to raise,
    or a list of problems (an instant pass that reports them)."""
    starts: list[float] = []
    pending = list(steps)

    def drain(client, queue, budgets, batch_size, should_stop=lambda: False, on_call=None, holds=None):
        starts.append(clock.now)
        step = pending.pop(0)
        if not pending and sweeper_ref[0] is not None:
            sweeper_ref[0].stop.set()  # the last step ends run_forever
        if isinstance(step, BaseException):
            raise step
        problems = []
        if isinstance(step, list):
            problems, step = step, 0.0
        clock.now += step
        result = engine.SweepResult(recovered=1, calls=1, problems=problems)
        if on_call:
            on_call(result, step)
        return result

    sweeper_ref: list = [None]
    monkeypatch.setattr(loop.engine, "drain", drain)
    monkeypatch.setattr(loop.engine, "queue_snapshot", lambda client, queue, lanes=(): SNAPSHOT)
    return starts, sweeper_ref


def test_passes_start_on_the_interval_grid_without_drift(monkeypatch, clock):
    starts, ref = script_engine(monkeypatch, clock, [3.0, 3.0, 3.0, 3.0])
    ref[0] = sweeper = make_sweeper(clock, interval="10s")
    sweeper.run_forever()
    # The 3s a pass takes is not added to the interval: 0, 10, 20, 30.
    assert starts == [0.0, 10.0, 20.0, 30.0]
    assert sweeper.passes == 4


def test_a_pass_longer_than_the_interval_starts_the_next_at_once(monkeypatch, clock):
    starts, ref = script_engine(monkeypatch, clock, [25.0, 25.0, 1.0])
    ref[0] = sweeper = make_sweeper(clock, interval="10s")
    sweeper.run_forever()
    # No catch-up burst for the missed slots either.
    assert starts == [0.0, 25.0, 50.0]


def test_an_outage_backs_off_exponentially_and_logs_once(monkeypatch, clock, caplog):
    down = redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
    starts, ref = script_engine(monkeypatch, clock, [down, down, down, down, 0.0, 0.0])
    ref[0] = sweeper = make_sweeper(clock, interval="60s")
    with caplog.at_level(logging.DEBUG, logger="stalledpolicy.sweeper"):
        sweeper.run_forever()
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    # 0.5s, 1s, 2s, 4s between retries; the pass after recovery then waits the interval.
    assert gaps == [0.5, 1.0, 2.0, 4.0, 60.0]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    recoveries = [r for r in caplog.records if r.getMessage() == "redis reachable again"]
    assert len(warnings) == 1 and "unreachable" in warnings[0].getMessage()
    assert len(recoveries) == 1 and recoveries[0].attempts == 4
    assert sweeper.health.redis_up and sweeper.health.last_pass_ok


def test_an_outage_whose_cause_changes_logs_the_new_cause_once(monkeypatch, clock, caplog):
    """Refused, then timing out: the one line of the outage named the first cause only."""
    down = redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
    slow = redis.TimeoutError("Timeout connecting to server")
    _, ref = script_engine(monkeypatch, clock, [down, slow, down, slow, 0.0])
    ref[0] = sweeper = make_sweeper(clock, interval="60s")
    with caplog.at_level(logging.DEBUG, logger="stalledpolicy.sweeper"):
        sweeper.run_forever()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.error_type for w in warnings] == ["ConnectionError", "TimeoutError"]
    assert "another reason" in warnings[1].getMessage()
    assert [r.getMessage() for r in caplog.records].count("redis reachable again") == 1


def test_refused_credentials_are_a_bad_setting_not_an_outage(monkeypatch, clock, caplog):
    """A server that refuses the URL's password answered: redis_up stays 1 (an
    alert on it must not page the Redis owners for the sweeper's setting), one
    error names the credentials, /readyz says so; it was 'redis unreachable'."""
    auth = redis.AuthenticationError("invalid username-password pair or user is disabled.")
    _, ref = script_engine(monkeypatch, clock, [auth, auth, 0.0])
    ref[0] = sweeper = make_sweeper(clock, interval="60s")
    with caplog.at_level(logging.DEBUG, logger="stalledpolicy.sweeper"):
        assert sweeper.sweep_pass() is False
        assert sweeper.metrics.redis_up.labels("orders")._value.get() == 1
        ok, reason = sweeper.health.ready()
        assert not ok and "refused this user/password" in reason and "unreachable" not in reason
        assert sweeper.bad_setting is not None and sweeper.redis_down is False
        assert sweeper.sweep_pass() is False
        assert sweeper.sweep_pass() is True
    problems = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in problems] == [
        "Redis refused the credentials of the Redis URL; nothing was moved; "
        "retrying next interval (logged once until a pass succeeds)"]
    assert "put them in the URL" in problems[0].error


def test_a_read_only_replica_is_named_with_the_fix(monkeypatch, clock, caplog):
    """It logged and served 'redis unreachable: You can't write against a read
    only replica.': true of a failover's moment, but a URL that names a replica
    (a reader endpoint) stays so: the fix is the URL."""
    replica = redis.ReadOnlyError("You can't write against a read only replica. script: 9f3c, on @user_script:38.")
    _, ref = script_engine(monkeypatch, clock, [replica, 0.0])
    ref[0] = sweeper = make_sweeper(clock)
    with caplog.at_level(logging.WARNING, logger="stalledpolicy.sweeper"):
        assert sweeper.sweep_pass() is False
    [warning] = caplog.records
    for text in (warning.error, sweeper.health.ready()[1]):
        assert "read-only replica" in text and "point the URL at the primary" in text


def test_readiness_follows_redis(monkeypatch, clock):
    down = redis.TimeoutError("Timeout connecting to server")
    health_seen = []
    script_engine(monkeypatch, clock, [down, 0.0])
    sweeper = make_sweeper(clock)
    assert sweeper.health.ready()[0] is False  # nothing swept yet
    assert sweeper.sweep_pass() is False
    health_seen.append(sweeper.health.ready())
    assert sweeper.metrics.redis_up.labels("orders")._value.get() == 0
    assert sweeper.sweep_pass() is True
    health_seen.append(sweeper.health.ready())
    assert [ok for ok, _ in health_seen] == [False, True]
    assert "redis unreachable" in health_seen[0][1]
    assert sweeper.metrics.redis_up.labels("orders")._value.get() == 1
    assert sweeper.metrics.morgue_size.labels("orders")._value.get() == 4


@pytest.mark.parametrize("attempts, jitter, expected", [
    (1, 0.0, 0.5), (1, 1.0, 1.0), (2, 0.0, 1.0), (3, 0.5, 3.0), (5, 1.0, 16.0),
    (6, 0.0, 15.0), (6, 1.0, 30.0), (7, 0.0, 15.0), (40, 0.5, 22.5), (40, 1.0, 30.0),
])
def test_backoff_is_capped_with_jitter(clock, attempts, jitter, expected):
    sweeper = make_sweeper(clock, jitter=jitter)
    sweeper._failed_attempts = attempts
    assert sweeper.backoff_delay() == pytest.approx(expected)


def test_retries_at_the_cap_keep_their_jitter(clock):
    """Replicas in a long outage do not retry in step: the cap bounds the
    delay, the jitter still spreads it."""
    draws = iter([0.0, 0.25, 0.5, 0.75, 1.0])
    sweeper = make_sweeper(clock)
    sweeper._jitter = lambda: next(draws)
    sweeper._failed_attempts = 30
    delays = [sweeper.backoff_delay() for _ in range(5)]
    assert len(set(delays)) == 5 and max(delays) == 30.0 and min(delays) == 15.0


def test_a_script_error_is_logged_once_per_message_until_a_pass_succeeds(monkeypatch, clock, caplog):
    boom = redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")
    other = redis.ResponseError("ERR something else")
    steps = [boom, boom, boom, other, other, 0.0, boom]
    starts, ref = script_engine(monkeypatch, clock, steps)
    ref[0] = sweeper = make_sweeper(clock, interval="5s")
    with caplog.at_level(logging.INFO, logger="stalledpolicy.sweeper"):
        sweeper.run_forever()
    errors = [r.error for r in caplog.records if r.levelno == logging.ERROR]
    # Once for each message, and again after a success reopened the window.
    assert errors == [str(boom), str(other), str(boom)]
    # A script error is no outage: retried on the interval, not the backoff.
    assert [b - a for a, b in zip(starts, starts[1:])] == [5.0] * 6
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_a_key_problem_is_warned_when_it_appears_and_counted_while_it_lasts(monkeypatch, clock, caplog):
    ring, totals = "emq:{orders}:ring is a string, ...", "emq:{orders}:sweeper:totals is a string, ..."
    _, ref = script_engine(monkeypatch, clock, [[ring], [ring], [], [ring, totals], [totals]])
    ref[0] = sweeper = make_sweeper(clock)
    gauge = []
    monkeypatch.setattr(sweeper, "_log_pass", lambda *a: gauge.append(
        sweeper.metrics.key_problems.labels("orders")._value.get()))
    with caplog.at_level(logging.INFO, logger="stalledpolicy.sweeper"):
        sweeper.run_forever()
    warned = [r.problem for r in caplog.records if r.levelno == logging.WARNING]
    # a problem that went away and came back is warned again; one that lasts, once
    assert warned == [ring, ring, totals]
    assert gauge == [1, 1, 0, 2, 1]
    assert sweeper.passes == 5 and sweeper.health.ready()[0]


def test_a_snapshot_the_server_refuses_is_a_key_problem_not_a_failed_pass(monkeypatch, clock, caplog):
    """The jobs moved; only the read for the gauges was refused (a key of the
    wrong type, or an ACL): the pass counts, the problem is warned and counted."""
    script_engine(monkeypatch, clock, [0.0, 0.0])
    refused = redis.ResponseError("Command # 4 (HGETALL emq:{orders}:sweeper:totals) of pipeline caused error: "
                                  "WRONGTYPE Operation against a key holding the wrong kind of value")

    def snapshot(client, queue, lanes=()):
        raise refused

    monkeypatch.setattr(loop.engine, "queue_snapshot", snapshot)
    sweeper = make_sweeper(clock)
    with caplog.at_level(logging.INFO, logger="stalledpolicy.sweeper"):
        assert sweeper.sweep_pass() and sweeper.sweep_pass()
    assert sweeper.health.ready() == (True, "ok") and sweeper.last_result.recovered == 1
    assert sweeper.metrics.key_problems.labels("orders")._value.get() == 1
    [warning] = [r for r in caplog.records if r.levelno >= logging.WARNING]  # once while it lasts
    assert "emq:{orders}:sweeper:totals" in warning.problem and "gauges" in warning.problem


def test_a_bug_in_a_pass_does_not_end_the_loop(monkeypatch, clock, caplog):
    starts, ref = script_engine(monkeypatch, clock, [KeyError("surprise"), 0.0])
    ref[0] = sweeper = make_sweeper(clock)
    with caplog.at_level(logging.ERROR, logger="stalledpolicy.sweeper"):
        sweeper.run_forever()
    assert sweeper.passes == 1
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert error.exc_info is not None  # an unexpected error keeps its traceback


def test_stop_during_a_pass_skips_the_wait_and_the_snapshot(monkeypatch, clock):
    snapshots = []
    ref: list = [None]

    def drain(client, queue, budgets, batch_size, should_stop=lambda: False, on_call=None, holds=None):
        ref[0].stop.set()  # the signal lands while the drain runs
        assert should_stop() is True
        return engine.SweepResult()

    monkeypatch.setattr(loop.engine, "drain", drain)
    monkeypatch.setattr(loop.engine, "queue_snapshot", lambda *a, **k: snapshots.append(1) or SNAPSHOT)
    ref[0] = sweeper = make_sweeper(clock, interval="1h")
    sweeper.run_forever()
    assert snapshots == []
    assert clock.now == 0.0  # not one second of the hour was waited


def test_the_client_is_made_once_and_again_only_after_a_failed_connect(monkeypatch, clock):
    made = []

    def connect(url):
        made.append(url)
        if len(made) == 1:
            raise redis.ConnectionError("refused")
        return object()

    script_engine(monkeypatch, clock, [0.0, 0.0, 0.0])
    sweeper = make_sweeper(clock)
    sweeper._connect = connect
    assert sweeper.sweep_pass() is False
    assert sweeper.sweep_pass() is True
    assert sweeper.sweep_pass() is True
    assert len(made) == 2


def test_errors_are_scrubbed_of_the_password(monkeypatch, clock, caplog):
    secret = "pa%24%24word"
    leak = redis.ConnectionError("could not auth with pa$$word or pa%24%24word")
    script_engine(monkeypatch, clock, [leak])
    sweeper = make_sweeper(clock, redis_url=f"redis://:{secret}@db.example:6379/0")
    with caplog.at_level(logging.DEBUG, logger="stalledpolicy.sweeper"):
        sweeper.sweep_pass()
    text = " ".join(f"{r.getMessage()} {vars(r)}" for r in caplog.records) + sweeper.health.reason
    assert "pa$$word" not in text and secret not in text
    assert "redis://:***@db.example:6379/0" in text


def test_health_goes_stale_when_the_loop_stops_beating(clock):
    health = Health(stale_after_s=30.0, clock=clock)
    assert health.alive()[0] is True
    clock.now = 29.0
    assert health.alive()[0] is True
    clock.now = 31.0
    ok, reason = health.alive()
    assert ok is False and "heartbeat" in reason
    health.beat()
    assert health.alive()[0] is True


def test_health_limit_is_three_intervals_with_a_floor(clock):
    assert make_sweeper(clock, interval="1m").health.stale_after_s == 180.0
    assert make_sweeper(clock, interval="1s").health.stale_after_s == loop.HEALTH_FLOOR_S


def test_counters_split_flat_jobs_from_lanes():
    metrics = SweeperMetrics("orders", ("imports",))
    result = engine.SweepResult(recovered=5, dead_lettered=2, orphans=1, quarantined=3,
                                lanes={"imports": engine.LaneCounts(1, 1), "acme": engine.LaneCounts(2, 0)})
    metrics.count_call(result, 0.002)
    metrics.count_call(result, 0.003)

    def value(counter, *labels):
        return counter.labels(*labels)._value.get()

    assert value(metrics.recovered, "orders", "") == 4       # (5 - 1 - 2) per call
    assert value(metrics.recovered, "orders", "imports") == 2
    assert value(metrics.recovered, "orders", OTHER_LANES) == 4  # acme: not configured
    assert value(metrics.dead_lettered, "orders", "") == 2
    assert value(metrics.dead_lettered, "orders", "imports") == 2
    assert value(metrics.orphans, "orders") == 2
    assert value(metrics.quarantined, "orders") == 6
    text = metrics.exposition().decode()
    assert 'stalledpolicy_script_call_duration_seconds_count 2.0' in text
    assert 'stalledpolicy_recovered_total{lane="",queue="orders"} 4.0' in text


def test_an_engine_that_lists_flat_jobs_under_the_empty_lane_is_not_double_counted():
    metrics = SweeperMetrics("orders", ("a",))
    result = engine.SweepResult(recovered=3, lanes={"": engine.LaneCounts(2, 0), "a": engine.LaneCounts(1, 0)})
    metrics.count_call(result, 0.001)
    assert metrics.recovered.labels("orders", "")._value.get() == 2
    assert metrics.recovered.labels("orders", "a")._value.get() == 1


def test_lanes_not_configured_share_one_series_so_tenants_do_not_grow_the_metrics():
    """A series per EchoMQ group (often one per tenant) grew without bound."""
    metrics = SweeperMetrics("orders", ("imports",))
    for tenant in range(50):
        metrics.count_call(engine.SweepResult(recovered=1, dead_lettered=1, lanes={
            f"tenant-{tenant}": engine.LaneCounts(1, 1)}), 0.001)
    text = metrics.exposition().decode()
    assert "tenant-" not in text
    lanes = {line.split('lane="')[1].split('"')[0] for line in text.splitlines()
             if line.startswith("stalledpolicy_recovered_total{")}
    assert lanes == {"", "imports", OTHER_LANES}
    assert metrics.recovered.labels("orders", OTHER_LANES)._value.get() == 50
    assert metrics.dead_lettered.labels("orders", OTHER_LANES)._value.get() == 50


# ------------------------------------------------------- redis_up follows round trips only


def redis_up(sweeper) -> float:
    return sweeper.metrics.redis_up.labels("orders")._value.get()


def test_a_bug_before_any_round_trip_does_not_claim_redis_up(monkeypatch, clock, caplog):
    script_engine(monkeypatch, clock, [KeyError("surprise")])
    sweeper = make_sweeper(clock)
    assert sweeper.sweep_pass() is False
    assert redis_up(sweeper) == 0 and sweeper.health.redis_up is False


def test_a_bug_during_an_outage_neither_ends_nor_extends_it(monkeypatch, clock, caplog):
    down = redis.ConnectionError("Connection refused")
    script_engine(monkeypatch, clock, [down, KeyError("surprise"), 0.0])
    sweeper = make_sweeper(clock)
    with caplog.at_level(logging.INFO, logger="stalledpolicy.sweeper"):
        assert sweeper.sweep_pass() is False
        assert sweeper.sweep_pass() is False  # the bug: nothing learnt about Redis
        assert redis_up(sweeper) == 0 and sweeper.redis_down
        assert not [r for r in caplog.records if r.getMessage() == "redis reachable again"]
        assert sweeper.sweep_pass() is True
    assert redis_up(sweeper) == 1 and not sweeper.redis_down
    [recovery] = [r for r in caplog.records if r.getMessage() == "redis reachable again"]
    assert recovery.attempts == 1


def test_an_error_reply_is_a_round_trip(monkeypatch, clock):
    down = redis.ConnectionError("Connection refused")
    script_engine(monkeypatch, clock, [down, redis.ResponseError("ERR script error")])
    sweeper = make_sweeper(clock)
    sweeper.sweep_pass()
    assert sweeper.sweep_pass() is False
    assert redis_up(sweeper) == 1 and sweeper.health.redis_up and not sweeper.redis_down
    assert sweeper.health.ready()[0] is False  # the pass still failed


def test_a_bug_after_a_successful_call_counts_that_call_as_a_round_trip(monkeypatch, clock):
    def drain(client, queue, budgets, batch_size, should_stop=lambda: False, on_call=None, holds=None):
        on_call(engine.SweepResult(recovered=1, calls=1), 0.001)
        raise KeyError("surprise after the first call")

    monkeypatch.setattr(loop.engine, "drain", drain)
    sweeper = make_sweeper(clock)
    assert sweeper.sweep_pass() is False
    assert redis_up(sweeper) == 1


def test_a_pod_is_ready_from_its_first_call_not_from_the_end_of_its_first_drain(monkeypatch, clock):
    seen = []

    def drain(client, queue, budgets, batch_size, should_stop=lambda: False, on_call=None, holds=None):
        seen.append(sweeper.health.ready())
        on_call(engine.SweepResult(recovered=25, calls=1, more=True), 0.001)
        seen.append(sweeper.health.ready())  # a large backlog: the drain goes on
        on_call(engine.SweepResult(recovered=25, calls=1), 0.001)
        return engine.SweepResult(recovered=50, calls=2)

    script_engine(monkeypatch, clock, [])
    monkeypatch.setattr(loop.engine, "drain", drain)
    sweeper = make_sweeper(clock)
    assert sweeper.sweep_pass() is True
    assert seen == [(False, "no pass yet"), (True, "ok")]


def test_a_pass_that_fails_after_its_first_call_is_unready_again(monkeypatch, clock):
    def drain(client, queue, budgets, batch_size, should_stop=lambda: False, on_call=None, holds=None):
        on_call(engine.SweepResult(recovered=1, calls=1), 0.001)
        raise redis.ResponseError("EMQWRONGTYPE emq:{orders}:pending is a string, not a sorted set")

    monkeypatch.setattr(loop.engine, "drain", drain)
    sweeper = make_sweeper(clock)
    assert sweeper.sweep_pass() is False
    ok, reason = sweeper.health.ready()
    assert ok is False and "EMQWRONGTYPE" in reason


def test_after_the_first_drain_a_pass_failing_after_its_first_call_does_not_flip_readiness(monkeypatch, clock):
    """Every call made the pod ready and the failure unready again: within each pass,
    for a pass that fails the same way each time (a long reshard, a refused step)."""
    seen = []

    def drain(client, queue, budgets, batch_size, should_stop=lambda: False, on_call=None, holds=None):
        on_call(engine.SweepResult(recovered=1, calls=1, more=True), 0.001)
        seen.append(sweeper.health.ready()[0])
        raise redis.ResponseError("EMQNOPERM the user may not HSET emq:{orders}:gactive")

    monkeypatch.setattr(loop.engine, "drain", drain)
    sweeper = make_sweeper(clock)
    assert sweeper.sweep_pass() is False and sweeper.sweep_pass() is False
    assert seen == [True, False]  # ready in the first drain only
    assert sweeper.health.ready()[0] is False


# ------------------------------------------------------------------ --once wording


def test_once_log_lines_do_not_promise_a_retry(monkeypatch, clock, caplog):
    script_engine(monkeypatch, clock, [redis.ResponseError("ERR boom"), redis.ConnectionError("refused")])
    sweeper = make_sweeper(clock, once=True)
    with caplog.at_level(logging.INFO, logger="stalledpolicy.sweeper"):
        sweeper.sweep_pass()
        sweeper.sweep_pass()
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert messages == ["sweep pass failed; --once exits 1", "redis unreachable; the pass failed and --once exits 1"]
    assert not any("retrying" in m for m in messages)


def test_the_long_running_log_lines_still_say_they_retry(monkeypatch, clock, caplog):
    script_engine(monkeypatch, clock, [redis.ResponseError("ERR boom")])
    sweeper = make_sweeper(clock)
    with caplog.at_level(logging.INFO, logger="stalledpolicy.sweeper"):
        sweeper.sweep_pass()
    assert "retrying next interval" in caplog.records[-1].getMessage()


# ------------------------------------------------------------------ stopped early


@pytest.mark.parametrize(("more", "calls", "early"), [(True, 3, True), (False, 3, False), (False, 0, True)])
def test_stopped_early_means_work_was_left(monkeypatch, clock, more, calls, early):
    ref: list = [None]

    def drain(client, queue, budgets, batch_size, should_stop=lambda: False, on_call=None, holds=None):
        ref[0].stop.set()  # the signal lands during the drain
        return engine.SweepResult(recovered=calls, calls=calls, more=more)

    monkeypatch.setattr(loop.engine, "drain", drain)
    ref[0] = sweeper = make_sweeper(clock)
    assert sweeper.sweep_pass() is True
    assert sweeper.last_stopped_early is early
    assert json.loads(loop.result_summary("orders", sweeper.last_result, sweeper.last_stopped_early))[
        "stopped_early"] is early


# ------------------------------------------------------------------ the status server on IPv6


def get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.parametrize("address", ["::1", "[::1]", "::"])
def test_the_status_server_listens_on_ipv6(clock, address):
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this host")
    server = StatusServer(address, 0, SweeperMetrics("orders"), Health(60.0, clock=clock)).start()
    try:
        assert get(f"http://[::1]:{server.port}/healthz") == 200
        if address == "::" and socket.has_dualstack_ipv6():
            assert get(f"http://127.0.0.1:{server.port}/healthz") == 200  # and IPv4 too
    finally:
        server.stop()


def test_by_default_the_status_server_answers_on_ipv4_and_ipv6(clock):
    """The kubelet probes the pod's IP: IPv6 in an IPv6-only cluster, IPv4 elsewhere."""
    address = SweeperConfig(queue="orders").metrics_address
    server = StatusServer(address, 0, SweeperMetrics("orders"), Health(60.0, clock=clock)).start()
    try:
        assert get(f"http://127.0.0.1:{server.port}/healthz") == 200
        if has_ipv6_loopback():  # else it fell back to IPv4 (the test below)
            assert get(f"http://[::1]:{server.port}/healthz") == 200
    finally:
        server.stop()


@pytest.mark.parametrize("refusal", [errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL])
def test_every_address_falls_back_to_ipv4_on_a_host_without_ipv6(clock, monkeypatch, refusal):
    ipv4_only(monkeypatch, refusal)
    server = StatusServer("::", 0, SweeperMetrics("orders"), Health(60.0, clock=clock)).start()
    try:
        assert get(f"http://127.0.0.1:{server.port}/healthz") == 200
    finally:
        server.stop()
    # one IPv6 address is not "every address": its failure stays an error
    with pytest.raises(OSError):
        StatusServer("::1", 0, SweeperMetrics("orders"), Health(60.0, clock=clock))


def test_the_status_server_still_listens_on_ipv4(clock):
    server = StatusServer("127.0.0.1", 0, SweeperMetrics("orders"), Health(60.0, clock=clock)).start()
    try:
        assert get(f"http://127.0.0.1:{server.port}/readyz") == 503  # no pass yet
    finally:
        server.stop()


# ------------------------------------------------------------------ the --once summary's lanes


def test_the_once_summary_lists_flat_jobs_under_the_empty_lane():
    """As the metrics' lane label and the morgue's JSON do: the lanes add up to the totals."""
    result = engine.SweepResult(recovered=3, dead_lettered=2, quarantined=1,
                                lanes={"acme": engine.LaneCounts(1, 0), "imports": engine.LaneCounts(0, 1)})
    lanes = json.loads(loop.result_summary("orders", result))["lanes"]
    assert lanes == {"": {"recovered": 2, "dead_lettered": 1}, "acme": {"recovered": 1, "dead_lettered": 0},
                     "imports": {"recovered": 0, "dead_lettered": 1}}
    assert sum(c["recovered"] for c in lanes.values()) == 3 and sum(c["dead_lettered"] for c in lanes.values()) == 2


def test_the_once_summary_of_a_pass_that_moved_nothing_has_no_lanes():
    assert json.loads(loop.result_summary("orders", engine.SweepResult()))["lanes"] == {}


def test_a_connection_dropped_after_redis_answered_is_not_blamed_on_tls(monkeypatch, clock):
    """A proxy in front of a Redis that went down (or Redis dying mid-call)
    closes the connection as a TLS-only server does: once a script call came
    back on this URL, the outage is told in redis-py's words, not as a
    question about rediss:// (reviewer's reproduction). Before any answer,
    the question stands."""
    closed = redis.ConnectionError("Connection closed by server.")
    _, ref = script_engine(monkeypatch, clock, [closed])
    ref[0] = fresh = make_sweeper(clock, interval="60s")
    fresh.sweep_pass()
    assert "TLS" in fresh.health.reason

    _, ref = script_engine(monkeypatch, clock, [0.0, closed])
    ref[0] = sweeper = make_sweeper(clock, interval="60s")
    assert sweeper.sweep_pass()
    assert not sweeper.sweep_pass()
    assert sweeper.health.reason == "redis unreachable: Connection closed by server."


def test_a_pass_refused_half_way_says_what_its_earlier_calls_moved(monkeypatch, clock, caplog):
    """A primary demoted during a drain: the calls before the refusal moved jobs,
    and the line said "nothing was moved" (reviewer's reproduction)."""
    def drain(client, queue, budgets, batch_size, should_stop=lambda: False, on_call=None, holds=None):
        on_call(engine.SweepResult(recovered=40, dead_lettered=2, calls=1), 0.01)
        raise redis.ReadOnlyError("You can't write against a read only replica.")

    monkeypatch.setattr(loop.engine, "drain", drain)
    sweeper = make_sweeper(clock)
    with caplog.at_level(logging.ERROR, logger="stalledpolicy.sweeper"):
        assert not sweeper.sweep_pass()
    [record] = [r for r in caplog.records if "read-only replica" in r.getMessage()]
    assert "nothing was moved" not in record.getMessage()
    assert "the 1 script call(s) before it were applied (40 recovered, 2 dead-lettered)" in record.getMessage()


def test_readyz_stops_saying_unreachable_once_redis_answers_again(monkeypatch, clock):
    """After an outage, the pass that drains the backlog: Redis is up (redis_up
    1) and /readyz said "redis unreachable" until the drain ended (reviewer's
    reproduction). Not ready still, for a true reason."""
    seen = []
    down = redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    def drain(client, queue, budgets, batch_size, should_stop=lambda: False, on_call=None, holds=None):
        seen.append(None)
        if len(seen) == 2:
            raise down
        on_call(engine.SweepResult(recovered=1000, calls=1), 0.01)
        seen[-1] = sweeper.health.ready()  # mid-drain, after one call came back
        return engine.SweepResult(recovered=1000, calls=1)

    monkeypatch.setattr(loop.engine, "drain", drain)
    monkeypatch.setattr(loop.engine, "queue_snapshot", lambda client, queue, lanes=(): SNAPSHOT)
    sweeper = make_sweeper(clock)
    assert sweeper.sweep_pass()  # the pod's first drain: ready from its first call
    assert not sweeper.sweep_pass()
    assert sweeper.health.ready() == (False, sweeper.health.reason) and "unreachable" in sweeper.health.reason
    assert sweeper.sweep_pass()
    ready, reason = seen[2]
    assert not ready and "unreachable" not in reason and reason.startswith("Redis reachable again"), reason
    assert sweeper.health.ready() == (True, "ok")


@pytest.mark.parametrize("failure, line", [
    (redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."), "redis unreachable"),
    (redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), "sweep pass failed"),
])
def test_a_pass_failing_after_a_signal_says_the_sweeper_stops_not_that_it_retries(monkeypatch, clock, caplog,
                                                                                 failure, line):
    """SIGTERM during a hung call: the call fails, and its line said "retrying"
    just before "sweeper stopped" (reviewer's note)."""
    def drain(client, queue, budgets, batch_size, should_stop=lambda: False, on_call=None, holds=None):
        sweeper.stop.set()  # the signal handler, while the call hangs
        raise failure

    monkeypatch.setattr(loop.engine, "drain", drain)
    sweeper = make_sweeper(clock)
    with caplog.at_level(logging.WARNING, logger="stalledpolicy.sweeper"):
        sweeper.run_forever()
    [record] = [r for r in caplog.records if r.getMessage().startswith(line)]
    assert "stopping (a signal came during the pass)" in record.getMessage(), record.getMessage()
    assert "retrying" not in record.getMessage()


def lease_engine(monkeypatch, clock, replies, snapshots):
    """Each pass returns the next ``(seconds to the next lease event or None,
    held, uncounted)`` at once; the gauges' reads are recorded in ``snapshots``."""
    starts: list[float] = []
    pending = list(replies)
    ref: list = [None]

    def drain(client, queue, budgets, batch_size, should_stop=lambda: False, on_call=None, holds=None):
        starts.append(clock.now)
        to_next, held, uncounted = pending.pop(0)
        if not pending:
            ref[0].stop.set()
        now_ms = 1_000_000 + int(clock.now * 1000)
        result = engine.SweepResult(calls=1, held=held, uncounted=uncounted, server_now_ms=now_ms,
                                    next_at_ms=None if to_next is None else now_ms + int(to_next * 1000))
        if on_call:
            on_call(result, 0.0)
        return result

    monkeypatch.setattr(loop.engine, "drain", drain)
    monkeypatch.setattr(loop.engine, "queue_snapshot",
                        lambda client, queue, lanes=(): snapshots.append(clock.now) or SNAPSHOT)
    return starts, ref


def test_a_pass_runs_when_the_next_lease_is_due_not_on_the_interval(monkeypatch, clock):
    snapshots: list[float] = []
    # a lease to hold in 0.2 s, then counted 0.25 s later, then nothing in active
    starts, ref = lease_engine(monkeypatch, clock, [(0.2, 0, 0), (0.25, 1, 0), (None, 0, 0), (None, 0, 0)],
                               snapshots)
    ref[0] = sweeper = make_sweeper(clock, interval="10s", holds=engine.Holds())
    sweeper.run_forever()
    assert starts == pytest.approx([0.0, 0.201, 0.452, 0.952])
    # the gauges are read by the interval's passes alone
    assert snapshots == [0.0]


def test_an_idle_queue_is_watched_twice_a_second_and_read_once_an_interval(monkeypatch, clock):
    snapshots: list[float] = []
    starts, ref = lease_engine(monkeypatch, clock, [(None, 0, 0)] * 6, snapshots)
    ref[0] = sweeper = make_sweeper(clock, interval="2s", holds=engine.Holds())
    sweeper.run_forever()
    assert starts == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0, 2.5])
    assert snapshots == pytest.approx([0.0, 2.0])


def test_without_holds_the_sweeper_still_wakes_at_the_next_deadline(monkeypatch, clock):
    starts, ref = lease_engine(monkeypatch, clock, [(3.0, 0, 0), (None, 0, 0), (None, 0, 0)], [])
    ref[0] = sweeper = make_sweeper(clock, interval="10s", holds=engine.NO_HOLDS)
    sweeper.run_forever()
    assert starts == pytest.approx([0.0, 3.001, 10.0])


def test_lapses_a_reaper_took_first_are_warned_and_counted(monkeypatch, clock, caplog):
    starts, ref = lease_engine(monkeypatch, clock, [(None, 0, 2), (None, 0, 0)], [])
    ref[0] = sweeper = make_sweeper(clock, interval="1s", holds=engine.Holds())
    with caplog.at_level(logging.INFO, logger="stalledpolicy.sweeper"):
        sweeper.run_forever()
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.uncounted == 2 and "stalledpolicy_lapses_uncounted" in warning.getMessage()
    assert sweeper.metrics.lapses_uncounted.labels("orders")._value.get() == 2
