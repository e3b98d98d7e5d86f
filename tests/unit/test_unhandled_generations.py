"""The sweeper follows the policy's current spec, also when kopf calls no handler for it.

A reconcile applies the newest body the controller has seen (reconcile.reconcile):
the status loop's status write answers with the policy as the API server holds it,
which may be a generation kopf has not handled yet. kopf then records as handled
the body its handler was called with, not the one applied. An edit back to that
body's spec is no change to kopf: no handler is called, and before, nothing applied
it: the sweeper ran the spec of the generation in between for good, and
status.observedGeneration stayed at that generation through every refresh. The
policy's sync now applies a policy generation newer than the one last applied,
whether or not kopf's handler asks for it."""

from __future__ import annotations

import copy
import json

import pytest

from stalledpolicy.controller.apply_requests import ApplyRequest
from tests.unit.test_budget_changed_events import (
    StatusWriteAnswering,
    budget_events,
    edited,
    max_stalled_of,
    running_budget,
)
from tests.unit.test_operator_parts import api_error, b64, reconciled_policy, retry_due

KEY = ("ns", "p")


class Kopf:
    """kopf's update handling as it decides whether to call a handler: the spec of
    the body its last handler was called with (its stored essence) against the
    body of the event it processes (its batching keeps only the latest); equal,
    no handler. The handler enqueues the policy; its sync follows."""

    def __init__(self, ctl, handled):
        self.ctl, self.handled = ctl, copy.deepcopy(handled)

    def process(self, body):
        """True when kopf called the update handler for ``body``."""
        if body["spec"] == self.handled["spec"]:
            return False
        self.ctl.request_policy_apply(body, ApplyRequest(
            "the policy was changed", kind="policy-event", body=body, generation=body["metadata"]["generation"]))
        self.ctl.sync(KEY)
        self.handled = copy.deepcopy(body)
        return True


def edits_kopf_handled_out_of_order(secrets):
    """maxStalled 1 -> 2 -> 3 -> 2. The status loop's write answers with generation 3
    before kopf's handler for generation 2 takes the apply lock: generation 3 is
    applied, and kopf records generation 2 as handled. The user sets generation 4
    to generation 2's spec before kopf has processed generation 3's event."""
    apps, ctl, first = reconciled_policy(secrets)
    kopf = Kopf(ctl, first)
    second, third = edited(first, 2, maxStalled=2), edited(first, 3, maxStalled=3)
    fourth = edited(first, 4, maxStalled=2)
    ctl.custom = StatusWriteAnswering(third)
    ctl.sync(KEY)
    assert kopf.process(second)
    assert running_budget(apps) == 3
    ctl.custom = StatusWriteAnswering(fourth)
    ctl.observe_policy(fourth, "MODIFIED")
    assert not kopf.process(fourth), "generation 4 is generation 2's spec: no change to kopf"
    return apps, ctl, kopf, fourth


WITH_SECRET = {("ns", "creds"): {"url": b64("redis://db:6379/0")}}


def test_an_edit_is_applied_once_whether_the_watch_or_kopfs_handler_brings_it_first():
    """The usual case: a sync between the watch event of an edit and kopf's handler
    for it applies the edit; the handler's request then has nothing left to do."""
    apps, ctl, first = reconciled_policy(dict(WITH_SECRET))
    kopf = Kopf(ctl, first)
    second = edited(first, 2, maxStalled=2)
    ctl.observe_policy(second, "MODIFIED")
    ctl.sync(KEY)
    assert [max_stalled_of(body) for body in apps.applied] == [1, 2]
    assert kopf.process(second)
    ctl.sync(KEY)
    assert [max_stalled_of(body) for body in apps.applied] == [1, 2]
    assert budget_events(ctl) == ["maxStalled 1 -> 2"]


@pytest.mark.parametrize("secrets", [WITH_SECRET, {}], ids=["redis-url-valid", "secret-missing"])
def test_an_edit_back_to_the_spec_kopf_last_handled_is_applied_by_the_sync(secrets):
    """Also while the policy's Secret is missing: an edit is applied whatever the
    Redis URL's state."""
    apps, ctl, kopf, fourth = edits_kopf_handled_out_of_order(dict(secrets))
    state = ctl.policies[KEY]
    ctl.sync(KEY)
    assert running_budget(apps) == 2, "the sweeper runs the policy's current maxStalled"
    assert state.outcome.generation == 4
    assert state.status_cache.status["observedGeneration"] == 4
    assert budget_events(ctl) == ["maxStalled 1 -> 3", "maxStalled 3 -> 2"]


def test_the_status_loop_applies_an_unhandled_generation_once():
    apps, ctl, kopf, fourth = edits_kopf_handled_out_of_order(dict(WITH_SECRET))
    applied = len(apps.applied)
    for _ in range(4):
        ctl.sync(KEY)
    assert len(apps.applied) == applied + 1
    # kopf's handler for a later edit of another field: the same budgets, told no more.
    fifth = edited(fourth, 5, sweepInterval="1m")
    ctl.observe_policy(fifth, "MODIFIED")
    assert kopf.process(fifth)
    assert [max_stalled_of(body) for body in apps.applied[applied:]] == [2, 2]
    assert budget_events(ctl) == ["maxStalled 1 -> 3", "maxStalled 3 -> 2"]


def test_a_refused_apply_of_an_unhandled_generation_is_retried_until_it_is_applied():
    apps, ctl, kopf, fourth = edits_kopf_handled_out_of_order(dict(WITH_SECRET))
    state = ctl.policies[KEY]
    apps.refuse = api_error(500, "Internal Server Error", "etcd is down")
    ctl.sync(KEY)
    assert (state.outcome.ok, state.outcome.reason, state.outcome.generation) == (False, "ApplyFailed", 4)
    apps.refuse = None
    assert ctl.sync(KEY) <= 5, "the next sync when the retry is due"
    assert not state.outcome.ok, "retried after the backoff, not at once"
    retry_due(ctl)
    ctl.sync(KEY)
    assert state.outcome.ok and state.outcome.generation == 4
    assert running_budget(apps) == 2


def test_kopfs_handler_for_a_generation_the_sync_applied_applies_nothing_more():
    """The sync applied generation 4 (the watch showed it); kopf's handler for it
    (its event came after all) asks again: nothing more is applied."""
    apps, ctl, kopf, fourth = edits_kopf_handled_out_of_order(dict(WITH_SECRET))
    state = ctl.policies[KEY]
    ctl.sync(KEY)
    applied = len(apps.applied)
    kopf.handled = copy.deepcopy(state.body)
    kopf.handled["spec"] = {}  # kopf's stored essence is older: it calls the handler
    assert kopf.process(fourth)
    assert len(apps.applied) == applied, "nothing applied again"
    assert running_budget(apps) == 2 and state.outcome.generation == 4


def namespace_terminating_refusal():
    from kubernetes.client.exceptions import ApiException

    exc = ApiException(status=403, reason="Forbidden")
    exc.body = json.dumps({
        "kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403,
        "message": 'deployments.apps "p-sweeper" is forbidden: unable to create new content in namespace ns '
                   "because it is being terminated",
        "details": {"causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace"}]}})
    return exc


def test_an_unhandled_generation_that_applies_nothing_is_not_tried_at_every_refresh():
    """The namespace is being deleted: the apply is refused, nothing is recorded
    (reconcile returns None), and the policy goes next."""
    apps, ctl, kopf, fourth = edits_kopf_handled_out_of_order(dict(WITH_SECRET))
    apps.refuse = namespace_terminating_refusal()
    attempts = []
    refuse = apps.patch_namespaced_deployment

    def counted(*args, **kwargs):
        attempts.append(1)
        return refuse(*args, **kwargs)

    apps.patch_namespaced_deployment = counted
    delays = [ctl.sync(KEY) for _ in range(4)]
    assert len(attempts) == 1, attempts
    assert delays[2:] == [ctl.config.status_interval] * 2


def test_an_edit_no_kopf_handler_applied_during_a_drift_conflict_is_applied_and_ends_it():
    """An edit of the policy is applied at once and ends a drift conflict (the
    docs/operations.md), also when no kopf handler asks for it."""
    from stalledpolicy.controller import drift
    from tests.unit.test_drift_conflict import FakeApps, fight, started
    from tests.unit.test_drift_conflict import edited as with_replicas

    apps, now = FakeApps(), [1_800_000_000.25]
    ctl = started(apps, now)
    fight(ctl, apps, now, drift.DRIFT_MAX_REVERTS + 1)
    state = ctl.policies[KEY]
    ctl.sync(KEY)
    ctl.sync(KEY)
    assert state.drift.conflict and apps.stored["spec"]["replicas"] == 0, "left to the other writer"

    ctl.observe_policy(with_replicas(state.body, 2, 2), "MODIFIED")  # and no kopf handler
    ctl.sync(KEY)
    ctl.sync(KEY)
    assert apps.stored["spec"]["replicas"] == 2
    assert not state.drift.conflict
    assert drift.DRIFT_REVERTS_ANNOTATION not in apps.stored["metadata"]["annotations"]
