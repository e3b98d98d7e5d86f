"""What the morgue CLI echoes back: a Redis URL pasted into --lane or --id is
refused (it was printed, password included, in tables, notes and JSON); a
worker's error quoting a URL with a password is shown masked; a row in no lane
is not shown as a flat job; a replay or purge of a lane with no dead job (a
mistyped --lane) says so instead of reading as "nothing to do". The real CLI
against a real Redis."""

from __future__ import annotations

import json

import pytest

from stalledpolicy.keyspace import QueueKeys
from tests.redis.test_morgue_cli import bury, morgue, table_rows

pytestmark = pytest.mark.redis

PASSWORD = "s3cr3tPW"


@pytest.fixture
def url(redis_server):
    return redis_server.url


@pytest.mark.parametrize("argv", [
    ["list", "--lane", f"redis://:{PASSWORD}@db:6379/0"],
    ["replay", "--lane", f"redis://:{PASSWORD}@db:6379/0", "--dry-run"],
    ["purge", "--id", f"rediss://user:{PASSWORD}@db:6380/0", "--dry-run"],
    ["replay", "--id", "JOB1", "--id", f"see redis://:{PASSWORD}@db/0", "-o", "json", "--dry-run"],
])
def test_a_url_with_a_password_in_lane_or_id_is_refused_masked(r, url, queue_name, argv):
    bury(r, queue_name, "JOB1")
    done = morgue(url, argv[0], "--queue", queue_name, *argv[1:])
    flag = "--lane" if "--lane" in argv else "--id"
    assert done.returncode == 2, done.stderr
    assert f"error: {flag}: " in done.stderr and "holds a URL with a password" in done.stderr
    assert PASSWORD not in done.stdout + done.stderr
    assert r.zrange(QueueKeys(queue_name).dead, 0, -1) == ["JOB1"]


@pytest.mark.parametrize("job_id", ["ssh://git@github.com/org/repo", "thumb:s3://bucket/key@v2"])
def test_an_id_shaped_like_a_url_without_a_password_is_selected(r, url, queue_name, job_id):
    bury(r, queue_name, job_id)
    done = morgue(url, "replay", "--queue", queue_name, "--id", job_id, "--dry-run", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ids"] == [job_id]


def test_a_password_quoted_in_a_last_error_is_masked_in_the_table_and_the_json(r, url, queue_name):
    bury(r, queue_name, "JOB1", last_error=f"TimeoutError talking to redis://:{PASSWORD}@db:6379/0 after 5s")
    table = morgue(url, "list", "--queue", queue_name)
    doc = json.loads(morgue(url, "list", "--queue", queue_name, "-o", "json").stdout)
    assert PASSWORD not in table.stdout + json.dumps(doc)
    assert "talking to redis://:***@db:6379/0 after 5s" in table.stdout
    assert doc["jobs"][0]["last_error"] == "TimeoutError talking to redis://:***@db:6379/0 after 5s"
    assert r.hget(QueueKeys(queue_name).job("JOB1"), "last_error").endswith("after 5s")  # the row untouched


def test_a_row_in_no_lane_is_not_shown_as_a_flat_job(r, url, queue_name):
    keys = QueueKeys(queue_name)
    bury(r, queue_name, "JOB1")
    r.zadd(keys.dead, {"JOB2": 0})  # its row missing
    rows = table_rows(morgue(url, "list", "--queue", queue_name).stdout, "ID")
    lanes = {row.split()[0]: row.split()[1] for row in rows[1:]}
    assert lanes == {"JOB1": "-", "JOB2": "[no"}  # "[no lane]", split on its space


@pytest.mark.parametrize("action, extra", [("replay", []), ("purge", []), ("purge", ["--older-than", "1d"])])
def test_a_change_of_a_lane_with_no_dead_job_says_so(r, url, queue_name, action, extra):
    bury(r, queue_name, "JOB1", lane="imports")
    bury(r, queue_name, "JOB2")
    done = morgue(url, action, "--queue", queue_name, "--lane", "import", "--yes", *extra)
    assert done.returncode == 0, done.stderr
    assert (f"nothing to {action} in queue {queue_name}; no dead job is in lane import; the morgue holds 2 "
            f"in other lanes (morgue stats --queue {queue_name} lists them)") in done.stdout
    doc = json.loads(morgue(url, action, "--queue", queue_name, "--lane", "import", "--yes", "-o", "json",
                            *extra).stdout)
    assert doc["note"].startswith("no dead job is in lane import")
    assert r.zcard(QueueKeys(queue_name).dead) == 2


def test_a_lane_with_dead_jobs_none_old_enough_gets_no_such_note(r, url, queue_name):
    bury(r, queue_name, "JOB1", lane="imports", age_ms=1000)
    done = morgue(url, "purge", "--queue", queue_name, "--lane", "imports", "--older-than", "1d", "--yes")
    assert done.returncode == 0, done.stderr
    assert "no dead job is in lane" not in done.stdout and "nothing to purge" in done.stdout


def test_the_json_writes_a_flat_job_and_a_row_in_no_lane_alike_in_every_command(r, url, queue_name):
    """list wrote a flat job's lane as null where stats and replay write "";
    purge gave no lanes at all, though its table shows them."""
    keys = QueueKeys(queue_name)
    bury(r, queue_name, "JOB1")
    bury(r, queue_name, "JOB2", lane="imports")
    r.zadd(keys.dead, {"JOB3": 0})  # its row missing: in no lane
    listed = json.loads(morgue(url, "list", "--queue", queue_name, "-o", "json").stdout)
    assert {job["id"]: job["lane"] for job in listed["jobs"]} == {"JOB1": "", "JOB2": "imports", "JOB3": None}
    flat = json.loads(morgue(url, "list", "--queue", queue_name, "--lane", "", "-o", "json").stdout)
    assert [job for job in flat["jobs"] if job["lane"] != flat["lane"]] == []
    stats = json.loads(morgue(url, "stats", "--queue", queue_name, "-o", "json").stdout)
    purge = json.loads(morgue(url, "purge", "--queue", queue_name, "--all", "--dry-run", "-o", "json").stdout)
    assert purge["lanes"] == stats["lanes"] == {"": 1, "imports": 1}
    assert purge["unreadable"] == stats["unreadable"] == 1
    replay = json.loads(morgue(url, "replay", "--queue", queue_name, "--all", "--dry-run", "-o", "json").stdout)
    assert replay["lanes"] == {"": 1, "imports": 1}
