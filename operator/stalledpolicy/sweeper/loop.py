"""The sweep loop: drain the expired prefix of ``active`` every interval.

Each pass calls :func:`stalledpolicy.engine.drain` (bounded script calls, one
at a time, so Redis is never blocked for long) and then reads one
:func:`~stalledpolicy.engine.queue_snapshot` for the gauges.

Failure policy (the process must never crash-loop):
- Redis unreachable: one warning when the outage starts, one info line when it
  ends, retries in between on a capped exponential backoff with jitter, and
  /readyz answers 503 meanwhile.
- Any other error of a pass (a script error, a bug): logged once per distinct
  message until a pass succeeds again, retried on the normal interval.
- The queue's slot being moved between Redis Cluster nodes (a resharding:
  TRYAGAIN, a script's 'non local key', redis-py's 'TTL exhausted'): Redis
  answered, so no outage; one warning naming the migration, retried every
  interval, /readyz 503 with that reason until a pass succeeds (in the first
  drain: a script call).
- ``stalledpolicy_redis_up`` and the readiness's Redis half follow what Redis
  did, never a guess: a completed round trip (a script call, the snapshot, or
  an error reply from the server) sets them up, an outage sets them down, and
  an error that is neither (a bug in our code, a reply we could not read)
  leaves them as they were.
- With ``--once`` there is no retry: the log lines say the process exits 1.

Stopping: a signal sets :attr:`Sweeper.stop`; the engine checks it between
script calls (so the current call finishes) and every wait is on that Event.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from typing import Any, Callable

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from stalledpolicy import engine
from stalledpolicy.redis_url import connecting, errors, redaction
from stalledpolicy.redis_url.errors import unreachable_errors
from stalledpolicy.sweeper.config import SweeperConfig
from stalledpolicy.sweeper.metrics import Health, SweeperMetrics, per_lane

log = logging.getLogger("stalledpolicy.sweeper")

BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 30.0
CONNECT_TIMEOUT_S = 2.0
SOCKET_TIMEOUT_S = 5.0
# The loop beats at least once a second while waiting and after every script
# call, so only a blocking Redis round trip (bounded by the timeouts above,
# plus one retry) delays a beat; the floor keeps a short interval from
# flagging a slow outage as a wedged loop.
HEALTH_FLOOR_S = 20.0
_WAIT_SLICE_S = 1.0

# Errors that mean "Redis cannot serve us now" (an outage), not "our call is wrong".
UNREACHABLE = unreachable_errors()


def connect(url: str) -> Any:
    """The sweeper's client for ``url`` (a RedisCluster on a cluster node)."""
    return connecting.connect(
        url,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=SOCKET_TIMEOUT_S,
        # One immediate retry replaces a pooled connection a restart broke;
        # the loop's own backoff handles real outages.
        retry=Retry(NoBackoff(), 1),
    )


class Sweeper:
    def __init__(
        self,
        config: SweeperConfig,
        metrics: SweeperMetrics,
        *,
        stop: threading.Event | None = None,
        connect_fn: Callable[[str], Any] = connect,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
    ):
        self.config = config
        self.metrics = metrics
        self.stop = stop or threading.Event()
        self.health = Health(stale_after_s=max(3 * config.interval, HEALTH_FLOOR_S), clock=clock)
        self._connect = connect_fn
        self._clock = clock
        self._jitter = jitter
        self._client: Any = None
        self._budgets = engine.Budgets(default=config.max_stalled, lanes=dict(config.lanes))
        self._down_since: float | None = None
        self._outage_causes: set[str] = set()  # error types logged in this outage
        self._failed_attempts = 0
        self._logged_errors: set[str] = set()
        self._calls_this_pass = 0
        self._first_drain = True  # no pass that made a call has ended yet
        self._reported_problems: set[str] = set()
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

    # -- one pass -------------------------------------------------------------

    def sweep_pass(self) -> bool:
        """Drain once; False when the pass failed (the reason is logged)."""
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
                client, self.config.queue, self._budgets, self.config.batch_size,
                should_stop=self.stop.is_set, on_call=self._on_call,
            )
            snapshot = None
            snapshot_problems: list[str] = []
            if not self.stop.is_set():
                try:
                    snapshot = engine.queue_snapshot(client, self.config.queue, tuple(self.config.lanes))
                except redis.ResponseError as exc:
                    if isinstance(exc, UNREACHABLE):
                        raise
                    # The jobs moved; only the read for the gauges was refused (a key of
                    # the wrong type, say the totals hash the sweep itself takes as a
                    # problem, or the ACL): a problem of the pass, not a failed pass.
                    snapshot_problems.append(f"the queue's sizes were not read for the gauges (they keep "
                                             f"their last values): {self._scrub(exc)}")
                self._redis_answered()
        except UNREACHABLE as exc:
            if errors.is_slot_migrating(exc):
                self._slot_migrating(exc)  # Redis answered: a resharding, not an outage
            elif errors.is_read_only_refusal(exc):
                self._read_only(exc)  # Redis answered: not an outage
            else:
                self._outage(exc)
            self.last_error = self.health.reason
            return False
        except Exception as exc:  # noqa: BLE001 (a script error or a bug must not end the process)
            if errors.is_slot_migrating(exc):
                self._slot_migrating(exc)
            else:
                if errors.is_missing_database(exc):
                    # the URL names a database the server lacks (any but 0 on a
                    # Redis Cluster): a bad setting, which --once exits 2 for
                    self.bad_setting = self._scrub(exc)
                self._pass_error(exc)
            self.last_error = self.health.reason
            return False
        seconds = self._clock() - started
        # drain stops only between calls: stopped early = work was left (more),
        # or the stop came before the first call
        self.last_stopped_early = self.stop.is_set() and (result.more or result.calls == 0)
        self._redis_answered()
        self.metrics.pass_duration.observe(seconds)
        self.metrics.last_pass.set(time.time())
        if snapshot is not None:
            self.metrics.observe_snapshot(snapshot)
        self.health.last_pass_ok = True
        self.health.reason = "ok"
        self._logged_errors.clear()
        self.last_result = result
        self.passes += 1
        self._report_problems([*result.problems, *snapshot_problems])
        self._log_pass(result, seconds, snapshot)
        return True

    def _report_problems(self, problems: list[str]) -> None:
        """A warning per problem when it appears (again), not every pass while it lasts."""
        self.metrics.key_problems.labels(self.config.queue).set(len(problems))
        for problem in problems:
            if problem not in self._reported_problems:
                log.warning("sweep: part of a pass was not done (a shared key of the queue is malformed, or the "
                            "Redis user may not run a command); every job still moved",
                            extra={"queue": self.config.queue, "problem": problem})
        self._reported_problems = set(problems)

    def _client_or_connect(self) -> Any:
        if self._client is None:
            self._client = self._connect(self.config.redis_url.get_secret_value())
        return self._client

    def _on_call(self, result: Any, seconds: float) -> None:
        self._calls_this_pass += 1
        self.so_far = self.so_far.merge(result)
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
            fields["lanes"] = ",".join(
                f"{name or '-'}:{c.recovered}/{c.dead_lettered}" for name, c in sorted(result.lanes.items())
            )
        if snapshot is not None:
            fields["morgue"] = snapshot.dead
        if self.last_stopped_early:
            fields["stopped_early"] = True
        did_work = result.recovered or result.dead_lettered or result.orphans or result.quarantined
        log.log(logging.INFO if did_work else logging.DEBUG,
                "sweep pass" if did_work else "sweep pass: nothing expired", extra=fields)

    # -- failures -------------------------------------------------------------

    def _outage(self, exc: BaseException) -> None:
        self._failed_attempts += 1
        self.metrics.set_redis_up(False)
        self.health.redis_up = False
        self.health.last_pass_ok = False
        self.health.reason = f"redis unreachable: {self._scrub(exc)}"
        # An outage's cause may change (refused, then a password the restarted
        # server no longer takes): each cause is logged once per outage.
        cause = type(exc).__name__
        if self._down_since is None:
            self._down_since = self._clock()
            self._outage_causes = {cause}
            log.warning(
                "redis unreachable; the pass failed and --once exits 1" if self.config.once else
                "redis unreachable; retrying with backoff (logged once per outage)",
                extra={"queue": self.config.queue, "redis": self.config.redis_url_redacted,
                       "error": self._scrub(exc), "error_type": cause},
            )
        elif cause not in self._outage_causes:
            self._outage_causes.add(cause)
            log.warning("redis still unreachable, for another reason now (logged once per reason and outage)",
                        extra={"queue": self.config.queue, "redis": self.config.redis_url_redacted,
                               "error": self._scrub(exc), "error_type": cause,
                               "attempt": self._failed_attempts})
        else:
            log.debug("redis still unreachable", extra={
                "queue": self.config.queue, "attempt": self._failed_attempts, "error": self._scrub(exc)})

    def _redis_answered(self) -> None:
        """A Redis round trip completed: Redis is up (and an outage, if any, is over)."""
        self.metrics.set_redis_up(True)
        self.health.redis_up = True
        if self._down_since is not None:
            log.info("redis reachable again", extra={
                "queue": self.config.queue, "redis": self.config.redis_url_redacted,
                "outage_s": round(self._clock() - self._down_since, 1),
                "attempts": self._failed_attempts})
        self._down_since = None
        self._failed_attempts = 0

    def _read_only(self, exc: BaseException) -> None:
        """A read-only replica refused the sweep's writes: Redis answered (it is
        up), but no pass can succeed until the URL names the primary (or a
        failover ends). Retried every interval; logged once until a pass succeeds."""
        self._redis_answered()
        message = self._scrub(exc)
        if not self._failed_pass(message, f"read-only: {message}", "sweep pass refused again by a read-only replica"):
            return
        log.error(
            ("Redis is a read-only replica and refused the sweep's writes: " + errors.READ_ONLY_ADVICE
             + "; nothing was moved; " + ("--once exits 1" if self.config.once else
                                          "retrying next interval (logged once until a pass succeeds)")),
            extra={"queue": self.config.queue, "redis": self.config.redis_url_redacted, "error": message,
                   "error_type": type(exc).__name__})

    def _slot_migrating(self, exc: BaseException) -> None:
        """The queue's slot is being moved between Redis Cluster nodes (a
        resharding): Redis answered (it is up, no backoff), the call that met
        the migration changed nothing (every script reads before it writes),
        and the pass is retried every interval until the slot has moved.
        Logged once until a pass succeeds."""
        self._redis_answered()
        moved = ("nothing was moved" if not self._calls_this_pass else
                 "the script calls before it were applied, the one that met the migration moved nothing")
        then = "--once exits 1" if self.config.once else "retrying next interval"
        what = (f"the slot of queue {self.config.queue} is being migrated between Redis Cluster nodes "
                f"(resharding); {moved}; {then}")
        if not self._failed_pass(what, "slot migrating", "sweep pass met the slot migration again"):
            return
        log.warning(what + ("" if self.config.once else " (logged once until a pass succeeds)"), extra={
            "queue": self.config.queue, "error": self._scrub(exc), "error_type": type(exc).__name__})

    def _pass_error(self, exc: BaseException) -> None:
        # Only a completed round trip may say Redis is up. An error reply (a
        # ResponseError: a script error, WRONGTYPE, NOSCRIPT, ...) is one: the
        # server read our call and answered. Anything else here (a bug in our
        # code, a reply we could not parse, a client-side DataError) says nothing
        # about Redis either way, so redis_up and the outage state stay as they
        # were; a script call that succeeded earlier in this pass already set
        # them up (see _on_call).
        if isinstance(exc, redis.ResponseError):
            self._redis_answered()
        message = self._scrub(exc)
        if not self._failed_pass(message, f"{type(exc).__name__}: {message}", "sweep pass failed again"):
            return
        is_redis_error = isinstance(exc, redis.RedisError)
        then = "--once exits 1" if self.config.once else "retrying next interval (logged once until a pass succeeds)"
        log.error(
            # an ACL refusal names the grant in `error` (EMQNOPERM ...); nothing moved
            f"sweep pass refused by the Redis ACL (the user may not use the queue's keys or a command; "
            f"the error names the grant); nothing was moved; {then}" if engine.is_acl_refusal(exc) else
            f"sweep pass failed; {then}",
            extra={"queue": self.config.queue, "error": message, "error_type": type(exc).__name__},
            exc_info=None if is_redis_error else exc,
        )

    def _failed_pass(self, reason: str, key: str, again: str) -> bool:
        """The pass failed for ``reason`` (/readyz says so). True the first time
        ``key`` is met since a pass succeeded: the caller logs it; else a debug
        line ``again`` and False."""
        self.health.last_pass_ok = False
        self.health.reason = f"last pass failed: {reason}"
        if key in self._logged_errors:
            log.debug(again, extra={"queue": self.config.queue, "error": reason})
            return False
        self._logged_errors.add(key)
        return True

    def _scrub(self, exc: BaseException) -> str:
        url = self.config.redis_url.get_secret_value()
        # a refusal the URL must fix (credentials, a database) in our words, else the server's
        return errors.refusal_in_our_words(exc, url) or redaction.scrub(str(exc) or type(exc).__name__, url)

    def backoff_delay(self) -> float:
        """0.5s, 1s, 2s, ... doubling per failed attempt, each stretched by up to
        100% at random (so replicas do not retry in step), never above 30s."""
        exponent = min(max(self._failed_attempts - 1, 0), 16)
        base = BACKOFF_MIN_S * 2**exponent
        return min(BACKOFF_MAX_S, base * (1.0 + self._jitter()))

    @property
    def redis_down(self) -> bool:
        return self._down_since is not None

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
        """Sweep every interval until :attr:`stop` is set."""
        next_at = self._clock()
        while not self.stop.is_set():
            self.sweep_pass()
            if self.stop.is_set():
                break
            if self.redis_down:
                self.wait(self.backoff_delay())
                next_at = self._clock()  # the pass after an outage runs at once
                continue
            # Schedule from the planned start, not from the end of the pass, so
            # the cadence does not drift; an overrun starts the next pass now
            # (and never in a burst of catch-up passes).
            next_at += self.config.interval
            now = self._clock()
            if next_at < now:
                next_at = now
            self.wait(next_at - now)
        self.close()

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
