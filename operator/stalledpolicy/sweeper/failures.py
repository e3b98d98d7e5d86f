"""What the sweeper does when a pass fails, or does part of its work.

Failure policy (the process must never crash-loop):
- The server refuses the URL's credentials (or wants some): Redis answered,
  so no outage (``redis_up`` stays 1): one error naming the credentials,
  retried every interval, /readyz 503; --once exits 2 (a bad setting).
- Redis unreachable: one warning when the outage starts (and one for each new
  cause during it), one info line when it ends, retries in between on a capped
  exponential backoff with jitter, and /readyz answers 503 meanwhile.
- Any other error of a pass (a script error, a bug): logged once per distinct
  message until a pass succeeds again, retried on the normal interval.
- The queue's slot being moved between Redis Cluster nodes (a resharding:
  TRYAGAIN, a script's 'non local key' or Valkey's 'undeclared keys were
  accessed during rehashing of the slot', redis-py's 'TTL exhausted'): Redis
  answered, so no outage; one warning naming the migration, retried every
  interval, /readyz 503 with that reason until a pass succeeds (in the first
  drain: a script call).
- ``stalledpolicy_redis_up`` and the readiness's Redis half follow what Redis
  did, never a guess: a completed round trip (a script call, the snapshot, or
  an error reply from the server) sets them up, an outage sets them down, and
  an error that is neither (a bug in our code, a reply we could not read)
  leaves them as they were.
- With ``--once`` there is no retry: the log lines say the process exits 1, or
  2 for a bad setting (a database the server lacks), or that a signal stops
  it (the pass failed after SIGTERM/SIGINT: exit 143/130, cli.py).
- A pass that succeeds but could not do part of its work (a malformed shared
  key, a command the ACL refuses) warns once per problem while it lasts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import redis

from stalledpolicy import engine
from stalledpolicy.redis_url import errors, redaction
from stalledpolicy.redis_url.errors import unreachable_errors
from stalledpolicy.sweeper.config import SweeperConfig
from stalledpolicy.sweeper.metrics import Health, SweeperMetrics

log = logging.getLogger("stalledpolicy.sweeper")

BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 30.0

# Errors that mean "Redis cannot serve us now" (an outage), not "our call is wrong".
UNREACHABLE = unreachable_errors()


class PassFailures:
    """The failure policy's methods of ``Sweeper`` (loop.py)."""

    # What these methods use of ``Sweeper``, which sets them. A mixin, not an
    # object of its own: a failure changes the pass's own state (health,
    # last_error, bad_setting), and tests read and set the outage state
    # (_failed_attempts, redis_down) on the Sweeper.
    config: SweeperConfig
    metrics: SweeperMetrics
    health: Health
    _clock: Callable[[], float]
    _jitter: Callable[[], float]
    _calls_this_pass: int
    so_far: Any
    stop: threading.Event
    bad_setting: str | None
    last_error: str | None

    def _init_failure_state(self) -> None:
        self._down_since: float | None = None
        self._outage_causes: set[str] = set()  # error types logged in this outage
        self._failed_attempts = 0
        self._logged_errors: set[str] = set()
        self._reported_problems: set[str] = set()
        self._url_answered = False  # a script call came back on this URL (set by the loop)

    def _handle_pass_failure(self, exc: Exception) -> None:
        """Sort the error that ended a pass by what it says of Redis, and
        leave in :attr:`last_error` what /readyz says of it."""
        if errors.is_credentials_refusal(exc):
            self._credentials_refused(exc)  # Redis answered: the URL's credentials are the problem
        elif isinstance(exc, UNREACHABLE):
            if errors.is_slot_migrating(exc):
                self._slot_migrating(exc)  # Redis answered: a resharding, not an outage
            elif errors.is_read_only_refusal(exc):
                self._read_only(exc)  # Redis answered: not an outage
            else:
                self._outage(exc)
        elif errors.is_slot_migrating(exc):
            self._slot_migrating(exc)
        else:
            if errors.is_missing_database(exc):
                # the URL names a database the server lacks (any but 0 on a
                # Redis Cluster): a bad setting, which --once exits 2 for
                self.bad_setting = self._scrub(exc)
            self._pass_error(exc)
        self.last_error = self.health.reason

    def _then(self, retrying: str) -> str:
        """What comes after a failed pass, for its log line: ``retrying`` in the
        long-running mode (stopping, when a signal came during the pass); with
        --once the exit it leads to (cli.py)."""
        if not self.config.once:
            return "stopping (a signal came during the pass)" if self.stop.is_set() else retrying
        if self.bad_setting is not None:
            return "--once exits 2 (a bad setting)"
        if self.stop.is_set():
            return "--once stops: a signal came during the pass (exit 143 SIGTERM, 130 SIGINT)"
        return "--once exits 1"

    def _pass_succeeded(self) -> None:
        """/readyz says ok, and each failure is logged again the next time it is met."""
        self.health.last_pass_ok = True
        self.health.reason = "ok"
        self._logged_errors.clear()

    def _report_problems(self, problems: list[str]) -> None:
        """A warning per problem when it appears (again), not every pass while it lasts."""
        self.metrics.key_problems.labels(self.config.queue).set(len(problems))
        for problem in problems:
            if problem not in self._reported_problems:
                log.warning("sweep: part of a pass was not done (a shared key of the queue is malformed, or the "
                            "Redis user may not run a command); every job still moved",
                            extra={"queue": self.config.queue, "problem": problem})
        self._reported_problems = set(problems)

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
                f"redis unreachable; the pass failed and {self._then('')}" if self.config.once else
                f"redis unreachable; {self._then('retrying with backoff (logged once per outage)')}",
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
            if not self.health.last_pass_ok:
                # /readyz still says not ready (no pass has ended well since), but
                # no longer that Redis is unreachable while the backlog drains
                self.health.reason = "Redis reachable again after an outage; draining, no pass has ended since"
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
             + f"; {self._moved_so_far()}; "
             + self._then("retrying next interval (logged once until a pass succeeds)")),
            extra={"queue": self.config.queue, "redis": self.config.redis_url_redacted, "error": message,
                   "error_type": type(exc).__name__})

    def _credentials_refused(self, exc: BaseException) -> None:
        """The server wants a password, or refuses the URL's user/password.
        Redis answered (it is up: an alert on ``redis_up`` must not page the
        Redis owners for the sweeper's setting); the URL is a bad setting, which
        --once exits 2 for. Retried every interval (a Secret fixed and the pod
        restarted, or the server's ACL fixed, ends it); logged once until a pass
        succeeds."""
        self._redis_answered()
        message = self._scrub(exc)
        self.bad_setting = message
        if not self._failed_pass(message, "credentials refused", "sweep pass refused again: the credentials"):
            return
        log.error(f"Redis refused the credentials of the Redis URL; {self._moved_so_far()}; "
                  + self._then("retrying next interval (logged once until a pass succeeds)"),
                  extra={"queue": self.config.queue, "redis": self.config.redis_url_redacted, "error": message,
                         "error_type": type(exc).__name__})

    def _moved_so_far(self) -> str:
        """What the pass that just failed moved: nothing, or what its answered
        script calls moved before the one that failed (a primary demoted, a
        user's rights changed half-way through a drain)."""
        if not self._calls_this_pass:
            return "nothing was moved"
        done = self.so_far
        return (f"the {self._calls_this_pass} script call(s) before it were applied ({done.recovered} recovered, "
                f"{done.dead_lettered} dead-lettered), the refused one moved nothing")

    def _slot_migrating(self, exc: BaseException) -> None:
        """The queue's slot is being moved between Redis Cluster nodes (a
        resharding): Redis answered (it is up, no backoff), the call that met
        the migration changed nothing (every script reads before it writes),
        and the pass is retried every interval until the slot has moved.
        Logged once until a pass succeeds."""
        self._redis_answered()
        moved = self._moved_so_far()
        then = self._then("retrying next interval")
        what = (f"the slot of queue {self.config.queue} is being migrated between Redis Cluster nodes "
                f"(resharding); {moved}; {then}")
        if not self._failed_pass(what, "slot migrating", "sweep pass met the slot migration again"):
            return
        once_note = "" if self.config.once or self.stop.is_set() else " (logged once until a pass succeeds)"
        log.warning(what + once_note, extra={
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
        then = self._then("retrying next interval (logged once until a pass succeeds)")
        log.error(
            # an ACL refusal names the grant in `error` (EMQNOPERM ...); nothing moved
            f"sweep pass refused by the Redis ACL (the user may not use the queue's keys or a command; "
            f"the error names the grant); {self._moved_so_far()}; {then}" if engine.is_acl_refusal(exc) else
            f"sweep pass failed: the Redis URL names a database this server does not have; {then}"
            if self.bad_setting is not None else f"sweep pass failed; {then}",
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
        # a refusal the URL must fix (credentials, a database) in our words, else the server's;
        # once a script call came back on this URL, a dropped connection blames no TLS or port
        return (errors.refusal_in_our_words(exc, url, connected=self._url_answered)
                or redaction.scrub(str(exc) or type(exc).__name__, url))

    def backoff_delay(self) -> float:
        """Up to 1s, 2s, 4s, ... doubling per failed attempt, never above 30s; each
        delay drawn at random from the upper half of that (at least 0.5s), so that
        replicas do not retry in step, at the cap too (a cap applied after the
        jitter made every retry of a long outage exactly 30s)."""
        exponent = min(max(self._failed_attempts - 1, 0), 16)
        base = min(BACKOFF_MAX_S, 2 * BACKOFF_MIN_S * 2**exponent)
        return base * (0.5 + 0.5 * self._jitter())

    @property
    def redis_down(self) -> bool:
        return self._down_since is not None
