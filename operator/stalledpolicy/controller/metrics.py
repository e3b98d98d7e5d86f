"""The operator's own Prometheus metrics (the sweepers have theirs: ``sweeper/metrics.py``).

Each ``Controller`` holds one ``OperatorMetrics`` on a registry of its own, so a
test builds a Controller and reads its numbers (``value``); the operator process
serves it on ``--metrics-port`` with the sweeper's ``StatusServer`` (``/metrics`` only).

No label names a policy, a namespace, a queue or a URL: the operator watches any
number of policies, and a label per policy would grow without bound. Labels
hold one of a fixed set of values (the condition reasons the code writes; anything
else is counted as ``Other``), so the number of series is fixed too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from stalledpolicy.controller import events
from stalledpolicy.controller.status import CONFIGURATION_REASONS
from stalledpolicy.sweeper.metrics import http_dropped_counter

# Counters' and histograms' *_created series (prometheus_client's default: each
# series' start time, as a gauge of its own in the text format) are read by no
# alert or dashboard of ours and nearly doubled what /metrics lists.
disable_created_metrics()

# ReconcileOutcome.reason -> the result label of a reconcile.
RECONCILE_RESULTS = {
    "Applied": "ok",
    events.INVALID_SPEC: "invalid_spec",
    events.APPLY_FAILED: "apply_failed",
    events.NAME_CONFLICT: "conflict",
    events.OLD_SWEEPER_DELETING: "waiting",
    events.QUEUE_CLAIMED: "queue_claimed",
}
# Problem reasons a status refresh may end with (the RedisReachable condition's reasons).
REFRESH_FAILURE_REASONS = ("RedisUnreachable", "RedisCredentialsRefused", "QueueUnreadable", "StatusWriteFailed",
                           *sorted(CONFIGURATION_REASONS))
OTHER = "Other"
REPLAY_RESULTS = ("done", "failed", "refused")

# A refresh is a few Redis round trips and one status patch; its ceiling is the Redis timeout (2s).
_REFRESH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# How late a refresh starts: ~0 with idle workers; seconds when every worker is busy.
_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.reconciles = Counter(
            "stalledpolicy_operator_reconciles",
            "Reconciles (applies of a policy's sweeper Deployment) by result: ok, invalid_spec, "
            "apply_failed (the API refused or was unreachable), conflict (a Deployment of that name "
            "owned by someone else), waiting (the sweeper of a deleted policy of the same name is "
            "not garbage-collected yet), queue_claimed (an older policy sweeps the same queue on the "
            "same Redis: no sweeper)", ["result"], registry=r)
        self.drift_reverts = Counter(
            "stalledpolicy_operator_drift_reverts",
            "Sweeper Deployments changed outside their policy and put back", registry=r)
        self.drift_conflicts = Counter(
            "stalledpolicy_operator_drift_conflicts",
            "Times the operator stopped reverting a sweeper another writer keeps changing "
            "(DriftConflict)", registry=r)
        self.sweepers_recreated = Counter(
            "stalledpolicy_operator_sweepers_recreated",
            "Sweeper Deployments deleted by someone while their policy exists, applied again", registry=r)
        self.refreshes = Counter(
            "stalledpolicy_operator_status_refreshes",
            "Status refreshes (queue read and status written) of the status loop, failed or not",
            registry=r)
        self.refresh_failures = Counter(
            "stalledpolicy_operator_status_refresh_failures",
            "Status refreshes that failed, by the reason written to the RedisReachable condition "
            "(RedisUnreachable, StatusWriteFailed, SecretNotFound, ...)", ["reason"], registry=r)
        self.refresh_duration = Histogram(
            "stalledpolicy_operator_status_refresh_duration_seconds",
            "Duration of one status refresh", registry=r, buckets=_REFRESH_BUCKETS)
        self.loop_lag = Histogram(
            "stalledpolicy_operator_status_loop_lag_seconds",
            "How late a status refresh starts after the time it was due (all workers busy: it grows)",
            registry=r, buckets=_LAG_BUCKETS)
        self.replays = Counter(
            "stalledpolicy_operator_replays",
            "Replay requests (the replay annotation) by result: done, failed (Redis), refused "
            "(an invalid request)", ["result"], registry=r)
        self.replayed_jobs = Counter(
            "stalledpolicy_operator_replayed_jobs", "Jobs moved from a morgue back to pending by replays",
            registry=r)
        self.policies = Gauge(
            "stalledpolicy_operator_policies", "StalledPolicies the operator knows (watched, not deleted)",
            registry=r)
        self.http_dropped = http_dropped_counter("stalledpolicy_operator", r)  # its /metrics server's
        # Series exist from the start, at 0, so dashboards and rate() see them.
        for result in RECONCILE_RESULTS.values():
            self.reconciles.labels(result)
        for reason in (*REFRESH_FAILURE_REASONS, OTHER):
            self.refresh_failures.labels(reason)
        for result in REPLAY_RESULTS:
            self.replays.labels(result)

    # -- the hooks (one call where the code decides an outcome) ----------------------
    def count_reconcile(self, outcome: Any) -> None:
        """One reconcile's ``status.ReconcileOutcome`` (every reconcile records exactly one)."""
        result = RECONCILE_RESULTS.get(outcome.reason) or ("ok" if outcome.ok else "apply_failed")
        self.reconciles.labels(result).inc()

    def count_refresh(self, problem: Any) -> None:
        """One finished refresh; ``problem``: its ``status.Problem``, or None."""
        self.refreshes.inc()
        if problem is not None:
            reason = problem.reason if problem.reason in REFRESH_FAILURE_REASONS else OTHER
            self.refresh_failures.labels(reason).inc()

    def count_replay(self, result: str, jobs: int = 0) -> None:
        self.replays.labels(result).inc()
        if jobs:
            self.replayed_jobs.inc(jobs)

    def count_policies(self, count: Callable[[], int]) -> None:
        """The policies gauge reads ``count()`` at each scrape."""
        self.policies.set_function(count)

    # -- reading ----------------------------------------------------------------------
    def value(self, name: str, **labels: str) -> float:
        """A sample's value (0.0 when absent), e.g. ``value("stalledpolicy_operator_reconciles_total",
        result="ok")``; for tests and debugging."""
        found = self.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
