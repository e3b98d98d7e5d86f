"""The sweeper Deployment's events that ask for an apply: deleted (put it back; or
the sweeper of a deleted predecessor of the same name is gone: apply the new
policy's now), and an owner reference lost (adopt it). Each adds an
``ApplyRequest`` for ``sync`` and enqueues the policy's key; none applies."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from stalledpolicy.controller import GROUP, PLURAL, VERSION, events
from stalledpolicy.controller.api_errors import api_error_types, describe_api_error
from stalledpolicy.controller.apply import adoptable, controller_owner, earlier_policy_uid, policy_owner
from stalledpolicy.controller.apply_requests import ApplyRequest
from stalledpolicy.controller.objects import is_deleting, sweeper_name
from stalledpolicy.controller.policy_state import PolicyState
from stalledpolicy.controller.redis_clients import PolicyKey
from stalledpolicy.controller.retry import RetryLater
from stalledpolicy.controller.status import ReconcileOutcome

if TYPE_CHECKING:  # for the annotations only: runtime imports this module (through sync)
    from stalledpolicy.controller.runtime import Controller


log = logging.getLogger("stalledpolicy.operator")
SWEEPER_DELETED, SWEEPER_ADOPTED = "sweeper-deleted", "sweeper-adopted"  # ApplyRequest kinds
SWEEPER_SUFFIX = "-sweeper"  # sweeper_name's, for a policy name that fits
_SHORTENED = re.compile(r"-[0-9a-f]{8}-sweeper$")  # sweeper_name of a name too long to fit


def is_current(ctl: Controller, key: PolicyKey, state: PolicyState) -> bool:
    """``state`` is still the policy's (not forgotten, not replaced by a new uid)."""
    return ctl.policies.get(key) is state


def _named_owner(deployment: Mapping[str, Any]) -> tuple[PolicyKey, Mapping[str, Any]] | None:
    """``(key, owner)`` of the StalledPolicy named as this Deployment's controller, when
    the Deployment carries that policy's sweeper name; else None."""
    meta = deployment.get("metadata") or {}
    owner = policy_owner(deployment)
    if owner is None:
        return None
    key = (str(meta.get("namespace") or ""), str(owner.get("name") or ""))
    if sweeper_name(key[1]) != meta.get("name"):
        return None
    return key, owner


def owned_policy_state(ctl: Controller,
                       deployment: Mapping[str, Any]) -> tuple[PolicyKey, PolicyState, Mapping[str, Any]] | None:
    """``(key, state, owner)`` of the policy this sweeper Deployment belongs to, when
    we know that policy (same uid), it is not being deleted, its last reconcile
    succeeded and the Deployment has its sweeper's name; else None. Memory only."""
    named = _named_owner(deployment)
    if named is None:
        return None
    key, owner = named
    state = ctl.policies.get(key)
    if state is None or state.outcome is None or not state.outcome.ok:
        return None
    if (state.body.get("metadata") or {}).get("uid") != owner.get("uid"):
        return None
    if is_deleting(state.body):
        return None
    return key, state, owner


def _waiting_policy(ctl: Controller, deployment: Mapping[str, Any]) -> PolicyKey | None:
    """The policy (created again under its old name) waiting for this Deployment,
    the sweeper of its deleted predecessor, to be gone; else None. Memory only."""
    named = _named_owner(deployment)
    if named is None:
        return None
    key = named[0]
    state = ctl.policies.get(key)
    if state is None or state.outcome is None or state.outcome.reason != events.OLD_SWEEPER_DELETING:
        return None
    if earlier_policy_uid(deployment, key[1], str((state.body.get("metadata") or {}).get("uid") or "")) is None:
        return None
    return key


def _policy_still_there(ctl: Controller, key: PolicyKey, state: PolicyState, owner: Mapping[str, Any],
                        deployment: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The check of the request ``reapply_after_deletion`` makes (run by sync): the
    policy as the API server holds it when it still exists and is not being deleted
    (the garbage collector deletes the sweeper right after it: ask the API server,
    not our memory); else None. Unreadable (the API server down or refusing): an
    ApplyFailed like any API error of a reconcile, and ``RetryLater``. A policy
    deleted meanwhile is forgotten before the retry (its status write is refused)."""
    from kubernetes.client.exceptions import ApiException  # deferred: the kubernetes client takes 0.4 s to import

    try:
        current = ctl.custom.get_namespaced_custom_object(GROUP, VERSION, key[0], PLURAL, key[1])
    except api_error_types() as exc:
        if isinstance(exc, ApiException) and exc.status == 404:
            return None  # gone: its sweeper went with it
        generation = int((state.body.get("metadata") or {}).get("generation") or 0)
        message = (f"Deployment {key[0]}/{(deployment.get('metadata') or {}).get('name')} was deleted and "
                   f"cannot be re-created yet: cannot check that StalledPolicy {key[0]}/{key[1]} still exists: "
                   f"{describe_api_error(exc)}; retrying")
        ctl.record_outcome(state.body, ReconcileOutcome(generation, False, events.APPLY_FAILED, message))
        raise RetryLater(message, events.APPLY_FAILED) from None
    if (current.get("metadata") or {}).get("uid") != owner.get("uid") or (
            current.get("metadata") or {}).get("deletionTimestamp"):
        return None
    log.info("sweeper Deployment deleted; re-applying", extra={"namespace": key[0], "policy": key[1]})
    found: Mapping[str, Any] = current
    return found


def reapply_after_deletion(ctl: Controller, deployment: Mapping[str, Any]) -> None:
    """Someone deleted a sweeper whose policy still exists: ask sync to put it back.
    Or the garbage collector deleted the sweeper of a deleted policy whose name a
    new policy took: ask sync to apply the new one's now, not at its next retry."""
    waiting = _waiting_policy(ctl, deployment)
    if waiting is not None:
        state = ctl.policies.get(waiting)
        if state is not None and not is_deleting(state.body):
            log.info("old sweeper Deployment deleted; applying the policy's own", extra={
                "namespace": waiting[0], "policy": waiting[1]})
            ctl.request_apply(waiting, ApplyRequest("the old sweeper Deployment was deleted", kind=SWEEPER_DELETED,
                                                    quiet=True))
        return
    owned = owned_policy_state(ctl, deployment)
    if owned is None:
        return
    key, state, owner = owned

    def recreated(outcome: ReconcileOutcome | None) -> None:
        if outcome is not None:
            ctl.metrics.sweepers_recreated.inc()

    ctl.request_apply(key, ApplyRequest(
        "the sweeper Deployment was deleted", kind=SWEEPER_DELETED, quiet=True,
        check=lambda: _policy_still_there(ctl, key, state, owner, deployment), done=recreated))


def disowned_policy(ctl: Controller, deployment: Mapping[str, Any]) -> PolicyKey | None:
    """The known, current policy whose sweeper this Deployment is, when it has lost
    its owner reference (apply.adoptable); else None. Memory only: asked on every
    event of a Deployment carrying our labels."""
    meta = deployment.get("metadata") or {}
    if meta.get("deletionTimestamp") or controller_owner(deployment) is not None:
        return None
    namespace, name = meta.get("namespace") or "", meta.get("name")
    # The policy named by the Deployment's name, one look-up: ``<policy>-sweeper``.
    if name and name.endswith(SWEEPER_SUFFIX):
        key = (namespace, name[:-len(SWEEPER_SUFFIX)])
        state = ctl.policies.get(key)
        if state is not None and sweeper_name(key[1]) == name and adoptable(deployment, key[1]):
            return key if not is_deleting(state.body) else None
    if not (name and _SHORTENED.search(name)):
        return None
    # A hash-shortened name (a policy name past 245 characters) names no policy
    # itself: only then are the known policies looked through. At most one is
    # adoptable (the policy label is a hash of the whole name too).
    for key, state in list(ctl.policies.items()):
        if key[0] == namespace and sweeper_name(key[1]) == name and adoptable(deployment, key[1]):
            return key if not is_deleting(state.body) else None
    return None


def adopt_sweeper(ctl: Controller, deployment: Mapping[str, Any]) -> None:
    """A policy's sweeper lost its owner reference: ask sync to apply the policy's
    spec, which puts it back (else the garbage collector would never delete the
    sweeper with its policy, and every later reconcile would call it a NameConflict)."""
    key = disowned_policy(ctl, deployment)
    state = ctl.policies.get(key) if key is not None else None
    if key is None or state is None:
        return
    name = (deployment.get("metadata") or {}).get("name")
    log.info("sweeper Deployment lost its owner reference; re-applying it as the policy's", extra={
        "namespace": key[0], "policy": key[1], "deployment": name})

    def adopted(outcome: ReconcileOutcome | None) -> None:
        if outcome is not None and outcome.ok:
            ctl.recorder.post(state.body, events.NORMAL, events.SWEEPER_ADOPTED,
                              f"Deployment {name} had lost its owner reference (a hand edit, a GitOps tool, a "
                              "deletion with --cascade=orphan); the operator applied the policy's spec and owns "
                              "it again")

    ctl.request_apply(key, ApplyRequest("the sweeper Deployment lost its owner reference", kind=SWEEPER_ADOPTED,
                                        quiet=True, done=adopted))
