"""Drift reverts and the DriftConflict: a condition on the policy, and a revert
budget that an operator restart does not refill."""

from __future__ import annotations

import copy

from stalledpolicy.controller import drift
from stalledpolicy.controller.reconcile import reconcile
from stalledpolicy.controller.retry import Retries
from stalledpolicy.controller.status import condition_of
from tests.unit.test_operator_parts import FakeApps, b64, fake_controller, policy_body

SECRETS = {("ns", "creds"): {"url": b64("redis://db:6379/0")}}
KEY = ("ns", "p")


def started(apps, now, body=None, secrets=SECRETS):
    """A controller (a new operator process) on the fake cluster ``apps``, its
    policy reconciled as kopf's resume handler does."""
    ctl = fake_controller(apps, dict(secrets))
    ctl.clock = lambda: now[0]
    ctl.retries = Retries(ctl.config.max_backoff, clock=lambda: now[0])
    body = body or policy_body()
    ctl.observe_policy(body, "ADDED")
    reconcile(ctl, body, resume=True)
    return ctl


def rival_change(apps):
    """Another field manager sets spec.replicas to 0 (as its own apply would)."""
    changed = apps.scale_by_hand(0)
    changed["metadata"]["managedFields"] = [
        {"manager": "stalledpolicy-operator", "operation": "Apply", "time": "2026-12-03T00:00:02Z"},
        {"manager": "rival-operator", "operation": "Apply", "time": "2026-12-03T00:00:03Z"}]
    return changed


def fight(ctl, apps, now, times):
    for _ in range(times):
        changed = rival_change(apps)
        ctl.observe_deployment(changed, "MODIFIED")
        drift.revert_drift(ctl, KEY, changed)
        ctl.sync(KEY)
        now[0] += 10


def kinds(ctl):
    return [e[2] for e in ctl.recorder.events]


def test_a_drift_conflict_is_the_policys_condition_and_ready_says_so():
    apps, now = FakeApps(), [1_800_000_000.25]
    ctl = started(apps, now)
    ctl.sync(KEY)
    status = ctl.policies[KEY].status
    assert condition_of(status, "SweeperInSync") is None, "no condition before any conflict"
    assert condition_of(status, "Ready")["reason"] != "DriftConflict"

    fight(ctl, apps, now, drift.DRIFT_MAX_REVERTS + 1)
    assert kinds(ctl).count("DriftReverted") == drift.DRIFT_MAX_REVERTS and kinds(ctl).count("DriftConflict") == 1
    ctl.sync(KEY)
    status = ctl.policies[KEY].status
    in_sync, ready = condition_of(status, "SweeperInSync"), condition_of(status, "Ready")
    assert (in_sync["status"], in_sync["reason"]) == ("False", "DriftConflict")
    assert "'rival-operator'" in in_sync["message"] and "p-sweeper" in in_sync["message"]
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", "DriftConflict", in_sync["message"])
    assert in_sync["observedGeneration"] == 1


def test_the_revert_budget_survives_an_operator_restart():
    """Two reverts, a restart, then the third is the last: the fourth change is a
    conflict. Before, the new process had a budget of three reverts again."""
    apps, now = FakeApps(), [1_800_000_000.25]
    first = started(apps, now)
    fight(first, apps, now, 2)
    recorded = apps.stored["metadata"]["annotations"][drift.DRIFT_REVERTS_ANNOTATION]
    assert recorded == "2027-01-15T08:00:00Z,2027-01-15T08:00:10Z"
    # The annotation is in the Deployment's generation: that write is ours, not drift.
    assert drift.drifted_policy(first, copy.deepcopy(apps.stored)) is None

    second = started(apps, now)  # the operator restarted
    fight(second, apps, now, 2)
    assert kinds(second) == ["DriftReverted", "DriftConflict"]
    assert apps.stored["spec"]["replicas"] == 0  # left to the other writer
    assert len(drift.recorded_reverts(apps.stored)) == drift.DRIFT_MAX_REVERTS


def test_reverts_in_the_same_second_count_each():
    apps, now = FakeApps(), [1_800_000_000.25]
    ctl = started(apps, now)
    for _ in range(drift.DRIFT_MAX_REVERTS):
        changed = rival_change(apps)
        drift.revert_drift(ctl, KEY, changed)
        ctl.sync(KEY)
        now[0] += 0.1
    assert kinds(ctl) == ["DriftReverted"] * drift.DRIFT_MAX_REVERTS
    assert len(drift.recorded_reverts(apps.stored)) == drift.DRIFT_MAX_REVERTS
    drift.revert_drift(ctl, KEY, rival_change(apps))
    ctl.sync(KEY)
    assert kinds(ctl)[-1] == "DriftConflict"


def test_reverts_older_than_the_window_are_not_counted_after_a_restart():
    apps, now = FakeApps(), [1_800_000_000.25]
    first = started(apps, now)
    fight(first, apps, now, 2)
    now[0] += drift.DRIFT_WINDOW
    second = started(apps, now)
    fight(second, apps, now, drift.DRIFT_MAX_REVERTS)
    assert kinds(second) == ["DriftReverted"] * drift.DRIFT_MAX_REVERTS


def test_a_conflict_outlives_a_restart_and_ends_when_the_sweeper_is_left_alone():
    apps, now = FakeApps(), [1_800_000_000.25]
    first = started(apps, now)
    fight(first, apps, now, drift.DRIFT_MAX_REVERTS + 1)
    first.sync(KEY)
    stored = first.policies[KEY].status

    body = policy_body()
    body["status"] = copy.deepcopy(stored)
    # Restarted: the status says there is a conflict. kopf's resume handler applies
    # nothing: the other writer's change stays, and no revert goes uncounted.
    applied = len(apps.applied)
    second = started(apps, now, body)
    assert len(apps.applied) == applied and apps.stored["spec"]["replicas"] == 0
    assert second.policies[KEY].outcome.ok
    assert drift.drifted_policy(second, copy.deepcopy(apps.stored)) is None
    apps.stored["status"] = {"observedGeneration": apps.stored["metadata"]["generation"], "replicas": 0}
    second.observe_deployment(copy.deepcopy(apps.stored), "MODIFIED")  # the deployment controller's
    second.sync(KEY)
    sweeper = condition_of(second.policies[KEY].status, "SweeperAvailable")
    assert "stopped reverting" in sweeper["message"] and "re-applies" not in sweeper["message"]
    assert len(apps.applied) == applied  # nor the status loop (no Secret change, conflict on)
    fight(second, apps, now, 1)
    assert apps.stored["spec"]["replicas"] == 0 and "DriftReverted" not in kinds(second)
    second.sync(KEY)
    assert condition_of(second.policies[KEY].status, "SweeperInSync")["reason"] == "DriftConflict"

    # The deployment controller's status writes on the drifted Deployment are no change:
    # they do not hold the conflict open.
    drifted = copy.deepcopy(apps.stored)
    now[0] += drift.DRIFT_WINDOW - 20  # 10 s after the rival's last change, then this
    drift.revert_drift(second, KEY, drifted)
    second.sync(KEY)
    assert apps.stored["spec"]["replicas"] == 0
    now[0] += 15
    applied = len(apps.applied)
    second.sync(KEY)  # left alone for a whole window: the policy's spec again
    assert len(apps.applied) == applied + 1 and apps.stored["spec"]["replicas"] == 1
    second.sync(KEY)
    status = second.policies[KEY].status
    in_sync = condition_of(status, "SweeperInSync")
    assert (in_sync["status"], in_sync["reason"]) == ("True", "InSync")
    assert condition_of(status, "Ready")["reason"] != "DriftConflict"
    fight(second, apps, now, 1)
    assert kinds(second) == ["DriftReverted"]


def edited(body, generation, replicas):
    body = copy.deepcopy(body)
    body["metadata"].update(generation=generation, resourceVersion=str(generation))
    body["spec"].setdefault("sweeper", {})["replicas"] = replicas
    return body


def test_an_edit_of_the_policy_during_a_conflict_is_applied_and_ends_it():
    """docs/operations.md: "the edit is applied at once and ends the conflict". Before, the edit was
    applied but SweeperInSync stayed False (and Ready False, DriftConflict) for the
    rest of the 5 minutes, with observedGeneration current: `kubectl wait
    --for=condition=Ready` after the fix timed out. Now the applied edit ends the
    conflict and refills the revert budget (the Deployment's annotation too)."""
    apps, now = FakeApps(), [1_800_000_000.25]
    ctl = started(apps, now)
    fight(ctl, apps, now, drift.DRIFT_MAX_REVERTS + 1)
    ctl.sync(KEY)
    assert condition_of(ctl.policies[KEY].status, "Ready")["reason"] == "DriftConflict"
    assert drift.DRIFT_REVERTS_ANNOTATION in apps.stored["metadata"]["annotations"]

    # An annotation edit (no new generation) changes nothing.
    reconcile(ctl, edited(policy_body(), 1, 1))
    assert ctl.policies[KEY].drift.conflict

    body = edited(policy_body(), 2, 2)
    ctl.observe_policy(body, "MODIFIED")
    reconcile(ctl, body)  # kopf's update handler
    assert apps.stored["spec"]["replicas"] == 2
    assert drift.DRIFT_REVERTS_ANNOTATION not in apps.stored["metadata"]["annotations"]
    # our own annotation write is no drift
    assert drift.drifted_policy(ctl, copy.deepcopy(apps.stored)) is None
    apps.stored["status"] = {"observedGeneration": apps.stored["metadata"]["generation"], "replicas": 2,
                             "updatedReplicas": 2, "availableReplicas": 2, "readyReplicas": 2}
    ctl.observe_deployment(copy.deepcopy(apps.stored), "MODIFIED")
    ctl.sync(KEY)
    status = ctl.policies[KEY].status
    in_sync, ready = condition_of(status, "SweeperInSync"), condition_of(status, "Ready")
    assert (in_sync["status"], in_sync["reason"], in_sync["observedGeneration"]) == ("True", "InSync", 2)
    assert (ready["status"], ready["reason"], status["observedGeneration"]) == ("True", "Ready", 2)

    # A full budget again: the next changes are reverted, three times, before a new conflict.
    fight(ctl, apps, now, drift.DRIFT_MAX_REVERTS + 1)
    assert kinds(ctl)[-drift.DRIFT_MAX_REVERTS - 1:] == ["DriftReverted"] * drift.DRIFT_MAX_REVERTS + ["DriftConflict"]


def test_the_sync_that_applies_the_edit_never_shows_the_conflicting_generation_in_sync():
    """An edit ends the conflict: the status the same sync writes has SweeperInSync
    True for the edited generation. Before (the apply and the status refresh on two
    threads), a refresh between the end of the conflict and the edit's outcome
    wrote SweeperInSync True with the generation that was in conflict (seen by the
    kube test as observedGeneration 1 after the edit to 2)."""
    apps, now = FakeApps(), [1_800_000_000.25]
    ctl = started(apps, now)
    fight(ctl, apps, now, drift.DRIFT_MAX_REVERTS + 1)
    ctl.sync(KEY)
    body = edited(policy_body(), 2, 2)
    ctl.observe_policy(body, "MODIFIED")
    ctl.sync(KEY)
    assert apps.stored["spec"]["replicas"] == 2
    in_sync = condition_of(ctl.policies[KEY].status, "SweeperInSync")
    assert (in_sync["status"], in_sync["observedGeneration"]) == ("True", 2)


def test_an_edit_made_while_the_operator_was_down_during_a_conflict_is_applied_at_start():
    apps, now = FakeApps(), [1_800_000_000.25]
    first = started(apps, now)
    fight(first, apps, now, drift.DRIFT_MAX_REVERTS + 1)
    first.sync(KEY)
    body = edited(policy_body(), 2, 2)
    body["status"] = copy.deepcopy(first.policies[KEY].status)  # the conflict, at generation 1
    second = started(apps, now, body)
    assert apps.stored["spec"]["replicas"] == 2 and not second.policies[KEY].drift.conflict
    assert drift.DRIFT_REVERTS_ANNOTATION not in apps.stored["metadata"]["annotations"]


def test_a_conflict_ended_by_the_window_is_in_sync_only_once_the_spec_is_applied_again():
    """The window is over, the re-apply refused: SweeperInSync said True (written
    before the re-apply) while the other writer's spec ran on."""
    from tests.unit.test_operator_parts import api_error

    apps, now = FakeApps(), [1_800_000_000.25]
    ctl = started(apps, now)
    fight(ctl, apps, now, drift.DRIFT_MAX_REVERTS + 1)
    ctl.sync(KEY)
    now[0] += drift.DRIFT_WINDOW + 1
    apps.refuse = api_error(500, "Internal Server Error", "etcdserver: request timed out")
    ctl.sync(KEY)  # left alone for a whole window: the re-apply is refused
    assert apps.stored["spec"]["replicas"] == 0
    ctl.sync(KEY)
    status = ctl.policies[KEY].status
    in_sync, ready = condition_of(status, "SweeperInSync"), condition_of(status, "Ready")
    assert (in_sync["status"], in_sync["reason"]) == ("False", "Reverting"), in_sync
    assert (ready["status"], ready["reason"]) == ("False", "ApplyFailed")

    apps.refuse = None
    now[0] += 5  # the first retry's delay
    ctl.sync(KEY)  # sync retries the re-apply
    assert apps.stored["spec"]["replicas"] == 1
    ctl.sync(KEY)
    status = ctl.policies[KEY].status
    assert condition_of(status, "SweeperInSync")["status"] == "True"
    assert condition_of(status, "Ready")["reason"] == "RollingOut"  # the new spec's rollout, nothing else


def test_a_change_made_while_no_operator_ran_is_a_counted_revert_at_the_start():
    """kopf's resume apply puts back what another writer changed while the operator
    was down: a revert like any other (event, metric, record, budget). Before, it was
    counted nowhere."""
    apps, now = FakeApps(), [1_800_000_000.25]
    first = started(apps, now)
    fight(first, apps, now, 1)
    rival_change(apps)  # while no operator runs
    second = started(apps, now)
    assert apps.stored["spec"]["replicas"] == 1
    assert kinds(second) == ["DriftReverted"]
    assert "while the operator was not running" in second.recorder.events[0][3]
    assert second.metrics.drift_reverts._value.get() == 1
    assert len(drift.recorded_reverts(apps.stored)) == 2 == len(second.policies[KEY].drift.reverts)
    assert drift.drifted_policy(second, copy.deepcopy(apps.stored)) is None  # the record's write is ours
    # the budget holds that revert: one more change is the last revert, the next a conflict
    fight(second, apps, now, 2)
    assert kinds(second) == ["DriftReverted", "DriftReverted", "DriftConflict"]


def test_a_start_that_applies_an_edit_or_nothing_counts_no_revert():
    apps, now = FakeApps(), [1_800_000_000.25]
    started(apps, now)
    assert kinds(started(apps, now)) == []  # nothing changed meanwhile
    edited = policy_body({"queue": "orders", "maxStalled": 3,
                          "redis": {"secretRef": {"name": "creds", "key": "url"}}}, generation=2)
    rival_change(apps)  # and the policy edited too: its apply is the edit's, not a revert
    ctl = started(apps, now, edited)
    assert "DriftReverted" not in kinds(ctl) and apps.stored["spec"]["replicas"] == 1
    assert drift.DRIFT_REVERTS_ANNOTATION not in (apps.stored["metadata"].get("annotations") or {})


def test_a_start_that_rolls_a_rotated_secret_counts_no_revert():
    apps, now = FakeApps(), [1_800_000_000.25]
    started(apps, now)
    rotated = {("ns", "creds"): {"url": b64("redis://:new@db:6379/0")}}
    rival_change(apps)  # and the Secret rotated: the apply rolls the pods for the new digest
    ctl = started(apps, now, secrets=rotated)
    assert "DriftReverted" not in kinds(ctl) and apps.stored["spec"]["replicas"] == 1


def test_a_restart_with_nothing_changed_applies_nothing():
    """The resume apply of a sweeper that is as the operator left it would change
    nothing: no request is made (one per policy at each restart, before)."""
    apps, now = FakeApps(), [1_800_000_000.25]
    first = started(apps, now)
    first.sync(KEY)
    assert len(apps.applied) == 1
    generation = apps.stored["metadata"]["generation"]
    for _ in range(2):
        restarted = started(apps, now)
        restarted.sync(KEY)
        outcome = restarted.policies[KEY].outcome
        assert outcome.ok and outcome.deployment_generation == generation
    assert len(apps.applied) == 1 and apps.annotation_patches == []
    assert "DriftReverted" not in kinds(restarted)
    assert restarted.metrics.value("stalledpolicy_operator_drift_reverts_total") == 0


def test_a_change_made_while_no_operator_ran_is_still_applied_and_counted():
    apps, now = FakeApps(), [1_800_000_000.25]
    started(apps, now)
    apps.scale_by_hand(0)
    restarted = started(apps, now)
    assert len(apps.applied) == 2 and apps.stored["spec"]["replicas"] == 1
    assert kinds(restarted).count("DriftReverted") == 1
    assert restarted.metrics.value("stalledpolicy_operator_drift_reverts_total") == 1
    assert drift.recorded_reverts(apps.stored), "the revert is recorded on the sweeper"


def test_a_field_removed_by_hand_while_no_operator_ran_is_applied_back():
    """A removal leaves the applied digest on the sweeper as it was: the fields are
    compared too."""
    apps, now = FakeApps(), [1_800_000_000.25]
    started(apps, now)
    container = apps.stored["spec"]["template"]["spec"]["containers"][0]
    removed = container["env"].pop(0)
    apps.stored["metadata"]["generation"] += 1
    started(apps, now)
    assert len(apps.applied) == 2
    assert removed in apps.stored["spec"]["template"]["spec"]["containers"][0]["env"]
