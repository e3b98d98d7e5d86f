"""The only writer of a policy's ``StatusCache`` (policy_state.py), each function
called under the policy's ``lock``: which body of the policy is the newest, the
status as written and as the API server holds it, the problem logged, the Redis endpoint the queue figures came from.
docs/architecture.md, "A policy's state"."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from stalledpolicy.controller.objects import WRITE_ECHO_TIMEOUT, generation_of, resource_version, snapshot
from stalledpolicy.controller.policy_state import PolicyState, StatusCache
from stalledpolicy.controller.status import Problem
from stalledpolicy.controller.status_document import status_patch, without_queue_figures


def first_seen(body: Mapping[str, Any]) -> StatusCache:
    """The cache of a policy new to this process: the status its body carries."""
    return StatusCache(status=dict(body.get("status") or {}))


def take_body(state: PolicyState, fresh: dict[str, Any]) -> bool:
    """Make ``fresh`` (this policy, same uid) the body we know, unless it is older.
    A version seen before and since replaced is older (kopf's handler body, a
    watch event sent again). While a status write of ours waits for the watch to
    deliver its version, the watch events before it are older than the body the
    write returned: their status would pass for the one the server holds and the
    whole status would be written again, the same. Equality of versions only."""
    cache = state.status_cache
    version = resource_version(fresh)
    current = resource_version(state.body)
    if cache.awaited_version is not None:
        caught_up = (version == cache.awaited_version
                     or generation_of(fresh) > generation_of(state.body)  # a spec change after our write
                     or status_patch(fresh.get("status") or {}, cache.stored or {}) is None
                     or time.monotonic() - cache.awaited_since > WRITE_ECHO_TIMEOUT)
        if not caught_up:
            # older than our write, and so for good: kopf's handler may bring
            # it back after the watch has caught up
            if version != current:
                cache.seen_versions.append(version)
            return False
        cache.awaited_version = None
    if version != current and version in cache.seen_versions:
        return False
    if version != current:
        cache.seen_versions.append(current)
    state.body = fresh
    cache.stored = dict(fresh.get("status") or {})
    return True


def written(state: PolicyState, status: dict[str, Any], answer: Any, uid: str | None) -> None:
    """Our status write of ``status`` succeeded; ``answer`` is the API server's reply.
    That reply (the policy of ``uid`` as our write left it) is newer than anything
    the watch has shown: the watch events until its own are older (``take_body``)."""
    cache = state.status_cache
    if isinstance(answer, Mapping) and (answer.get("metadata") or {}).get("uid") == uid and resource_version(answer):
        if resource_version(answer) != resource_version(state.body):
            cache.seen_versions.append(resource_version(state.body))
        state.body = snapshot(answer)
        cache.awaited_version, cache.awaited_since = resource_version(answer), time.monotonic()
    cache.status = cache.stored = status


def read_back(state: PolicyState, stored: Mapping[str, Any] | None) -> None:
    """The status the API server holds, read after a refused patch: the next is made against it."""
    state.status_cache.stored = dict(stored or {})


def endpoint_read(state: PolicyState, endpoint: tuple[Any, ...] | None, changed: bool) -> None:
    """The Redis endpoint judged by this refresh (queue_figures.endpoint_changed);
    ``changed``: another Redis, whose figures are not the ones in status (dropped
    until it is read, so no DeadLettered for its morgue's first reading)."""
    cache = state.status_cache
    cache.redis_endpoint = endpoint
    if changed:
        cache.status = without_queue_figures(cache.status)


def problem_changed(state: PolicyState, problem: Problem | None) -> bool:
    """Whether ``problem`` (None: none) is not the one logged last; it is from now."""
    cache = state.status_cache
    if problem == cache.logged_problem:
        return False
    cache.logged_problem = problem
    return True
