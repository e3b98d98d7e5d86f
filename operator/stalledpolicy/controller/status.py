"""What a policy's status is made of: what the operator observes (``ReconcileOutcome``,
``DeploymentState``, a ``Problem`` reading the queue) and the conditions it makes
of them (SweeperAvailable, RedisReachable, SweeperInSync, Ready), each with the
most telling reason. The whole status, and the patch that writes only what
changed: status_document.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stalledpolicy.controller import events
from stalledpolicy.policy.conditions import (
    FALSE,
    READY,
    REDIS_REACHABLE,
    SWEEPER_AVAILABLE,
    SWEEPER_IN_SYNC,
    TRUE,
    UNKNOWN,
)
from stalledpolicy.redis_url.redaction import redact_urls

__all__ = ["READY", "REDIS_REACHABLE", "SWEEPER_AVAILABLE", "SWEEPER_IN_SYNC", "TRUE", "FALSE", "UNKNOWN"]


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class ReconcileOutcome:
    """What the last reconcile of a policy did, for generation ``generation``."""

    generation: int
    ok: bool
    reason: str
    message: str
    suspended: bool = False
    # metadata.generation of the Deployment as applied: its rollout is done
    # when the Deployment's status.observedGeneration reaches it. A newer
    # generation seen later is someone else's edit (drift), re-applied.
    deployment_generation: int | None = None
    # spec.replicas the policy asks for (0 when suspended): availability is
    # judged against it, never against a Deployment someone scaled by hand.
    replicas: int | None = None
    # Digest of the spec.redis.secretRef value the applied pod template names.
    secret_digest: str | None = None
    # QueueClaimed: the (namespace, name) of the older policy that holds the queue.
    claimed_by: tuple[str, str] | None = None


@dataclass(frozen=True)
class DeploymentState:
    generation: int
    observed_generation: int
    replicas: int  # the Deployment's spec.replicas (what it asks for now, maybe not what the policy asks)
    updated: int
    available: int
    ready: int
    total: int = -1  # status.replicas: old and new pods (-1: not reported)
    # Why its pods cannot be created (the ReplicaFailure condition: a ResourceQuota,
    # a PodSecurity level, a LimitRange refused them), or None.
    pods_refused: str | None = None
    # The rollout made no progress within progressDeadlineSeconds (Progressing=False,
    # ProgressDeadlineExceeded: pods that never become ready), or None.
    stuck: str | None = None

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> DeploymentState:
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        replicas = spec.get("replicas")
        conditions = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, Mapping)}
        refused = conditions.get("ReplicaFailure") or {}
        progressing = conditions.get("Progressing") or {}
        return cls(
            generation=int((obj.get("metadata") or {}).get("generation") or 0),
            observed_generation=int(status.get("observedGeneration") or 0),
            replicas=1 if replicas is None else int(replicas),
            updated=int(status.get("updatedReplicas") or 0),
            available=int(status.get("availableReplicas") or 0),
            ready=int(status.get("readyReplicas") or 0),
            total=int(status.get("replicas") or 0),
            pods_refused=(api_text(refused.get("message") or refused.get("reason") or "refused")
                          if refused.get("status") == "True" else None),
            stuck=(api_text(progressing.get("message") or "")
                   if progressing.get("status") == "False"
                   and progressing.get("reason") == "ProgressDeadlineExceeded" else None),
        )


# At most this many characters of the API server's own text go into a condition or an event.
API_MESSAGE_MAX = 1000


def api_text(text: str) -> str:
    """Text the API server wrote about our objects (a refusal, a Deployment's
    condition), as it wrote it: it names our sweeper Deployment, which holds no
    secret; any URL credentials are masked all the same, and it is cut at
    ``API_MESSAGE_MAX`` characters."""
    return redact_urls(str(text))[:API_MESSAGE_MAX]


@dataclass(frozen=True)
class Problem:
    reason: str
    message: str


@dataclass(frozen=True)
class Condition:
    status: str
    reason: str
    message: str


def pods_refused_hint(refusal: str) -> str:
    """What to fix for pods the cluster refuses to create, from the ReplicaSet's
    FailedCreate message (the ReplicaFailure condition): the admission plugin that
    refused names its cause, so the hint names the policy field or the namespace's
    object that settles it."""
    text = refusal.lower()
    if "priorityclass" in text or "priority class" in text:
        return ("the PriorityClass spec.sweeper.priorityClassName names must exist: create it "
                "(kubectl get priorityclass) or fix or remove spec.sweeper.priorityClassName")
    if "podsecurity" in text or "pod security" in text:
        return ("the namespace's Pod Security level refuses the sweeper's pods: relax the namespace's "
                "pod-security.kubernetes.io/enforce label (kubectl label namespace ... "
                "pod-security.kubernetes.io/enforce=baseline --overwrite)")
    if "quota" in text:
        return ("a ResourceQuota of the namespace refuses them: raise that quota (kubectl describe "
                "resourcequota) or lower the policy's spec.sweeper.resources (or spec.sweeper.replicas)")
    if ("per container" in text or "per pod" in text or "limitrange" in text
            or "limit range" in text or "limit to request ratio" in text):
        return ("a LimitRange of the namespace refuses them: fit the policy's spec.sweeper.resources to "
                "it (kubectl describe limitrange) or change that LimitRange")
    if "serviceaccount" in text or "service account" in text:
        return "the pods' ServiceAccount is missing: check the namespace's ServiceAccounts"
    return ("fix what the message names (a ResourceQuota, the namespace's PodSecurity level, a LimitRange, "
            "a PriorityClass: spec.sweeper.priorityClassName) or the policy's spec.sweeper.resources")


def sweeper_condition(outcome: ReconcileOutcome, deployment: DeploymentState | None,
                      deployment_name: str, drift_conflict: str | None = None) -> Condition:
    """SweeperAvailable. Availability is judged against the replicas the policy asks
    for (``outcome.replicas``), also when its last apply failed: the Deployment then
    runs an earlier spec, maybe with fewer replicas. ``drift_conflict``: another
    writer keeps changing the sweeper and the operator has stopped reverting it."""
    if not outcome.ok:
        if outcome.reason in (events.NAME_CONFLICT, events.OLD_SWEEPER_DELETING,
                              events.QUEUE_CLAIMED):  # that Deployment is not ours, or no sweeper may run
            return Condition(FALSE, outcome.reason, outcome.message)
        if deployment is None:
            return Condition(FALSE, outcome.reason, outcome.message)
    if deployment is None:
        return Condition(FALSE, "DeploymentMissing", f"Deployment {deployment_name} does not exist yet")
    if outcome.ok and outcome.suspended and deployment.replicas == 0:
        return Condition(TRUE, "Suspended", "spec.suspend is true: the sweeper is scaled to zero")
    if outcome.ok and outcome.replicas == 0 and deployment.replicas == 0:
        # As asked, but nothing sweeps: never "available".
        return Condition(TRUE, "ScaledToZero",
                         "spec.sweeper.replicas is 0: no sweeper runs and stalled jobs are not recovered; "
                         "set spec.sweeper.replicas to 1 or more to sweep (spec.suspend: true says a pause)")
    rolled = deployment.observed_generation >= deployment.generation and (
        outcome.deployment_generation is None
        or deployment.observed_generation >= outcome.deployment_generation)
    if not rolled:
        return Condition(FALSE, "RollingOut",
                         f"Deployment {deployment_name} has not observed its latest change yet")
    # A failed reconcile that could not tell what the policy asks for (a spec that
    # does not parse) judges the sweeper that runs, its last applied spec, by its count.
    want = deployment.replicas if outcome.replicas is None else outcome.replicas
    if not outcome.ok and want == 0:
        # Nothing runs and the policy's spec is not applied: never "0 of 0 available".
        return Condition(FALSE, outcome.reason, outcome.message)
    if deployment.pods_refused and want > 0:
        return Condition(FALSE, "PodsNotCreated",
                         f"the cluster refuses to create the pods of Deployment {deployment_name}: "
                         f"{deployment.pods_refused}; {pods_refused_hint(deployment.pods_refused)}")
    if deployment.stuck and want > 0:
        return Condition(FALSE, "ProgressDeadlineExceeded",
                         f"Deployment {deployment_name} made no progress: {deployment.stuck}; "
                         f"`kubectl describe deployment {deployment_name}` and its pods say why they do "
                         "not become ready (an image that cannot be pulled: spec.sweeper.image, "
                         "spec.sweeper.imagePullSecrets; pods that cannot be scheduled: "
                         "spec.sweeper.resources, nodeSelector, tolerations)")
    if deployment.replicas != want:
        # Scaled by hand (kubectl scale), or the policy's new count not applied: not
        # the policy's sweeper, even when "0 of 0" are up.
        if not outcome.ok:
            then = f"the policy's spec is not applied ({outcome.reason}: see the Ready condition)"
        elif drift_conflict:
            then = ("the operator has stopped reverting it: another writer keeps changing it "
                    "(DriftConflict, see the SweeperInSync condition)")
        else:
            then = "the operator re-applies the policy's spec"
        return Condition(FALSE, "Progressing",
                         f"Deployment {deployment_name} asks for {deployment.replicas} replicas, "
                         f"the policy for {want}; {then}")
    if deployment.total > deployment.updated:
        # kubectl rollout status' rule: old pods still run, the new ones may not be ready yet.
        return Condition(FALSE, "RollingOut",
                         f"{deployment.updated} of {deployment.total} sweeper pods run the current spec; "
                         "old pods are still being replaced")
    if deployment.updated < want or deployment.available < want:
        return Condition(FALSE, "Progressing",
                         f"{deployment.available} of {want} sweeper replicas available, "
                         f"{deployment.updated} updated to the current spec")
    return Condition(TRUE, "Available", f"{deployment.available} of {want} sweeper replicas available")


def redis_condition(problem: Problem | None) -> Condition:
    if problem is None:
        return Condition(TRUE, "Reachable", "the queue was read")
    return Condition(FALSE, problem.reason, problem.message)


# RedisReachable reasons that say, from the API server's answer, that the policy's
# Secret or spec.redis.url gives no Redis URL.
NO_URL_REASONS = frozenset({"SecretNotFound", "SecretKeyNotFound", "SecretValueEmpty", "InvalidRedisURL"})
# RedisReachable reasons that a person must fix in the policy or its Secret (or
# the operator's RBAC), as opposed to an outage that passes.
CONFIGURATION_REASONS = NO_URL_REASONS | {"SecretUnreadable", "InvalidSpec"}


def in_sync_condition(drift_conflict: str | None, deployment_name: str, *, reverting: bool = False) -> Condition:
    """SweeperInSync: False with DriftConflict (``drift_conflict``, its message) while
    the operator has stopped putting back a sweeper another writer keeps changing;
    False with Reverting once that is over until the policy's spec is applied again
    (an apply that fails leaves the other writer's spec running)."""
    if drift_conflict:
        return Condition(FALSE, events.DRIFT_CONFLICT, drift_conflict)
    if reverting:
        return Condition(FALSE, events.DRIFT_REVERTING,
                         f"Deployment {deployment_name} has been left alone since the drift conflict; "
                         "the policy's spec is being applied over it again")
    return Condition(TRUE, "InSync", f"Deployment {deployment_name} holds the policy's spec; "
                                     "changes made to it outside the policy are reverted")


def ready_condition(outcome: ReconcileOutcome, sweeper: Condition, redis: Condition,
                    in_sync: Condition | None = None) -> Condition:
    """Ready's reason is the most telling failure: the reconcile's own (NameConflict,
    OldSweeperDeleting, ApplyFailed, InvalidSpec), then a DriftConflict (the sweeper
    runs another writer's spec, not the policy's), then Redis (a configuration
    problem, a queue Redis refuses to read, or Redis being unreachable: a sweeper
    reports ready only while it reaches Redis, so an outage would otherwise read
    as a rollout that does not finish), then the sweeper's rollout."""
    if not outcome.ok:
        return Condition(FALSE, outcome.reason, outcome.message)
    if in_sync is not None and in_sync.status != TRUE:
        return Condition(FALSE, in_sync.reason, in_sync.message)
    if redis.status != TRUE:
        also = "" if sweeper.status == TRUE else f"; sweeper: {sweeper.message}"
        return Condition(FALSE, redis.reason, redis.message + also)
    if sweeper.status != TRUE:
        return Condition(FALSE, sweeper.reason, sweeper.message)
    if sweeper.reason == "Suspended":
        return Condition(TRUE, "Suspended", "the policy is suspended; Redis is reachable")
    if sweeper.reason == "ScaledToZero":
        return Condition(TRUE, "ScaledToZero", "spec.sweeper.replicas is 0: no sweeper runs; Redis is reachable")
    return Condition(TRUE, "Ready", "the sweeper is available and Redis is reachable")


def condition_of(status: Mapping[str, Any] | None, type_: str) -> Mapping[str, Any] | None:
    for condition in (status or {}).get("conditions") or []:
        if condition.get("type") == type_:
            found: Mapping[str, Any] = condition
            return found
    return None
