"""What the operator holds in memory for one policy (its ``PolicyState``)."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from stalledpolicy.controller.objects import SEEN_VERSIONS
from stalledpolicy.controller.redis_clients import PolicyKey
from stalledpolicy.controller.status import Problem, ReconcileOutcome


@dataclass
class DriftState:
    """The drift revert budget and conflict of one policy; changed by drift_reverts only.

    Reverts of the last DRIFT_WINDOW seconds (wall-clock times, also recorded on the
    Deployment); past DRIFT_MAX_REVERTS another writer is fighting us: no more reverts
    until the sweeper has been left alone a while. ``conflict`` is the DriftConflict
    message meanwhile (the SweeperInSync condition, kept in status, so a restarted
    operator goes on not reverting)."""

    reverts: list[Any] = field(default_factory=list[Any])
    conflict: str | None = None
    last_seen: float | None = None
    seen_generation: int = 0
    # The policy generation applied when the conflict began: a newer generation
    # applied (an edit of the policy) ends the conflict.
    conflict_generation: int = 0
    resume: bool = False  # the conflict is over: sync applies the spec again
    # ended by the window, the spec not applied since: not in sync yet (the
    # re-apply may fail); cleared by the next successful reconcile
    reverting: bool = False


@dataclass
class ClaimState:
    """One sweeper per queue (queue_claims.py, its only writer): whether a refresh of
    this process has read (or failed to read) the queue yet, how many refreshes in a
    row could not (Redis unreachable or refusing), how many in a row read it without
    a problem, and whether the last found no Redis URL (its Secret or URL is wrong)."""

    refreshed: bool = False
    read_failures: int = 0
    reads: int = 0
    misconfigured: bool = False


@dataclass
class ReplayState:
    """Replays by annotation (replay_serving.py, its only writer after creation)."""

    served: list[Any] = field(default_factory=list[Any])  # tokens served, oldest first (the last SERVED_HISTORY)
    refused: str | None = None  # an invalid replay request, warned about once
    # replays done whose record is not in status yet, oldest first, each with
    # what it left undone; status shows the last, each is announced once it lands
    unwritten: list[tuple[dict[str, Any], str | None]] = field(default_factory=list)


@dataclass
class StatusCache:
    """The policy's status as this process knows it (status_cache.py, its only writer,
    under the policy's ``lock``)."""

    status: dict[str, Any] | None = None  # as last written (or first seen)
    # as the API server holds it, as far as we know: what we wrote, or what a
    # newer watch event shows (someone else's edit); the status patch is made
    # against it, so a status edited or wiped by hand is written back
    stored: dict[str, Any] | None = None
    # resourceVersions of this policy seen and since replaced (newest last): a body
    # carrying one of them is older than ``PolicyState.body``.
    seen_versions: deque[str | None] = field(default_factory=lambda: deque(maxlen=SEEN_VERSIONS))
    # The version our last status write made, until the watch delivers it: the
    # watch events before it are older than the body that write returned.
    awaited_version: str | None = None
    awaited_since: float = 0.0
    logged_problem: Problem | None = None
    # The Redis endpoint the queue figures in status were read from, as
    # (spec.redis as JSON, (host, port, database) of the resolved URL, a short host
    # taken in the policy's namespace (same_redis_server.as_seen_from), or None when it
    # cannot be resolved now); None until the first refresh of this process.
    redis_endpoint: tuple[Any, ...] | None = None


@dataclass
class PolicyState:
    key: PolicyKey
    body: dict[str, Any]
    lock: threading.RLock = field(default_factory=threading.RLock)
    outcome: ReconcileOutcome | None = None
    status_cache: StatusCache = field(default_factory=lambda: StatusCache())
    replay: ReplayState = field(default_factory=lambda: ReplayState())
    # The newest policy generation sync asked itself to apply (sync._request_new_generation): once each.
    generation_requested: int = 0
    # The budgets (events.sweeper_budgets) of the sweeper Deployment as this process
    # last applied it (in its sync): the old side of the next BudgetChanged
    # (not kopf's ``old``: docs/architecture.md).
    applied_budgets: dict[str, Any] | None = None
    drift: DriftState = field(default_factory=lambda: DriftState())
    claim: ClaimState = field(default_factory=lambda: ClaimState())

    @property
    def status(self) -> dict[str, Any] | None:
        """The policy's status as last written (or first seen); read only: status_cache.py writes it."""
        return self.status_cache.status
