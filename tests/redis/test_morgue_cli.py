"""``stalledpolicy morgue``: the real CLI as a subprocess against a real Redis.

The morgue is built directly with QueueKeys, shaped as the sweep leaves it:
row ``state=dead``, ``stalled``, ``attempts``, ``last_error``, ``dead_at`` (ms,
server clock) with ``dead_attempts`` (the attempts it belongs to), optional
``group``; the id in ``emq:{q}:dead``.
"""

from __future__ import annotations

import io
import json
import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from stalledpolicy.devenv.ports import free_port
from stalledpolicy.keyspace import QueueKeys
from stalledpolicy.morgue import cli as morgue_cli
from stalledpolicy.morgue import prompt

HOUR_MS = 3600 * 1000


# ------------------------------------------------------------------ helpers


def server_ms(r) -> int:
    seconds, micros = r.time()
    return seconds * 1000 + micros // 1000


def bury(r, queue: str, job_id: str, *, lane: str | None = None, stalled: int = 2, attempts: int = 3,
         last_error: str = "stalled", age_ms: int = 60_000, dead_at: bool = True) -> None:
    """One dead-lettered job, as the sweep leaves it."""
    keys = QueueKeys(queue)
    row = {"state": "dead", "stalled": stalled, "attempts": attempts, "last_error": last_error,
           "payload": json.dumps({"job": job_id})}
    if dead_at:
        row["dead_at"] = server_ms(r) - age_ms
        row["dead_attempts"] = attempts
    if lane is not None:
        row["group"] = lane
    r.hset(keys.job(job_id), mapping=row)
    r.zadd(keys.dead, {job_id: 0})


def standard_morgue(r, queue: str) -> None:
    """Two flat jobs, three in lane ``tenant-a``, one in ``tenant-b``; JOB001 died 3h12m ago."""
    bury(r, queue, "JOB001", age_ms=(3 * 3600 + 12 * 60 + 5) * 1000, last_error="stalled", attempts=4)
    bury(r, queue, "JOB002", age_ms=30 * 60 * 1000, last_error="boom\nat worker.ex:12")
    bury(r, queue, "JOB003", lane="tenant-a", stalled=1, attempts=2, age_ms=2 * HOUR_MS)
    bury(r, queue, "JOB004", lane="tenant-a", age_ms=10 * 60 * 1000)
    bury(r, queue, "JOB005", lane="tenant-a", age_ms=5 * 60 * 1000)
    bury(r, queue, "JOB006", lane="tenant-b", age_ms=90 * 1000)


def dump(r) -> dict:
    """Every key and its value: 'nothing changed' is checked on the whole database."""
    out = {}
    for key in sorted(r.keys("*")):
        kind = r.type(key)
        if kind == "hash":
            out[key] = r.hgetall(key)
        elif kind == "zset":
            out[key] = r.zrange(key, 0, -1, withscores=True)
        elif kind == "list":
            out[key] = r.lrange(key, 0, -1)
        elif kind == "set":
            out[key] = sorted(r.smembers(key))
        else:
            out[key] = r.get(key)
    return out


def morgue(url: str, *args: str, input: str | None = None, env: dict | None = None,
           stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("STALLEDPOLICY_")}
    full_env.update(env or {})
    argv = [sys.executable, "-m", "stalledpolicy", "morgue", *args]
    if url is not None:
        argv += ["--redis-url", url]
    return subprocess.run(
        argv, input=input, stdin=None if input is not None else stdin,
        capture_output=True, text=True, env=full_env, timeout=60,
    )


def morgue_in_pty(url: str, *args: str, answer: str) -> tuple[int, str, str]:
    """Run with stdin on a pseudo-terminal (an engineer at a terminal) and type ``answer``."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STALLEDPOLICY_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "stalledpolicy", "morgue", *args, "--redis-url", url],
        stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    os.close(slave)
    try:
        # typing ahead is what a terminal allows: the line discipline holds the
        # line until the prompt reads it
        os.write(master, answer.encode())
        out, err = proc.communicate(timeout=60)
    finally:
        # drain the terminal's echo of the answer before closing
        while select.select([master], [], [], 0)[0]:
            try:
                if not os.read(master, 4096):
                    break
            except OSError:
                break
        os.close(master)
    return proc.returncode, out, err


def table_rows(stdout: str, first_header: str) -> list[str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first_header))
    rows = []
    for line in lines[start:]:
        if not line.strip():
            break
        rows.append(line)
    return rows


# Its clock is not TIME where os.clock exists: Redis 7.2+ and Valkey answer TIME
# inside a script with the time the script began, so a loop until TIME says
# "later" outlasts busy-reply-threshold (5 s; 15 s measured on Valkey 8.1), and
# from then on the server answers the call waiting behind it with BUSY instead
# of running it. os.clock is the server's CPU time, all of which the loop
# spends; Redis 7.0 has no os.clock, and its TIME moves on.
_LONG_SCRIPT = (
    "local has_clock, clock = pcall(function() return os.clock end) "
    "local function now() "
    "  if has_clock then return clock() end "
    "  local t = redis.call('TIME') return t[1] + t[2] / 1e6 "
    "end "
    "local stop = now() + ARGV[1] "
    "repeat until now() >= stop")


class LongScript(threading.Thread):
    """Another client's script keeping the server busy for ``seconds`` of its CPU time,
    under busy-reply-threshold however loaded the machine: a call sent meanwhile is neither read nor refused, and
    runs when the script ends, even if its client gave up waiting and closed the
    connection. ``start()`` returns once the server is busy in it (a PING of a
    connection of its own gets no answer): a call sent after is behind it, however
    slowly this machine started the thread and its connection."""

    def __init__(self, redis_server, seconds: float) -> None:
        super().__init__(name="long-script", daemon=True)
        self.redis_server, self.seconds = redis_server, seconds

    def run(self) -> None:
        with self.redis_server.client() as other:
            # The script counts CPU seconds (Valkey's script clock stands still), and a
            # loaded machine gives the server a fraction of a core: its wall time may pass
            # the 5 s after which the server answers BUSY to every other call (tried at a
            # load of 9). The threshold is raised for the script's time (lua-time-limit:
            # its name in Redis 6, an alias in Redis 7 and Valkey 8).
            threshold = other.config_get("lua-time-limit")["lua-time-limit"]
            other.config_set("lua-time-limit", 600_000)
            try:
                other.eval(_LONG_SCRIPT, 0, self.seconds)
            finally:
                other.config_set("lua-time-limit", threshold)

    def start(self) -> None:
        super().start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            # one attempt (redis-py retries a timed-out command by default); at a busy
            # server even the connection's handshake goes unanswered
            with self.redis_server.client(socket_timeout=0.05, retry=Retry(NoBackoff(), 0)) as probe:
                try:
                    probe.ping()
                except (redis.TimeoutError, redis.ConnectionError):
                    return
            time.sleep(0.01)
        raise AssertionError("the long script never kept the server busy")


def another_clients_long_script(redis_server, seconds: float) -> LongScript:
    return LongScript(redis_server, seconds)


pytestmark = pytest.mark.redis


@pytest.fixture
def url(redis_server):
    return redis_server.url


# -------------------------------------------------------------------- stats


def test_stats_table_shows_size_lanes_and_oldest_age(r, url, queue_name):
    standard_morgue(r, queue_name)
    result = morgue(url, "stats", "--queue", queue_name)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert queue_name in out
    assert "dead jobs" in out and " 6" in out.splitlines()[1]
    assert "3h12m ago" in out
    lanes = {line.split()[0]: int(line.split()[1]) for line in table_rows(out, "LANE")[1:]}
    assert lanes == {"-": 2, "tenant-a": 3, "tenant-b": 1}


def test_stats_json_is_one_document(r, url, queue_name):
    standard_morgue(r, queue_name)
    result = morgue(url, "stats", "--queue", queue_name, "-o", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["queue"] == queue_name
    assert doc["size"] == 6
    assert doc["lanes"] == {"": 2, "tenant-a": 3, "tenant-b": 1}
    oldest = int(r.hget(QueueKeys(queue_name).job("JOB001"), "dead_at"))
    assert doc["oldest_dead_at_ms"] == oldest
    assert 3 * 3600 + 12 * 60 <= doc["oldest_age_s"] < 3 * 3600 + 13 * 60


def test_stats_of_an_empty_morgue(r, url, queue_name):
    result = morgue(url, "stats", "--queue", queue_name, "-o", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (doc["size"], doc["lanes"], doc["oldest_dead_at_ms"]) == (0, {}, None)


def test_queue_and_url_from_the_environment(r, url, queue_name):
    standard_morgue(r, queue_name)
    result = morgue(None, "stats", "-o", "json",
                    env={"STALLEDPOLICY_REDIS_URL": url, "STALLEDPOLICY_QUEUE": queue_name})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["size"] == 6


def test_the_sweepers_variables_work_as_the_sweeper_reads_them(r, url, queue_name):
    """The same STALLEDPOLICY_REDIS_URL and STALLEDPOLICY_QUEUE as the sweeper's
    (run in its pod, the URL from a Secret): the sweeper strips whitespace
    around them and takes an empty variable as unset, so the morgue does too
    (it said the URL must start with redis://, the queue may not hold ' ')."""
    standard_morgue(r, queue_name)
    result = morgue(None, "stats", "-o", "json",
                    env={"STALLEDPOLICY_REDIS_URL": f" {url} \n", "STALLEDPOLICY_QUEUE": f"{queue_name}\n"})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["size"] == 6
    result = morgue(None, "stats", env={"STALLEDPOLICY_REDIS_URL": url, "STALLEDPOLICY_QUEUE": "  "})
    assert result.returncode == 2
    assert "--queue is required (or set STALLEDPOLICY_QUEUE)" in result.stderr


def test_a_blank_url_is_refused_naming_where_it_came_from(r, url, queue_name):
    """A set-but-blank STALLEDPOLICY_REDIS_URL (a Secret key holding nothing) is a
    refusal that names the variable, as in the sweeper, not '--redis-url is
    required (or set ...)' for a variable that is set; a blank --redis-url is
    refused too instead of falling back to the variable."""
    for blank in ("", " \n"):
        result = morgue(None, "stats", "--queue", queue_name, env={"STALLEDPOLICY_REDIS_URL": blank})
        assert result.returncode == 2, result.stderr
        assert "STALLEDPOLICY_REDIS_URL is set but empty (or only whitespace)" in result.stderr
        assert "is required" not in result.stderr
        result = morgue(blank, "stats", "--queue", queue_name, env={"STALLEDPOLICY_REDIS_URL": url})
        assert result.returncode == 2, result.stderr
        assert "--redis-url is set but empty (or only whitespace)" in result.stderr
    result = morgue(None, "stats", "--queue", queue_name)
    assert result.returncode == 2 and "--redis-url is required (or set STALLEDPOLICY_REDIS_URL)" in result.stderr


# --------------------------------------------------------------------- list


def test_list_table_columns_and_values(r, url, queue_name):
    standard_morgue(r, queue_name)
    result = morgue(url, "list", "--queue", queue_name)
    assert result.returncode == 0, result.stderr
    rows = table_rows(result.stdout, "ID")
    header = rows[0]
    assert header.split()[:5] == ["ID", "LANE", "STALLED", "ATTEMPTS", "DIED"]
    assert header.rstrip().endswith("LAST ERROR")
    body = {line.split()[0]: line for line in rows[1:]}
    assert sorted(body) == [f"JOB00{i}" for i in range(1, 7)]
    # every column starts at the same offset on every row
    lane_col, error_col = header.index("LANE"), header.index("LAST ERROR")
    assert body["JOB003"][lane_col:].startswith("tenant-a")
    assert body["JOB001"][lane_col:].startswith("-")
    assert body["JOB001"][error_col:] == "stalled"
    # a multi-line worker error stays on its row
    assert body["JOB002"][error_col:] == "boom at worker.ex:12"
    assert "3h12m ago" in body["JOB001"]
    fields = body["JOB003"].split()
    assert fields[2:4] == ["1", "2"]  # STALLED, ATTEMPTS
    assert "jobs 1-6 of 6" in result.stdout


def test_list_lane_limit_offset(r, url, queue_name):
    standard_morgue(r, queue_name)
    result = morgue(url, "list", "--queue", queue_name, "--lane", "tenant-a", "--limit", "2")
    assert result.returncode == 0, result.stderr
    ids = [line.split()[0] for line in table_rows(result.stdout, "ID")[1:]]
    assert ids == ["JOB003", "JOB004"]
    assert "jobs 1-2 of 3" in result.stdout and "--offset 2" in result.stdout

    result = morgue(url, "list", "--queue", queue_name, "--lane", "tenant-a", "--offset", "2",
                    "-o", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [job["id"] for job in doc["jobs"]] == ["JOB005"]
    assert doc["total"] == 3

    result = morgue(url, "list", "--queue", queue_name, "--lane", "", "-o", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [job["id"] for job in doc["jobs"]] == ["JOB001", "JOB002"]  # jobs without a lane
    assert doc["total"] == 2


def test_list_json_has_full_rows(r, url, queue_name):
    long_error = "x" * 300
    bury(r, queue_name, "JOB100", lane="tenant-a", stalled=5, attempts=9, last_error=long_error)
    bury(r, queue_name, "JOB101", dead_at=False)
    result = morgue(url, "list", "--queue", queue_name, "-o", "json")
    assert result.returncode == 0, result.stderr
    jobs = {job["id"]: job for job in json.loads(result.stdout)["jobs"]}
    row = r.hgetall(QueueKeys(queue_name).job("JOB100"))
    assert jobs["JOB100"]["lane"] == "tenant-a"
    assert jobs["JOB100"]["stalled"] == 5
    assert jobs["JOB100"]["attempts"] == 9
    assert jobs["JOB100"]["last_error"] == long_error  # not truncated in JSON
    assert jobs["JOB100"]["dead_at_ms"] == int(row["dead_at"])
    assert jobs["JOB100"]["state"] == "dead"
    assert jobs["JOB101"]["dead_at_ms"] is None and jobs["JOB101"]["age_s"] is None


def test_list_empty_morgue(r, url, queue_name):
    result = morgue(url, "list", "--queue", queue_name)
    assert result.returncode == 0, result.stderr
    assert "empty" in result.stdout


def test_a_queue_with_no_key_at_all_is_named_as_such_not_only_as_an_empty_morgue(r, url, queue_name):
    """A mistyped --queue (or database) looked like an empty morgue."""
    for action in ("list", "stats"):
        result = morgue(url, action, "--queue", queue_name)
        assert result.returncode == 0, result.stderr
        assert f"no key of queue {queue_name} exists on this database" in result.stdout, result.stdout
        assert "check --queue and the URL's database" in result.stdout
    r.hset(QueueKeys(queue_name).metrics_completed, "count", 3)  # a queue in use, its morgue empty
    for action in ("list", "stats"):
        result = morgue(url, action, "--queue", queue_name)
        assert result.returncode == 0 and "no key of queue" not in result.stdout, result.stdout
    assert morgue(url, "list", "--queue", queue_name).stdout == f"queue {queue_name}: the morgue is empty\n"


def test_list_of_an_empty_lane_is_not_an_empty_morgue(r, url, queue_name):
    standard_morgue(r, queue_name)
    result = morgue(url, "list", "--queue", queue_name, "--lane", "nosuch")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"queue {queue_name}: no jobs in lane nosuch (the morgue holds 6)\n"
    result = morgue(url, "list", "--queue", queue_name, "--lane", "tenant-a", "--offset", "3")
    assert "no jobs at offset 3 (total 3)" in result.stdout
    r.delete(QueueKeys(queue_name).dead)
    result = morgue(url, "list", "--queue", queue_name, "--lane", "nosuch")
    assert "the morgue is empty" in result.stdout


# ------------------------------------------------------------------- replay


def assert_replayed(r, queue, job_id, lane):
    keys = QueueKeys(queue)
    row = r.hgetall(keys.job(job_id))
    assert row["state"] == "pending", row
    assert int(row.get("stalled", 0)) == 0, row
    assert r.zscore(keys.dead, job_id) is None
    target = keys.lane_pending(lane) if lane else keys.pending
    assert r.zscore(target, job_id) is not None, f"{job_id} not in {target}"


def assert_still_dead(r, queue, job_id):
    keys = QueueKeys(queue)
    assert r.zscore(keys.dead, job_id) is not None
    assert r.hget(keys.job(job_id), "state") == "dead"


def test_replay_lane_moves_only_that_lane_to_its_lane_pending(r, url, queue_name):
    standard_morgue(r, queue_name)
    result = morgue(url, "replay", "--queue", queue_name, "--lane", "tenant-a", "--yes")
    assert result.returncode == 0, result.stderr
    assert "replayed 3 jobs" in result.stdout
    for job_id in ("JOB003", "JOB004", "JOB005"):
        assert_replayed(r, queue_name, job_id, "tenant-a")
    for job_id in ("JOB001", "JOB002", "JOB006"):
        assert_still_dead(r, queue_name, job_id)
    assert "tenant-a" in r.lrange(QueueKeys(queue_name).ring, 0, -1)
    assert r.zcard(QueueKeys(queue_name).pending) == 0


def test_replay_ids_flat_and_grouped(r, url, queue_name):
    standard_morgue(r, queue_name)
    result = morgue(url, "replay", "--queue", queue_name, "--id", "JOB002", "--id", "JOB006",
                    "--yes", "-o", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert sorted(doc["ids"]) == ["JOB002", "JOB006"]
    assert doc["replayed"] == 2 and doc["missing"] == []
    assert_replayed(r, queue_name, "JOB002", None)
    assert_replayed(r, queue_name, "JOB006", "tenant-b")
    assert r.zcard(QueueKeys(queue_name).dead) == 4


def test_replay_all(r, url, queue_name):
    standard_morgue(r, queue_name)
    result = morgue(url, "replay", "--queue", queue_name, "--all", "--yes")
    assert result.returncode == 0, result.stderr
    assert r.zcard(QueueKeys(queue_name).dead) == 0
    assert r.zcard(QueueKeys(queue_name).pending) == 2
    assert r.zcard(QueueKeys(queue_name).lane_pending("tenant-a")) == 3
    assert r.zcard(QueueKeys(queue_name).lane_pending("tenant-b")) == 1


def test_bare_replay_is_refused_before_touching_anything(r, url, queue_name):
    standard_morgue(r, queue_name)
    before = dump(r)
    result = morgue(url, "replay", "--queue", queue_name, "--yes")
    assert result.returncode == 2
    assert "--all" in result.stderr
    assert dump(r) == before


def test_contradictory_selection_is_bad_usage(r, url, queue_name):
    standard_morgue(r, queue_name)
    before = dump(r)
    result = morgue(url, "replay", "--queue", queue_name, "--all", "--lane", "tenant-a", "--yes")
    assert result.returncode == 2 and "--all" in result.stderr
    result = morgue(url, "purge", "--queue", queue_name, "--id", "JOB001", "--older-than", "1h", "--yes")
    assert result.returncode == 2 and "--id" in result.stderr and "--older-than" in result.stderr
    assert dump(r) == before


def test_replay_dry_run_changes_nothing(r, url, queue_name):
    standard_morgue(r, queue_name)
    before = dump(r)
    result = morgue(url, "replay", "--queue", queue_name, "--all", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "would replay 6 jobs" in result.stdout
    result = morgue(url, "replay", "--queue", queue_name, "--lane", "tenant-a", "--dry-run", "-o", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["dry_run"] is True
    assert sorted(doc["ids"]) == ["JOB003", "JOB004", "JOB005"]
    assert doc["lanes"] == {"tenant-a": 3}
    assert dump(r) == before


def test_replay_missing_id_exits_1_and_names_it(r, url, queue_name):
    standard_morgue(r, queue_name)
    result = morgue(url, "replay", "--queue", queue_name, "--id", "JOB001", "--id", "JOB999", "--yes")
    assert result.returncode == 1
    assert "JOB999" in result.stderr and "not in the morgue" in result.stderr
    assert_replayed(r, queue_name, "JOB001", None)


def test_replay_without_yes_and_without_tty_refuses(r, url, queue_name):
    standard_morgue(r, queue_name)
    before = dump(r)
    result = morgue(url, "replay", "--queue", queue_name, "--all")
    assert result.returncode == 2
    assert "--yes" in result.stderr
    assert dump(r) == before
    # a piped "y" is not a terminal either: still refused
    result = morgue(url, "replay", "--queue", queue_name, "--all", input="y\n")
    assert result.returncode == 2
    assert dump(r) == before


def test_replay_confirmed_at_a_terminal(r, url, queue_name):
    standard_morgue(r, queue_name)
    code, out, err = morgue_in_pty(url, "replay", "--queue", queue_name, "--lane", "tenant-b",
                                   answer="y\n")
    assert code == 0, err
    assert f"Replay 1 job of queue {queue_name}? [y/N]" in err
    assert_replayed(r, queue_name, "JOB006", "tenant-b")


def test_replay_declined_at_a_terminal_changes_nothing(r, url, queue_name):
    standard_morgue(r, queue_name)
    before = dump(r)
    code, out, err = morgue_in_pty(url, "replay", "--queue", queue_name, "--all", answer="n\n")
    assert code == 4
    assert "aborted" in err
    assert dump(r) == before


# -------------------------------------------------------------------- purge


def test_purge_older_than_respects_dead_at(r, url, queue_name):
    standard_morgue(r, queue_name)
    bury(r, queue_name, "JOB007", dead_at=False)  # no time of death: never "older than"
    keys = QueueKeys(queue_name)
    result = morgue(url, "purge", "--queue", queue_name, "--older-than", "1h", "--yes", "-o", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert sorted(doc["ids"]) == ["JOB001", "JOB003"]
    for job_id in ("JOB001", "JOB003"):
        assert r.zscore(keys.dead, job_id) is None
        assert not r.exists(keys.job(job_id))
    for job_id in ("JOB002", "JOB004", "JOB005", "JOB006", "JOB007"):
        assert_still_dead(r, queue_name, job_id)


def test_purge_lane_with_older_than(r, url, queue_name):
    standard_morgue(r, queue_name)
    result = morgue(url, "purge", "--queue", queue_name, "--lane", "tenant-a", "--older-than", "7m",
                    "--yes", "-o", "json")
    assert result.returncode == 0, result.stderr
    assert sorted(json.loads(result.stdout)["ids"]) == ["JOB003", "JOB004"]
    assert_still_dead(r, queue_name, "JOB005")
    assert_still_dead(r, queue_name, "JOB001")


def test_purge_dry_run_and_refusal_change_nothing(r, url, queue_name):
    standard_morgue(r, queue_name)
    before = dump(r)
    result = morgue(url, "purge", "--queue", queue_name, "--all", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "would purge 6 jobs" in result.stdout
    result = morgue(url, "purge", "--queue", queue_name, "--all")
    assert result.returncode == 2 and "--yes" in result.stderr
    result = morgue(url, "purge", "--queue", queue_name)
    assert result.returncode == 2
    assert dump(r) == before


def test_purge_prompt_says_it_is_permanent(r, url, queue_name):
    standard_morgue(r, queue_name)
    before = dump(r)
    code, out, err = morgue_in_pty(url, "purge", "--queue", queue_name, "--id", "JOB001", answer="\n")
    assert code == 4  # Enter alone takes the default: No
    assert "Purge 1 job of queue" in err and "permanently" in err and "[y/N]" in err
    assert dump(r) == before
    code, out, err = morgue_in_pty(url, "purge", "--queue", queue_name, "--id", "JOB001", answer="yes\n")
    assert code == 0, err
    assert not r.exists(QueueKeys(queue_name).job("JOB001"))


def test_the_age_purge_question_says_its_rule_applies_when_it_runs(r, url, queue_name):
    """It asked 'Purge 2 jobs ...?' and could then delete more (jobs that grew old
    enough while the prompt was open): the question must say so, as the dating
    question does."""
    standard_morgue(r, queue_name)
    before = dump(r)
    code, out, err = morgue_in_pty(url, "purge", "--queue", queue_name, "--older-than", "1h", answer="n\n")
    assert code == 4 and dump(r) == before
    question = " ".join(err.split())
    assert "Purge 2 jobs of queue" in question and "cannot be undone" in question
    assert "a job that grows old enough meanwhile is purged too" in question


def test_purge_missing_id_exits_1(r, url, queue_name):
    standard_morgue(r, queue_name)
    result = morgue(url, "purge", "--queue", queue_name, "--id", "JOB404", "--yes")
    assert result.returncode == 1
    assert "JOB404" in result.stderr
    assert r.zcard(QueueKeys(queue_name).dead) == 6


def test_age_purge_keeps_undated_entries_and_dates_them(r, url, queue_name):
    keys = QueueKeys(queue_name)
    bury(r, queue_name, "JOB001", age_ms=2 * HOUR_MS)
    bury(r, queue_name, "JOB002", dead_at=False)  # dead-lettered by EchoMQ itself: no dead_at
    before = dump(r)
    result = morgue(url, "purge", "--queue", queue_name, "--older-than", "1h", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "would purge 1 job " in result.stdout
    assert "1 job without a valid time of death would be kept" in result.stderr
    assert dump(r) == before

    result = morgue(url, "purge", "--queue", queue_name, "--older-than", "1h", "--yes")
    assert result.returncode == 0, result.stderr
    assert not r.exists(keys.job("JOB001"))
    assert_still_dead(r, queue_name, "JOB002")
    assert abs(int(r.hget(keys.job("JOB002"), "dead_at")) - server_ms(r)) < 60_000
    assert "now recorded" in result.stderr


def laneless_morgue(r, queue: str) -> None:
    """JOB001 of lane imports; JOB002 whose row is gone; JOB003 whose row is a string."""
    keys = QueueKeys(queue)
    bury(r, queue, "JOB001", lane="imports")
    r.zadd(keys.dead, {"JOB002": 0})
    r.set(keys.job("JOB003"), "x")
    r.zadd(keys.dead, {"JOB003": 0})


def test_a_lane_replay_says_nothing_of_rows_that_have_no_lane(r, url, queue_name):
    """A row that is missing or not a hash belongs to no lane: `replay --lane`
    neither selects nor reports it (it used to exit 1, "would not replay 2 jobs")."""
    laneless_morgue(r, queue_name)
    result = morgue(url, "replay", "--queue", queue_name, "--lane", "imports", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "would replay 1 job " in result.stdout
    assert "would not replay" not in result.stderr and "JOB002" not in result.stderr + result.stdout

    result = morgue(url, "replay", "--queue", queue_name, "--lane", "imports", "--yes", "-o", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (doc["ids"], doc["refused"], doc["missing"]) == (["JOB001"], {}, [])
    assert_replayed(r, queue_name, "JOB001", "imports")
    keys = QueueKeys(queue_name)
    assert r.zrange(keys.dead, 0, -1) == ["JOB002", "JOB003"]


def test_stats_and_a_flat_list_count_rows_without_a_lane_apart(r, url, queue_name):
    """What `--lane ''` lists and counts is what replay and purge `--lane ''` select."""
    laneless_morgue(r, queue_name)
    bury(r, queue_name, "JOB004")  # flat
    doc = json.loads(morgue(url, "stats", "--queue", queue_name, "-o", "json").stdout)
    assert (doc["size"], doc["lanes"], doc["unreadable"]) == (4, {"imports": 1, "": 1}, 2)
    result = morgue(url, "stats", "--queue", queue_name)
    assert result.returncode == 0, result.stderr
    assert "unreadable rows" in result.stdout and "2 (missing or not a hash" in result.stdout
    result = morgue(url, "list", "--queue", queue_name, "--lane", "", "-o", "json")
    assert result.returncode == 0, result.stderr
    assert [job["id"] for job in json.loads(result.stdout)["jobs"]] == ["JOB004"]
    preview = morgue(url, "replay", "--queue", queue_name, "--lane", "", "--dry-run", "-o", "json")
    assert json.loads(preview.stdout)["ids"] == ["JOB004"]


def test_a_purge_preview_counts_rows_without_a_lane_apart_from_the_flat_lane(r, url, queue_name):
    """The purge preview's LANE table counted a row that is missing or not a
    hash under `-` (flat), where stats, list --lane '' and every --lane '' leave
    it out: it has a row of its own now, as the purge script decides it."""
    laneless_morgue(r, queue_name)
    bury(r, queue_name, "JOB004")  # flat
    before = dump(r)
    code, out, err = morgue_in_pty(url, "purge", "--queue", queue_name, "--all", answer="n\n")
    assert code == 4, err
    preview = err.split("Purge 4 jobs of queue", 1)[0]
    lanes = {line.rsplit(None, 1)[0].strip(): line.rsplit(None, 1)[1] for line in table_rows(preview, "LANE")[1:]
             if not line.startswith("ids:")}
    assert lanes == {"imports": "1", "-": "1", "[in no lane: row missing or not a hash]": "2"}
    assert dump(r) == before
    # what `--lane ''` selects is the flat lane the preview counts
    result = morgue(url, "purge", "--queue", queue_name, "--lane", "", "--yes", "-o", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["ids"] == ["JOB004"]


def test_rows_that_cannot_be_replayed_stay_and_are_explained(r, url, queue_name):
    keys = QueueKeys(queue_name)
    bury(r, queue_name, "JOB001")
    bury(r, queue_name, "JOB002")
    r.hset(keys.job("JOB002"), "state", "active")  # listed as dead, but the row says otherwise
    r.zadd(keys.dead, {"JOB003": 0})  # a dangling id: its row is gone
    result = morgue(url, "list", "--queue", queue_name)
    assert result.returncode == 0, result.stderr
    body = {line.split()[0]: line for line in table_rows(result.stdout, "ID")[1:]}
    assert "job row is missing" in body["JOB003"]

    result = morgue(url, "replay", "--queue", queue_name, "--all", "--yes", "-o", "json")
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    assert doc["ids"] == ["JOB001"]
    assert set(doc["refused"]) == {"JOB002", "JOB003"}
    assert "JOB002" in result.stderr and "not dead" in result.stderr
    assert_replayed(r, queue_name, "JOB001", None)
    assert r.zscore(keys.dead, "JOB002") is not None and r.zscore(keys.dead, "JOB003") is not None


def test_a_key_of_the_wrong_type_is_named_and_exits_1_but_the_jobs_move(r, url, queue_name):
    keys = QueueKeys(queue_name)
    bury(r, queue_name, "JOB001", lane="tenant-a")
    r.set(keys.ring, "oops")
    result = morgue(url, "replay", "--queue", queue_name, "--all", "--yes", "-o", "json")
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    assert doc["ids"] == ["JOB001"] and len(doc["problems"]) == 1
    assert f"warning: {keys.ring} is a string, not a list" in result.stderr
    assert_replayed(r, queue_name, "JOB001", "tenant-a")


# ------------------------------------------------------------- bad input, outages


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["stats", "--queue", "bad:name"], "--queue"),
        (["stats", "--queue", "a{b}"], "--queue"),
        (["purge", "--queue", "q", "--older-than", "soon", "--yes"], "--older-than"),
        (["purge", "--queue", "q", "--older-than", "9" * 320 + "d", "--dry-run"], "--older-than"),
        (["list", "--queue", "q", "--limit", "0"], "--limit"),
        (["list", "--queue", "q", "-o", "yaml"], "--output"),
        (["stats"], "--queue"),
    ],
)
def test_bad_usage_exits_2_with_a_message_naming_the_option(url, args, needle):
    result = morgue(url, *args)
    assert result.returncode == 2
    assert needle in result.stderr


@pytest.mark.parametrize("args", [
    ["stats", "--queue", "q", "--redisurl=redis://:hunter2@h/0"],   # a mistyped flag
    ["stats", "--queue", "q", "redis://u:hunter2@h/0"],              # the flag forgotten
    ["stats", "--queue", "q", "-o", "rediss://:hunter2@h/0"],        # in the wrong place
])
def test_argparse_never_echoes_a_password(url, args):
    result = morgue(url, *args)
    assert result.returncode == 2 and "hunter2" not in result.stderr
    assert "***" in result.stderr


def test_bad_url_is_bad_usage():
    result = morgue("http://:hunter2@localhost:1/0", "stats", "--queue", "q")
    assert result.returncode == 2
    assert "--redis-url" in result.stderr and "hunter2" not in result.stderr


def test_redis_down_exits_3_without_the_password():
    port = free_port()
    secret_url = f"redis://:s3cr3t-pw@127.0.0.1:{port}/0"
    for action in (["stats"], ["replay", "--all", "--yes"]):
        result = morgue(secret_url, *action, "--queue", "orders")
        assert result.returncode == 3, result.stderr
        assert f"127.0.0.1:{port}" in result.stderr
        assert "cannot reach Redis" in result.stderr
        assert "s3cr3t-pw" not in result.stderr + result.stdout
        assert "***" in result.stderr


@pytest.fixture(scope="module")
def password_server(server_binaries):
    from stalledpolicy.devenv.redis_server import start_redis

    server = start_redis(["--requirepass", "c0rrect-h0rse"], binaries=server_binaries)
    yield server
    server.stop()


def test_password_protected_server(password_server, queue_name):
    client = password_server.client(password="c0rrect-h0rse", decode_responses=True)
    bury(client, queue_name, "JOB001")
    good = f"redis://:c0rrect-h0rse@127.0.0.1:{password_server.port}/0"
    bad = f"redis://:wr0ng-pw@127.0.0.1:{password_server.port}/0"
    result = morgue(good, "replay", "--queue", queue_name, "--all", "--yes")
    assert result.returncode == 0, result.stderr
    assert "c0rrect-h0rse" not in result.stdout + result.stderr
    assert_replayed(client, queue_name, "JOB001", None)
    result = morgue(bad, "stats", "--queue", queue_name)
    assert result.returncode == 3
    assert "wr0ng-pw" not in result.stdout + result.stderr
    assert f"redis://:***@127.0.0.1:{password_server.port}/0" in result.stderr
    client.close()


@pytest.mark.parametrize("credentials", ["", ":wr0ng-pw@", "bob:wr0ng-pw@", "default:wr0ng-pw@"])
@pytest.mark.parametrize("protocol", ["", "?protocol=2", "?protocol=3"])
def test_missing_or_wrong_credentials_are_explained_in_our_words(password_server, queue_name, credentials,
                                                                 protocol):
    """No password (HELLO ... / NOAUTH), a wrong one (WRONGPASS), an unknown user: one message."""
    url = f"redis://{credentials}127.0.0.1:{password_server.port}/0{protocol}"
    for action in (["stats"], ["replay", "--all", "--yes"]):
        result = morgue(url, *action, "--queue", queue_name)
        assert result.returncode == 3, result.stderr
        assert "requires a password (or refused this user/password): put them in the URL, " \
               "redis://user:password@host" in result.stderr
        assert f"127.0.0.1:{password_server.port}/0" in result.stderr
        assert "HELLO" not in result.stderr and "invalid username-password" not in result.stderr
        assert "Authentication required" not in result.stderr and "wr0ng-pw" not in result.stderr


@pytest.mark.parametrize("action", [["replay", "--all"], ["purge", "--older-than", "1m"]])
def test_a_read_only_replica_is_named_with_the_fix_and_nothing_changed(queue_name, action, server_binaries):
    """A reader endpoint given for the primary: it read 'lost the connection to
    Redis ...: You can't write against a read only replica' and 'the change may
    have been partly applied', though the connection was fine and the first
    call changed nothing."""
    from stalledpolicy.devenv.redis_server import start_redis

    server = start_redis(binaries=server_binaries)
    try:
        client = server.client(decode_responses=True)
        standard_morgue(client, queue_name)
        # a replica of a primary it cannot reach keeps its data and refuses writes
        client.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
        before = dump(client)
        result = morgue(server.url, *action, "--queue", queue_name, "--yes")
        assert result.returncode == 3, result.stderr
        assert f"Redis at {server.url} is a read-only replica" in result.stderr
        assert "point --redis-url at the primary" in result.stderr
        assert "nothing was changed" in result.stderr
        assert "lost the connection" not in result.stderr and "partly applied" not in result.stderr
        assert dump(client) == before
    finally:
        server.stop()
    help_text = subprocess.run([sys.executable, "-m", "stalledpolicy", "morgue", action[0], "--help"],
                               capture_output=True, text=True, timeout=60).stdout
    assert "read-only replica (point --redis-url at the primary)" in " ".join(help_text.split())


def test_a_database_the_server_does_not_have_is_bad_usage(r, url, queue_name):
    beyond = url.removesuffix("/0") + "/16"  # the test server has the default 16 databases
    for action in (["stats"], ["list"], ["purge", "--all", "--yes"]):
        result = morgue(beyond, *action, "--queue", queue_name)
        assert result.returncode == 2, result.stderr
        assert f"--redis-url {beyond}: the database 16 does not exist on this server" in result.stderr
        assert "failed" not in result.stderr


def test_a_reader_that_went_away_is_not_an_error(r, url, queue_name):
    """`morgue list | head`: no traceback when the pipe is closed."""
    standard_morgue(r, queue_name)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte: a certain EPIPE
    env = {k: v for k, v in os.environ.items() if not k.startswith("STALLEDPOLICY_")}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "stalledpolicy", "morgue", "list", "--queue", queue_name,
             "--redis-url", url],
            stdout=write_end, stderr=subprocess.PIPE, text=True, env=env, timeout=60,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Broken pipe" not in proc.stderr


def test_help_documents_exit_codes():
    result = subprocess.run([sys.executable, "-m", "stalledpolicy", "morgue", "replay", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for code in ("0", "1", "2", "3", "4", "130", "143"):
        assert f"\n  {code}  " in result.stdout
    assert "stopped_early" in result.stdout
    assert "--yes" in result.stdout and "--dry-run" in result.stdout


# ------------------------------------------------------------ the prompt, in process


@pytest.mark.parametrize(
    ("typed", "agreed"),
    [("y\n", True), ("YES\n", True), (" y \n", True), ("n\n", False), ("\n", False), ("", False),
     ("yep\n", False)],
)
def test_confirm_only_yes_agrees(typed, agreed):
    err = io.StringIO()
    assert prompt.confirm("Replay 3 jobs of queue q?", stdin=io.StringIO(typed), stderr=err) is agreed
    assert err.getvalue().startswith("Replay 3 jobs of queue q? [y/N] ")


def test_a_pipe_is_not_interactive():
    read_end, write_end = os.pipe()
    try:
        with os.fdopen(read_end) as pipe:
            assert prompt.is_interactive(pipe) is False
    finally:
        os.close(write_end)
    assert prompt.is_interactive(io.StringIO("y\n")) is False


def test_a_large_replay_loses_nothing(r, url, queue_name):
    count = 1237  # more than two of the engine's bounded script calls
    keys = QueueKeys(queue_name)
    now = server_ms(r)
    pipe = r.pipeline(transaction=False)
    for i in range(count):
        job_id = f"JOB{i:06d}"
        row = {"state": "dead", "stalled": 3, "attempts": 3, "last_error": "stalled", "dead_at": now,
               "dead_attempts": 3}
        if i % 3 == 0:
            row["group"] = "bulk"
        pipe.hset(keys.job(job_id), mapping=row)
        pipe.zadd(keys.dead, {job_id: 0})
    pipe.execute()
    result = morgue(url, "replay", "--queue", queue_name, "--all", "--yes", "-o", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["replayed"] == count and len(set(doc["ids"])) == count
    grouped = len(range(0, count, 3))
    assert r.zcard(keys.dead) == 0
    assert r.zcard(keys.lane_pending("bulk")) == grouped
    assert r.zcard(keys.pending) == count - grouped


class AnswerAfter:
    """A terminal whose user answers only after ``meanwhile()`` ran (another
    engineer acting on the same morgue while the prompt is open)."""

    def __init__(self, answer: str, meanwhile):
        self.answer, self.meanwhile = answer, meanwhile

    def isatty(self) -> bool:
        return True

    def readline(self) -> str:
        self.meanwhile()
        return self.answer


def _args(*argv: str):
    import argparse

    parser = argparse.ArgumentParser(prog="stalledpolicy morgue")
    morgue_cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_only_the_confirmed_jobs_change(r, url, queue_name):
    """What the engineer confirmed is what runs: a job that dies while the prompt
    is open is not replayed by the approved --lane, and a job someone else
    replayed meanwhile is reported, not silently counted."""
    standard_morgue(r, queue_name)
    keys = QueueKeys(queue_name)

    def meanwhile():
        bury(r, queue_name, "JOB050", lane="tenant-a")  # a new death in the lane
        r.zrem(keys.dead, "JOB004")  # another engineer took JOB004 out
        r.hset(keys.job("JOB004"), "state", "pending")

    out, err = io.StringIO(), io.StringIO()
    code = morgue_cli.run(
        _args("replay", "--redis-url", url, "--queue", queue_name, "--lane", "tenant-a"),
        stdin=AnswerAfter("y\n", meanwhile), stdout=out, stderr=err,
    )
    assert code == 1, err.getvalue()
    assert "Replay 3 jobs" in err.getvalue()
    assert "JOB004" in err.getvalue() and "left the morgue" in err.getvalue()
    assert_replayed(r, queue_name, "JOB003", "tenant-a")
    assert_replayed(r, queue_name, "JOB005", "tenant-a")
    assert_still_dead(r, queue_name, "JOB050")
    assert r.zscore(keys.lane_pending("tenant-a"), "JOB004") is None  # not moved twice


def test_how_far_a_change_got_is_kept_apart_from_the_parsed_arguments(r, url, queue_name, monkeypatch):
    """The run state (the real calls began, one of them answered) lives in a
    ChangeRun of its own; it used to be set on the argparse namespace."""
    from stalledpolicy.morgue.change import ChangeRun

    standard_morgue(r, queue_name)
    runs = []
    real = morgue_cli.run_change

    def spy(*args, **kwargs):
        runs.append(args[-1])
        return real(*args, **kwargs)

    monkeypatch.setattr(morgue_cli, "run_change", spy)
    args = _args("replay", "--redis-url", url, "--queue", queue_name, "--all", "--yes")
    names = set(vars(args))
    code = morgue_cli.run(args, stdin=io.StringIO(), stdout=io.StringIO(), stderr=io.StringIO())
    assert code == 0
    assert set(vars(args)) == names
    (run,) = runs
    assert isinstance(run, ChangeRun) and (run.started, run.answered) == (True, True)


def test_a_change_that_timed_out_is_not_sent_again(r, redis_server, url, queue_name):
    """redis-py resends a command after a timeout; a replay whose first call was
    only slow would then run twice and report its own moves as jobs that
    "left the morgue". A change is sent once: a timeout is reported as an
    outcome the engineer must check, and the call that did run is the only one."""
    standard_morgue(r, queue_name)
    keys = QueueKeys(queue_name)
    busy_s, timeout_s = 2.0, 1.0  # a resend (at ~1.0 s) would be answered at ~2.0 s

    def evalsha_calls() -> int:
        return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))

    sent = {}
    worker = another_clients_long_script(redis_server, busy_s)

    def meanwhile():
        # another client's long script: the server runs ours only after it
        sent["before"] = evalsha_calls()
        worker.start()

    out, err = io.StringIO(), io.StringIO()
    code = morgue_cli.run(
        _args("replay", "--redis-url", f"{url}?socket_timeout={timeout_s}", "--queue", queue_name,
              "--lane", "tenant-a"),
        stdin=AnswerAfter("y\n", meanwhile), stdout=out, stderr=err,
    )
    worker.join()
    assert code == 5, err.getvalue() + out.getvalue()  # outcome unknown, not 3 (unreachable)
    assert err.getvalue().endswith(
        f"stalledpolicy morgue replay: a replay call got no answer from Redis at {url}?socket_timeout={timeout_s} "
        "within 1 s\n"
        "the call may have run on the server: its outcome is unknown (it is not sent again, and no further "
        "call was sent)\n"
        f"check what it did before running the command again: stalledpolicy morgue stats --queue {queue_name} "
        "(and 'list'), with the same Redis URL\n")
    assert r.ping()  # the call that was sent has run by now
    assert evalsha_calls() - sent["before"] == 1
    for job_id in ("JOB003", "JOB004", "JOB005"):
        assert_replayed(r, queue_name, job_id, "tenant-a")
    assert r.zcard(keys.dead) == 3


def test_a_purge_call_that_timed_out_after_others_answered_says_what_they_did(r, redis_server, url, queue_name,
                                                                             monkeypatch):
    """Three calls of two jobs; the second is sent while the server runs
    another client's long script, so it times out, and runs afterwards. The
    engineer learns that its outcome is unknown (exit 5), what the first call
    purged, and the command to check with; the third call is never sent."""
    from stalledpolicy import engine

    monkeypatch.setattr(engine.morgue, "MORGUE_BATCH", 2)
    for i in range(1, 6):
        bury(r, queue_name, f"JOB00{i}")
    keys = QueueKeys(queue_name)
    worker = another_clients_long_script(redis_server, 2.0)
    real = engine.morgue_purge

    def purge(*args, dry_run=False, progress=None, **kwargs):
        def after_call(result):
            if progress is not None:
                progress(result)
            # after the first call only: a resent second call would also answer 2 ids
            if not dry_run and worker.ident is None and len(result.ids) == 2:
                worker.start()  # the next call waits behind it
        return real(*args, dry_run=dry_run, progress=after_call, **kwargs)

    monkeypatch.setattr(engine, "morgue_purge", purge)
    out, err = io.StringIO(), io.StringIO()
    code = morgue_cli.run(
        _args("purge", "--redis-url", f"{url}?socket_timeout=1", "--queue", queue_name, "--all", "--yes",
              "-o", "json"),
        stdin=io.StringIO(), stdout=out, stderr=err,
    )
    worker.join()
    assert code == 5, err.getvalue()
    text = err.getvalue()
    assert "a purge call got no answer from Redis" in text and "its outcome is unknown" in text
    assert "2 jobs purged by the calls answered before it\n" in text
    assert f"stalledpolicy morgue stats --queue {queue_name}" in text
    assert "vanished" not in text and "left the morgue" not in text
    assert r.ping()  # the unanswered call has run by now; the third was never sent
    assert r.zrange(keys.dead, 0, -1) == ["JOB005"]


def test_which_failures_of_a_sent_call_leave_its_outcome_unknown():
    unknown = [redis.TimeoutError("Timeout reading from socket"), TimeoutError("timed out"),
               redis.ConnectionError("Connection closed by server."),
               redis.ConnectionError("Error while reading from 127.0.0.1:6379 : (104, 'Connection reset by peer')")]
    ran_nothing = [redis.TimeoutError("Timeout connecting to server"),
                   redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
                   redis.AuthenticationError("invalid username-password pair"),
                   redis.BusyLoadingError("Redis is loading the dataset in memory"),
                   redis.ResponseError("NOSCRIPT"), redis.ReadOnlyError("READONLY")]
    assert [morgue_cli.may_have_run(exc) for exc in unknown] == [True] * len(unknown)
    assert [morgue_cli.may_have_run(exc) for exc in ran_nothing] == [False] * len(ran_nothing)


def test_the_exit_codes_are_documented_in_the_help():
    from stalledpolicy.morgue import exit_codes
    from stalledpolicy.morgue.arguments import EXIT_CODES_EPILOG

    codes = [value for name, value in vars(exit_codes).items() if name.startswith("EXIT_")]
    for code in codes:
        assert f"\n  {code} " in EXIT_CODES_EPILOG, code
    assert "outcome unknown" in EXIT_CODES_EPILOG


@pytest.fixture
def silent_server():
    """A port that accepts connections (the kernel's backlog) and never answers: a hung Redis."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    listener.close()


@pytest.mark.parametrize("action", [["stats"], ["replay", "--all", "--yes"]])
def test_a_server_that_does_not_answer_is_reported_in_our_words_after_one_timeout(silent_server, action):
    """One socket timeout, not two (redis-py's retry after a timeout doubled it)."""
    shown = f"{silent_server}?socket_timeout=1"
    started = time.monotonic()
    result = morgue(shown, *action, "--queue", "orders")
    elapsed = time.monotonic() - started
    assert result.returncode == 3, result.stderr
    assert f"no answer from Redis at {shown} within 1 s" in result.stderr
    assert "Timeout reading" not in result.stderr
    assert elapsed < 1.9, elapsed


def test_the_cli_waits_seconds_not_a_minute_for_an_answer(silent_server, queue_name, monkeypatch):
    assert morgue_cli.SOCKET_TIMEOUT_S <= 10
    monkeypatch.setattr(morgue_cli, "SOCKET_TIMEOUT_S", 0.5)  # the default, shortened for the test
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    code = morgue_cli.run(_args("list", "--redis-url", silent_server, "--queue", queue_name),
                          stdin=io.StringIO(), stdout=out, stderr=err)
    assert code == 3
    assert err.getvalue() == f"stalledpolicy morgue list: no answer from Redis at {silent_server} within 0.5 s\n"
    assert time.monotonic() - started < 0.95


def big_morgue(r, queue: str, count: int) -> list[str]:
    keys = QueueKeys(queue)
    now = server_ms(r)
    ids = [f"JOB{i:06d}" for i in range(count)]
    pipe = r.pipeline(transaction=False)
    for i, job_id in enumerate(ids):
        row = {"state": "dead", "stalled": 3, "attempts": 3, "last_error": "stalled", "dead_at": now - HOUR_MS,
               "dead_attempts": 3}
        if i % 3 == 0:
            row["group"] = "bulk"
        pipe.hset(keys.job(job_id), mapping=row)
        pipe.zadd(keys.dead, {job_id: 0})
    pipe.execute()
    return ids


def signal_after_first_call(monkeypatch, name: str, signum: int) -> None:
    """The engine's first real (not dry-run) call is followed by ``signum`` to this process."""
    from stalledpolicy import engine

    real = getattr(engine, name)

    def wrapped(*args, dry_run=False, progress=None, **kwargs):
        def after_call(result):
            if not dry_run:
                # without a handler of the CLI's, the signal would end (or interrupt) pytest itself
                assert signal.getsignal(signum) not in (signal.SIG_DFL, signal.default_int_handler), \
                    "no handler for the signal while the change runs"
                os.kill(os.getpid(), signum)
            if progress is not None:
                progress(result)
        return real(*args, dry_run=dry_run, progress=after_call, **kwargs)

    monkeypatch.setattr(engine, name, wrapped)


@pytest.mark.parametrize(("action", "signum", "code"), [
    (["replay", "--all"], signal.SIGTERM, 143),
    (["replay", "--lane", "bulk"], signal.SIGINT, 130),
    (["purge", "--all"], signal.SIGINT, 130),
    (["purge", "--older-than", "30m"], signal.SIGTERM, 143),
])
def test_a_signal_stops_a_change_between_calls_and_reports_what_moved(r, url, queue_name, monkeypatch,
                                                                      action, signum, code):
    ids = big_morgue(r, queue_name, 1600)  # four calls of 500 (the lane: 534, two)
    keys = QueueKeys(queue_name)
    signal_after_first_call(monkeypatch, "morgue_" + action[0], signum)
    out, err = io.StringIO(), io.StringIO()
    result = morgue_cli.run(_args(*action, "--yes", "-o", "json", "--redis-url", url, "--queue", queue_name),
                            stdin=io.StringIO(), stdout=out, stderr=err)
    assert result == code, err.getvalue()
    doc = json.loads(out.getvalue())
    past = "replayed" if action[0] == "replay" else "purged"
    left = r.zrange(keys.dead, 0, -1)
    assert doc["stopped_early"] is True and doc["signal"] == signal.Signals(signum).name
    assert doc[past] == len(doc["ids"]) == len(ids) - len(left) > 0 and left  # one call ran, no other
    assert set(doc["ids"]).isdisjoint(left)
    if "--older-than" in action:
        assert doc["not_reached"] is None
    else:
        selected = ids[::3] if "--lane" in action else ids
        assert sorted(doc["not_reached"]) == sorted(set(selected) & set(left))
    assert f"stopped by {signal.Signals(signum).name}" in err.getvalue()


def test_a_signal_during_the_last_call_stops_nothing(r, url, queue_name, monkeypatch):
    big_morgue(r, queue_name, 300)  # one call
    signal_after_first_call(monkeypatch, "morgue_replay", signal.SIGTERM)
    out, err = io.StringIO(), io.StringIO()
    result = morgue_cli.run(_args("replay", "--all", "--yes", "-o", "json", "--redis-url", url, "--queue", queue_name),
                            stdin=io.StringIO(), stdout=out, stderr=err)
    doc = json.loads(out.getvalue())
    assert result == 0, err.getvalue()
    assert doc["replayed"] == 300 and doc["stopped_early"] is False and doc["not_reached"] is None
    assert r.zcard(QueueKeys(queue_name).dead) == 0


def test_a_signal_during_the_last_call_of_an_age_purge_stops_nothing(r, url, queue_name, monkeypatch):
    """An age purge runs by rule (no pinned ids): whether a call was the last
    one is the engine's to know, and a signal then leaves nothing undone."""
    big_morgue(r, queue_name, 300)  # one call, every job old enough
    signal_after_first_call(monkeypatch, "morgue_purge", signal.SIGTERM)
    out, err = io.StringIO(), io.StringIO()
    result = morgue_cli.run(_args("purge", "--older-than", "30m", "--yes", "-o", "json", "--redis-url", url,
                                  "--queue", queue_name), stdin=io.StringIO(), stdout=out, stderr=err)
    doc = json.loads(out.getvalue())
    assert result == 0, err.getvalue()
    assert doc["purged"] == 300 and doc["stopped_early"] is False and doc["signal"] is None
    assert "stopped by" not in err.getvalue()
    assert r.zcard(QueueKeys(queue_name).dead) == 0


def test_a_change_without_a_signal_says_it_was_not_stopped(r, url, queue_name):
    standard_morgue(r, queue_name)
    result = morgue(url, "replay", "--queue", queue_name, "--all", "--yes", "-o", "json")
    doc = json.loads(result.stdout)
    assert result.returncode == 0 and doc["stopped_early"] is False and doc["not_reached"] is None


def test_sigterm_during_a_large_replay_prints_what_moved_and_exits_143(r, redis_server, url, queue_name):
    """The real process and a real SIGTERM: it used to die silently with jobs moved."""
    count = 20000
    big_morgue(r, queue_name, count)
    keys = QueueKeys(queue_name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STALLEDPOLICY_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "stalledpolicy", "morgue", "replay", "--queue", queue_name, "--all", "--yes",
         "-o", "json", "--redis-url", url],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 30
        while r.zcard(keys.dead) == count and time.monotonic() < deadline:
            time.sleep(0.001)
        r.execute_command("CLIENT", "PAUSE", 1000, "WRITE")  # holds the next call: the signal lands mid-run
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    doc = json.loads(out)
    left = r.zcard(keys.dead)
    assert 0 < left < count
    assert doc["stopped_early"] is True and doc["replayed"] == count - left
    assert "stopped by SIGTERM" in err and "Traceback" not in err


def test_ctrl_c_before_the_change_starts_says_nothing_changed(r, url, queue_name, monkeypatch):
    from stalledpolicy import engine

    standard_morgue(r, queue_name)
    before = dump(r)

    def interrupted_preview(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "morgue_replay", interrupted_preview)
    out, err = io.StringIO(), io.StringIO()
    code = morgue_cli.run(_args("replay", "--redis-url", url, "--queue", queue_name, "--all", "--yes"),
                          stdin=io.StringIO(), stdout=out, stderr=err)
    assert code == 130
    assert "nothing was changed" in err.getvalue() and "partly applied" not in err.getvalue()
    assert dump(r) == before


# ------------------------------------------------------------------ cluster


@pytest.mark.slow
def test_morgue_on_a_three_node_cluster(redis_cluster, queue_name):
    client = redis_cluster.client(decode_responses=True)
    standard_morgue(client, queue_name)
    url = redis_cluster.url  # one node's URL: the CLI finds the cluster from it
    result = morgue(url, "stats", "--queue", queue_name, "-o", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["size"] == 6 and doc["lanes"]["tenant-a"] == 3
    assert 3 * 3600 + 12 * 60 <= doc["oldest_age_s"] < 3 * 3600 + 13 * 60
    result = morgue(url, "list", "--queue", queue_name, "--lane", "tenant-a")
    assert result.returncode == 0, result.stderr
    assert [line.split()[0] for line in table_rows(result.stdout, "ID")[1:]] == ["JOB003", "JOB004", "JOB005"]
    result = morgue(url, "replay", "--queue", queue_name, "--lane", "tenant-a", "--yes")
    assert result.returncode == 0, result.stderr
    for job_id in ("JOB003", "JOB004", "JOB005"):
        assert_replayed(client, queue_name, job_id, "tenant-a")
    result = morgue(url, "purge", "--queue", queue_name, "--older-than", "1h", "--yes", "-o", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["ids"] == ["JOB001"]
    assert client.zcard(QueueKeys(queue_name).dead) == 2
    client.close()


# ------------------------------------------------- an age purge with only undated entries


def test_an_age_purge_with_nothing_old_enough_still_dates_the_undated_entries(r, url, queue_name):
    """The preview finds no job to purge; the real call must still run, or the
    undated entries never get a time of death (and the note must not say they did)."""
    keys = QueueKeys(queue_name)
    bury(r, queue_name, "JOB001", age_ms=60_000)   # too young
    bury(r, queue_name, "JOB002", dead_at=False)   # undated

    # no terminal and no --yes: nothing written, and the note says so
    result = morgue(url, "purge", "--queue", queue_name, "--older-than", "1h")
    assert result.returncode == 0, result.stderr
    assert "nothing to purge" in result.stdout
    assert r.hget(keys.job("JOB002"), "dead_at") is None
    assert "now recorded" not in result.stderr
    assert "not dated" in result.stderr and "--yes" in result.stderr

    result = morgue(url, "purge", "--queue", queue_name, "--older-than", "1h", "--yes", "-o", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["ids"] == [] and doc["undated"] == 1 and doc["undated_dated"] is True
    assert abs(int(r.hget(keys.job("JOB002"), "dead_at")) - server_ms(r)) < 60_000
    assert_still_dead(r, queue_name, "JOB001")
    assert_still_dead(r, queue_name, "JOB002")


def undatable_morgue(r, queue: str) -> None:
    """Two entries no age purge can date: JOB008's row is gone, JOB009's is a string."""
    keys = QueueKeys(queue)
    r.zadd(keys.dead, {"JOB008": 0})
    r.set(keys.job("JOB009"), "x")
    r.zadd(keys.dead, {"JOB009": 0})


def test_an_age_purge_tells_datable_entries_from_undatable_ones(r, url, queue_name):
    """Only a row that exists and is a hash can get a time of death: the others
    are not reported as dated, run after run, and the note says how they go."""
    keys = QueueKeys(queue_name)
    bury(r, queue_name, "JOB001", age_ms=2 * HOUR_MS)  # old enough
    bury(r, queue_name, "JOB002", dead_at=False)        # undated, datable
    undatable_morgue(r, queue_name)

    result = morgue(url, "purge", "--queue", queue_name, "--older-than", "1h", "--dry-run", "-o", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (doc["ids"], doc["undated"], doc["undated_dated"], doc["undatable"]) == (["JOB001"], 1, False, 2)
    assert "note: 1 job without a valid time of death would be kept" in result.stderr
    assert "note: 2 jobs whose row is missing or not a hash would be kept" in result.stderr

    result = morgue(url, "purge", "--queue", queue_name, "--older-than", "1h", "--yes", "-o", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (doc["ids"], doc["undated"], doc["undated_dated"], doc["undatable"]) == (["JOB001"], 1, True, 2)
    assert "note: 1 job without a valid time of death was kept; its time of death is now recorded" in result.stderr
    assert "note: 2 jobs whose row is missing or not a hash were kept" in result.stderr
    assert "cannot be given one" in result.stderr and "--id" in result.stderr

    # a second age purge: nothing left to date, and it does not claim it dated anything
    result = morgue(url, "purge", "--queue", queue_name, "--older-than", "1h", "--yes", "-o", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (doc["ids"], doc["undated"], doc["undated_dated"], doc["undatable"]) == ([], 0, False, 2)
    assert "now recorded" not in result.stderr
    assert "note: 2 jobs whose row is missing or not a hash were kept" in result.stderr

    # as the note says: by id, without --older-than
    result = morgue(url, "purge", "--queue", queue_name, "--id", "JOB008", "--id", "JOB009", "--yes")
    assert result.returncode == 0, result.stderr
    assert r.zrange(keys.dead, 0, -1) == ["JOB002"] and not r.exists(keys.job("JOB009"))


def test_an_age_purge_with_only_undatable_entries_asks_for_no_dating(r, url, queue_name):
    """Nothing to purge and nothing that can be dated: no write is needed, so
    none is asked for (no --yes hint, no question at a terminal)."""
    undatable_morgue(r, queue_name)
    before = dump(r)
    result = morgue(url, "purge", "--queue", queue_name, "--older-than", "1h")
    assert result.returncode == 0, result.stderr
    assert "nothing to purge" in result.stdout
    assert "not dated" not in result.stderr and "--yes" not in result.stderr
    assert "2 jobs whose row is missing or not a hash were kept" in result.stderr
    code, out, err = morgue_in_pty(url, "purge", "--queue", queue_name, "--older-than", "1h", answer="y\n")
    assert code == 0, err
    assert "Record now" not in err and "[y/N]" not in err
    assert dump(r) == before


def test_the_preview_counts_only_datable_entries_as_getting_a_time_of_death(r, url, queue_name):
    bury(r, queue_name, "JOB001", age_ms=2 * HOUR_MS)
    bury(r, queue_name, "JOB002", dead_at=False)
    undatable_morgue(r, queue_name)
    before = dump(r)
    code, out, err = morgue_in_pty(url, "purge", "--queue", queue_name, "--older-than", "1h", answer="n\n")
    assert code == 4, err
    preview = err.split("Purge 1 job of queue", 1)[0]
    assert "1 job without a valid time of death would be kept and get now as its time of death" in preview
    assert "2 jobs whose row is missing or not a hash would be kept" in preview
    assert dump(r) == before


def test_dating_the_undated_entries_is_asked_at_a_terminal(r, url, queue_name):
    keys = QueueKeys(queue_name)
    bury(r, queue_name, "JOB002", dead_at=False)
    before = dump(r)
    code, out, err = morgue_in_pty(url, "purge", "--queue", queue_name, "--older-than", "1h", answer="n\n")
    assert code == 4, err
    assert "Record now as the time of death of the 1 job" in err and "[y/N]" in err
    assert dump(r) == before
    code, out, err = morgue_in_pty(url, "purge", "--queue", queue_name, "--older-than", "1h", answer="y\n")
    assert code == 0, err
    assert r.hget(keys.job("JOB002"), "dead_at") is not None
    assert "now recorded" in err


# ------------------------------------------------------------ the preview before the question


def test_the_question_comes_after_a_preview_of_count_lanes_and_ids(r, url, queue_name):
    standard_morgue(r, queue_name)
    before = dump(r)
    code, out, err = morgue_in_pty(url, "replay", "--queue", queue_name, "--lane", "tenant-a", answer="n\n")
    assert code == 4
    preview, question = err.split("Replay 3 jobs of queue", 1)
    assert f"replay preview for queue {queue_name}: 3 jobs" in preview
    assert "ids: JOB003, JOB004, JOB005" in preview
    lanes = {line.split()[0]: line.split()[1] for line in table_rows(preview, "LANE")[1:]
             if not line.startswith("ids:")}
    assert lanes == {"tenant-a": "3"}

    code, out, err = morgue_in_pty(url, "purge", "--queue", queue_name, "--all", "--id", "JOB404",
                                   answer="n\n")
    assert code == 2  # --all with --id: refused before any preview
    code, out, err = morgue_in_pty(url, "purge", "--queue", queue_name, "--all", answer="n\n")
    assert code == 4
    preview = err.split("Purge 6 jobs of queue", 1)[0]
    assert f"purge preview for queue {queue_name}: 6 jobs" in preview
    assert "ids: JOB001, JOB002, JOB003, JOB004, JOB005, JOB006" in preview
    lanes = {line.split()[0]: line.split()[1] for line in table_rows(preview, "LANE")[1:]
             if not line.startswith("ids:")}
    assert lanes == {"tenant-a": "3", "-": "2", "tenant-b": "1"}
    assert dump(r) == before


def test_the_preview_names_what_would_be_left_in_the_morgue(r, url, queue_name):
    keys = QueueKeys(queue_name)
    bury(r, queue_name, "JOB001")
    bury(r, queue_name, "JOB002")
    r.hset(keys.job("JOB002"), "state", "active")
    code, out, err = morgue_in_pty(url, "replay", "--queue", queue_name, "--all", "--id", "x", answer="n\n")
    assert code == 2
    code, out, err = morgue_in_pty(url, "replay", "--queue", queue_name, "--all", answer="n\n")
    assert code == 4
    preview = err.split("Replay 1 job of queue", 1)[0]
    assert "ids: JOB001" in preview
    assert "1 job would be left in the morgue" in preview and "JOB002" in preview


# ------------------------------------------------------------- the URL, checked at start


@pytest.mark.parametrize(("suffix", "needle"), [
    ("/1x", "database number"),                 # redis-py would silently use DB 0
    ("/0?socket_timeout=abc", "socket_timeout"),
    ("/0?db=x", "db"),
    ("/0?protocol=9", "protocol"),              # refused by redis-py only on connect: was exit 3
    ("/0?no_such_option=1", "does not know"),  # a TypeError at the first command: was a traceback
])
def test_a_bad_redis_url_is_bad_usage_naming_the_flag(redis_server, suffix, needle):
    bad = f"redis://:hunter2@127.0.0.1:{redis_server.port}{suffix}"
    result = morgue(bad, "stats", "--queue", "q")
    assert result.returncode == 2, result.stderr
    assert "--redis-url" in result.stderr and needle in result.stderr
    assert "hunter2" not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


def test_an_unparseable_redis_url_is_bad_usage_without_a_traceback():
    result = morgue("redis://:hunter2@[::1/0", "stats", "--queue", "q")
    assert result.returncode == 2, result.stderr
    assert "--redis-url" in result.stderr and "Traceback" not in result.stderr
    assert "hunter2" not in result.stderr
    result = morgue(None, "stats", "--queue", "q", env={"STALLEDPOLICY_REDIS_URL": "redis://h:6379/1x"})
    assert result.returncode == 2 and "STALLEDPOLICY_REDIS_URL" in result.stderr


# ------------------------------------------------------------ numbers too large for Redis


@pytest.mark.parametrize(("flag", "value"), [
    ("--limit", str(10**30)),
    ("--offset", str(10**30)),
    ("--limit", "9" * 5000),     # past int()'s 4,300-digit limit
    ("--offset", "4294967296"),
])
def test_a_huge_limit_or_offset_is_bad_usage(r, url, queue_name, flag, value):
    standard_morgue(r, queue_name)
    result = morgue(url, "list", "--queue", queue_name, flag, value)
    assert result.returncode == 2, result.stderr
    assert flag in result.stderr and "at most 4294967295" in result.stderr
    assert "Traceback" not in result.stderr and "4300" not in result.stderr
    assert len(result.stderr) < 2000  # the number is not echoed whole


def test_the_largest_offset_is_accepted(r, url, queue_name):
    standard_morgue(r, queue_name)
    result = morgue(url, "list", "--queue", queue_name, "--offset", "4294967295", "--limit", "4294967295")
    assert result.returncode == 0, result.stderr
    assert "no jobs at offset 4294967295 (total 6)" in result.stdout


def test_lanes_and_ids_that_differ_only_in_whitespace_are_told_apart(r, url, queue_name):
    """A table showed a tab, a newline or two spaces in a lane or an id as one
    space: two lanes looked like one, and what the table showed selected nothing."""
    bury(r, queue_name, "JOB001", lane="a\tb")
    bury(r, queue_name, "JOB002", lane="a b")
    bury(r, queue_name, "JOB\n003", lane="a  b")
    result = morgue(url, "stats", "--queue", queue_name)
    assert result.returncode == 0, result.stderr
    lanes = [line.rsplit(None, 1)[0] for line in table_rows(result.stdout, "LANE")[1:]]
    assert sorted(lanes) == sorted(["a\\x09b", "a b", "a  b"])
    result = morgue(url, "list", "--queue", queue_name)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in table_rows(result.stdout, "ID")[1:]}
    assert rows["JOB\\x0a003"].startswith("JOB\\x0a003  a  b ") and " a\\x09b " in rows["JOB001"]
    result = morgue(url, "replay", "--queue", queue_name, "--lane", "a\tb", "--dry-run")
    assert result.returncode == 0 and "a\\x09b" in result.stdout and "JOB001" in result.stdout
    result = morgue(url, "list", "--queue", queue_name, "--lane", "a\nb")
    assert result.stdout.startswith(f"queue {queue_name}: no jobs in lane a\\x0ab ")


def test_a_lane_named_dash_is_not_shown_as_the_flat_jobs(r, url, queue_name):
    """Flat jobs show as '-' in a LANE column; a lane named '-' read the same."""
    bury(r, queue_name, "JOB001")
    bury(r, queue_name, "JOB002", lane="-")
    result = morgue(url, "stats", "--queue", queue_name)
    assert result.returncode == 0, result.stderr
    assert sorted(line.split()[0] for line in table_rows(result.stdout, "LANE")[1:]) == ["-", "\\x2d"]
    result = morgue(url, "list", "--queue", queue_name)
    rows = {line.split()[0]: line.split()[1] for line in table_rows(result.stdout, "ID")[1:]}
    assert rows == {"JOB001": "-", "JOB002": "\\x2d"}
    result = morgue(url, "replay", "--queue", queue_name, "--lane", "-", "--dry-run")
    assert result.returncode == 0 and "\\x2d  " in result.stdout and "JOB002" in result.stdout


# ------------------------------------------------------------ bytes that are not UTF-8


def bury_raw(redis_server, queue: str, job_id: bytes, *, lane: bytes | None = None,
             last_error: bytes = b"stalled") -> None:
    raw = redis_server.client()
    prefix = QueueKeys(queue).prefix.encode()
    row = {b"state": b"dead", b"stalled": b"2", b"attempts": b"3", b"last_error": last_error,
           b"dead_at": str(server_ms(raw) - 60_000).encode(), b"dead_attempts": b"3", b"payload": b"{}"}
    if lane is not None:
        row[b"group"] = lane
    raw.hset(prefix + b"job:" + job_id, mapping=row)
    raw.zadd(prefix + b"dead", {job_id: 0})
    raw.close()


def test_ids_lanes_and_errors_that_are_not_utf8_are_listed_replayed_and_purged(r, redis_server, url,
                                                                                queue_name):
    bury(r, queue_name, "JOB001")
    bury_raw(redis_server, queue_name, b"JOB\xff2", lane=b"lane\xfe", last_error=b"bad \xfd byte")
    bury_raw(redis_server, queue_name, b"JOB\xff3", last_error=b"\xc3(")
    raw = redis_server.client()
    prefix = QueueKeys(queue_name).prefix.encode()

    result = morgue(url, "list", "--queue", queue_name)
    assert result.returncode == 0, result.stderr
    body = {line.split()[0]: line for line in table_rows(result.stdout, "ID")[1:]}
    assert set(body) == {"JOB001", "JOB\\xff2", "JOB\\xff3"}
    assert "lane\\xfe" in body["JOB\\xff2"] and "bad \\xfd byte" in body["JOB\\xff2"]

    result = morgue(url, "list", "--queue", queue_name, "-o", "json")
    assert result.returncode == 0, result.stderr
    jobs = {job["id"]: job for job in json.loads(result.stdout)["jobs"]}
    assert jobs["JOB\udcff2"]["lane"] == "lane\udcfe"  # surrogateescape: the bytes, recoverable

    result = morgue(url, "stats", "--queue", queue_name, "-o", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["lanes"] == {"": 2, "lane\udcfe": 1}
    result = morgue(url, "stats", "--queue", queue_name)
    assert result.returncode == 0 and "lane\\xfe" in result.stdout

    # the pinned ids go back to Redis as the same bytes: the job really moves
    result = morgue(url, "replay", "--queue", queue_name, "--lane", "lane\udcfe", "--yes")
    assert result.returncode == 0, result.stderr
    assert "replayed 1 job" in result.stdout and "JOB\\xff2" in result.stdout
    assert raw.zscore(prefix + b"g:lane\xfe:pending", b"JOB\xff2") is not None
    assert raw.hget(prefix + b"job:JOB\xff2", b"state") == b"pending"

    # an id typed with raw bytes on the command line reaches the same job
    argv = [sys.executable, "-m", "stalledpolicy", "morgue", "purge", "--queue", queue_name,
            "--id", b"JOB\xff3", "--yes", "--redis-url", url]
    env = {k: v for k, v in os.environ.items() if not k.startswith("STALLEDPOLICY_")}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "purged 1 job" in done.stdout
    assert not raw.exists(prefix + b"job:JOB\xff3")
    assert raw.zrange(prefix + b"dead", 0, -1) == [b"JOB001"]
    raw.close()


def test_a_stdout_closed_before_the_start_is_not_a_traceback(url, queue_name):
    argv = [sys.executable, "-m", "stalledpolicy", "morgue", "stats", "--queue", queue_name, "--redis-url", url]
    env = {k: v for k, v in os.environ.items() if not k.startswith("STALLEDPOLICY_")}
    # the child starts with file descriptor 1 closed, as `stalledpolicy morgue stats >&-` does
    result = subprocess.run(["bash", "-c", 'exec "$@" >&-', "bash", *argv],
                            capture_output=False, stderr=subprocess.PIPE, text=True, env=env, timeout=60)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize("action", ["replay", "purge"])
def test_an_empty_id_is_bad_usage_naming_the_flag_before_redis_is_contacted(action):
    """It was the engine's 'ids: every id must be a non-empty string', after
    connecting (a server that is down made it exit 3 instead)."""
    down = f"redis://127.0.0.1:{free_port()}/0"
    result = morgue(down, action, "--queue", "q", "--id", "JOB001", "--id", "", "--yes")
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"stalledpolicy morgue {action}: error: --id: a job id cannot be empty\n"


@pytest.mark.parametrize(("queue", "words"), [("", "must be a non-empty string"), ("a b", "contains ' '")])
def test_a_bad_queue_is_named_once(url, queue, words):
    result = morgue(url, "stats", "--queue", queue)
    assert result.returncode == 2
    assert result.stderr.startswith("stalledpolicy morgue stats: error: --queue (or STALLEDPOLICY_QUEUE): ")
    assert words in result.stderr and "queue: " not in result.stderr.partition("STALLEDPOLICY_QUEUE): ")[2]


def test_a_url_in_the_queue_setting_shows_no_password(url):
    result = morgue(url, "stats", "--queue", "redis://:s3cr3t@elsewhere")
    assert result.returncode == 2 and "--queue" in result.stderr
    assert "s3cr3t" not in result.stderr and "***" in result.stderr


def test_a_ghost_row_is_shown_as_one_and_refused_by_the_replay(r, url, queue_name):
    keys = QueueKeys(queue_name)
    r.hset(keys.job("JOB001"), mapping={"stalled": "1", "state": "dead", "last_error": "stalled"})
    r.zadd(keys.dead, {"JOB001": 0})
    listed = morgue(url, "list", "--queue", queue_name)
    assert listed.returncode == 0, listed.stderr
    assert "[ghost row] stalled" in listed.stdout and "[ghost row]  no attempts and no payload" in listed.stdout
    doc = json.loads(morgue(url, "list", "--queue", queue_name, "-o", "json").stdout)
    assert doc["jobs"][0]["warning"].startswith("ghost row:") and doc["jobs"][0]["problem"] is None
    replay = morgue(url, "replay", "--queue", queue_name, "--all", "--yes")
    assert replay.returncode == 1, replay.stdout + replay.stderr  # as for any job left in the morgue
    assert "ghost row" in replay.stderr and r.zrange(keys.dead, 0, -1) == ["JOB001"]


# ------------------------------------------- a queue with no key, errors of exit 1, a row not dead

NO_KEY = "exists on this database (emq:{{{queue}}}:*): check --queue and the URL's database"


def test_a_queue_with_no_key_is_named_by_replay_purge_and_every_json_document(r, url, queue_name):
    """`replay --all` said `nothing to replay` and `purge -o json` gave a plain
    document with exit 0: a mistyped --queue passed for an empty morgue there
    and in the JSON of stats and list (their tables had the note)."""
    note = f"no key of queue {queue_name} " + NO_KEY.format(queue=queue_name)
    replay = morgue(url, "replay", "--queue", queue_name, "--all", "--yes")
    assert replay.returncode == 0, replay.stderr  # nothing failed
    assert replay.stdout == f"nothing to replay in queue {queue_name}; {note}\n"
    dry = morgue(url, "purge", "--queue", queue_name, "--all", "--dry-run")
    assert dry.returncode == 0 and note in dry.stdout, dry.stdout + dry.stderr
    for argv in (("replay", "--all", "--yes"), ("purge", "--older-than", "1d", "--yes"),
                 ("purge", "--all", "--dry-run"), ("stats",), ("list",), ("list", "--lane", "a")):
        result = morgue(url, *argv, "--queue", queue_name, "-o", "json")
        assert result.returncode == 0, (argv, result.stderr)
        doc = json.loads(result.stdout)
        assert doc["note"] == note and doc["error"] is None, (argv, doc)
    by_id = morgue(url, "replay", "--queue", queue_name, "--id", "JOB001", "--yes", "-o", "json")
    assert by_id.returncode == 1 and json.loads(by_id.stdout)["note"] == note

    r.hset(QueueKeys(queue_name).metrics_completed, "count", 3)  # a queue in use, its morgue empty
    for argv in (("replay", "--all", "--yes"), ("purge", "--older-than", "1d", "--yes"), ("stats",), ("list",)):
        result = morgue(url, *argv, "--queue", queue_name, "-o", "json")
        assert result.returncode == 0 and "note" not in json.loads(result.stdout), (argv, result.stdout)
    assert morgue(url, "replay", "--queue", queue_name, "--all", "--yes").stdout == (
        f"nothing to replay in queue {queue_name}\n")


def test_a_change_that_exits_1_says_why_in_the_json_error(r, url, queue_name):
    """`error` was null on exit 1 (ids missing, jobs left in the morgue); the
    docs/cli.md promises null on success only."""
    keys = QueueKeys(queue_name)
    bury(r, queue_name, "JOB001")
    bury(r, queue_name, "JOB002", age_ms=3 * 86400 * 1000)
    r.hset(keys.job("JOB002"), "state", "active")
    result = morgue(url, "replay", "--queue", queue_name, "--id", "JOB002", "--id", "NOPE", "--yes", "-o", "json")
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    assert doc["error"] == "1 id not in the morgue; 1 job not replayed (left in the morgue)"
    assert doc["missing"] == ["NOPE"] and list(doc["refused"]) == ["JOB002"]  # the details, as they were
    dry = morgue(url, "replay", "--queue", queue_name, "--all", "--dry-run", "-o", "json")
    assert dry.returncode == 1 and json.loads(dry.stdout)["error"] == (
        "1 job would not be replayed (left in the morgue)")
    aged = morgue(url, "purge", "--queue", queue_name, "--older-than", "1d", "--yes", "-o", "json")
    assert aged.returncode == 1 and json.loads(aged.stdout)["error"] == "1 job not purged (left in the morgue)"
    ok = morgue(url, "purge", "--queue", queue_name, "--id", "JOB001", "--yes", "-o", "json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["error"] is None


def test_a_signal_between_calls_says_so_in_the_json_error(r, url, queue_name, monkeypatch):
    big_morgue(r, queue_name, 1600)
    signal_after_first_call(monkeypatch, "morgue_replay", signal.SIGTERM)
    out, err = io.StringIO(), io.StringIO()
    code = morgue_cli.run(_args("replay", "--all", "--yes", "-o", "json", "--redis-url", url, "--queue", queue_name),
                          stdin=io.StringIO(), stdout=out, stderr=err)
    doc = json.loads(out.getvalue())
    assert code == 143, err.getvalue()
    assert doc["error"] == (f"stopped by SIGTERM with {doc['replayed']} jobs replayed and "
                            f"{len(doc['not_reached'])} jobs not reached")


def test_list_shows_the_state_of_a_row_that_is_not_dead(r, url, queue_name):
    """Such a row showed `-` everywhere, with no hint that replay and purge
    leave it in the morgue (and that a lane replay or an age purge exits 1)."""
    keys = QueueKeys(queue_name)
    bury(r, queue_name, "JOB001")
    bury(r, queue_name, "JOB002", last_error="boom")
    r.hset(keys.job("JOB002"), "state", "active")
    # a state and a payload (no ghost row): every other column `-`
    r.hset(keys.job("JOB003"), mapping={"state": "pending", "payload": "{}"})
    r.zadd(keys.dead, {"JOB003": 0})
    result = morgue(url, "list", "--queue", queue_name)
    assert result.returncode == 0, result.stderr
    body = {line.split()[0]: line for line in table_rows(result.stdout, "ID")[1:]}
    assert "not dead" not in body["JOB001"]
    assert body["JOB002"].endswith("[not dead: 'active'] boom"), body
    assert body["JOB003"].endswith("[not dead: 'pending']"), body
    assert result.stdout.count("\n[not dead: 'S']  the row's state is S, not dead") == 1  # the legend
    listed = json.loads(morgue(url, "list", "--queue", queue_name, "-o", "json").stdout)
    jobs = {job["id"]: job for job in listed["jobs"]}
    assert (jobs["JOB002"]["state"], jobs["JOB003"]["state"]) == ("active", "pending")
