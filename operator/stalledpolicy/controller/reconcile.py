"""Policy -> sweeper Deployment, level-based: read, check ownership, apply.

Called by the kopf handlers for create, resume and update (and again when
someone deletes the sweeper). It never imports kopf: a spec the operator can
never run raises ``InvalidPolicy`` (kopf: permanent, until the spec changes);
a state that may fix itself (a Deployment of that name owned by someone else)
raises ``RetryLater`` with a growing delay.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from stalledpolicy.controller import events
from stalledpolicy.controller.apply import apply_deployment, conflict_reason, read_deployment
from stalledpolicy.controller.config import backoff
from stalledpolicy.controller.runtime import Controller, plain, sweeper_name
from stalledpolicy.controller.status import ReconcileOutcome

log = logging.getLogger("stalledpolicy.operator")

NAME_CONFLICT_FIRST_RETRY = 5.0


class InvalidPolicy(Exception):
    pass


class RetryLater(Exception):
    def __init__(self, message: str, delay: float) -> None:
        super().__init__(message)
        self.delay = delay


SWEEPER_REPOSITORY = "ghcr.io/stalledpolicy/stalledpolicy-operator"


def default_sweeper_image() -> str:
    """The operator's own image at its own version (one image runs both)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{SWEEPER_REPOSITORY}:{version('stalledpolicy-operator')}"
    except PackageNotFoundError:
        return f"{SWEEPER_REPOSITORY}:latest"


def build(body: Mapping[str, Any], spec, sweeper_image: str | None) -> dict:
    from stalledpolicy.policy.builder import build_sweeper_deployment

    meta = body.get("metadata") or {}
    return build_sweeper_deployment(
        meta["name"], meta["namespace"], meta["uid"], spec,
        image=sweeper_image or default_sweeper_image(), generation=meta.get("generation"))


def reconcile(ctl: Controller, body: Mapping[str, Any], *, retry: int = 0,
              old_spec: Mapping[str, Any] | None = None) -> ReconcileOutcome:
    from stalledpolicy.policy.models import PolicyError, StalledPolicySpec

    body = plain(body)
    meta = body.get("metadata") or {}
    namespace, name, uid = meta.get("namespace"), meta.get("name"), meta.get("uid")
    generation = int(meta.get("generation") or 0)

    try:
        spec = StalledPolicySpec.from_k8s(body.get("spec"))
    except PolicyError as exc:
        ctl.record_outcome(body, ReconcileOutcome(generation, False, events.INVALID_SPEC, str(exc)))
        raise InvalidPolicy(str(exc)) from None

    deployment = build(body, spec, ctl.config.sweeper_image)
    deployment_name = deployment["metadata"]["name"]
    existing = read_deployment(ctl.apps, namespace, deployment_name)
    if existing is not None:
        ctl.observe_deployment(existing)
    clash = conflict_reason(existing, uid)
    if clash:
        message = (f"Deployment {namespace}/{deployment_name} already exists and {clash}; "
                   "the operator will not take it over: delete or rename that Deployment, "
                   "or give this policy another name")
        ctl.record_outcome(body, ReconcileOutcome(generation, False, events.NAME_CONFLICT, message))
        delay = backoff(retry, NAME_CONFLICT_FIRST_RETRY, ctl.config.max_backoff)
        raise RetryLater(message, delay)

    applied = apply_deployment(ctl.apps, deployment)
    ctl.observe_deployment(applied)
    changed = existing is None or (existing.get("metadata") or {}).get("resourceVersion") != (
        applied.get("metadata") or {}).get("resourceVersion")
    if changed:
        log.info("sweeper Deployment applied", extra={
            "namespace": namespace, "policy": name, "deployment": deployment_name,
            "generation": generation, "first_apply": existing is None})
    if old_spec is not None:
        message = events.budget_change_message(old_spec, body.get("spec") or {})
        if message:
            ctl.recorder.post(body, events.NORMAL, events.BUDGET_CHANGED, message)
    outcome = ReconcileOutcome(
        generation, True, "Applied", f"sweeper Deployment {deployment_name} applied",
        suspended=spec.suspend,
        deployment_generation=int((applied.get("metadata") or {}).get("generation") or 0) or None)
    ctl.record_outcome(body, outcome)
    return outcome


def reapply_after_deletion(ctl: Controller, deployment: Mapping[str, Any]) -> None:
    """Someone deleted a sweeper whose policy still exists: put it back."""
    meta = deployment.get("metadata") or {}
    owner = next((ref for ref in meta.get("ownerReferences") or [] if ref.get("controller")), None)
    if owner is None:
        return
    state = ctl.policies.get((meta.get("namespace"), owner.get("name")))
    if state is None or state.outcome is None or not state.outcome.ok:
        return
    if (state.body.get("metadata") or {}).get("uid") != owner.get("uid"):
        return
    if (state.body.get("metadata") or {}).get("deletionTimestamp"):
        return
    if sweeper_name(owner.get("name")) != meta.get("name"):
        return
    # The policy may be on its way out (the garbage collector deletes the sweeper
    # right after it): ask the API server, not our memory.
    from kubernetes.client.exceptions import ApiException

    from stalledpolicy.controller import GROUP, PLURAL, VERSION

    try:
        current = ctl.custom.get_namespaced_custom_object(
            GROUP, VERSION, meta.get("namespace"), PLURAL, owner.get("name"))
    except ApiException:
        return
    if (current.get("metadata") or {}).get("uid") != owner.get("uid") or (
            current.get("metadata") or {}).get("deletionTimestamp"):
        return
    log.info("sweeper Deployment deleted; re-applying", extra={
        "namespace": meta.get("namespace"), "policy": owner.get("name")})
    try:
        reconcile(ctl, current)
    except (InvalidPolicy, RetryLater):
        pass  # recorded as the policy's condition
