"""The loop: ``sync(ctl, key)``, the one place a policy's sweeper Deployment is applied.

The ``Scheduler`` runs it for a policy key when a trigger enqueued the key (an
``ApplyRequest``, or a kick) and after the delay it returned. A sync applies the
pending requests (``reconcile``), refreshes the status (``StatusRefresh``),
applies again at once when the refresh found a reason, and returns the delay
before the next sync: the status interval, or sooner when a failed apply's retry
is due (``Retries``, the one retry policy). docs/architecture.md has the trigger
table and the reasoning.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from stalledpolicy.controller.apply_requests import ApplyRequest
from stalledpolicy.controller.objects import generation_of, is_deleting
from stalledpolicy.controller.policy_state import PolicyState
from stalledpolicy.controller.queue_claims import claim_reconcile_reason
from stalledpolicy.controller.reconcile import reconcile
from stalledpolicy.controller.redis_clients import PolicyKey
from stalledpolicy.controller.retry import InvalidPolicy, RetryLater

if TYPE_CHECKING:  # for the annotations only: runtime imports this module
    from stalledpolicy.controller.runtime import Controller

log = logging.getLogger("stalledpolicy.operator")
NEW_GENERATION = "new-generation"  # the ApplyRequest kind of a generation no apply has had
FOUND_BY_REFRESH = "found-by-refresh"  # the kind of a reason the status refresh found
APPLIED_SOON = 1.0  # after an apply the refresh found a reason for: its outcome in status soon


def sync(ctl: Controller, key: PolicyKey) -> float | None:
    """Apply what is asked (or due), refresh the status; the delay before the next
    sync of ``key``, or None when the policy is gone or not applied yet."""
    state = ctl.policies.get(key)
    if state is None:
        return None
    _request_new_generation(ctl, state)
    _apply_pending(ctl, state)
    if ctl.policies.get(key) is not state:
        return None
    if state.outcome is None:
        # no apply asked for yet in this process (kopf's handler enqueues the key)
        # or none recorded (the namespace is being deleted)
        return _retry_wait(ctl, key)
    refreshed = ctl.status_refresh().refresh(state)
    if refreshed is None:
        return None
    delay, why, queue_moves = refreshed
    if queue_moves:
        ctl.kick_queue((state.body.get("spec") or {}).get("queue"), key)
    if why is None:
        why = claim_reconcile_reason(ctl, state)  # outside the status lock: it may read other policies' Secrets
    if why is not None:
        # Found by the refresh, no event: a retry of it waits for the backoff.
        ctl.pending_applies.add(key, ApplyRequest(why, kind=FOUND_BY_REFRESH), fresh=False)
        if _apply_pending(ctl, state):
            delay = min(delay, APPLIED_SOON)
    wait = _retry_wait(ctl, key)
    return delay if wait is None else min(delay, wait)


def _retry_wait(ctl: Controller, key: PolicyKey) -> float | None:
    """Seconds until the pending requests of ``key`` are due, or None (none pending)."""
    if not ctl.pending_applies.pending(key):
        return None
    return 0.0 if ctl.pending_applies.fresh(key) else ctl.retries.wait(key)


def _request_new_generation(ctl: Controller, state: PolicyState) -> None:
    """A policy generation newer than the one last applied, seen since (the watch, or
    our status write's answer): applied by this sync, once per generation, whether
    or not kopf calls a handler for it (docs/architecture.md, "Not kopf's old").
    A failed apply is left to its own retries; a policy being deleted is not applied."""
    outcome = state.outcome
    generation = generation_of(state.body)
    if outcome is None or generation <= int(outcome.generation or 0) or is_deleting(state.body):
        return
    if generation <= state.generation_requested:
        return
    state.generation_requested = generation
    ctl.pending_applies.add(state.key, ApplyRequest(
        f"policy generation {generation} is not applied yet", kind=NEW_GENERATION, generation=generation))


def _apply_pending(ctl: Controller, state: PolicyState) -> bool:
    """Apply the pending requests of ``state``'s policy when they are due: True when
    an apply was made. A request sync could not apply is
    put back, due after the key's backoff."""
    key = state.key
    pending = ctl.pending_applies
    if not pending.pending(key) or (not pending.fresh(key) and ctl.retries.wait(key) > 0):
        return False
    requests = pending.take(key)
    try:
        return _apply(ctl, state, requests)
    finally:
        for request in requests:
            request.taken.set()


def _apply(ctl: Controller, state: PolicyState, requests: list[ApplyRequest]) -> bool:
    key = state.key
    if ctl.policies.get(key) is not state:
        return False
    try:
        chosen = [(request, body) for request in requests
                  if (body := _body_to_apply(ctl, state, request)) is not None]
        if not chosen:
            return False
        body = max((body for _, body in chosen), key=generation_of)
        resume = any(request.resume for request, _ in chosen)
        for request, _ in chosen:
            if not request.quiet and not ctl.retries.failures(key):  # once per streak of failures
                log.info("applying the sweeper Deployment", extra={
                    "namespace": key[0], "policy": key[1], "why": request.why})
        outcome = reconcile(ctl, body, resume=resume, state=state)
    except InvalidPolicy:
        ctl.retries.succeeded(key)  # nothing to retry until the spec changes
        return True
    except RetryLater as exc:
        ctl.retries.failed(key, exc.first_delay)
        ctl.pending_applies.put_back(key, requests)
        return True
    ctl.retries.succeeded(key)
    for request, _ in chosen:
        if request.done is not None:
            request.done(outcome)
    return True


def _body_to_apply(ctl: Controller, state: PolicyState, request: ApplyRequest) -> Mapping[str, Any] | None:
    """The policy ``request`` asks to apply, or None when it has nothing left to do."""
    uid = (state.body.get("metadata") or {}).get("uid")
    if request.body is not None and (request.body.get("metadata") or {}).get("uid") != uid:
        return None  # another policy of that name's (deleted since)
    if request.generation is not None and not request.resume:
        outcome = state.outcome
        if outcome is not None and outcome.ok and int(outcome.generation or 0) >= request.generation:
            return None  # applied already (the request of a newer event, or our own level check)
    if request.check is not None:
        return request.check()
    return request.body if request.body is not None else state.body

