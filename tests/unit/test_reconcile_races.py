"""Threads that reconcile one policy at once (kopf's handlers, the status loop's
re-applies, drift reverts): each interleaving is made to happen, deterministically,
by holding the policy's apply lock while another thread is on its way to it."""

from __future__ import annotations

import copy
import threading

from stalledpolicy.controller.reconcile import reconcile
from tests.unit.test_operator_parts import b64, reconciled_policy

KEY = ("ns", "p")


class AnnouncedLock:
    """A policy's apply lock that says when a thread other than ``owner`` is about
    to take it (it has read whatever it read before; it may block next)."""

    def __init__(self, lock, owner: threading.Thread) -> None:
        self.lock, self.owner = lock, owner
        self.coming = threading.Event()

    def __enter__(self):
        if threading.current_thread() is not self.owner:
            self.coming.set()
        return self.lock.__enter__()

    def __exit__(self, *exc):
        return self.lock.__exit__(*exc)


def edited(body, generation, replicas):
    body = copy.deepcopy(body)
    body["metadata"].update(generation=generation, resourceVersion=str(generation))
    body["spec"].setdefault("sweeper", {})["replicas"] = replicas
    return body


def while_held(state, other, then):
    """Run ``other`` on a thread of its own; once it is about to take the policy's
    apply lock (held here), ``then()`` (with the lock held), then let it go on."""
    lock = AnnouncedLock(state.apply_lock, threading.current_thread())
    state.apply_lock = lock
    errors = []

    def run():
        try:
            other()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    with lock.lock:
        thread = threading.Thread(target=run)
        thread.start()
        assert lock.coming.wait(5), "the other thread never came to the apply lock"
        then()
    thread.join(5)
    assert not thread.is_alive() and not errors, errors


def test_a_status_loop_reapply_never_applies_the_generation_an_edit_replaced():
    """The status loop re-applies for a rotated Secret from the policy as it read it;
    the policy is edited and kopf's update handler applies the edit while that
    re-apply waits for the apply lock. Before, the re-apply then applied the old
    generation over the edit and recorded it: the sweeper ran the old spec and
    observedGeneration went back from 2 to 1, until the next edit."""
    secrets = {("ns", "creds"): {"url": b64("redis://db:6379/0")}}
    apps, ctl, body = reconciled_policy(secrets)
    ctl.sync(KEY)
    secrets[("ns", "creds")] = {"url": b64("redis://:rotated@db:6379/0")}
    state = ctl.policies[KEY]
    edit = edited(body, 2, 3)

    def kopf_update_handler():
        ctl.observe_policy(edit, "MODIFIED")
        reconcile(ctl, edit)
        assert apps.stored["spec"]["replicas"] == 3

    while_held(state, lambda: ctl.sync(KEY), kopf_update_handler)
    assert apps.stored["spec"]["replicas"] == 3
    assert state.outcome.generation == 2
    ctl.sync(KEY)
    assert state.status_cache.status["observedGeneration"] == 2


def test_a_kopf_handler_that_waited_never_applies_an_older_generation_than_the_one_applied():
    """kopf's handler for generation 2 waits for the apply lock while a re-apply of
    the status loop applies generation 3 (the watch has shown it). Before, the
    handler then applied generation 2 over it: a rollout back to the old spec and
    observedGeneration 3 -> 2, until kopf's handler for generation 3 came."""
    secrets = {("ns", "creds"): {"url": b64("redis://db:6379/0")}}
    apps, ctl, body = reconciled_policy(secrets)
    ctl.sync(KEY)
    state = ctl.policies[KEY]
    second, third = edited(body, 2, 2), edited(body, 3, 3)
    ctl.observe_policy(second, "MODIFIED")

    def status_loop_reapply():
        ctl.observe_policy(third, "MODIFIED")
        secrets[("ns", "creds")] = {"url": b64("redis://:rotated@db:6379/0")}
        ctl.sync(KEY)
        assert apps.stored["spec"]["replicas"] == 3

    while_held(state, lambda: reconcile(ctl, second), status_loop_reapply)
    assert apps.stored["spec"]["replicas"] == 3
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
