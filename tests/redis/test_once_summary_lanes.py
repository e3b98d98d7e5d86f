"""``stalledpolicy sweep --once``'s JSON summary: flat jobs are a lane too, ""
(as in the metrics' ``lane`` label and the morgue's JSON), so a script that
sums the lanes gets the totals."""

from __future__ import annotations

import json

import pytest

from tests.redis.test_sweeper_process import add_active, sweepers  # noqa: F401 - a fixture

pytestmark = pytest.mark.redis


def test_the_once_summary_counts_flat_jobs_under_the_empty_lane(redis_server, r, queue_name, sweepers):  # noqa: F811
    add_active(r, queue_name, "JOB0001")                  # flat, first stall: recovered
    add_active(r, queue_name, "JOB0002", stalled=1)       # flat, reaches budget 2: dead
    add_active(r, queue_name, "JOB0003", group="acme")    # lane job: back to its lane
    sweeper = sweepers("--redis-url", redis_server.url, "--queue", queue_name, "--max-stalled", "2", "--once",
                       "--metrics-port", "0")
    assert sweeper.wait(60) == 0, sweeper.stderr
    summary = json.loads(sweeper.stdout.strip().splitlines()[-1])
    assert (summary["recovered"], summary["dead_lettered"]) == (2, 1)
    assert summary["lanes"] == {"": {"recovered": 1, "dead_lettered": 1}, "acme": {"recovered": 1, "dead_lettered": 0}}
