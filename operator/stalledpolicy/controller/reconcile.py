"""Policy -> sweeper Deployment, level-based: read, check ownership, apply.

Called by the kopf handlers for create, resume and update, and again when
someone deletes or edits the sweeper (``reapply_after_deletion``,
``revert_drift``) or the referenced Secret changes (``reapply``, from the
status loop). It never imports kopf: a spec the operator can never run raises
``InvalidPolicy`` (kopf: permanent, until the spec changes); a state that may
fix itself (a Deployment of that name owned by someone else, an API refusal
such as a 422) is recorded as the policy's condition and raises ``RetryLater``
with a growing delay.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any, Mapping, NoReturn

from stalledpolicy.controller import FIELD_MANAGER, GROUP, events
from stalledpolicy.controller.apply import (apply_deployment, conflict_reason, earlier_policy_uid,
                                            policy_owner, read_deployment)
from stalledpolicy.controller.config import backoff, image_allowed
from stalledpolicy.controller.redis_clients import PolicyKey
from stalledpolicy.controller.runtime import Controller, plain, sweeper_name
from stalledpolicy.controller.status import ReconcileOutcome, api_text

log = logging.getLogger("stalledpolicy.operator")

NAME_CONFLICT_FIRST_RETRY = 5.0
OLD_SWEEPER_FIRST_RETRY = 1.0
APPLY_FAILED_FIRST_RETRY = 5.0


class InvalidPolicy(Exception):
    pass


class RetryLater(Exception):
    def __init__(self, message: str, delay: float, reason: str | None = None) -> None:
        super().__init__(message)
        self.delay = delay
        self.reason = reason  # the condition reason recorded (NameConflict, ApplyFailed, ...)


SWEEPER_REPOSITORY = "ghcr.io/stalledpolicy/stalledpolicy-operator"


def default_sweeper_image() -> str:
    """The operator's own image at its own version (one image runs both)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{SWEEPER_REPOSITORY}:{version('stalledpolicy-operator')}"
    except PackageNotFoundError:
        return f"{SWEEPER_REPOSITORY}:latest"


def build(body: Mapping[str, Any], spec, sweeper_image: str | None,
          secret_digest: str | None = None) -> dict:
    from stalledpolicy.policy.builder import build_sweeper_deployment

    meta = body.get("metadata") or {}
    return build_sweeper_deployment(
        meta["name"], meta["namespace"], meta["uid"], spec,
        image=sweeper_image or default_sweeper_image(), generation=meta.get("generation"),
        secret_digest=secret_digest)


def _api_errors() -> tuple[type[BaseException], ...]:
    import urllib3
    from kubernetes.client.exceptions import ApiException

    return ApiException, urllib3.exceptions.HTTPError, OSError


def describe_api_error(exc: BaseException) -> str:
    """The API server's own words for a refused request: ``HTTP 422 Unprocessable
    Entity: Deployment.apps "x" is invalid: ...``. The request was our sweeper
    Deployment, which holds no secret (the Redis URL of a Secret arrives by
    secretKeyRef, an inline URL is credential-free by validation), so neither
    does the message; any ``user:password@`` in it is masked all the same."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        text = f"HTTP {exc.status} {exc.reason}"
        detail = None
        try:
            detail = json.loads(exc.body).get("message") if exc.body else None
        except (TypeError, ValueError, AttributeError):
            pass
        if detail:
            text += f": {detail}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return api_text(text)


def namespace_terminating(exc: BaseException) -> bool:
    """The API server refused a create because the namespace is being deleted
    (403 with the NamespaceTerminating cause)."""
    from kubernetes.client.exceptions import ApiException

    if not isinstance(exc, ApiException) or exc.status != 403 or not exc.body:
        return False
    try:
        causes = (json.loads(exc.body).get("details") or {}).get("causes") or []
    except (TypeError, ValueError, AttributeError):
        return False
    return any(isinstance(c, Mapping) and c.get("reason") == "NamespaceTerminating" for c in causes)


def _secret_digest(ctl: Controller, namespace: str, spec, existing: Mapping[str, Any] | None) -> str | None:
    """The digest of the policy's Secret value for the pod template. When that value
    is no usable Redis URL now (Secret missing, forbidden or unreadable, key missing,
    not a Redis URL), the digest the running pods have, so neither a passing error
    nor an apply for another reason rolls the sweeper onto a broken Secret."""
    from stalledpolicy.policy.builder import SECRET_DIGEST_ANNOTATION

    ref = spec.redis.secret_ref
    if ref is None:
        return None
    digest = ctl.secret_digest(namespace, {"name": ref.name, "key": ref.key})
    if digest is None and existing is not None:
        template = ((existing.get("spec") or {}).get("template") or {}).get("metadata") or {}
        digest = (template.get("annotations") or {}).get(SECRET_DIGEST_ANNOTATION)
    return digest


def reconcile(ctl: Controller, body: Mapping[str, Any], *, retry: int = 0,
              old_spec: Mapping[str, Any] | None = None) -> ReconcileOutcome | None:
    """Apply the policy's sweeper Deployment. One reconcile of a policy at a time
    (kopf's handlers and the re-applies after drift, deletion or a Secret change).
    None when there is nothing to do: the namespace is being deleted."""
    body = plain(body)
    with ctl.state(body).apply_lock:
        return _reconcile(ctl, body, retry, old_spec)


def _reconcile(ctl: Controller, body: dict, retry: int,
               old_spec: Mapping[str, Any] | None) -> ReconcileOutcome | None:
    from stalledpolicy.policy.models import PolicyError, StalledPolicySpec

    meta = body.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name")
    generation = int(meta.get("generation") or 0)

    try:
        spec = StalledPolicySpec.from_k8s(body.get("spec"))
    except PolicyError as exc:
        ctl.record_outcome(body, ReconcileOutcome(generation, False, events.INVALID_SPEC, str(exc)))
        raise InvalidPolicy(str(exc)) from None

    if spec.sweeper.image is not None and not sweeper_image_allowed(ctl, spec.sweeper.image):
        _refuse_image(ctl, body, generation, retry, spec.sweeper.image)

    deployment_name = sweeper_name(name)
    try:
        existing = read_deployment(ctl.apps, namespace, deployment_name)
    except _api_errors() as exc:
        _apply_failed(ctl, body, generation, retry,
                      f"cannot read Deployment {namespace}/{deployment_name}: {describe_api_error(exc)}")
    if existing is not None:
        ctl.observe_deployment(existing, read=True)
    _wait_unless_ours(ctl, body, generation, retry, existing, deployment_name)

    secret_digest = _secret_digest(ctl, namespace, spec, existing)
    deployment = build(body, spec, ctl.config.sweeper_image, secret_digest)
    try:
        applied = apply_deployment(ctl.apps, deployment)
    except _api_errors() as exc:
        if namespace_terminating(exc):
            # The namespace deletion took the sweeper before its policy: nothing
            # can be created there any more, and the policy goes next. Not a failure.
            log.info("namespace is being deleted; the sweeper Deployment is not created again", extra={
                "namespace": namespace, "policy": name, "deployment": deployment_name})
            return None
        _apply_failed(ctl, body, generation, retry,
                      f"applying Deployment {namespace}/{deployment_name} failed: {describe_api_error(exc)}")
    ctl.observe_deployment(applied, read=True)
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
        deployment_generation=int((applied.get("metadata") or {}).get("generation") or 0) or None,
        replicas=int(deployment["spec"]["replicas"]), secret_digest=secret_digest)
    ctl.record_outcome(body, outcome)
    return outcome


def _wait_unless_ours(ctl: Controller, body: dict, generation: int, retry: int,
                      existing: Mapping[str, Any] | None, deployment_name: str) -> None:
    """Raises RetryLater (its condition recorded) when the Deployment of the sweeper's
    name is not this policy's: a deleted predecessor's, which the garbage collector
    deletes (OldSweeperDeleting), or anyone else's (NameConflict)."""
    meta = body.get("metadata") or {}
    namespace, name, uid = meta.get("namespace"), meta.get("name"), meta.get("uid")
    earlier = earlier_policy_uid(existing, name, uid)
    if earlier is not None:
        # Deleted and created again under the same name (kubectl delete + apply,
        # replace --force): the old sweeper goes with its owner. Its deletion
        # (reapply_after_deletion) or this retry applies ours.
        deleting = " (its deletion has begun)" if (existing.get("metadata") or {}).get("deletionTimestamp") else ""
        message = (f"Deployment {namespace}/{deployment_name} belongs to the deleted StalledPolicy {name} "
                   f"(uid {earlier}){deleting}: waiting for the garbage collector to delete it, then this "
                   "policy's sweeper is created; if it stays, check that Deployment's finalizers "
                   f"(kubectl get deployment -n {namespace} {deployment_name} -o yaml) or delete it")
        ctl.record_outcome(body, ReconcileOutcome(generation, False, events.OLD_SWEEPER_DELETING, message))
        raise RetryLater(message, backoff(retry, OLD_SWEEPER_FIRST_RETRY, ctl.config.max_backoff),
                         events.OLD_SWEEPER_DELETING)
    clash = conflict_reason(existing, uid)
    if clash:
        message = (f"Deployment {namespace}/{deployment_name} already exists and {clash}; "
                   "the operator will not take it over: delete or rename that Deployment, "
                   "or give this policy another name")
        ctl.record_outcome(body, ReconcileOutcome(generation, False, events.NAME_CONFLICT, message))
        delay = backoff(retry, NAME_CONFLICT_FIRST_RETRY, ctl.config.max_backoff)
        raise RetryLater(message, delay, events.NAME_CONFLICT)


def own_sweeper_image(ctl: Controller) -> str:
    """The image a policy without ``spec.sweeper.image`` runs (always allowed)."""
    return ctl.config.sweeper_image or default_sweeper_image()


def sweeper_image_allowed(ctl: Controller, image: str) -> bool:
    return image_allowed(image, ctl.config.allowed_sweeper_images, own_sweeper_image(ctl))


def _deployment_images(deployment: Mapping[str, Any]) -> list[str]:
    pod = (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {})
    return [c.get("image") or "" for key in ("initContainers", "containers")
            for c in pod.get(key) or [] if isinstance(c, Mapping)]


def _refuse_image(ctl: Controller, body: dict, generation: int, retry: int, image: str) -> NoReturn:
    """``spec.sweeper.image`` is not on the operator's allowlist: the sweeper gets the
    Redis URL from a Secret of the namespace, so an image of the policy author's
    choosing could read any Secret there. InvalidSpec, like any spec the operator
    will not run (see :func:`_stop_refused_sweeper` for a sweeper already running)."""
    meta = body.get("metadata") or {}
    own = own_sweeper_image(ctl)
    allowed = ", ".join(repr(p) for p in ctl.config.allowed_sweeper_images)
    message = (f"spec.sweeper.image {image!r} is not an allowed sweeper image (the operator allows "
               f"{own!r}" + (f" and {allowed}" if allowed else " only") + "): remove spec.sweeper.image "
               "to run the default image, or ask the operator's admin to add this image to the chart "
               "value sweeperAllowedImages (--allowed-sweeper-image)")
    try:
        message += _stop_refused_sweeper(ctl, meta)
    except _api_errors() as exc:
        deployment_name = sweeper_name(meta.get("name"))
        message += (f"; Deployment {meta.get('namespace')}/{deployment_name} may still run a refused image, "
                    f"checking it or scaling it to 0 failed: {describe_api_error(exc)}")
        ctl.record_outcome(body, ReconcileOutcome(generation, False, events.INVALID_SPEC, message))
        raise RetryLater(message, backoff(retry, APPLY_FAILED_FIRST_RETRY, ctl.config.max_backoff),
                         events.INVALID_SPEC) from None
    ctl.record_outcome(body, ReconcileOutcome(generation, False, events.INVALID_SPEC, message))
    raise InvalidPolicy(message)


def _stop_refused_sweeper(ctl: Controller, meta: Mapping[str, Any]) -> str:
    """As for any InvalidSpec, the policy's existing sweeper keeps its last applied
    spec, but only while that runs allowed images: one that runs a refused image
    (the list was narrowed, or the sweeper predates the list) is scaled to 0
    replicas (the operator may not delete Deployments) until the spec is fixed
    and applied again. What was found, as a clause for the InvalidSpec message."""
    namespace, deployment_name = meta.get("namespace"), sweeper_name(meta.get("name"))
    existing = read_deployment(ctl.apps, namespace, deployment_name)
    if existing is None or conflict_reason(existing, meta.get("uid")) is not None:
        return ""
    refused = [i for i in _deployment_images(existing) if not sweeper_image_allowed(ctl, i)]
    if not refused:
        return f"; Deployment {deployment_name} keeps running its last applied spec"
    # One message whether scaled now or before: one event, not one per reconcile.
    if int((existing.get("spec") or {}).get("replicas", 1) or 0) != 0:
        _scale_to_zero(ctl.apps, namespace, deployment_name)
        log.warning("sweeper Deployment runs a refused image; scaled to 0", extra={
            "namespace": namespace, "policy": meta.get("name"), "deployment": deployment_name})
    return f"; Deployment {deployment_name} runs a refused image ({refused[0]!r}) and is scaled to 0 replicas"


def _scale_to_zero(apps, namespace: str, name: str) -> None:
    apps.patch_namespaced_deployment(name, namespace, {"spec": {"replicas": 0}},
                                     field_manager=FIELD_MANAGER,
                                     _content_type="application/merge-patch+json")


def _apply_failed(ctl: Controller, body: dict, generation: int, retry: int, message: str) -> NoReturn:
    """The API refused (a 422 for requests above limits, a 403, ...): a condition and
    a Warning event (once per distinct message), and a retry with a growing delay."""
    ctl.record_outcome(body, ReconcileOutcome(generation, False, events.APPLY_FAILED, message))
    raise RetryLater(message, backoff(retry, APPLY_FAILED_FIRST_RETRY, ctl.config.max_backoff),
                     events.APPLY_FAILED)


# -- re-applies outside kopf's handlers --------------------------------------------------

# Drift reverts allowed per policy in DRIFT_WINDOW seconds. Past that another writer
# (a second operator, an HPA, a GitOps tool) is changing the sweeper as fast as we put
# it back: every flip is a rollout, so stop reverting and say who it is. Reverts
# resume once the sweeper has been left alone for DRIFT_WINDOW seconds.
DRIFT_MAX_REVERTS = 3
DRIFT_WINDOW = 300.0


def _current(ctl: Controller, key: PolicyKey, state) -> bool:
    """``state`` is still the policy's (not forgotten, not replaced by a new uid)."""
    return ctl.policies.get(key) is state


def _reconcile_again(ctl: Controller, key: PolicyKey, body: Mapping[str, Any]) -> ReconcileOutcome | None:
    """Reconcile ``body`` for a reason kopf does not see; a failure is the
    policy's condition (and event) already, and the status loop retries it with
    a growing delay (``reapply_failures``). Never brings back the state of a
    policy forgotten (deleted) in the meantime."""
    state = ctl.policies.get(key)
    if state is None:
        return None
    uid = (body.get("metadata") or {}).get("uid")
    with state.apply_lock:
        if not _current(ctl, key, state) or (state.body.get("metadata") or {}).get("uid") != uid:
            return None
        try:
            outcome = reconcile(ctl, body)
        except InvalidPolicy:
            outcome = None
        except RetryLater:
            state.reapply_failures += 1
            return None
        state.reapply_failures = 0
        return outcome


def reapply(ctl: Controller, key: PolicyKey, why: str) -> None:
    """Apply the policy's Deployment again from the policy as last seen (the status
    loop: the referenced Secret changed, or an earlier re-apply failed)."""
    state = ctl.policies.get(key)
    if state is None or state.outcome is None:
        return
    if (state.body.get("metadata") or {}).get("deletionTimestamp"):
        return
    if state.reapply_failures == 0:  # once per streak of failures, not on every retry
        log.info("re-applying the sweeper Deployment", extra={
            "namespace": key[0], "policy": key[1], "why": why})
    _reconcile_again(ctl, key, state.body)


def _deleting(obj: Mapping[str, Any] | None) -> bool:
    return bool(((obj or {}).get("metadata") or {}).get("deletionTimestamp"))


def _named_owner(deployment: Mapping[str, Any]):
    """``(key, owner)`` of the StalledPolicy named as this Deployment's controller, when
    the Deployment carries that policy's sweeper name; else None."""
    meta = deployment.get("metadata") or {}
    owner = policy_owner(deployment)
    if owner is None:
        return None
    key = (meta.get("namespace") or "", owner.get("name") or "")
    if sweeper_name(key[1]) != meta.get("name"):
        return None
    return key, owner


def _owned_policy_state(ctl: Controller, deployment: Mapping[str, Any]):
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
    if _deleting(state.body):
        return None
    return key, state, owner


def drifted_policy(ctl: Controller, deployment: Mapping[str, Any]) -> PolicyKey | None:
    """The policy whose sweeper Deployment someone else changed (``kubectl scale``,
    an env edit): its generation is past the one our last apply made. Memory only,
    so kopf's watch can ask on every event; our own no-op applies never bump the
    generation, so they never look like drift. A policy or Deployment being deleted
    (foreground deletion bumps the generation) is never drift."""
    meta = deployment.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    owned = _owned_policy_state(ctl, deployment)
    if owned is None:
        return None
    key, state, _ = owned
    applied = state.outcome.deployment_generation
    if applied is None or int(meta.get("generation") or 0) <= applied:
        return None
    return key


def other_field_managers(deployment: Mapping[str, Any]) -> list[str]:
    """The field managers of the Deployment's spec and metadata other than ours,
    most recent first (the status writers, the deployment controller, change no spec)."""
    from stalledpolicy.controller import FIELD_MANAGER

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
    import calendar

    text = ((deployment.get("metadata") or {}).get("annotations") or {}).get(DRIFT_REVERTS_ANNOTATION) or ""
    times = []
    for item in text.split(","):
        try:
            times.append(float(calendar.timegm(time.strptime(item.strip(), "%Y-%m-%dT%H:%M:%SZ"))))
        except ValueError:
            continue
    return times


def _record_reverts(ctl: Controller, state, deployment_name: str, times: list[float]) -> None:
    """Write the revert times on the sweeper Deployment (a merge patch of one
    annotation, under the policy's apply_lock). A Deployment's annotations are part
    of its generation (the API server copies them to its ReplicaSets): the one this
    write makes is ours, like an apply's, never drift to revert; the pod template is
    unchanged, so no rollout. Failing, this process still counts the reverts; only
    a restart before the next write forgets them."""
    namespace = state.key[0]
    value = ",".join(_format_time(t) for t in times)
    try:
        response = ctl.apps.patch_namespaced_deployment(
            deployment_name, namespace, {"metadata": {"annotations": {DRIFT_REVERTS_ANNOTATION: value}}},
            field_manager=FIELD_MANAGER, _content_type="application/merge-patch+json", _preload_content=False)
        written = json.loads(response.data)
    except _api_errors() as exc:
        log.warning("could not record the drift reverts on the sweeper Deployment: %s", describe_api_error(exc),
                    extra={"namespace": namespace, "policy": state.key[1], "deployment": deployment_name})
        return
    ctl.observe_deployment(written, read=True)
    generation = int((written.get("metadata") or {}).get("generation") or 0)
    with state.lock:
        if state.outcome is not None and state.outcome.ok and generation > (state.outcome.deployment_generation or 0):
            state.outcome = dataclasses.replace(state.outcome, deployment_generation=generation)


def _drift_allowed(ctl: Controller, state, deployment: Mapping[str, Any], now: float) -> bool:
    """Whether the policy's budget allows another revert (under its apply_lock;
    a revert that happens is counted by the caller); False (a DriftConflict Warning
    and the policy's SweeperInSync condition, once per conflict) when another writer
    keeps changing the sweeper. The reverts counted are this process's and those
    recorded on the Deployment (an earlier process's)."""
    meta = deployment.get("metadata") or {}
    generation = int(meta.get("generation") or 0)
    if state.drift_conflict:
        if now - (state.drift_last_seen or now) < DRIFT_WINDOW:
            if generation > state.drift_seen_generation:  # a change, not a status write
                state.drift_last_seen, state.drift_seen_generation = now, generation
            return False
        _end_drift_conflict(state)  # left alone long enough: revert again
    state.drift_last_seen, state.drift_seen_generation = now, generation
    # Each revert writes the whole list: the longer one knows every revert (the
    # Deployment's, after a restart; ours, if the other writer dropped the annotation).
    ours, recorded = ([t for t in times if now - t < DRIFT_WINDOW]
                      for times in (state.drift_reverts, recorded_reverts(deployment)))
    state.drift_reverts[:] = ours if len(ours) >= len(recorded) else recorded
    if len(state.drift_reverts) < DRIFT_MAX_REVERTS:
        return True
    ctl.metrics.drift_conflicts.inc()
    others = other_field_managers(deployment)
    who = (f"field manager {others[0]!r}" + (f" (also {', '.join(others[1:])})" if others[1:] else "")
           if others else "another writer")
    message = (f"Deployment {meta.get('name')} was changed outside the policy {DRIFT_MAX_REVERTS + 1} times "
               f"in {int(DRIFT_WINDOW)} s, last by {who}; the operator stops reverting it until it is "
               f"left alone for {int(DRIFT_WINDOW)} s: stop the other writer (a second operator, an "
               "autoscaler, a GitOps tool) and edit the StalledPolicy instead")
    state.drift_conflict = message
    log.warning(message, extra={"namespace": state.key[0], "policy": state.key[1],
                                "reason": events.DRIFT_CONFLICT})
    ctl.recorder.post(state.body, events.WARNING, events.DRIFT_CONFLICT, message)
    ctl._kick(state.key)  # the condition
    return False


def _end_drift_conflict(state) -> None:
    state.drift_conflict = None
    state.drift_reverts.clear()


def drift_conflict_over(ctl: Controller, state, now: float) -> bool:
    """The status loop's check (under the policy's status lock): True, and the
    conflict ended, once the sweeper has been left alone for DRIFT_WINDOW seconds;
    the caller applies the policy's spec again (what the other writer left is
    reverted) and SweeperInSync turns True."""
    if not state.drift_conflict or now - (state.drift_last_seen or now) < DRIFT_WINDOW:
        return False
    _end_drift_conflict(state)
    log.info("sweeper Deployment left alone since the drift conflict; reverting again",
             extra={"namespace": state.key[0], "policy": state.key[1]})
    return True


def revert_drift(ctl: Controller, key: PolicyKey, deployment: Mapping[str, Any], clock=None) -> None:
    """Someone changed a sweeper Deployment (``key``: its policy, as ``drifted_policy``
    found it): apply the policy's spec over it (server-side apply, forced: the fields
    the operator owns come back; fields it never set stay), at most DRIFT_MAX_REVERTS
    times in DRIFT_WINDOW seconds (wall-clock times: they outlive the process)."""
    state = ctl.policies.get(key)
    if state is None:
        return
    with state.apply_lock:
        # A reconcile of ours may have made this generation while we waited, or the
        # policy may be gone (or on its way out).
        if drifted_policy(ctl, deployment) != key or not _current(ctl, key, state):
            return
        now = (clock or ctl.clock)()
        if not _drift_allowed(ctl, state, deployment, now):
            return
        meta = deployment.get("metadata") or {}
        seen = int(meta.get("generation") or 0)
        log.info("sweeper Deployment changed outside the policy; re-applying", extra={
            "namespace": key[0], "policy": key[1], "deployment": meta.get("name"), "generation": seen})
        outcome = _reconcile_again(ctl, key, state.body)
        # Only an apply that changed the spec reverted something: a change to a
        # field the operator never sets (`kubectl rollout restart`'s annotation)
        # is left alone by it, bumps no generation and uses up no budget.
        if outcome is not None and (outcome.deployment_generation or 0) > seen and not _deleting(state.body):
            state.drift_reverts.append(now)
            _record_reverts(ctl, state, meta.get("name"), state.drift_reverts)
            ctl.metrics.drift_reverts.inc()
            ctl.recorder.post(state.body, events.NORMAL, events.DRIFT_REVERTED,
                              f"Deployment {meta.get('name')} was changed outside the policy (generation {seen}); "
                              "the operator re-applied the policy's spec: edit the StalledPolicy instead")


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
    if earlier_policy_uid(deployment, key[1], (state.body.get("metadata") or {}).get("uid")) is None:
        return None
    return key


def _recheck_later(ctl: Controller, key: PolicyKey, state, deployment: Mapping[str, Any],
                   exc: BaseException) -> None:
    """The policy whose sweeper was deleted could not be read (the API server down or
    refusing): an ApplyFailed like any API error of a reconcile (its condition, a
    Warning event and log line once per message), and the status loop's re-apply,
    retried with a growing delay (``reapply_failures``). A policy deleted meanwhile
    is forgotten before that (its status write is refused), so it gets no sweeper."""
    with state.apply_lock:
        if not _current(ctl, key, state):
            return
        generation = int((state.body.get("metadata") or {}).get("generation") or 0)
        message = (f"Deployment {key[0]}/{(deployment.get('metadata') or {}).get('name')} was deleted and "
                   f"cannot be re-created yet: cannot check that StalledPolicy {key[0]}/{key[1]} still exists: "
                   f"{describe_api_error(exc)}; retrying")
        state.reapply_failures += 1  # before the outcome's kick: that refresh re-applies
        ctl.record_outcome(state.body, ReconcileOutcome(generation, False, events.APPLY_FAILED, message))


def reapply_after_deletion(ctl: Controller, deployment: Mapping[str, Any]) -> None:
    """Someone deleted a sweeper whose policy still exists: put it back. Or the
    garbage collector deleted the sweeper of a deleted policy whose name a new
    policy took: apply the new one's now, instead of at its next retry."""
    waiting = _waiting_policy(ctl, deployment)
    if waiting is not None:
        state = ctl.policies.get(waiting)
        if state is not None and not _deleting(state.body):
            log.info("old sweeper Deployment deleted; applying the policy's own", extra={
                "namespace": waiting[0], "policy": waiting[1]})
            _reconcile_again(ctl, waiting, state.body)
        return
    owned = _owned_policy_state(ctl, deployment)
    if owned is None:
        return
    key, state, owner = owned
    # The policy may be on its way out (the garbage collector deletes the sweeper
    # right after it): ask the API server, not our memory.
    from kubernetes.client.exceptions import ApiException

    from stalledpolicy.controller import GROUP, PLURAL, VERSION

    try:
        current = ctl.custom.get_namespaced_custom_object(GROUP, VERSION, key[0], PLURAL, key[1])
    except _api_errors() as exc:
        if isinstance(exc, ApiException) and exc.status == 404:
            return  # gone: its sweeper went with it
        _recheck_later(ctl, key, state, deployment, exc)
        return
    if (current.get("metadata") or {}).get("uid") != owner.get("uid") or (
            current.get("metadata") or {}).get("deletionTimestamp"):
        return
    log.info("sweeper Deployment deleted; re-applying", extra={"namespace": key[0], "policy": key[1]})
    if _reconcile_again(ctl, key, current) is not None:
        ctl.metrics.sweepers_recreated.inc()
