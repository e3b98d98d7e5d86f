"""The status a policy should show, and the patch that writes only what changed.

``desired_status`` turns what the operator knows (the reconcile outcome, the
sweeper Deployment's state, one queue snapshot or the reason it could not be
read) into the status it should show; ``status_patch`` keeps only what differs
from the status shown now, and ``status_json_patch`` sends it guarded by the
policy's uid. ``observedGeneration`` (and each condition's) is the generation
the last reconcile applied, never a newer one: so ``kubectl wait
--for=condition=Ready`` after an edit waits for that edit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from stalledpolicy.controller.status import (
    DeploymentState,
    Problem,
    ReconcileOutcome,
    condition_of,
    in_sync_condition,
    ready_condition,
    redis_condition,
    sweeper_condition,
    utc_now,
)
from stalledpolicy.policy.conditions import READY, REDIS_REACHABLE, SWEEPER_AVAILABLE, SWEEPER_IN_SYNC, set_condition

if TYPE_CHECKING:  # for the annotations only: the engine imports redis-py
    from stalledpolicy.engine import QueueSnapshot


def snapshot_numbers(snapshot: QueueSnapshot) -> dict[str, Any]:
    return {
        "deadLetters": snapshot.dead,
        "pending": snapshot.pending,
        "active": snapshot.active,
        "recoveredTotal": snapshot.recovered_total,
        "deadLetteredTotal": snapshot.dead_lettered_total,
        "orphansTotal": snapshot.orphans_total,
        "quarantinedTotal": snapshot.quarantined_total,
        "uncountedLapsesTotal": snapshot.uncounted_total,
        "lanes": [{"name": lane.name, "pending": lane.pending,
                   "deadLettered": lane.dead_lettered_total, "recovered": lane.recovered_total}
                  for lane in snapshot.lanes],
    }


# The status fields read from the queue's Redis: dropped when the policy names
# another Redis (spec.redis, or the URL its Secret holds), until the new one is read.
QUEUE_FIGURES = ("deadLetters", "pending", "active", "recoveredTotal", "deadLetteredTotal",
                 "orphansTotal", "quarantinedTotal", "uncountedLapsesTotal", "lanes")


class _Removed:
    """A member of a status patch to remove from the stored status."""

    def __repr__(self) -> str:
        return "REMOVED"


REMOVED = _Removed()


def without_queue_figures(status: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (status or {}).items() if k not in QUEUE_FIGURES}


def desired_status(previous: Mapping[str, Any] | None, *, outcome: ReconcileOutcome,
                   deployment: DeploymentState | None, deployment_name: str,
                   snapshot: QueueSnapshot | None = None, problem: Problem | None = None,
                   last_replay: Mapping[str, Any] | None = None, now: str | None = None,
                   drift_conflict: str | None = None, drift_reverting: bool = False) -> dict[str, Any]:
    """The status to show. Numbers of a failed read keep their last values.
    ``drift_conflict``: the DriftConflict message while the operator has stopped
    reverting the sweeper; SweeperInSync appears with the first one (True once over).
    ``drift_reverting``: the conflict is over, the policy's spec not applied again yet."""
    previous = dict(previous or {})
    now = now or utc_now()
    generation = outcome.generation
    redis = redis_condition(problem)
    sweeper = sweeper_condition(outcome, deployment, deployment_name, drift_conflict)
    in_sync = None
    if drift_conflict or drift_reverting or condition_of(previous, SWEEPER_IN_SYNC) is not None:
        in_sync = in_sync_condition(drift_conflict, deployment_name, reverting=drift_reverting)
    ready = ready_condition(outcome, sweeper, redis, in_sync)
    conditions = list(previous.get("conditions") or [])
    updates = [(READY, ready), (SWEEPER_AVAILABLE, sweeper), (REDIS_REACHABLE, redis)]
    if in_sync is not None:
        updates.append((SWEEPER_IN_SYNC, in_sync))
    for type_, condition in updates:
        conditions = set_condition(conditions, type_, condition.status, condition.reason,
                                   condition.message, generation, now)
    status = {k: v for k, v in previous.items() if k != "lastUpdateTime"}
    status.update({"observedGeneration": generation, "conditions": conditions,
                   "sweeperDeployment": deployment_name})
    if snapshot is not None:
        status.update(snapshot_numbers(snapshot))
    if last_replay is not None:
        status["lastReplay"] = dict(last_replay)
    if previous.get("lastUpdateTime"):
        status["lastUpdateTime"] = previous["lastUpdateTime"]
    if status_patch(previous, status):
        status["lastUpdateTime"] = now
    return status


def _stored_form(value: Any) -> Any:
    """``value`` as the API server keeps it: a stored status never holds a null
    (none of its fields is nullable), so none is written either."""
    if isinstance(value, Mapping):
        return {k: _stored_form(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_stored_form(v) for v in value]
    return value


def status_patch(previous: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> dict[str, Any] | None:
    """The top-level members of ``desired`` that differ from ``previous``, or None if equal
    (written by :func:`status_json_patch`, each member set whole).

    ``lastUpdateTime`` alone is never a change (it only follows real changes).
    """
    previous = previous or {}
    # Equal members are equal in stored form too: the stored forms are built only for
    # members that differ as they are (every refresh compares the whole status twice;
    # nearly always equal).
    patch = {key: value for key, value in desired.items()
             if key != "lastUpdateTime" and previous.get(key) != value
             and _stored_form(previous.get(key)) != _stored_form(value)}
    # queue figures of another Redis (``without_queue_figures``) are removed
    patch.update({key: REMOVED for key in QUEUE_FIGURES if key in previous and key not in desired})
    if not patch:
        return None
    if "lastUpdateTime" in desired:
        patch["lastUpdateTime"] = desired["lastUpdateTime"]
    return patch


def _pointer(key: str) -> str:
    """``key`` as one JSON Pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def status_json_patch(uid: str | None, stored: Mapping[str, Any] | None,
                      patch: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``patch`` (from :func:`status_patch`) as a JSON patch for the status subresource,
    guarded by a ``test`` of ``metadata.uid``: the API server applies it to the
    policy of that uid only, and refuses it (422) when the name now belongs to a
    policy created since. A merge patch has no such guard (a ``metadata.uid`` in it
    is dropped by the status subresource, not compared), so a write still in flight
    for a deleted policy would land on its successor. ``stored`` is the status the
    server holds as far as we know: empty, the patch sets the whole ``/status``
    (its members cannot be added to a status that does not exist)."""
    ops: list[dict[str, Any]] = []
    if uid:
        ops.append({"op": "test", "path": "/metadata/uid", "value": uid})
    if not stored:
        ops.append({"op": "add", "path": "/status",
                    "value": _stored_form({k: v for k, v in patch.items() if v is not REMOVED})})
    else:
        ops.extend({"op": "remove", "path": f"/status/{_pointer(key)}"} if value is REMOVED else
                   {"op": "add", "path": f"/status/{_pointer(key)}", "value": _stored_form(value)}
                   for key, value in patch.items())
    return ops
