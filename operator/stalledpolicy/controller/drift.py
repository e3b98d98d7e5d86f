"""Drift: a sweeper Deployment changed outside its policy (``kubectl scale``, an env
edit, another controller) gets the policy's spec applied over it again, at most
DRIFT_MAX_REVERTS times in DRIFT_WINDOW seconds. Past that another writer is
fighting the operator: a DriftConflict (an event, a log line, a metric and the
policy's SweeperInSync condition) and no more reverts until the sweeper has been
left alone a whole window. The reverts are recorded on the Deployment and the
conflict in the policy's status, so an operator restart changes neither.

The budget and the conflict: ``drift_reverts``; here, the trigger: a changed
sweeper found and its policy applied over it again."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from stalledpolicy.controller import events
from stalledpolicy.controller.apply_requests import ApplyRequest
from stalledpolicy.controller.drift_reverts import (
    DRIFT_MAX_REVERTS,
    DRIFT_REVERTS_ANNOTATION,
    DRIFT_WINDOW,
    count_revert,
    drift_allowed,
    end_conflict_by_edit,
    other_field_managers,
    recorded_reverts,
)
from stalledpolicy.controller.objects import is_deleting
from stalledpolicy.controller.redis_clients import PolicyKey
from stalledpolicy.controller.status import ReconcileOutcome
from stalledpolicy.controller.sweeper_events import is_current, owned_policy_state

if TYPE_CHECKING:  # for the annotations only: runtime imports this module (through sync)
    from stalledpolicy.controller.runtime import Controller

log = logging.getLogger("stalledpolicy.operator")
DRIFT_REVERT = "drift-revert"  # the ApplyRequest kind

# The budget's settings and helpers keep their names here too (the tests know them as
# drift's); they live in drift_reverts, below reconcile, which uses them (issue 23).
__all__ = ["DRIFT_MAX_REVERTS", "DRIFT_REVERTS_ANNOTATION", "DRIFT_WINDOW", "drifted_policy", "end_conflict_by_edit",
           "other_field_managers", "recorded_reverts", "revert_drift"]


def drifted_policy(ctl: Controller, deployment: Mapping[str, Any]) -> PolicyKey | None:
    """The policy whose sweeper Deployment someone else changed (``kubectl scale``,
    an env edit): its generation is past the one our last apply made. Memory only,
    so kopf's watch can ask on every event; our own no-op applies never bump the
    generation, so they never look like drift. A policy or Deployment being deleted
    (foreground deletion bumps the generation) is never drift."""
    meta = deployment.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    owned = owned_policy_state(ctl, deployment)
    if owned is None:
        return None
    key, state, _ = owned
    applied = state.outcome.deployment_generation if state.outcome is not None else None
    if applied is None or int(meta.get("generation") or 0) <= applied:
        return None
    return key


def revert_drift(ctl: Controller, key: PolicyKey, deployment: Mapping[str, Any]) -> None:
    """Someone changed a sweeper Deployment (``key``: its policy, as ``drifted_policy``
    found it): ask sync to apply the policy's spec over it (server-side apply,
    forced: the fields the operator owns come back; fields it never set stay), at
    most DRIFT_MAX_REVERTS times in DRIFT_WINDOW seconds (wall-clock times: they
    outlive the process). The budget is checked, and a revert counted, by the
    request's check and done, which the policy's sync runs."""
    state = ctl.policies.get(key)
    if state is None:
        return
    meta = deployment.get("metadata") or {}
    seen = int(meta.get("generation") or 0)
    now = ctl.clock()  # when the change was seen: the budget's window is judged by it

    def check() -> Mapping[str, Any] | None:
        # A sync may have made this generation since, or the policy may be gone
        # (or on its way out).
        if drifted_policy(ctl, deployment) != key or not is_current(ctl, key, state):
            return None
        # The status refresh ends a conflict under the status lock (drift_conflict_over):
        # the window checked and this change counted are one step to it.
        posts = events.DeferredPosts()  # a DriftConflict is posted after the status lock
        with posts.flushed_to(ctl.recorder), state.lock:
            allowed = drift_allowed(ctl, state, deployment, now, posts)
        if not allowed:
            return None
        log.info("sweeper Deployment changed outside the policy; re-applying", extra={
            "namespace": key[0], "policy": key[1], "deployment": meta.get("name"), "generation": seen})
        return state.body

    def counted(outcome: ReconcileOutcome | None) -> None:
        # Only an apply that changed the spec reverted something: a change to a
        # field the operator never sets (`kubectl rollout restart`'s annotation)
        # is left alone by it, bumps no generation and uses up no budget.
        if outcome is not None and (outcome.deployment_generation or 0) > seen and not is_deleting(state.body):
            count_revert(ctl, state, str(meta.get("name") or ""), seen, outcome.deployment_generation or 0, now)

    ctl.request_apply(key, ApplyRequest("the sweeper Deployment changed outside the policy", kind=DRIFT_REVERT,
                                        quiet=True, check=check, done=counted))
