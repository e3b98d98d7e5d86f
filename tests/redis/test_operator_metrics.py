"""The operator's metrics against a real Redis: replays served (and refused), and
status refreshes failing when Redis is down."""

from __future__ import annotations

import pytest

from stalledpolicy.controller import REPLAY_ANNOTATION, REPLAY_LANE_ANNOTATION
from tests.redis.test_operator_runtime import b64, dead_letter, policy, world  # noqa: F401 - a fixture

pytestmark = pytest.mark.redis


def test_replays_are_counted_by_result_with_the_jobs_they_moved(world, r, queue_name):  # noqa: F811
    ctl, sink, _, _, _ = world
    dead_letter(r, queue_name, "JOB0001")
    dead_letter(r, queue_name, "JOB0002")
    ctl.observe_policy(policy(queue_name, annotations={REPLAY_ANNOTATION: "first"}, rv="9"), "MODIFIED")
    ctl.refresh(("ns", "p"))
    assert sink.patches[-1]["lastReplay"]["replayed"] == 2
    assert ctl.metrics.value("stalledpolicy_operator_replays_total", result="done") == 1
    assert ctl.metrics.value("stalledpolicy_operator_replayed_jobs_total") == 2
    ctl.refresh(("ns", "p"))  # the same token: served already, not counted again
    assert ctl.metrics.value("stalledpolicy_operator_replays_total", result="done") == 1

    bad_lane = {REPLAY_ANNOTATION: "second", REPLAY_LANE_ANNOTATION: "no spaces allowed"}
    ctl.observe_policy(policy(queue_name, annotations=bad_lane, rv="10"), "MODIFIED")
    ctl.refresh(("ns", "p"))
    assert ctl.metrics.value("stalledpolicy_operator_replays_total", result="refused") == 1
    assert ctl.metrics.value("stalledpolicy_operator_replayed_jobs_total") == 2


def test_an_unreachable_redis_is_a_failed_refresh(world):  # noqa: F811
    ctl, _, _, _, secrets = world
    ctl.refresh(("ns", "p"))
    secrets[("ns", "creds")] = {"url": b64("redis://:hunter2@127.0.0.1:1/0")}
    ctl.refresh(("ns", "p"))
    failures = "stalledpolicy_operator_status_refresh_failures_total"
    assert ctl.metrics.value(failures, reason="RedisUnreachable") == 1
    assert ctl.metrics.value("stalledpolicy_operator_status_refreshes_total") == 2
    assert "hunter2" not in ctl.metrics.exposition().decode()
