"""The drift revert budget (drift: a sweeper Deployment changed outside its
policy, reverted by ``drift``): at most DRIFT_MAX_REVERTS reverts in DRIFT_WINDOW
seconds, counted, recorded on the Deployment, and the DriftConflict past that,
until the sweeper is left alone a whole window or the policy is edited. Below
``reconcile`` (which counts a revert made at an operator start and ends a conflict
by an edit) and ``status_refresh`` (which ends a conflict the window closed). The only
module that changes a policy's ``DriftState``."""

from __future__ import annotations

import calendar
import dataclasses
import json
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from stalledpolicy.controller import FIELD_MANAGER, GROUP, events
from stalledpolicy.controller.api_errors import api_error_types, describe_api_error
from stalledpolicy.controller.objects import is_deleting
from stalledpolicy.controller.policy_state import PolicyState
from stalledpolicy.controller.status import FALSE
from stalledpolicy.policy.builder import APPLIED_DIGEST_ANNOTATION

if TYPE_CHECKING:  # for the annotations only: runtime imports this module (through sync)
    from stalledpolicy.controller.runtime import Controller

log = logging.getLogger("stalledpolicy.operator")


# Drift reverts allowed per policy in DRIFT_WINDOW seconds. Past that another writer
# (a second operator, an HPA, a GitOps tool) is changing the sweeper as fast as we put
# it back: every flip is a rollout, so stop reverting and say who it is. Reverts
# resume once the sweeper has been left alone for DRIFT_WINDOW seconds.
DRIFT_MAX_REVERTS = 3
DRIFT_WINDOW = 300.0


def other_field_managers(deployment: Mapping[str, Any]) -> list[str]:
    """The field managers of the Deployment's spec and metadata other than ours,
    most recent first (the status writers, the deployment controller, change no spec)."""
    entries = [e for e in (deployment.get("metadata") or {}).get("managedFields") or []
               if isinstance(e, Mapping) and e.get("manager") and e.get("manager") != FIELD_MANAGER
               and e.get("subresource") != "status"]
    entries.sort(key=lambda e: str(e.get("time") or ""), reverse=True)
    names: list[str] = []
    for entry in entries:
        if entry["manager"] not in names:
            names.append(entry["manager"])
    return names


# The drift reverts of the last DRIFT_WINDOW seconds, recorded on the sweeper
# Deployment itself (it is ours, and goes with its policy): an operator restarted in
# the middle of a fight still knows how many it has made. Comma-separated RFC 3339 times.
DRIFT_REVERTS_ANNOTATION = f"{GROUP}/drift-reverts"


def _format_time(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


def recorded_reverts(deployment: Mapping[str, Any]) -> list[float]:
    """The revert times recorded on ``deployment`` (a value that does not parse counts nothing)."""
    text = ((deployment.get("metadata") or {}).get("annotations") or {}).get(DRIFT_REVERTS_ANNOTATION) or ""
    times = []
    for item in text.split(","):
        try:
            times.append(float(calendar.timegm(time.strptime(item.strip(), "%Y-%m-%dT%H:%M:%SZ"))))
        except ValueError:
            continue
    return times


def _record_reverts(ctl: Controller, state: PolicyState, deployment_name: str, times: list[float],
                    applied_generation: int) -> None:
    """Write the revert times on the sweeper Deployment (a merge patch of one
    annotation, in the policy's sync) just after our apply made
    ``applied_generation``. A Deployment's annotations are part of its generation
    (the API server copies them to its ReplicaSets): the one this write makes is
    ours, like an apply's, never drift to revert, when it is the very next one; a
    later one means another writer changed the sweeper between our apply and this
    write, and that change is drift (taking it as ours kept it unnoticed). The pod
    template is unchanged, so no rollout. Failing, this process still counts the
    reverts; only a restart before the next write forgets them."""
    namespace = state.key[0]
    value = ",".join(_format_time(t) for t in times) or None  # none: the annotation removed
    try:
        response = ctl.apps.patch_namespaced_deployment(
            deployment_name, namespace, {"metadata": {"annotations": {DRIFT_REVERTS_ANNOTATION: value}}},
            field_manager=FIELD_MANAGER, _content_type="application/merge-patch+json", _preload_content=False)
        written = json.loads(response.data)
    except api_error_types() as exc:
        log.warning("could not record the drift reverts on the sweeper Deployment: %s", describe_api_error(exc),
                    extra={"namespace": namespace, "policy": state.key[1], "deployment": deployment_name})
        return
    ctl.observe_deployment(written, read=True)
    generation = int((written.get("metadata") or {}).get("generation") or 0)
    if generation != applied_generation + 1:
        return  # unchanged (nothing to take), or another writer came in between (drift)
    with state.lock:
        if state.outcome is not None and state.outcome.ok and generation > (state.outcome.deployment_generation or 0):
            state.outcome = dataclasses.replace(state.outcome, deployment_generation=generation)


def drift_allowed(ctl: Controller, state: PolicyState, deployment: Mapping[str, Any], now: float,
                   posts: events.DeferredPosts) -> bool:
    """Whether the policy's budget allows another revert (in its sync, under its
    status lock; a revert that happens is counted by the caller); False (a
    DriftConflict Warning and the policy's SweeperInSync condition, once per
    conflict) when another writer keeps changing the sweeper. The reverts counted
    are this process's and those recorded on the Deployment (an earlier process's)."""
    meta = deployment.get("metadata") or {}
    generation = int(meta.get("generation") or 0)
    if state.drift.conflict:
        if now - (state.drift.last_seen or now) < DRIFT_WINDOW:
            if generation > state.drift.seen_generation:  # a change, not a status write
                state.drift.last_seen, state.drift.seen_generation = now, generation
            return False
        _end_drift_conflict(state)  # left alone long enough: revert again
    state.drift.last_seen, state.drift.seen_generation = now, generation
    # Each revert writes the whole list: the longer one knows every revert (the
    # Deployment's, after a restart; ours, if the other writer dropped the annotation).
    ours, recorded = ([t for t in times if now - t < DRIFT_WINDOW]
                      for times in (state.drift.reverts, recorded_reverts(deployment)))
    state.drift.reverts[:] = ours if len(ours) >= len(recorded) else recorded
    if len(state.drift.reverts) < DRIFT_MAX_REVERTS:
        return True
    ctl.metrics.drift_conflicts.inc()
    others = other_field_managers(deployment)
    who = (f"field manager {others[0]!r}" + (f" (also {', '.join(others[1:])})" if others[1:] else "")
           if others else "another writer")
    message = (f"Deployment {meta.get('name')} was changed outside the policy {DRIFT_MAX_REVERTS + 1} times "
               f"in {int(DRIFT_WINDOW)} s, last by {who}; the operator stops reverting it until it is "
               f"left alone for {int(DRIFT_WINDOW)} s: stop the other writer (a second operator, an "
               "autoscaler, a GitOps tool) and edit the StalledPolicy instead")
    state.drift.conflict = message
    state.drift.conflict_generation = _applied_generation(state)
    log.warning(message, extra={"namespace": state.key[0], "policy": state.key[1],
                                "reason": events.DRIFT_CONFLICT})
    posts.post(state.body, events.WARNING, events.DRIFT_CONFLICT, message)
    ctl.kick(state.key)  # the condition
    return False


def _applied_generation(state: PolicyState) -> int:
    """The policy generation the sweeper was last applied for (the body's, before any apply)."""
    if state.outcome is not None and state.outcome.ok:
        return int(state.outcome.generation or 0)
    return int((state.body.get("metadata") or {}).get("generation") or 0)


def end_conflict_by_edit(state: PolicyState, generation: int) -> bool:
    """A reconcile that applied ``generation`` of the policy (in its sync):
    True, and the conflict ended with its revert budget refilled, when that is an
    edit made since the conflict began (the README: "an edit of the policy applies
    it at once"; so SweeperInSync turns True and Ready follows). The caller clears
    the reverts recorded on the Deployment (``clear_recorded_reverts``)."""
    with state.lock:
        if not state.drift.conflict or generation <= state.drift.conflict_generation:
            return False
        _end_drift_conflict(state)
        state.drift.resume = False
    log.info("the policy was edited during a drift conflict: its spec is applied, the conflict is over", extra={
        "namespace": state.key[0], "policy": state.key[1], "generation": generation})
    return True


def clear_recorded_reverts(ctl: Controller, state: PolicyState, applied: Mapping[str, Any]) -> None:
    """Remove the drift reverts annotation from the sweeper Deployment (a new revert
    budget), if the one just applied (``applied``, the API server's answer) has it."""
    meta = applied.get("metadata") or {}
    if DRIFT_REVERTS_ANNOTATION in (meta.get("annotations") or {}):
        _record_reverts(ctl, state, str(meta.get("name") or ""), [], int(meta.get("generation") or 0))


def _end_drift_conflict(state: PolicyState) -> None:
    state.drift.conflict = None
    state.drift.reverts.clear()


def conflict_from_status(state: PolicyState, in_sync: Mapping[str, Any] | None, generation: int, now: float) -> None:
    """A new policy state from a status whose SweeperInSync records a DriftConflict an
    earlier process declared: it lasts until the sweeper has been left alone for a
    whole window from ``now``; ``generation``, the one it was declared for."""
    in_sync = in_sync or {}
    if in_sync.get("status") != FALSE or in_sync.get("reason") != events.DRIFT_CONFLICT:
        return
    state.drift.conflict = in_sync.get("message") or events.DRIFT_CONFLICT
    state.drift.last_seen = now
    # the generation it was declared for (conditions carry the applied one)
    state.drift.conflict_generation = int(in_sync.get("observedGeneration") or generation or 0)


def conflict_holds_at_start(state: PolicyState, generation: int, deployment_generation: int | None) -> bool:
    """At an operator start (under the status lock): whether the conflict the status
    records holds for ``generation`` (none, or the policy was edited since it began:
    False, apply); the Deployment's generation is then the one seen (only a later
    change is drift)."""
    if not state.drift.conflict or generation > state.drift.conflict_generation:
        return False
    state.drift.seen_generation = max(state.drift.seen_generation, deployment_generation or 0)
    return True


def check_window(state: PolicyState, now: float) -> None:
    """The status refresh's look at the conflict (under the status lock): ends it once
    the window is over (``drift_conflict_over``), and the next apply is asked for."""
    if state.drift.conflict:
        state.drift.resume = drift_conflict_over(state, now) or state.drift.resume


def take_resume(state: PolicyState) -> bool:
    """Whether a conflict ended by its window asks for the spec to be applied again (once)."""
    resume: bool = state.drift.resume
    state.drift.resume = False
    return resume


def applied(state: PolicyState) -> None:
    """A successful reconcile: the policy's spec is on the sweeper again."""
    state.drift.reverting = False


def drift_conflict_over(state: PolicyState, now: float) -> bool:
    """The status loop's check (under the policy's status lock): True, and the
    conflict ended, once the sweeper has been left alone for DRIFT_WINDOW seconds;
    the caller applies the policy's spec again (what the other writer left is
    reverted); SweeperInSync is False Reverting until an apply succeeds, then True."""
    if not state.drift.conflict or now - (state.drift.last_seen or now) < DRIFT_WINDOW:
        return False
    _end_drift_conflict(state)
    state.drift.reverting = True
    log.info("sweeper Deployment left alone since the drift conflict; reverting again",
             extra={"namespace": state.key[0], "policy": state.key[1]})
    return True


def count_revert(ctl: Controller, state: PolicyState, deployment_name: str, seen: int, applied_generation: int,
                 now: float, while_down: bool = False) -> None:
    """An apply of ours (in the policy's sync) reverted generation ``seen``
    of the sweeper: one revert of the budget, recorded on the Deployment, counted
    in the metric and told in a DriftReverted event."""
    state.drift.reverts.append(now)
    _record_reverts(ctl, state, deployment_name, state.drift.reverts, applied_generation)
    ctl.metrics.drift_reverts.inc()
    when = " while the operator was not running" if while_down else ""
    ctl.recorder.post(state.body, events.NORMAL, events.DRIFT_REVERTED,
                      f"Deployment {deployment_name} was changed outside the policy{when} (generation {seen}); "
                      "the operator re-applied the policy's spec: edit the StalledPolicy instead")


def count_revert_at_start(ctl: Controller, state: PolicyState, existing: Mapping[str, Any], wanted: Mapping[str, Any],
                          applied: Mapping[str, Any], now: float) -> bool:
    """kopf's resume apply at an operator start (in the policy's sync, its
    outcome recorded): True, and counted as a revert (with those an earlier process
    recorded on the Deployment), when it changed a sweeper that still carried the
    digest of the very Deployment it applied (``wanted``): what it put back, someone
    else had changed while no operator ran. An edit of the policy, a rotated Secret
    or another operator version changes the digest: such an apply is no revert."""
    meta = existing.get("metadata") or {}
    digest = (meta.get("annotations") or {}).get(APPLIED_DIGEST_ANNOTATION)
    seen = int(meta.get("generation") or 0)
    made = int((applied.get("metadata") or {}).get("generation") or 0)
    if (digest != wanted["metadata"]["annotations"][APPLIED_DIGEST_ANNOTATION]
            or made <= seen or is_deleting(state.body)):
        return False
    with state.lock:
        recorded = [t for t in recorded_reverts(existing) if now - t < DRIFT_WINDOW]
        if len(recorded) > len(state.drift.reverts):
            state.drift.reverts[:] = recorded
    log.info("sweeper Deployment changed outside the policy while the operator was not running; re-applied",
             extra={"namespace": state.key[0], "policy": state.key[1], "deployment": meta.get("name"),
                    "generation": seen})
    count_revert(ctl, state, str(meta.get("name") or ""), seen, made, now, while_down=True)
    return True
