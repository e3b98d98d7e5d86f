"""BudgetChanged: each change of the budgets the sweeper Deployment runs with is told
once, old -> new as applied, whichever reconcile applies it.

A reconcile applies the newest body the controller has seen (reconcile.reconcile),
which may be newer than the one kopf's update handler was called with: the status
loop's write answers with the policy as the API server holds it, a re-apply reads
it. kopf's ``old`` is the last configuration kopf handled, and after a handler kopf
records the body it handled as handled, not the newer one that was applied. Before,
the event compared kopf's ``old`` with the body applied: one change was told twice,
or as a change from a value the sweeper never had, or a change a re-apply made was
never told."""

from __future__ import annotations

import copy

from stalledpolicy.controller import drift
from stalledpolicy.controller.reconcile import reconcile
from tests.unit.test_operator_parts import FakeApps, b64, fake_controller, policy_body, reconciled_policy
from tests.unit.test_reconcile_races import kopf_handler

KEY = ("ns", "p")


def edited(body, generation, **spec):
    """``body`` edited by a user: a new generation (and resourceVersion), ``spec`` set."""
    body = copy.deepcopy(body)
    body["metadata"].update(generation=generation, resourceVersion=str(generation))
    body["spec"].update(spec)
    return body


def budget_events(ctl):
    return [message for (_, kind, reason, message) in ctl.recorder.events if reason == "BudgetChanged"]


def max_stalled_of(deployment):
    """The sweeper's STALLEDPOLICY_MAX_STALLED in ``deployment``."""
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return int(next(item["value"] for item in container["env"] if item["name"] == "STALLEDPOLICY_MAX_STALLED"))


def running_budget(apps):
    return max_stalled_of(apps.stored)


class StatusWriteAnswering:
    """The policies' custom-objects API as the status loop uses it: its status write
    answers with the policy as the API server holds it then (here, after the user's
    later edit ``current``), status included."""

    def __init__(self, current):
        self.current = current

    def patch_namespaced_custom_object_status(self, *args, **kwargs):
        return copy.deepcopy(self.current)


def test_a_kopf_handler_that_applied_a_newer_edit_and_the_handler_of_that_edit_tell_it_once():
    """maxStalled 1 -> 2 -> 3 in quick edits. The status loop's write answers with
    generation 3 before kopf's handler for generation 2 takes the apply lock, so that
    handler applies 3. kopf then records generation 2 as handled, and calls its
    handler for 3 with ``old`` = generation 2's spec. Before: "maxStalled 1 -> 3",
    then "maxStalled 2 -> 3" for the same change (2 never ran)."""
    apps, ctl, first = reconciled_policy()
    second, third = edited(first, 2, maxStalled=2), edited(first, 3, maxStalled=3)
    ctl.custom = StatusWriteAnswering(third)
    ctl.sync(KEY)
    assert ctl.policies[KEY].body["metadata"]["generation"] == 3

    reconcile(ctl, second)  # kopf's update handler for generation 2
    assert running_budget(apps) == 3
    reconcile(ctl, third)  # and for generation 3
    assert running_budget(apps) == 3
    assert budget_events(ctl) == ["maxStalled 1 -> 3"]


def test_an_edit_taken_back_before_it_was_applied_is_no_budget_change():
    """maxStalled 1 -> 2 -> 1: the handler for generation 2 applies 3, which is 1 again;
    the sweeper never ran with 2. Before: "maxStalled 2 -> 1" from the handler for
    generation 3 (``old`` = generation 2's spec)."""
    apps, ctl, first = reconciled_policy()
    second = edited(first, 2, maxStalled=2)
    third = edited(first, 3, maxStalled=1, sweepInterval="1m")  # back, with another change kopf sees
    ctl.custom = StatusWriteAnswering(third)
    ctl.sync(KEY)

    reconcile(ctl, second)
    reconcile(ctl, third)
    # the sweeper never ran with 2; the handler for 3 found it applied: no apply made
    assert [max_stalled_of(applied) for applied in apps.applied] == [1, 1]
    assert budget_events(ctl) == []


def test_kopf_handlers_after_a_sync_that_applied_a_newer_edit_tell_nothing_again():
    """maxStalled 1 -> 2 -> 3: the watch shows generation 3 (and the Secret rotates)
    before kopf's handler for generation 2 asks for its apply; the sync applies
    generation 3 and tells "maxStalled 1 -> 3". Before: the re-apply told nothing,
    the handler for 2 told "maxStalled 1 -> 3" (it applied nothing new) and the
    handler for 3 "maxStalled 2 -> 3". Now the apply that changed the budget tells
    it, and nothing after it does."""
    secrets = {("ns", "creds"): {"url": b64("redis://db:6379/0")}}
    apps, ctl, first = reconciled_policy(secrets)
    ctl.sync(KEY)
    second, third = edited(first, 2, maxStalled=2), edited(first, 3, maxStalled=3)
    ctl.observe_policy(second, "MODIFIED")
    ctl.observe_policy(third, "MODIFIED")
    secrets[("ns", "creds")] = {"url": b64("redis://:rotated@db:6379/0")}
    ctl.sync(KEY)
    assert running_budget(apps) == 3
    assert budget_events(ctl) == ["maxStalled 1 -> 3"]
    for handled in (second, third):  # kopf's handlers, late
        kopf_handler(ctl, handled)
        ctl.sync(KEY)
    assert running_budget(apps) == 3
    assert budget_events(ctl) == ["maxStalled 1 -> 3"]


def test_a_budget_change_a_reapply_made_is_told_even_when_kopf_never_sees_it():
    """maxStalled 1 -> 2 -> 1 (with another change). The status loop's write answers
    with generation 2 and its re-apply (a rotated Secret) applies it; kopf, busy
    meanwhile, handles only generation 3 (its batching keeps the latest event), with
    ``old`` = generation 1's spec. The sweeper ran 1, 2, 1. Before: no event at all."""
    secrets = {("ns", "creds"): {"url": b64("redis://db:6379/0")}}
    apps, ctl, first = reconciled_policy(secrets)
    second = edited(first, 2, maxStalled=2)
    third = edited(first, 3, maxStalled=1, sweepInterval="1m")
    ctl.custom = StatusWriteAnswering(second)
    secrets[("ns", "creds")] = {"url": b64("redis://:rotated@db:6379/0")}
    ctl.sync(KEY)  # writes status (answered with generation 2), then re-applies
    assert running_budget(apps) == 2

    reconcile(ctl, third)  # kopf's update handler
    assert running_budget(apps) == 1
    assert budget_events(ctl) == ["maxStalled 1 -> 2", "maxStalled 2 -> 1"]


def test_lanes_are_told_by_the_budget_the_sweeper_gets():
    """A lane without a budget of its own runs with the policy's: raising the policy's
    raises the lane's, and giving the lane its own budget equal to the policy's
    changes nothing the sweeper does. Before: the lane's change went untold, and
    "lane a maxStalled of the policy -> 1" was told for no change at all."""
    spec = {"queue": "orders", "redis": {"secretRef": {"name": "creds", "key": "url"}},
            "maxStalled": 1, "lanes": [{"name": "a"}, {"name": "b", "maxStalled": 5}]}
    apps = FakeApps()
    ctl = fake_controller(apps)
    first = policy_body(spec)
    ctl.observe_policy(first, "ADDED")
    reconcile(ctl, first)
    assert budget_events(ctl) == [], "creating the sweeper is no budget change"

    second = edited(first, 2, maxStalled=3)
    reconcile(ctl, second)
    third = edited(second, 3, lanes=[{"name": "a", "maxStalled": 3}, {"name": "c", "maxStalled": 0}])
    reconcile(ctl, third)
    assert budget_events(ctl) == ["maxStalled 1 -> 3; lane a maxStalled 1 -> 3",
                                  "lane b removed; lane c added (maxStalled 0)"]


# -- what was right before, and stays so ---------------------------------------------


def test_an_edit_made_while_the_operator_was_down_is_told_once_at_start():
    """At a start, kopf runs the resume handler (no ``old``) before the update
    handler, in the same cycle, on the same body: the resume handler applies the
    edit; the sweeper as it was before (built from generation 1) is the old side."""
    apps, before, first = reconciled_policy()
    edit = edited(first, 2, maxStalled=4)
    ctl = fake_controller(apps)  # the operator restarted
    ctl.observe_policy(edit, "ADDED")
    reconcile(ctl, edit, resume=True)
    reconcile(ctl, edit)
    assert running_budget(apps) == 4
    assert budget_events(ctl) == ["maxStalled 1 -> 4"]


def test_putting_back_a_budget_edited_by_hand_on_the_sweeper_is_no_budget_change():
    """A hand edit of the sweeper's env is drift: reverted, and told as DriftReverted,
    also by an operator started since (which knows no earlier apply of its own)."""
    apps, ctl, first = reconciled_policy()
    for controller in (ctl, fake_controller(apps)):  # then as a new operator process
        controller.observe_policy(first, "ADDED")
        changed = copy.deepcopy(apps.stored)
        env = changed["spec"]["template"]["spec"]["containers"][0]["env"]
        next(item for item in env if item["name"] == "STALLEDPOLICY_MAX_STALLED")["value"] = "9"
        changed["metadata"]["generation"] += 1
        apps.stored = copy.deepcopy(changed)
        if controller is ctl:
            drift.revert_drift(controller, KEY, changed)
            controller.sync(KEY)
        else:
            reconcile(controller, first, resume=True)
        assert running_budget(apps) == 1
        assert budget_events(controller) == []
    assert [e[2] for e in ctl.recorder.events].count("DriftReverted") == 1


def test_a_change_applied_when_the_deleted_sweeper_is_created_again_is_told_once():
    """The sweeper is deleted and the policy edited meanwhile: the re-apply after the
    deletion creates it with the new budget, the change from what ran before."""
    from stalledpolicy.controller.sweeper_events import reapply_after_deletion

    apps, ctl, first = reconciled_policy()
    gone = copy.deepcopy(apps.stored)
    edit = edited(first, 2, maxStalled=2)

    class Custom:
        def get_namespaced_custom_object(self, *args):
            return copy.deepcopy(edit)

    ctl.custom = Custom()
    apps.stored = None
    ctl.observe_deployment(gone, "DELETED")
    reapply_after_deletion(ctl, gone)
    ctl.sync(("ns", "p"))
    assert running_budget(apps) == 2
    reconcile(ctl, edit)  # kopf's update handler
    assert budget_events(ctl) == ["maxStalled 1 -> 2"]
