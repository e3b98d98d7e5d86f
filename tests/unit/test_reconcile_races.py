"""Requests that reach one policy's sync in any order (kopf's handlers, the watch,
the status refresh's re-applies, drift reverts): the scheduler runs one sync of a
policy at a time, and each applies the newest generation seen, never an older one
(docs/architecture.md, "The newest generation, never an older one")."""

from __future__ import annotations

import copy

from stalledpolicy.controller.apply_requests import ApplyRequest
from tests.unit.test_operator_parts import b64, reconciled_policy

KEY = ("ns", "p")


def edited(body, generation, replicas):
    body = copy.deepcopy(body)
    body["metadata"].update(generation=generation, resourceVersion=str(generation))
    body["spec"].setdefault("sweeper", {})["replicas"] = replicas
    return body


def kopf_handler(ctl, body):
    """kopf's update handler for ``body``: its request, for the policy's next sync (main._request_apply)."""
    generation = body["metadata"]["generation"]
    ctl.request_policy_apply(body, ApplyRequest("the policy was changed", kind="policy-event", body=body,
                                                generation=generation))


def test_a_reapply_for_a_rotated_secret_applies_the_edit_seen_since_once():
    """The Secret rotates and the policy is edited before the next sync: that sync
    applies the edit with the new Secret, once; kopf's handler of the edit then has
    nothing left to do. Before (a re-apply on a thread of the status loop), the
    re-apply could apply the generation the edit replaced over it, and
    observedGeneration went back from 2 to 1 until the next edit."""
    secrets = {("ns", "creds"): {"url": b64("redis://db:6379/0")}}
    apps, ctl, body = reconciled_policy(secrets)
    ctl.sync(KEY)
    state = ctl.policies[KEY]
    applied = len(apps.applied)
    secrets[("ns", "creds")] = {"url": b64("redis://:rotated@db:6379/0")}
    edit = edited(body, 2, 3)
    ctl.observe_policy(edit, "MODIFIED")
    ctl.sync(KEY)
    kopf_handler(ctl, edit)
    ctl.sync(KEY)
    assert len(apps.applied) == applied + 1, "the edit and the new Secret are one apply"
    assert apps.stored["spec"]["replicas"] == 3
    assert state.outcome.generation == 2 and state.outcome.secret_digest == ctl.secret_digest(
        "ns", {"name": "creds"})
    assert state.status_cache.status["observedGeneration"] == 2


def test_a_kopf_request_for_an_older_generation_never_applies_it():
    """kopf's handler for generation 2 asks for its apply after a sync applied
    generation 3 (the watch showed it): nothing is applied. Asked before that sync,
    the sync applies generation 3 once. Before (a handler waiting for the apply lock),
    the handler applied generation 2 over 3: a rollout back to the old spec and
    observedGeneration 3 -> 2, until kopf's handler for generation 3 came."""
    secrets = {("ns", "creds"): {"url": b64("redis://db:6379/0")}}
    apps, ctl, body = reconciled_policy(secrets)
    ctl.sync(KEY)
    state = ctl.policies[KEY]
    second, third = edited(body, 2, 2), edited(body, 3, 3)
    ctl.observe_policy(second, "MODIFIED")
    kopf_handler(ctl, second)  # pending when the watch shows generation 3
    ctl.observe_policy(third, "MODIFIED")
    applied = len(apps.applied)
    ctl.sync(KEY)
    assert len(apps.applied) == applied + 1 and apps.stored["spec"]["replicas"] == 3
    kopf_handler(ctl, second)  # asked again after generation 3 was applied (kopf retried it)
    ctl.sync(KEY)
    assert len(apps.applied) == applied + 1 and apps.stored["spec"]["replicas"] == 3
    assert state.outcome.generation == 3


def test_a_change_seen_at_the_end_of_a_drift_conflict_is_never_reverted_by_the_sync_ending_it():
    """The other writer changes the sweeper again just before the conflict's window
    ends, and the next sync of the policy comes just after it would have ended.
    Before (a revert and a status refresh on two threads), the refresh ended the
    conflict (SweeperInSync True) and put the policy's spec back over a change 2 s
    old, a revert counted nowhere; the change holds the conflict open."""
    from stalledpolicy.controller import drift
    from tests.unit.test_drift_conflict import FakeApps, fight, rival_change, started

    apps, now = FakeApps(), [1_800_000_000.25]
    ctl = started(apps, now)
    fight(ctl, apps, now, drift.DRIFT_MAX_REVERTS + 1)
    state = ctl.policies[KEY]
    began = state.drift.last_seen
    ctl.sync(KEY)
    assert state.drift.conflict
    applied = len(apps.applied)
    now[0] = began + drift.DRIFT_WINDOW - 1
    changed = rival_change(apps)
    ctl.observe_deployment(changed, "MODIFIED")
    drift.revert_drift(ctl, KEY, changed)
    now[0] = began + drift.DRIFT_WINDOW + 1  # the sync comes after the window would have ended
    ctl.sync(KEY)
    assert state.drift.conflict, "the change 2 s before holds the conflict open"
    assert len(apps.applied) == applied and apps.stored["spec"]["replicas"] == 0
