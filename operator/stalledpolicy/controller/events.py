"""Kubernetes Events on the policy (what ``kubectl describe stalledpolicy`` shows).

Posted through the core API from any thread (the status workers are not kopf
handlers, so kopf's own posting cannot be used there). A failed post is logged
and dropped: an Event is a courtesy, never a reason to fail a reconcile.
"""

from __future__ import annotations

import datetime as dt
import logging
import socket
from typing import Any, Mapping

from stalledpolicy.controller import FIELD_MANAGER, GROUP, KIND, VERSION

log = logging.getLogger(__name__)

NORMAL = "Normal"
WARNING = "Warning"
MESSAGE_MAX = 1024


# Reasons (CamelCase, as kubectl shows them).
BUDGET_CHANGED = "BudgetChanged"
DEAD_LETTERED = "DeadLettered"
REDIS_UNREACHABLE = "RedisUnreachable"
REDIS_REACHABLE = "RedisReachable"
REPLAYED = "Replayed"
REPLAY_FAILED = "ReplayFailed"
REPLAY_INCOMPLETE = "ReplayIncomplete"
NAME_CONFLICT = "NameConflict"
INVALID_SPEC = "InvalidSpec"
APPLY_FAILED = "ApplyFailed"
DRIFT_REVERTED = "DriftReverted"
DRIFT_CONFLICT = "DriftConflict"


def _budget(value: int | None) -> str:
    return "of the policy" if value is None else str(value)


def budget_change_message(old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    """Describe a change of the budgets between two specs, or None when they are equal."""
    def budgets(spec: Mapping[str, Any]) -> tuple[int, dict[str, int | None]]:
        lanes = {lane.get("name"): lane.get("maxStalled") for lane in spec.get("lanes") or []}
        return int(spec.get("maxStalled", 1)), lanes

    old_default, old_lanes = budgets(old or {})
    new_default, new_lanes = budgets(new or {})
    parts = []
    if old_default != new_default:
        parts.append(f"maxStalled {old_default} -> {new_default}")
    for lane in sorted(set(old_lanes) | set(new_lanes), key=str):
        before, after = old_lanes.get(lane), new_lanes.get(lane)
        if lane not in old_lanes:
            parts.append(f"lane {lane} added (maxStalled {_budget(after)})")
        elif lane not in new_lanes:
            parts.append(f"lane {lane} removed")
        elif before != after:
            parts.append(f"lane {lane} maxStalled {_budget(before)} -> {_budget(after)}")
    return "; ".join(parts) or None


def dead_letter_growth_message(queue: str, before: int | None, now: int) -> str | None:
    if before is None or now <= before:
        return None
    grown = now - before
    return (f"{grown} job{'s' if grown != 1 else ''} dead-lettered in queue {queue} "
            f"(morgue now holds {now}); inspect with `stalledpolicy morgue list`")


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_event(policy: Mapping[str, Any], type_: str, reason: str, message: str,
                now: str | None = None) -> dict:
    meta = policy.get("metadata") or {}
    stamp = now or _now()
    if len(message) > MESSAGE_MAX:
        message = message[: MESSAGE_MAX - 3] + "..."
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta.get('name', 'stalledpolicy')}.",
                     "namespace": meta.get("namespace")},
        "involvedObject": {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
        },
        "type": type_,
        "reason": reason,
        "message": message,
        "source": {"component": FIELD_MANAGER},
        "reportingComponent": FIELD_MANAGER,
        "reportingInstance": socket.gethostname()[:128],
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class EventRecorder:
    def __init__(self, core_api) -> None:
        self._core = core_api

    def post(self, policy: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        event = build_event(policy, type_, reason, message)
        namespace = event["metadata"]["namespace"]
        try:
            self._core.create_namespaced_event(namespace, event, _preload_content=False)
        except Exception as exc:  # noqa: BLE001 - see module docstring
            log.warning("could not post event", extra={
                "namespace": namespace, "policy": event["involvedObject"]["name"],
                "reason": reason, "error": type(exc).__name__})


class NullRecorder:
    """Collects events in memory (tests, dry runs)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str]] = []

    def post(self, policy: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append(((policy.get("metadata") or {}).get("name"), type_, reason, message))
