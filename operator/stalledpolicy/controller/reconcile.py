"""Policy -> sweeper Deployment, level-based: read, check ownership, apply (a
policy's first apply: apply unless a Deployment of that name exists, and read and
check only if one does).

The apply step of ``sync`` (sync.py), its only caller in the operator, whatever
asked for the apply (docs/architecture.md, the trigger table). It never imports
kopf: a spec the operator can never run raises ``InvalidPolicy`` (nothing is
retried until the spec changes); a state that may fix itself (a Deployment of
that name owned by someone else, an API refusal such as a 422) is recorded as
the policy's condition and raises ``RetryLater`` (sync's one backoff).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from stalledpolicy.controller import drift_reverts, events
from stalledpolicy.controller.api_errors import (
    api_error_types,
    describe_api_error,
    namespace_terminating,
    with_policy_fields,
)
from stalledpolicy.controller.apply import (
    already_applied,
    apply_deployment,
    conflict_reason,
    create_deployment,
    earlier_policy_uid,
    read_deployment,
    scale_to_zero,
)
from stalledpolicy.controller.objects import (
    asks_for_pods,
    generation_of,
    metadata_of,
    plain,
    policy_key,
    sweeper_name,
)
from stalledpolicy.controller.policy_state import PolicyState
from stalledpolicy.controller.queue_claims import FREE, UNKNOWN, claim_of, claimed_message, owner_text
from stalledpolicy.controller.retry import InvalidPolicy, RetryLater
from stalledpolicy.controller.status import ReconcileOutcome, condition_of
from stalledpolicy.controller.sweeper_image import default_sweeper_image, refuse_image, sweeper_image_allowed
from stalledpolicy.policy.builder import (
    POLICY_GENERATION_ANNOTATION,
    SECRET_DIGEST_ANNOTATION,
    build_sweeper_deployment,
)
from stalledpolicy.policy.models import PolicyError, StalledPolicySpec

if TYPE_CHECKING:  # for the annotations only: runtime imports this module (through sync)
    from stalledpolicy.controller.runtime import Controller


log = logging.getLogger("stalledpolicy.operator")


def build(body: Mapping[str, Any], spec: StalledPolicySpec, sweeper_image: str | None,
          secret_digest: str | None = None) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    return build_sweeper_deployment(
        meta["name"], meta["namespace"], meta["uid"], spec,
        image=sweeper_image or default_sweeper_image(), generation=meta.get("generation"),
        secret_digest=secret_digest)


def _secret_digest(ctl: Controller, namespace: str, spec: StalledPolicySpec,
                   existing: Mapping[str, Any] | None) -> str | None:
    """The digest of the policy's Secret value for the pod template. When that value
    is no usable Redis URL now (Secret missing, forbidden or unreadable, key missing,
    not a Redis URL), the digest the running pods have, so neither a passing error
    nor an apply for another reason rolls the sweeper onto a broken Secret."""
    ref = spec.redis.secret_ref
    if ref is None:
        return None
    digest = ctl.secret_digest(namespace, {"name": ref.name, "key": ref.key})
    if digest is None and existing is not None:
        template = ((existing.get("spec") or {}).get("template") or {}).get("metadata") or {}
        digest = (template.get("annotations") or {}).get(SECRET_DIGEST_ANNOTATION)
    return digest


def reconcile(ctl: Controller, body: Mapping[str, Any], *, resume: bool = False,
              state: PolicyState | None = None) -> ReconcileOutcome | None:
    """Apply the policy's sweeper Deployment (sync's step; the scheduler runs one sync
    of a policy at a time). None when there is nothing to do: the namespace is being
    deleted. ``state``: the policy's, known (sync's); without it (a test), found or
    made (``Controller.get_or_create_state``).
    ``resume``: an operator start (kopf's resume handler), which applies nothing
    while the policy's status records a DriftConflict (see ``_hold_for_conflict``).
    BudgetChanged compares what was applied (``_budget_change``), not kopf's ``old``
    (docs/architecture.md, "Not kopf's old")."""
    chosen: dict[str, Any] = plain(body)
    if state is None:
        state = ctl.get_or_create_state(chosen)
    # A request may carry an older body than the newest seen (kopf's handler of an
    # earlier edit): never apply a generation older than the newest seen.
    # (state.body is replaced whole, never changed in place: read without the status
    # lock, which another thread's watch event may hold.)
    newest = state.body
    if generation_of(newest) > generation_of(chosen):
        chosen = plain(newest)
    return _reconcile(ctl, state, chosen, resume)


def _reconcile(ctl: Controller, state: PolicyState, body: dict[str, Any],
               resume: bool = False) -> ReconcileOutcome | None:
    namespace, name = policy_key(body)
    generation = generation_of(body)

    try:
        spec = StalledPolicySpec.from_k8s(body.get("spec"))
    except PolicyError as exc:
        ctl.record_outcome(body, ReconcileOutcome(generation, False, events.INVALID_SPEC, str(exc)))
        raise InvalidPolicy(str(exc)) from None

    if spec.sweeper.image is not None and not sweeper_image_allowed(ctl, spec.sweeper.image):
        refuse_image(ctl, body, generation, spec.sweeper.image)

    deployment_name = sweeper_name(name)
    wanted = 0 if spec.suspend else int(spec.sweeper.replicas)
    existing: Mapping[str, Any] | None = None
    sent: _Sent | None = None
    if _never_applied(state, body, resume) and claim_of(ctl, body).verdict == FREE:
        # No read first: a Deployment of that name, if any, refuses the create (then it is read and judged below).
        sent = _build_and_send(ctl, body, spec, generation, wanted, None,
                               lambda deployment: create_deployment(ctl.apps, deployment))
        if sent is None:
            return None
    if sent is None or sent.applied is None:
        try:
            existing = read_deployment(ctl.apps, namespace, deployment_name)
        except api_error_types() as exc:
            _apply_failed(ctl, body, generation,
                          f"cannot read Deployment {namespace}/{deployment_name}: {describe_api_error(exc)}",
                          wanted)
        if existing is not None:
            ctl.observe_deployment(existing, read=True)
        _wait_unless_ours(ctl, body, generation, existing, deployment_name)

        claimed = _queue_claimed(ctl, state, body, generation, existing, deployment_name)
        if claimed is not None:
            return claimed
        if resume and existing is not None:
            held = _hold_for_conflict(ctl, state, body, generation, spec, existing, wanted)
            if held is not None:
                return held
        # No request when it would change nothing: at an operator start too, where a
        # change made while no operator ran shows as not applied (and is counted below).
        sent = _build_and_send(ctl, body, spec, generation, wanted, existing, lambda deployment: (
            existing if existing is not None and already_applied(existing, deployment)
            else apply_deployment(ctl.apps, deployment)))
        if sent is None:
            return None
    deployment, applied, secret_digest = sent.deployment, sent.applied, sent.secret_digest
    assert applied is not None  # the apply returns the object as stored
    budget_change = _budget_change(state, existing, deployment)
    ctl.observe_deployment(applied, read=True)
    changed = existing is None or (existing.get("metadata") or {}).get("resourceVersion") != (
        applied.get("metadata") or {}).get("resourceVersion")
    if changed:
        log.info("sweeper Deployment applied", extra={
            "namespace": namespace, "policy": name, "deployment": deployment_name,
            "generation": generation, "first_apply": existing is None})
    outcome = ReconcileOutcome(
        generation, True, "Applied", f"sweeper Deployment {deployment_name} applied",
        suspended=spec.suspend,
        deployment_generation=int((applied.get("metadata") or {}).get("generation") or 0) or None,
        replicas=int(deployment["spec"]["replicas"]), secret_digest=secret_digest)
    # The status loop refreshes under this lock: the conflict ends in one step with
    # the outcome of the edit that ended it (in between, a refresh showed
    # SweeperInSync True for the generation that was in conflict).
    with state.lock:
        edit_ended_conflict = drift_reverts.end_conflict_by_edit(state, generation)
        ctl.record_outcome(body, outcome)
    if budget_change:
        ctl.recorder.post(body, events.NORMAL, events.BUDGET_CHANGED, budget_change)
    if edit_ended_conflict:
        drift_reverts.clear_recorded_reverts(ctl, state, applied)
    elif resume and existing is not None:
        drift_reverts.count_revert_at_start(ctl, state, existing, deployment, applied, ctl.clock())
    return outcome


class _Sent(NamedTuple):
    deployment: dict[str, Any]          # as built
    applied: dict[str, Any] | None      # as stored; None: a create met a Deployment of that name
    secret_digest: str | None


def _build_and_send(ctl: Controller, body: dict[str, Any], spec: StalledPolicySpec, generation: int, wanted: int,
                    existing: Mapping[str, Any] | None,
                    send: Callable[[dict[str, Any]], dict[str, Any] | None]) -> _Sent | None:
    """Build the policy's sweeper Deployment (the Secret's digest judged against
    ``existing``, the Deployment as read, if any) and ``send`` it. None when the
    API server refused it because the namespace is being deleted (nothing to do);
    any other refusal raises ApplyFailed's RetryLater (``_apply_refused``)."""
    namespace, name = policy_key(body)
    secret_digest = _secret_digest(ctl, namespace, spec, existing)
    deployment = build(body, spec, ctl.config.sweeper_image, secret_digest)
    try:
        applied = send(deployment)
    except api_error_types() as exc:
        _apply_refused(ctl, body, generation, exc, sweeper_name(name), wanted)
        return None
    return _Sent(deployment, applied, secret_digest)


def _budget_change(state: PolicyState, existing: Mapping[str, Any] | None, deployment: Mapping[str, Any]) -> str | None:
    """What BudgetChanged says for the apply of ``deployment`` just made, or None; the
    budgets it applied are remembered for the next one. The old side is what the
    last apply of this process put on the sweeper (not kopf's ``old``:
    docs/architecture.md); with none remembered (the first apply
    since the operator started), the Deployment as read before this apply, if it was
    built from another generation of the policy. Budgets edited by hand on the
    sweeper of this very generation are drift (DriftReverted), no budget edit.
    Creating the sweeper is no change."""
    applied = events.sweeper_budgets(deployment)
    before = state.applied_budgets
    if before is None and existing is not None and _policy_generation(existing) != _policy_generation(deployment):
        before = events.sweeper_budgets(existing)
    state.applied_budgets = applied
    if before is None or applied is None:
        return None
    return events.budget_change_message(before, applied)


def _policy_generation(deployment: Mapping[str, Any]) -> str | None:
    """The policy generation a sweeper Deployment was built from (builder.py records it)."""
    return ((deployment.get("metadata") or {}).get("annotations") or {}).get(POLICY_GENERATION_ANNOTATION)


def _wait_unless_ours(ctl: Controller, body: dict[str, Any], generation: int,
                      existing: Mapping[str, Any] | None, deployment_name: str) -> None:
    """Raises RetryLater (its condition recorded) when the Deployment of the sweeper's
    name is not this policy's: a deleted predecessor's, which the garbage collector
    deletes (OldSweeperDeleting), or anyone else's (NameConflict)."""
    namespace, name = policy_key(body)
    uid = str(metadata_of(body).get("uid") or "")
    earlier = earlier_policy_uid(existing, name, uid)
    if earlier is not None and existing is not None:
        # Deleted and created again under the same name (kubectl delete + apply,
        # replace --force): the old sweeper goes with its owner. Its deletion
        # (reapply_after_deletion) or this retry applies ours.
        deleting = " (its deletion has begun)" if (existing.get("metadata") or {}).get("deletionTimestamp") else ""
        message = (f"Deployment {namespace}/{deployment_name} belongs to the deleted StalledPolicy {name} "
                   f"(uid {earlier}){deleting}: waiting for the garbage collector to delete it, then this "
                   "policy's sweeper is created; if it stays, check that Deployment's finalizers "
                   f"(kubectl get deployment -n {namespace} {deployment_name} -o yaml) or delete it")
        ctl.record_outcome(body, ReconcileOutcome(generation, False, events.OLD_SWEEPER_DELETING, message))
        raise RetryLater(message, events.OLD_SWEEPER_DELETING)
    clash = conflict_reason(existing, uid, name)
    if clash:
        message = (f"Deployment {namespace}/{deployment_name} already exists and {clash}; "
                   "the operator will not take it over: delete or rename that Deployment, "
                   "or give this policy another name")
        ctl.record_outcome(body, ReconcileOutcome(generation, False, events.NAME_CONFLICT, message))
        raise RetryLater(message, events.NAME_CONFLICT)


def _never_applied(state: PolicyState, body: Mapping[str, Any], resume: bool) -> bool:
    """Whether the policy can have no sweeper of its own yet, as far as the operator
    knows: no apply by this process, none recorded in its status (an apply's outcome
    always writes ``observedGeneration``), and no operator start (whose apply judges
    the Deployment as it was left). Then the first apply is made without reading the
    Deployment first (``create_deployment``)."""
    return not resume and state.outcome is None and not (body.get("status") or {}).get("observedGeneration")


def _apply_refused(ctl: Controller, body: dict[str, Any], generation: int, exc: BaseException,
                   deployment_name: str, wanted: int) -> None:
    """The API server refused the apply: returns when the namespace is being deleted
    (nothing to do), else raises ApplyFailed's RetryLater (``_apply_failed``)."""
    namespace, name = policy_key(body)
    if namespace_terminating(exc):
        # The namespace deletion took the sweeper before its policy: nothing
        # can be created there any more, and the policy goes next. Not a failure.
        log.info("namespace is being deleted; the sweeper Deployment is not created again", extra={
            "namespace": namespace, "policy": name, "deployment": deployment_name})
        return
    _apply_failed(ctl, body, generation,
                  with_policy_fields(f"applying Deployment {namespace}/{deployment_name} failed: "
                                     f"{describe_api_error(exc)}"), wanted)


def _apply_failed(ctl: Controller, body: dict[str, Any], generation: int, message: str,
                  replicas: int | None = None) -> NoReturn:
    """The API refused (a 422 for requests above limits, a 403, ...): a condition and
    a Warning event (once per distinct message), and a retry with a growing delay.
    ``replicas``: what the policy asks for, which the Deployment left from an earlier
    apply is judged against (its own spec.replicas may be 0: never "0 of 0 available")."""
    ctl.record_outcome(body, ReconcileOutcome(generation, False, events.APPLY_FAILED, message,
                                              replicas=replicas))
    raise RetryLater(message, events.APPLY_FAILED)


def _hold_for_conflict(ctl: Controller, state: PolicyState, body: dict[str, Any], generation: int,
                       spec: StalledPolicySpec, existing: Mapping[str, Any], wanted: int) -> ReconcileOutcome | None:
    """At an operator start (kopf's resume handler), a DriftConflict the policy's status
    records (``Controller._keep_new_state`` took it from SweeperInSync) means no apply: applying
    would put the policy's spec back over the other writer's, a revert the conflict
    exists to stop, and one counted nowhere. The Deployment is taken as it is (its
    generation is the one "applied", so only a later change is drift, and that is not
    reverted while the conflict lasts); the status loop applies the policy's spec once
    the sweeper has been left alone for a whole window. None: no conflict, apply."""
    meta = body.get("metadata") or {}
    existing_meta = existing.get("metadata") or {}
    deployment_generation = int(existing_meta.get("generation") or 0) or None
    template = ((existing.get("spec") or {}).get("template") or {}).get("metadata") or {}
    with state.lock:
        if not drift_reverts.conflict_holds_at_start(state, generation, deployment_generation):
            return None  # none, or the policy was edited since it began: apply (that ends it)
    log.info("drift conflict recorded in the policy's status: the sweeper Deployment is not applied at start; "
             "the policy's spec is applied once the sweeper is left alone", extra={
                 "namespace": meta.get("namespace"), "policy": meta.get("name"),
                 "deployment": existing_meta.get("name"), "generation": generation})
    outcome = ReconcileOutcome(
        generation, True, "Applied",
        f"sweeper Deployment {existing_meta.get('name')} left as another writer set it (DriftConflict)",
        suspended=spec.suspend, deployment_generation=deployment_generation, replicas=wanted,
        secret_digest=(template.get("annotations") or {}).get(SECRET_DIGEST_ANNOTATION))
    ctl.record_outcome(body, outcome)
    return outcome


def _queue_claimed(ctl: Controller, state: PolicyState, body: dict[str, Any], generation: int,
                   existing: Mapping[str, Any] | None, deployment_name: str) -> ReconcileOutcome | None:
    """When an older policy the operator knows sweeps the same queue on the same Redis
    (queue_claims.py): no sweeper for this one. None creates no Deployment; ours, if
    it exists (this policy swept the queue before the older one was seen, or while
    the older one did not sweep), is scaled to 0 replicas, kept so that the policy's
    spec comes back whole when the claim ends. When the claim cannot be told now
    (UNKNOWN), what holds stays: a policy held back stays so, a sweeper that asks
    for pods is applied as usual, and none is started. QueueClaimed (a Warning
    event, Ready=False); the status loop looks again at each refresh. None: the
    queue is this policy's."""
    claim = claim_of(ctl, body)
    if claim.verdict == FREE:
        return None
    owner, owner_confirmed = claim.owner, True
    if claim.verdict == UNKNOWN:
        current = state.outcome
        if current is not None and current.reason == events.QUEUE_CLAIMED and current.claimed_by is not None:
            owner = current.claimed_by  # held back before: stays so, by the same policy
        elif existing is not None and asks_for_pods(existing):
            return None  # a sweeper runs now: it goes on
        else:
            recorded = condition_of(body.get("status") or {}, "Ready") or {}
            if current is None and recorded.get("reason") == events.QUEUE_CLAIMED and recorded.get("message"):
                # An operator start, before the older policies are refreshed: the
                # claim the status records stays, in its own words, with no new
                # event (each restart posted two Warnings per held-back policy).
                outcome = ReconcileOutcome(generation, False, events.QUEUE_CLAIMED, recorded["message"], replicas=0)
                ctl.record_outcome(body, outcome, announce=False)
                return outcome
            owner_confirmed = False  # the older policy is named, not recorded as the holder
    namespace, name = policy_key(body)
    queue = str((body.get("spec") or {}).get("queue") or "")
    note = ""
    if existing is not None:
        note = f" (its Deployment {deployment_name} is scaled to 0 replicas)"
        if asks_for_pods(existing):
            try:
                scale_to_zero(ctl.apps, namespace, deployment_name)
            except api_error_types() as exc:
                _apply_failed(ctl, body, generation,
                              f"queue {queue} is claimed by {owner_text((namespace, name), owner)}, and scaling "
                              f"Deployment {namespace}/{deployment_name} to 0 failed: {describe_api_error(exc)}", 0)
            log.warning("queue claimed by an older policy: sweeper Deployment scaled to 0", extra={
                "namespace": namespace, "policy": name, "deployment": deployment_name,
                "claimed_by": f"{owner[0]}/{owner[1]}" if owner and owner_confirmed else "(cannot be told now)"})
    message = claimed_message((namespace, name), queue, owner, note, owner_confirmed=owner_confirmed,
                              misconfigured=claim.misconfigured)
    outcome = ReconcileOutcome(generation, False, events.QUEUE_CLAIMED, message, replicas=0,
                               claimed_by=owner if owner and owner_confirmed else None)
    ctl.record_outcome(body, outcome)
    return outcome
