"""Status conditions of a StalledPolicy, as pure functions over plain lists.

Conditions are dicts in the CRD's shape (``type``, ``status``, ``reason``,
``message``, ``lastTransitionTime``, ``observedGeneration``), kept as a list
keyed by ``type``. Functions never mutate their input: they return a new list,
so comparing old and new tells whether a status patch is needed.

``lastTransitionTime`` changes only when a condition's ``status`` changes (a
new reason or message alone keeps it), as Kubernetes conventions ask.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

READY = "Ready"
SWEEPER_AVAILABLE = "SweeperAvailable"
REDIS_REACHABLE = "RedisReachable"
# False (reason DriftConflict) while another writer keeps changing the sweeper
# Deployment and the operator has stopped putting it back; absent until then.
SWEEPER_IN_SYNC = "SweeperInSync"

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"
_STATUSES = (TRUE, FALSE, UNKNOWN)

# Reasons used by the summary below; the operator may use any CamelCase word.

MESSAGE_MAX = 32768
# The CRD judges a condition's type and reason with CEL rules built from these
# very patterns and words (policy.resource): RE2 and Python read them alike
# (fullmatch here: "$" in Python also matches before a final newline).
CONDITION_TYPE_PATTERN = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                          r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$")
CONDITION_TYPE_FIX = ("must be a condition type: letters, digits, '-', '_' and '.', starting and ending "
                      "with a letter or digit, with an optional DNS-subdomain prefix and '/', for example "
                      "Ready or example.com/SweeperAvailable")
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
CONDITION_REASON_FIX = ("must be a CamelCase word: a letter, then letters, digits, '_', ',' or ':', "
                        "ending with a letter, digit or '_', for example SweeperAvailable")
_TYPE = re.compile(CONDITION_TYPE_PATTERN)
_REASON = re.compile(CONDITION_REASON_PATTERN)


@dataclass(frozen=True)
class Condition:
    """A condition's meaning, without its bookkeeping (time, generation)."""

    type: str
    status: str
    reason: str
    message: str = ""

    @classmethod
    def of(cls, condition: Mapping[str, Any]) -> Condition:
        return cls(
            type=str(condition["type"]),
            status=str(condition.get("status", UNKNOWN)),
            reason=str(condition.get("reason", "")),
            message=str(condition.get("message", "")),
        )


def format_time(now: datetime | str) -> str:
    """RFC 3339 UTC with second precision (``2026-12-02T15:56:25Z``), as the API stores it."""
    if isinstance(now, str):
        return now
    if now.tzinfo is None:
        raise ValueError("now: give a timezone-aware datetime (datetime.now(timezone.utc))")
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def utcnow() -> datetime:
    return datetime.now(UTC)


def get_condition(conditions: Iterable[Mapping[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    """The condition of that type (a copy), or None."""
    for condition in conditions or ():
        if condition.get("type") == type_:
            return dict(condition)
    return None


def condition_status(conditions: Iterable[Mapping[str, Any]] | None, type_: str) -> str:
    """``True``, ``False`` or ``Unknown`` (a missing condition is Unknown)."""
    found = get_condition(conditions, type_)
    return str(found.get("status", UNKNOWN)) if found else UNKNOWN


def set_condition(
    conditions: Sequence[Mapping[str, Any]] | None,
    type: str,  # noqa: A002 - the field's own name
    status: str | bool,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime | str,
) -> list[dict[str, Any]]:
    """A new condition list with ``type`` set (replaced in place, or appended).

    ``status`` may be a bool. ``lastTransitionTime`` is kept when the status is
    unchanged and set to ``now`` when it changes (or the condition is new).
    Raises ValueError for a status outside True/False/Unknown or a type or
    reason the CRD would refuse (in its words: the reason must be a CamelCase
    word). Messages are cut to the CRD's limit.
    """
    if isinstance(status, bool):
        status = TRUE if status else FALSE
    if status not in _STATUSES:
        raise ValueError(f"status: {status!r}; use True, False or Unknown")
    if not _TYPE.fullmatch(type or ""):
        raise ValueError(f"type: {type!r}; status.conditions type {CONDITION_TYPE_FIX}")
    if not _REASON.fullmatch(reason or ""):
        raise ValueError(f"reason: {reason!r}; status.conditions reason {CONDITION_REASON_FIX}")

    previous = get_condition(conditions, type)
    keep_time = previous is not None and previous.get("status") == status and previous.get(
        "lastTransitionTime"
    )
    updated: dict[str, Any] = {
        "type": type,
        "status": status,
        "reason": reason,
        "message": (message or "")[:MESSAGE_MAX],
        "lastTransitionTime": (previous["lastTransitionTime"] if keep_time and previous is not None
                               else format_time(now)),
    }
    if generation is not None:
        updated["observedGeneration"] = int(generation)

    result: list[dict[str, Any]] = []
    placed = False
    for condition in conditions or ():
        if condition.get("type") == type:
            result.append(updated)
            placed = True
        else:
            result.append(dict(condition))
    if not placed:
        result.append(updated)
    return result


def set_conditions(
    conditions: Sequence[Mapping[str, Any]] | None,
    updates: Iterable[Condition],
    generation: int | None,
    now: datetime | str,
) -> list[dict[str, Any]]:
    """:func:`set_condition` for several conditions at once."""
    result = [dict(c) for c in conditions or ()]
    for update in updates:
        result = set_condition(
            result, update.type, update.status, update.reason, update.message, generation, now
        )
    return result
