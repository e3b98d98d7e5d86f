"""The sweep loop: drain the expired prefix of ``active``, scheduled by the
leases themselves.

Each pass calls :func:`stalledpolicy.engine.drain` (bounded script calls, one
at a time, so Redis is never blocked for long); once an interval it also reads
one :func:`~stalledpolicy.engine.queue_snapshot` for the gauges. The drain's
last call says (server clock) when the next lease is due to be held or
counted (scripts/lib/holds.lua), and the next pass runs then: EchoMQ's
consumers reap a lapsed lease within milliseconds, so a fixed cadence would
count almost nothing (docs/echomq.md, "Holding a lapsing lease"). While it
waits, the loop looks every ``LEASE_WATCH_S`` for a lease claimed meanwhile
that is due sooner (one ZCOUNT: ``engine.lease_due_sooner``) and sweeps at
once when there is one; it waits at most until the next interval's pass.

A pass that fails, or does only part of its work, is handled as failures.py
says (``PassFailures``): an outage backs off, anything else is retried on the
interval, and each cause is logged once while it lasts.

Stopping: a signal sets :attr:`Sweeper.stop`; the engine checks it between
script calls (so the current call finishes) and every wait is on that Event.
The client makes no new attempt once it is set (client.py: a single server's
client makes one attempt per call, ``StoppableRedisCluster`` stops its retries).
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from stalledpolicy import engine
from stalledpolicy.sweeper.client import connect
from stalledpolicy.sweeper.config import SweeperConfig
from stalledpolicy.sweeper.failures import UNREACHABLE, PassFailures
from stalledpolicy.sweeper.metrics import Health, SweeperMetrics, per_lane
from stalledpolicy.tables import printable

log = logging.getLogger("stalledpolicy.sweeper")

# The loop beats at least once a second while waiting and after every script
# call, so only a blocking Redis round trip delays a beat: on a single server
# one call (two attempts, each bounded by client's timeouts); on a Redis
# Cluster one node's round trip (the client beats before each, see
# StoppableRedisCluster), however many attempts and slot-table refreshes the
# call makes. The floor keeps a short interval from flagging a slow outage as
# a wedged loop.
HEALTH_FLOOR_S = 20.0
_WAIT_SLICE_S = 1.0
#: how often the loop looks for a lease claimed since the last pass that is
#: due before the pass it planned: a lease is seen before its last
#: ``Holds.lead_ms`` when it is at least this plus the lead long. One ZCOUNT
#: (O(log n)) a look; where the ACL refuses it, one script call instead.
LEASE_WATCH_S = 0.5
#: a pass timed for a lease's deadline runs this much after it, so that the
#: server's millisecond clock has reached it
_DEADLINE_MARGIN_S = 0.001


class Sweeper(PassFailures):
    def __init__(
        self,
        config: SweeperConfig,
        metrics: SweeperMetrics,
        *,
        stop: threading.Event | None = None,
        connect_fn: Callable[[str], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
        holds: engine.Holds = engine.Holds(),
    ):
        self.config = config
        self.metrics = metrics
        self.holds = holds
        #: each call sized by the time the ones before took, within batchSize
        self.sizer = engine.CallSizer(config.batch_size)
        self.stop = stop or threading.Event()
        self.health = Health(stale_after_s=max(3 * config.interval, HEALTH_FLOOR_S), clock=clock)
        # the default client retries nothing once a stop is requested, and on a
        # cluster beats before each round trip of a call's attempts (/healthz stays
        # fresh while Redis is down; /readyz says so once the call gives up)
        self._connect = connect_fn or (lambda url: connect(url, should_stop=self.stop.is_set,
                                                           on_attempt=self.health.beat))
        self._clock = clock
        self._jitter = jitter
        self._client: Any = None
        self._budgets = engine.Budgets(default=config.max_stalled, lanes=dict(config.lanes))
        self._init_failure_state()
        self._calls_this_pass = 0
        self._first_drain = True  # no pass that made a call has ended yet
        #: what is wrong with the Redis URL when the last pass failed for it (a
        #: database the server does not have), in our words; else None
        self.bad_setting: str | None = None
        #: why the last pass failed (what /readyz says), None after a pass that did not
        self.last_error: str | None = None
        #: what the script calls of the current (or last) pass answered so far:
        #: the counts of a pass that failed part-way
        self.so_far: Any = engine.SweepResult()
        self.last_result: Any = None
        #: the last successful pass stopped at a stop request before draining
        #: everything expired (or before its first call)
        self.last_stopped_early = False
        self.passes = 0
        #: the looks between passes for a lease due sooner (LEASE_WATCH_S); off
        #: once the ACL refused one (then a pass every LEASE_WATCH_S instead)
        self.lease_watch_reads = 0
        self._lease_watch_refused = False

    # -- one pass -------------------------------------------------------------

    def sweep_pass(self, snapshot: bool = True) -> bool:
        """Drain once, then read the gauges' snapshot when ``snapshot``; False
        when the pass failed (the reason is logged)."""
        read_snapshot = snapshot
        started = self._clock()
        self.health.beat()
        self._first_drain = self._first_drain and not self._calls_this_pass
        self._calls_this_pass = 0
        self.bad_setting = None
        self.last_error = None
        self.so_far = engine.SweepResult()
        try:
            client = self._client_or_connect()
            result = engine.drain(
                client, self.config.queue, self._budgets, self.sizer,
                should_stop=self.stop.is_set, on_call=self._on_call, holds=self.holds,
            )
            gauges = None
            snapshot_problems: list[str] = []
            if read_snapshot and not self.stop.is_set():
                try:
                    gauges = engine.queue_snapshot(client, self.config.queue, tuple(self.config.lanes))
                except redis.ResponseError as exc:
                    if isinstance(exc, UNREACHABLE):
                        raise
                    # The jobs moved; only the read for the gauges was refused (a key of
                    # the wrong type, say the totals hash the sweep itself takes as a
                    # problem, or the ACL): a problem of the pass, not a failed pass.
                    snapshot_problems.append(f"the queue's sizes were not read for the gauges (they keep "
                                             f"their last values): {self._scrub(exc)}")
                self._redis_answered()
        except Exception as exc:  # noqa: BLE001 (a script error or a bug must not end the process)
            self._handle_pass_failure(exc)
            return False
        seconds = self._clock() - started
        # drain stops only between calls: stopped early = work was left (more),
        # or the stop came before the first call
        self.last_stopped_early = self.stop.is_set() and (result.more or result.calls == 0)
        self._redis_answered()
        self.metrics.pass_duration.observe(seconds)
        self.metrics.last_pass.set(time.time())
        if gauges is not None:
            self.metrics.observe_snapshot(gauges)
        self._pass_succeeded()
        self.last_result = result
        self.passes += 1
        self._report_problems([*result.problems, *snapshot_problems])
        self._log_pass(result, seconds, gauges)
        return True

    def _client_or_connect(self) -> Any:
        if self._client is None:
            self._client = self._connect(self.config.redis_url.get_secret_value())
        return self._client

    def _on_call(self, result: Any, seconds: float) -> None:
        self._calls_this_pass += 1
        self._url_answered = True
        self.so_far.add(result)
        self.metrics.count_call(result, seconds)
        self.health.beat()
        self._redis_answered()  # a script call came back: a round trip
        if self._first_drain:
            # A call that came back moved its jobs: the pod sweeps, so it is ready
            # now, not at the end of its first drain (a new pod with a large backlog
            # would hold its rollout for as long as that drain lasts). A failure
            # later in the pass makes it unready again. Only in the first drain:
            # after it, readiness is the last pass's (a pass that fails after its
            # first call every time would flip it within each pass).
            self.health.last_pass_ok = True
            self.health.reason = "ok"

    def _log_pass(self, result: Any, seconds: float, snapshot: Any) -> None:
        fields = {
            "queue": self.config.queue,
            "recovered": result.recovered,
            "dead_lettered": result.dead_lettered,
            "orphans": result.orphans,
            "quarantined": result.quarantined,
            "calls": result.calls,
            "duration_ms": round(seconds * 1000, 1),
        }
        if result.lanes:
            # each lane as the morgue's tables show one (tables.printable, exact): a byte
            # that is not UTF-8 as \xNN, so lanes that differ only there stay apart
            fields["lanes"] = ",".join(
                f"{printable(name, exact=True) if name else '-'}:{c.recovered}/{c.dead_lettered}"
                for name, c in sorted(result.lanes.items())
            )
        if snapshot is not None:
            fields["morgue"] = snapshot.dead
        if result.held:
            fields["held"] = result.held
        if result.uncounted:
            fields["uncounted"] = result.uncounted
        if self.last_stopped_early:
            fields["stopped_early"] = True
        if result.uncounted:
            log.warning("a held lease lapsed and another reaper returned the job before this sweeper counted "
                        "the stall: the budget did not hold for it (the sweeper was late; see "
                        "stalledpolicy_lapses_uncounted)", extra={"queue": self.config.queue,
                                                                  "uncounted": result.uncounted})
        did_work = result.recovered or result.dead_lettered or result.orphans or result.quarantined
        log.log(logging.INFO if did_work else logging.DEBUG,
                "sweep pass" if did_work else "sweep pass: nothing expired", extra=fields)

    # -- the loop ---------------------------------------------------------------

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, beating; True when a stop was requested."""
        deadline = self._clock() + seconds
        while not self.stop.is_set():
            self.health.beat()
            remaining = deadline - self._clock()
            if remaining <= 0:
                return False
            self.stop.wait(min(remaining, _WAIT_SLICE_S))
        return True

    def run_forever(self) -> None:
        """Sweep until :attr:`stop` is set: a full pass (with the gauges) every
        interval, and passes between them when a lease is due to be held or
        counted (at most ``LEASE_WATCH_S`` apart while holding leases)."""
        next_full = self._clock()
        while not self.stop.is_set():
            full = self._clock() >= next_full
            succeeded = self.sweep_pass(snapshot=full)
            if self.stop.is_set():
                break
            if self.redis_down:
                self.wait(self.backoff_delay())
                next_full = self._clock()  # the pass after an outage runs at once, in full
                continue
            now = self._clock()
            if full:
                # Scheduled from the planned start, not from the end of the pass, so
                # the cadence does not drift; an overrun starts the next pass now
                # (and never in a burst of catch-up passes).
                next_full = max(next_full + self.config.interval, now)
            sleep = self._sleep_before_next_pass(next_full - now, succeeded)
            if succeeded and self._watching_leases():
                self.wait_watching_leases(sleep)
            else:
                self.wait(sleep)
        self.close()

    def _sleep_before_next_pass(self, to_full: float, succeeded: bool) -> float:
        """Until the next full pass, or sooner when the last call named the next
        lease to hold or count (at most ``LEASE_WATCH_S`` while holding leases
        and the ACL refuses the loop's look between passes). A failed pass waits
        for the next full one (failures.py retries on the interval)."""
        sleep = max(0.0, to_full)
        if not succeeded:
            return sleep
        if self.holds.lead_ms > 0 and self._lease_watch_refused:
            sleep = min(sleep, LEASE_WATCH_S)
        to_lease = self.last_result.seconds_to_next()
        if to_lease is not None:
            sleep = min(sleep, to_lease + _DEADLINE_MARGIN_S)
        return sleep

    def _watching_leases(self) -> bool:
        return self.holds.lead_ms > 0 and not self._lease_watch_refused and self.last_result is not None

    def wait_watching_leases(self, seconds: float) -> bool:
        """``wait(seconds)``, looking every ``LEASE_WATCH_S`` for a lease claimed
        since the last pass that is due before the pass planned; returns early
        (False) when there is one, or when the look fails (the pass that follows
        meets the failure and handles it); True when a stop was requested."""
        deadline = self._clock() + seconds
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0:
                return False
            if self.wait(min(remaining, LEASE_WATCH_S)):
                return True
            if deadline - self._clock() <= 0:
                return False
            try:
                self.lease_watch_reads += 1
                if engine.lease_due_sooner(self._client_or_connect(), self.config.queue, self.last_result,
                                           self.holds):
                    return False
            except Exception as exc:  # noqa: BLE001 (the next pass meets and reports any failure)
                if engine.is_acl_refusal(exc):
                    self._lease_watch_refused = True
                    log.warning("the ACL refuses the loop's look for new leases between passes (ZCOUNT on "
                                "active): a pass every %gs looks instead; grant ZCOUNT on the queue's keys "
                                "(docs/redis.md, ACL)", LEASE_WATCH_S, extra={"queue": self.config.queue})
                return False

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001 (closing a dead connection may raise; nothing to do)
                pass
            self._client = None


def result_summary(queue: str, result: Any, stopped_early: bool = False, error: str | None = None) -> str:
    """One JSON line for ``--once``: what the pass did. ``lanes`` lists every
    lane that moved a job, the flat jobs under "" (as the metrics' ``lane``
    label and the morgue's JSON do), so its counts add up to ``recovered`` and
    ``dead_lettered``. ``error``: why the pass failed (null when it did not);
    the counts are then what the calls answered before the failure."""
    return json.dumps({
        "queue": queue,
        "recovered": result.recovered,
        "dead_lettered": result.dead_lettered,
        "orphans": result.orphans,
        "quarantined": result.quarantined,
        "calls": result.calls,
        "lanes": {name: {"recovered": recovered, "dead_lettered": dead_lettered}
                  for name, (recovered, dead_lettered) in sorted(per_lane(result).items())},
        "stopped_early": stopped_early,
        "error": error,
    })
