"""The operator's status computation: conditions, observedGeneration, patch-on-change."""

from __future__ import annotations

from stalledpolicy.controller.status import (
    FALSE,
    READY,
    REDIS_REACHABLE,
    SWEEPER_AVAILABLE,
    TRUE,
    DeploymentState,
    Problem,
    ReconcileOutcome,
    condition_of,
    sweeper_condition,
)
from stalledpolicy.controller.status_document import desired_status, status_patch
from stalledpolicy.engine import LaneSnapshot, QueueSnapshot

T0, T1, T2 = "2026-12-02T10:00:00Z", "2026-12-02T10:00:10Z", "2026-12-02T10:00:20Z"


def snapshot(dead=0, pending=0, active=0, lanes=()):
    return QueueSnapshot(dead=dead, pending=pending, active=active, recovered_total=3,
                         dead_lettered_total=dead, orphans_total=0, quarantined_total=0,
                         lanes=list(lanes))


def available(generation=1, replicas=1):
    return DeploymentState(generation=generation, observed_generation=generation, replicas=replicas,
                           updated=replicas, available=replicas, ready=replicas)


def applied(generation=1, deployment_generation=1, suspended=False):
    return ReconcileOutcome(generation, True, "Applied", "applied", suspended=suspended,
                            deployment_generation=deployment_generation)


def test_ready_when_sweeper_available_and_queue_read():
    status = desired_status({}, outcome=applied(), deployment=available(), deployment_name="p-sweeper",
                            snapshot=snapshot(dead=2, pending=5, active=1), now=T0)
    assert condition_of(status, READY)["status"] == TRUE
    assert status["deadLetters"] == 2 and status["pending"] == 5 and status["active"] == 1
    assert status["observedGeneration"] == 1
    assert all(c["observedGeneration"] == 1 for c in status["conditions"])
    assert status["lastUpdateTime"] == T0


def test_same_observation_twice_needs_no_patch():
    first = desired_status({}, outcome=applied(), deployment=available(), deployment_name="p-sweeper",
                           snapshot=snapshot(dead=2), now=T0)
    again = desired_status(first, outcome=applied(), deployment=available(), deployment_name="p-sweeper",
                           snapshot=snapshot(dead=2), now=T1)
    assert status_patch(first, again) is None
    assert again["lastUpdateTime"] == T0


def test_a_grown_morgue_patches_only_what_changed():
    first = desired_status({}, outcome=applied(), deployment=available(), deployment_name="p-sweeper",
                           snapshot=snapshot(dead=2), now=T0)
    later = desired_status(first, outcome=applied(), deployment=available(), deployment_name="p-sweeper",
                           snapshot=snapshot(dead=5), now=T1)
    patch = status_patch(first, later)
    assert patch["deadLetters"] == 5
    assert patch["lastUpdateTime"] == T1
    assert "conditions" not in patch  # nothing about readiness changed


def test_unreachable_redis_keeps_last_numbers_and_marks_ready_false():
    first = desired_status({}, outcome=applied(), deployment=available(), deployment_name="p-sweeper",
                           snapshot=snapshot(dead=4, pending=9), now=T0)
    down = desired_status(first, outcome=applied(), deployment=available(), deployment_name="p-sweeper",
                          problem=Problem("RedisUnreachable", "cannot read queue"), now=T1)
    assert down["deadLetters"] == 4 and down["pending"] == 9
    redis = condition_of(down, REDIS_REACHABLE)
    assert (redis["status"], redis["reason"], redis["lastTransitionTime"]) == (FALSE, "RedisUnreachable", T1)
    ready = condition_of(down, READY)
    assert (ready["status"], ready["reason"]) == (FALSE, "RedisUnreachable")
    # The sweeper condition did not change status: its transition time stays.
    assert condition_of(down, SWEEPER_AVAILABLE)["lastTransitionTime"] == T0


def test_observed_generation_follows_the_reconciled_generation_not_the_newest():
    first = desired_status({}, outcome=applied(generation=1), deployment=available(),
                           deployment_name="p-sweeper", snapshot=snapshot(), now=T0)
    # The spec changed to generation 2, the reconcile applied it (Deployment generation 2),
    # but the deployment controller has not observed it yet: not Ready for generation 2.
    rolling = DeploymentState(generation=2, observed_generation=1, replicas=1, updated=1, available=1, ready=1)
    second = desired_status(first, outcome=applied(generation=2, deployment_generation=2),
                            deployment=rolling, deployment_name="p-sweeper", snapshot=snapshot(), now=T1)
    assert second["observedGeneration"] == 2
    ready = condition_of(second, READY)
    assert (ready["status"], ready["observedGeneration"]) == (FALSE, 2)
    done = DeploymentState(generation=2, observed_generation=2, replicas=1, updated=1, available=1, ready=1)
    third = desired_status(second, outcome=applied(generation=2, deployment_generation=2),
                           deployment=done, deployment_name="p-sweeper", snapshot=snapshot(), now=T2)
    assert condition_of(third, READY)["status"] == TRUE


def test_stale_deployment_state_from_before_the_apply_is_not_trusted():
    # Memory still holds the Deployment as it was at generation 1 (fully available),
    # but the apply returned generation 2: the sweeper has not restarted yet.
    outcome = applied(generation=3, deployment_generation=2)
    condition = sweeper_condition(outcome, available(generation=1), "p-sweeper")
    assert condition.status == FALSE and condition.reason == "RollingOut"


def test_name_conflict_makes_ready_false_with_its_reason():
    outcome = ReconcileOutcome(1, False, "NameConflict", "Deployment ns/p-sweeper already exists")
    status = desired_status({}, outcome=outcome, deployment=available(), deployment_name="p-sweeper",
                            snapshot=snapshot(), now=T0)
    for type_ in (READY, SWEEPER_AVAILABLE):
        condition = condition_of(status, type_)
        assert (condition["status"], condition["reason"]) == (FALSE, "NameConflict")


def test_suspended_policy_is_ready_with_zero_replicas():
    outcome = applied(suspended=True)
    zero = DeploymentState(generation=1, observed_generation=1, replicas=0, updated=0, available=0, ready=0)
    status = desired_status({}, outcome=outcome, deployment=zero, deployment_name="p-sweeper",
                            snapshot=snapshot(), now=T0)
    assert condition_of(status, SWEEPER_AVAILABLE)["reason"] == "Suspended"
    assert (condition_of(status, READY)["status"], condition_of(status, READY)["reason"]) == (TRUE, "Suspended")


def test_rollout_with_old_pods_left_is_not_available():
    # The deployment controller counts the old pod as available and the new one as
    # updated before the new one is ready: that is not the new sweeper running.
    rolling = DeploymentState(generation=2, observed_generation=2, replicas=1, updated=1, available=1,
                              ready=1, total=2)
    condition = sweeper_condition(applied(generation=2, deployment_generation=2), rolling, "p-sweeper")
    assert condition.status == FALSE and condition.reason == "RollingOut"


def test_progressing_deployment_is_not_available():
    partial = DeploymentState(generation=1, observed_generation=1, replicas=2, updated=2, available=1, ready=1)
    condition = sweeper_condition(applied(), partial, "p-sweeper")
    assert condition.status == FALSE and "1 of 2" in condition.message


def test_missing_secret_reason_reaches_ready():
    status = desired_status({}, outcome=applied(), deployment=available(), deployment_name="p-sweeper",
                            problem=Problem("SecretNotFound", "Secret ns/creds does not exist"), now=T0)
    ready = condition_of(status, READY)
    assert (ready["status"], ready["reason"]) == (FALSE, "SecretNotFound")
    assert "ns/creds" in ready["message"]


def test_lanes_and_last_replay_are_published():
    snap = snapshot(lanes=[LaneSnapshot(name="imports", pending=3, recovered_total=1, dead_lettered_total=2)])
    record = {"token": "t1", "replayed": 2, "time": T0}
    status = desired_status({}, outcome=applied(), deployment=available(), deployment_name="p-sweeper",
                            snapshot=snap, last_replay=record, now=T0)
    assert status["lanes"] == [{"name": "imports", "pending": 3, "deadLettered": 2, "recovered": 1}]
    assert status["lastReplay"] == record
    assert status["sweeperDeployment"] == "p-sweeper"


def test_deployment_state_reads_defaults():
    state = DeploymentState.from_object({"metadata": {"generation": 4}, "spec": {}, "status": {}})
    assert (state.generation, state.replicas, state.available, state.observed_generation) == (4, 1, 0, 0)


def test_a_sweeper_scaled_to_zero_by_hand_is_not_available():
    # kubectl scale --replicas=0: the Deployment is "0 of 0 available", which is
    # not what the policy asks for.
    outcome = ReconcileOutcome(1, True, "Applied", "applied", deployment_generation=2, replicas=1)
    scaled = DeploymentState(generation=2, observed_generation=2, replicas=0, updated=0, available=0, ready=0)
    condition = sweeper_condition(outcome, scaled, "p-sweeper")
    assert (condition.status, condition.reason) == (FALSE, "Progressing")
    assert "asks for 0 replicas, the policy for 1" in condition.message
    status = desired_status({}, outcome=outcome, deployment=scaled, deployment_name="p-sweeper",
                            snapshot=snapshot(), now=T0)
    assert condition_of(status, READY)["status"] == FALSE


def test_availability_is_counted_against_the_policys_replicas():
    outcome = ReconcileOutcome(1, True, "Applied", "applied", deployment_generation=1, replicas=2)
    # Someone scaled 2 -> 1 and the one pod is up: still short of the policy's two.
    one = DeploymentState(generation=1, observed_generation=1, replicas=1, updated=1, available=1, ready=1)
    assert sweeper_condition(outcome, one, "p-sweeper").status == FALSE
    two = DeploymentState(generation=1, observed_generation=1, replicas=2, updated=2, available=2, ready=2)
    assert sweeper_condition(outcome, two, "p-sweeper").message == "2 of 2 sweeper replicas available"


def test_a_configuration_problem_is_ready_s_reason_before_progressing():
    # A missing Secret keeps the new pods from starting: the rollout never ends,
    # and the reason to show is the Secret, not the rollout.
    starting = DeploymentState(generation=1, observed_generation=1, replicas=1, updated=1, available=0, ready=0)
    for reason in ("SecretNotFound", "SecretKeyNotFound", "SecretUnreadable", "InvalidRedisURL"):
        status = desired_status({}, outcome=applied(), deployment=starting, deployment_name="p-sweeper",
                                problem=Problem(reason, f"{reason} message"), now=T0)
        ready = condition_of(status, READY)
        assert (ready["status"], ready["reason"]) == (FALSE, reason)
        assert ready["message"] == f"{reason} message; sweeper: 0 of 1 sweeper replicas available, " \
            "1 updated to the current spec"
        assert condition_of(status, SWEEPER_AVAILABLE)["reason"] == "Progressing"
    # An unreachable Redis comes first too: a sweeper is ready only while it
    # reaches Redis, so the pods it keeps unready are not the cause.
    status = desired_status({}, outcome=applied(), deployment=starting, deployment_name="p-sweeper",
                            problem=Problem("RedisUnreachable", "down"), now=T0)
    ready = condition_of(status, READY)
    assert (ready["reason"], ready["message"]) == (
        "RedisUnreachable", "down; sweeper: 0 of 1 sweeper replicas available, 1 updated to the current spec")
    assert condition_of(status, SWEEPER_AVAILABLE)["reason"] == "Progressing"
    # The reconcile's own failure (the API refused the Deployment) comes before all.
    refused = ReconcileOutcome(2, False, "ApplyFailed", "applying Deployment ns/p-sweeper failed: HTTP 422 ...")
    status = desired_status({}, outcome=refused, deployment=available(), deployment_name="p-sweeper",
                            snapshot=snapshot(), problem=Problem("SecretNotFound", "no Secret"), now=T0)
    ready = condition_of(status, READY)
    assert (ready["status"], ready["reason"]) == (FALSE, "ApplyFailed") and "HTTP 422" in ready["message"]
    # The sweeper that runs (the last applied spec) is still described as it is.
    assert condition_of(status, SWEEPER_AVAILABLE)["status"] == TRUE


def deployment_object(conditions, replicas=1, available=0):
    """A sweeper Deployment as the deployment controller leaves it."""
    return {"metadata": {"generation": 1}, "spec": {"replicas": replicas},
            "status": {"observedGeneration": 1, "replicas": replicas, "updatedReplicas": replicas,
                       "availableReplicas": available, "conditions": conditions}}


def test_pods_the_cluster_refuses_and_a_stuck_rollout_are_the_sweepers_reason():
    refused = DeploymentState.from_object(deployment_object([
        {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"},
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
         "message": 'pods "p-sweeper-1" is forbidden: exceeded quota: q, requested: pods=1'}], replicas=1))
    condition = sweeper_condition(applied(), refused, "p-sweeper")
    assert (condition.status, condition.reason) == (FALSE, "PodsNotCreated")
    assert "exceeded quota" in condition.message and "p-sweeper" in condition.message
    status = desired_status({}, outcome=applied(), deployment=refused, deployment_name="p-sweeper",
                            snapshot=snapshot(), now=T0)
    assert condition_of(status, READY)["reason"] == "PodsNotCreated"

    stuck = DeploymentState.from_object(deployment_object([
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
         "message": 'ReplicaSet "p-sweeper-1" has timed out progressing.'}]))
    condition = sweeper_condition(applied(), stuck, "p-sweeper")
    assert (condition.status, condition.reason) == (FALSE, "ProgressDeadlineExceeded")
    assert "timed out progressing" in condition.message and "spec.sweeper.image" in condition.message

    # suspended: no pods wanted, nothing to refuse
    suspended = DeploymentState.from_object(deployment_object([
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": "stale"}], replicas=0))
    outcome = ReconcileOutcome(1, True, "Applied", "applied", suspended=True, deployment_generation=1, replicas=0)
    assert sweeper_condition(outcome, suspended, "p-sweeper").reason == "Suspended"
    # a healthy Deployment reads as before
    healthy = DeploymentState.from_object(deployment_object([
        {"type": "Available", "status": "True"},
        {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}], available=1))
    assert sweeper_condition(applied(), healthy, "p-sweeper").reason == "Available"


def test_a_sweeper_scaled_to_zero_by_the_policy_does_not_read_as_a_running_sweeper():
    """spec.sweeper.replicas: 0 without suspend: nothing sweeps. Ready may be True (the
    policy is as asked) but must not say 'the sweeper is available'."""
    outcome = ReconcileOutcome(1, True, "Applied", "applied", deployment_generation=1, replicas=0)
    zero = available(replicas=0)
    sweeper = sweeper_condition(outcome, zero, "p-sweeper")
    assert (sweeper.status, sweeper.reason) == (TRUE, "ScaledToZero")
    assert "spec.sweeper.replicas" in sweeper.message and "spec.suspend" in sweeper.message
    status = desired_status({}, outcome=outcome, deployment=zero, deployment_name="p-sweeper",
                            snapshot=snapshot(), now=T0)
    ready = condition_of(status, READY)
    assert (ready["status"], ready["reason"]) == (TRUE, "ScaledToZero")
    assert "available" not in ready["message"]


def test_the_status_json_patch_is_guarded_by_the_uid_and_sets_members_whole():
    from stalledpolicy.controller.status_document import status_json_patch

    ops = status_json_patch("u-1", {"pending": 1}, {"pending": 2, "a/b~c": {"x": None, "y": 1}})
    assert ops == [{"op": "test", "path": "/metadata/uid", "value": "u-1"},
                   {"op": "add", "path": "/status/pending", "value": 2},
                   {"op": "add", "path": "/status/a~1b~0c", "value": {"y": 1}}]
    # No status known on the server: its members could not be added, the status is set whole.
    assert status_json_patch("u-1", {}, {"pending": 2})[1:] == [
        {"op": "add", "path": "/status", "value": {"pending": 2}}]


def test_a_failed_apply_judges_the_sweeper_against_the_replicas_the_policy_asks_for():
    """The policy asks for 2 replicas, its apply is refused (requests above limits), the
    Deployment left from before asks for 0: not "0 of 0 sweeper replicas available"."""
    zero = DeploymentState(generation=3, observed_generation=3, replicas=0, updated=0, available=0, ready=0,
                           total=0)
    refused = ReconcileOutcome(4, False, "ApplyFailed", "applying Deployment ns/p-sweeper failed: HTTP 422",
                               replicas=2)
    condition = sweeper_condition(refused, zero, "p-sweeper")
    assert (condition.status, condition.reason) == (FALSE, "Progressing")
    assert "the policy for 2" in condition.message and "not applied" in condition.message
    assert "re-applies" not in condition.message
    # A failed reconcile that cannot tell the count (a spec that does not parse) never
    # calls a Deployment at 0 available either.
    invalid = ReconcileOutcome(4, False, "InvalidSpec", "spec.maxStalled: ...")
    assert sweeper_condition(invalid, zero, "p-sweeper").status == FALSE
    # Asked for 2, 2 run (the last applied spec): described as it is.
    two = available(replicas=2)
    assert sweeper_condition(refused, two, "p-sweeper").status == TRUE


def test_during_a_drift_conflict_the_sweepers_message_does_not_promise_a_revert():
    scaled = DeploymentState(generation=5, observed_generation=5, replicas=0, updated=0, available=0, ready=0)
    outcome = ReconcileOutcome(1, True, "Applied", "applied", deployment_generation=5, replicas=1)
    assert "re-applies the policy's spec" in sweeper_condition(outcome, scaled, "p-sweeper").message
    condition = sweeper_condition(outcome, scaled, "p-sweeper", drift_conflict="changed 4 times ...")
    assert condition.reason == "Progressing"
    assert "re-applies" not in condition.message and "stopped reverting" in condition.message
    status = desired_status({}, outcome=outcome, deployment=scaled, deployment_name="p-sweeper",
                            snapshot=snapshot(), now=T0, drift_conflict="changed 4 times ...")
    assert "stopped reverting" in condition_of(status, SWEEPER_AVAILABLE)["message"]


def test_the_hint_for_pods_not_created_follows_the_refusal():
    def hint(message):
        refused = DeploymentState.from_object(deployment_object([
            {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": message}]))
        condition = sweeper_condition(applied(), refused, "p-sweeper")
        assert condition.reason == "PodsNotCreated" and message in condition.message
        return condition.message.split(message, 1)[1]

    priority = hint('pods "p-sweeper-7d9-" is forbidden: no PriorityClass with name urgent was found')
    assert "spec.sweeper.priorityClassName" in priority
    assert "ResourceQuota" not in priority and "spec.sweeper.resources" not in priority
    quota = hint('pods "p-sweeper-7d9-x" is forbidden: exceeded quota: q, requested: pods=1, used: pods=1, '
                 'limited: pods=1')
    assert "ResourceQuota" in quota and "spec.sweeper.resources" in quota and "priorityClassName" not in quota
    security = hint('pods "p-sweeper-7d9-x" is forbidden: violates PodSecurity "restricted:latest": '
                    'seccompProfile (pod or container "sweeper" must set securityContext.seccompProfile.type)')
    assert "pod-security.kubernetes.io/enforce" in security and "spec.sweeper.resources" not in security
    limits = hint('pods "p-sweeper-7d9-x" is forbidden: maximum memory usage per Container is 128Mi, '
                  'but limit is 256Mi')
    assert "LimitRange" in limits and "spec.sweeper.resources" in limits
    other = hint('pods "p-sweeper-7d9-x" is forbidden: something new')
    assert "spec.sweeper.resources" in other
