"""Events are API calls (up to the 30 s deadline): the ones a status refresh or a
drift revert decides under a policy's status lock are posted once it is let go,
so a slow API server never holds up that policy's watch events and reconciles."""

from __future__ import annotations

import threading

from stalledpolicy.controller import drift
from stalledpolicy.controller.events import NullRecorder
from tests.unit.test_drift_conflict import KEY, fight, started
from tests.unit.test_operator_parts import FakeApps
from tests.unit.test_redis_endpoint_change import Cluster


def held_by_another_thread(lock) -> bool:
    taken: list[bool] = []

    def attempt() -> None:
        got = lock.acquire(blocking=False)
        if got:
            lock.release()
        taken.append(got)

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join()
    return not taken[0]


class LockWatchingRecorder(NullRecorder):
    """Notes, for each post, whether the policy's status lock was held meanwhile."""

    def __init__(self, ctl) -> None:
        super().__init__()
        self.ctl = ctl
        self.under_lock: list[str] = []

    def post(self, policy, type_, reason, message) -> None:
        state = self.ctl.policies.get(KEY)
        if state is not None and held_by_another_thread(state.lock):
            self.under_lock.append(reason)
        super().post(policy, type_, reason, message)


def test_a_refresh_posts_its_events_after_the_status_lock():
    cluster = Cluster({"queue": "emails", "redis": {"url": "redis://db:6379/0"}})
    recorder = cluster.ctl.recorder = LockWatchingRecorder(cluster.ctl)
    cluster.servers["redis://db:6379/0"] = 1
    cluster.ctl.sync(KEY)
    cluster.servers["redis://db:6379/0"] = 3
    cluster.ctl.sync(KEY)  # DeadLettered
    del cluster.servers["redis://db:6379/0"]
    cluster.ctl.sync(KEY)  # RedisUnreachable
    assert [e[2] for e in recorder.events] == ["DeadLettered", "RedisUnreachable"]
    assert recorder.under_lock == []


def test_a_drift_conflict_is_posted_after_the_status_lock():
    apps, now = FakeApps(), [1_800_000_000.25]
    ctl = started(apps, now)
    recorder = ctl.recorder = LockWatchingRecorder(ctl)
    fight(ctl, apps, now, drift.DRIFT_MAX_REVERTS + 1)
    assert "DriftConflict" in [e[2] for e in recorder.events]
    assert recorder.under_lock == []
