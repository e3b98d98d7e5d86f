"""Kubernetes Events on the policy (what ``kubectl describe stalledpolicy`` shows).

Posted through the core API from any thread (the status workers are not kopf
handlers, so kopf's own posting cannot be used there). A failed post is logged
and dropped: an Event is a courtesy, never a reason to fail a reconcile.

Repeats are folded the way client-go's EventRecorder does it (its correlator):

- the same (policy, type, reason, message) again within ``WINDOW_SECONDS`` of
  its last occurrence patches the existing Event's ``count``, ``lastTimestamp``
  and ``message`` instead of creating another object; if that Event is gone
  (404: expired or deleted) a new one is created;
- more than ``SIMILAR_MAX`` distinct messages of the same (policy, type, reason)
  within the window (a poison-job storm posts a ``DeadLettered`` with a new
  morgue size every refresh) are one Event from the ``SIMILAR_MAX + 1``-th on,
  its message the latest one prefixed with ``COMBINED_PREFIX``, its count the
  number of occurrences it stands for. Only messages whose post succeeded
  count toward that limit (an API server down does not use it up).

What is remembered for that (the Event's name and count per key, the distinct
messages per reason) lives in memory in two LRU caches of ``CACHE_SIZE``
entries each: a key pushed out, or a restart, only means the next repeat
creates a new Event. Messages pass ``redact_urls`` (callers scrub already; this
is the last line) and are cut to ``MESSAGE_MAX`` characters.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from stalledpolicy.controller import FIELD_MANAGER, GROUP, KIND, VERSION
from stalledpolicy.policy.builder import CONTAINER_NAME
from stalledpolicy.policy.models import ENV_LANES, ENV_MAX_STALLED, parse_lane_budgets
from stalledpolicy.redis_url.redaction import redact_urls

log = logging.getLogger(__name__)

NORMAL = "Normal"
WARNING = "Warning"
MESSAGE_MAX = 1024
# client-go's correlator: a repeat within 10 minutes is counted on the same
# Event; more than 10 distinct messages of one reason in 10 minutes are combined.
WINDOW_SECONDS = 600.0
SIMILAR_MAX = 10
CACHE_SIZE = 4096
COMBINED_PREFIX = "(combined from similar events): "


# Reasons (CamelCase, as kubectl shows them).
BUDGET_CHANGED = "BudgetChanged"
DEAD_LETTERED = "DeadLettered"
# EchoMQ's own reapers returned lapsed leases before the sweep counted them: the
# stall budget did not see those stalls (docs/echomq.md).
LAPSES_UNCOUNTED = "LapsesUncounted"
REDIS_UNREACHABLE = "RedisUnreachable"
REDIS_REACHABLE = "RedisReachable"
REPLAYED = "Replayed"
REPLAY_FAILED = "ReplayFailed"
REPLAY_INCOMPLETE = "ReplayIncomplete"
NAME_CONFLICT = "NameConflict"
# The sweeper of an earlier policy of the same name (deleted, then created again)
# is still there: the garbage collector deletes it, then this policy gets its own.
OLD_SWEEPER_DELETING = "OldSweeperDeleting"
INVALID_SPEC = "InvalidSpec"
APPLY_FAILED = "ApplyFailed"
DRIFT_REVERTED = "DriftReverted"
SWEEPER_ADOPTED = "SweeperAdopted"
DRIFT_CONFLICT = "DriftConflict"
# SweeperInSync's reason (no event) between the end of a DriftConflict and the
# apply that puts the policy's spec back.
DRIFT_REVERTING = "Reverting"
# An older policy of the operator's sweeps the same queue on the same Redis: this
# one gets no sweeper (two sweepers of one queue race, neither budget holds).
QUEUE_CLAIMED = "QueueClaimed"
# A policy held back by QUEUE_CLAIMED got its queue: its sweeper is applied now.
QUEUE_RELEASED = "QueueReleased"


def queue_released_message(queue: Any, claimed_by: tuple[Any, ...] | None) -> str:
    by = f" by {claimed_by[0]}/{claimed_by[1]}" if claimed_by else ""
    return f"queue {queue} is no longer claimed{by}: this policy's sweeper Deployment is applied"


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


def sweeper_budgets(deployment: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The budgets a sweeper Deployment runs with, read from its container's env and
    shaped as a policy spec's for ``budget_change_message``: ``maxStalled`` and each
    lane's effective budget (its own, else the policy's: the sweeper is only given
    that). None when they cannot be read there (no sweeper container, or an env
    value edited into something the sweeper would refuse)."""

    pod_spec = (((deployment or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
    container = next((c for c in pod_spec.get("containers") or [] if c.get("name") == CONTAINER_NAME), None)
    if container is None:
        return None
    env = {item.get("name"): item.get("value") for item in container.get("env") or [] if isinstance(item, Mapping)}
    try:
        max_stalled = int(str(env[ENV_MAX_STALLED]))
        lanes = parse_lane_budgets(env.get(ENV_LANES) or "")
    except (KeyError, TypeError, ValueError):
        return None
    return {"maxStalled": max_stalled,
            "lanes": [{"name": lane, "maxStalled": budget} for lane, budget in lanes.items()]}


def dead_letter_growth_message(queue: str, before: int | None, now: int) -> str | None:
    if before is None or now <= before:
        return None
    grown = now - before
    return (f"{grown} job{'s' if grown != 1 else ''} dead-lettered in queue {queue} "
            f"(morgue now holds {now}); inspect with `stalledpolicy morgue list`")


def uncounted_lapses_message(queue: str, before: int | None, now: int) -> str | None:
    if before is None or now <= before:
        return None
    grown = now - before
    return (f"{grown} lapsed lease{'s' if grown != 1 else ''} of queue {queue} returned by another reaper "
            f"before the sweep counted {'them' if grown != 1 else 'it'} ({now} in total): those stalls "
            f"did not count toward maxStalled; see stalledpolicy_lapses_uncounted and docs/echomq.md")


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _message(text: str) -> str:
    text = redact_urls(text)
    if len(text) > MESSAGE_MAX:
        text = text[: MESSAGE_MAX - 3] + "..."
    return text


def build_event(policy: Mapping[str, Any], type_: str, reason: str, message: str,
                now: str | None = None) -> dict[str, Any]:
    meta = policy.get("metadata") or {}
    stamp = now or _now()
    message = _message(message)
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


class _LRU:
    """A dict bounded to ``size`` entries; the least recently used goes first."""

    def __init__(self, size: int) -> None:
        self.size = max(1, int(size))
        self._items: OrderedDict[Hashable, Any] = OrderedDict()

    def get(self, key: Hashable) -> Any:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: Hashable, value: Any) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def pop(self, key: Hashable) -> None:
        self._items.pop(key, None)

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class _Posted:
    """The Event a key was last posted as."""
    name: str
    count: int
    seen: float  # clock() of the last occurrence


@dataclass
class _Similar:
    """Distinct messages (digests) of one (policy, type, reason) in the window."""
    messages: set[bytes | None]
    seen: float


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=16).digest()


def _created_name(response: Any) -> str | None:
    """The name the API server gave (generateName) from a create's response."""
    try:
        data = getattr(response, "data", response)
        body = json.loads(data) if isinstance(data, (bytes, str)) else data
        name = (body.get("metadata") or {}).get("name") if isinstance(body, Mapping) else None
        return name if isinstance(name, str) and name else None
    except (TypeError, ValueError, AttributeError):
        return None


class EventRecorder:
    """Posts Events on policies, folding repeats (see the module docstring).

    Thread-safe: posts of the same (policy, type, reason) are serialised (so a
    repeat never races its first post into two Events), others run in parallel.
    """

    _STRIPES = 32

    def __init__(self, core_api: Any, *, window: float = WINDOW_SECONDS, similar_max: int = SIMILAR_MAX,
                 cache_size: int = CACHE_SIZE, clock: Callable[[], float] = time.monotonic) -> None:
        self._core = core_api
        self._window = float(window)
        self._similar_max = int(similar_max)
        self._clock = clock
        self._posted = _LRU(cache_size)    # event key -> _Posted
        self._similar = _LRU(cache_size)   # (policy, type, reason) -> _Similar
        self._cache_lock = threading.Lock()
        self._stripes = [threading.Lock() for _ in range(self._STRIPES)]

    def cached(self) -> tuple[int, int]:
        """How many Events and how many (policy, type, reason) groups are remembered."""
        with self._cache_lock:
            return len(self._posted), len(self._similar)

    def post(self, policy: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        event = build_event(policy, type_, reason, message)
        namespace = event["metadata"]["namespace"]
        involved = event["involvedObject"]
        group = (namespace, involved["apiVersion"], involved["kind"], involved["name"],
                 involved["uid"], type_, reason)
        with self._stripes[hash(group) % self._STRIPES]:
            try:
                self._post(event, group)
            except Exception as exc:  # noqa: BLE001 - see module docstring
                log.warning("could not post event", extra={
                    "namespace": namespace, "policy": involved["name"],
                    "reason": reason, "error": type(exc).__name__})

    def _key(self, event: dict[str, Any], group: tuple[Any, ...], now: float) -> tuple[Hashable, bytes | None]:
        """The event's key: its own message, or the group's combined Event once
        more than ``similar_max`` distinct messages came within the window; and
        the message's digest to remember once the post succeeded (None: nothing
        to remember). Nothing is remembered here: a post that fails uses up no
        place among the similar messages."""
        digest = _digest(event["message"])
        with self._cache_lock:
            similar = self._similar_within_window(group, now)
            if digest in similar.messages or len(similar.messages) < self._similar_max:
                return group + (digest,), digest
        event["message"] = _message(COMBINED_PREFIX + event["message"])
        return group + (None,), None

    def _remember(self, group: tuple[Any, ...], digest: bytes | None, now: float) -> None:
        """A post of ``group`` succeeded: its message counts among the similar ones."""
        with self._cache_lock:
            similar = self._similar_within_window(group, now)
            similar.seen = now
            if digest is not None:
                similar.messages.add(digest)
            self._similar.put(group, similar)

    def _similar_within_window(self, group: tuple[Any, ...], now: float) -> _Similar:
        """The group's distinct messages of the current window (a new, empty one
        once the window has passed). Call with ``_cache_lock`` held."""
        similar = self._similar.get(group)
        if similar is None or now - similar.seen > self._window:
            return _Similar(set(), now)
        found: _Similar = similar
        return found

    def _post(self, event: dict[str, Any], group: tuple[Any, ...]) -> None:
        from kubernetes.client.exceptions import ApiException  # deferred: the kubernetes client takes 0.4 s to import

        now = self._clock()
        key, digest = self._key(event, group, now)
        namespace = event["metadata"]["namespace"]
        with self._cache_lock:
            posted = self._posted.get(key)
        if posted is not None and now - posted.seen <= self._window:
            count = posted.count + 1
            patch = {"count": count, "lastTimestamp": event["lastTimestamp"],
                     "message": event["message"]}
            try:
                response = self._core.patch_namespaced_event(posted.name, namespace, patch,
                                                             _preload_content=False)
                getattr(response, "data", None)  # read: the connection goes back to the pool
            except ApiException as exc:
                if exc.status != 404:
                    raise
                # expired or deleted: forget it, and create it anew below
                with self._cache_lock:
                    self._posted.pop(key)
            else:
                with self._cache_lock:
                    self._posted.put(key, _Posted(posted.name, count, now))
                self._remember(group, digest, now)
                return
        response = self._core.create_namespaced_event(namespace, event, _preload_content=False)
        name = _created_name(response)
        with self._cache_lock:
            if name:
                self._posted.put(key, _Posted(name, 1, now))
            else:  # no name to patch: the next repeat creates again
                self._posted.pop(key)
        self._remember(group, digest, now)


class DeferredPosts:
    """Events decided under a policy's lock, posted once it is let go: a post is an
    API call (up to the 30 s deadline), and while the lock is held the policy's
    watch events and reconciles wait for it. Same ``post`` as a recorder."""

    def __init__(self) -> None:
        self._posts: list[tuple[Mapping[str, Any], str, str, str]] = []

    def post(self, policy: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self._posts.append((policy, type_, reason, message))

    def flush(self, recorder: Any) -> None:
        """Post what was kept to ``recorder``, in order (call without the lock)."""
        posts, self._posts = self._posts, []
        for post in posts:
            recorder.post(*post)

    @contextlib.contextmanager
    def flushed_to(self, recorder: Any) -> Iterator[DeferredPosts]:
        """``with posts.flushed_to(recorder), state.lock:`` posts once the lock is let
        go (context managers exit in reverse order), however the block ends."""
        try:
            yield self
        finally:
            self.flush(recorder)


class NullRecorder:
    """Collects events in memory (tests, dry runs)."""

    def __init__(self) -> None:
        self.events: list[tuple[str | None, str, str, str]] = []

    def post(self, policy: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append(((policy.get("metadata") or {}).get("name"), type_, reason, message))
