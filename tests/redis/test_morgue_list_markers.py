"""``morgue list``: the markers of rows that replay and purge leave in the
morgue (a state other than ``dead``, a ghost row) leave the LAST ERROR column
its error, piped or on an 80-column terminal, and a legend under the table
says what they mean. The real CLI against a real Redis.

The markers used to be the whole explanation (a ghost row's was 148
characters): cut at 60 columns for a pipe, a marked row showed none of its
error, the one thing an engineer piping ``list`` into grep reads the column for.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys

import pytest

from stalledpolicy.keyspace import QueueKeys
from tests.redis.test_morgue_cli import bury, morgue, table_rows

pytestmark = pytest.mark.redis

ERROR = "ConnectionResetError: upstream payments-api closed the socket"
# what the column must show of it at the least, piped (60 columns) or at 80
ERROR_HEAD = "ConnectionReset"


@pytest.fixture
def url(redis_server):
    return redis_server.url


def marked_morgue(r, queue: str) -> None:
    """JOB001 plain, JOB002 not dead, JOB003 a ghost row, JOB004 a ghost row
    whose state is not dead: every marked row with the same long error."""
    keys = QueueKeys(queue)
    bury(r, queue, "JOB001", last_error=ERROR)
    bury(r, queue, "JOB002", last_error=ERROR)
    r.hset(keys.job("JOB002"), "state", "active")
    r.hset(keys.job("JOB003"), mapping={"stalled": "1", "state": "dead", "last_error": ERROR})
    r.hset(keys.job("JOB004"), mapping={"stalled": "1", "state": "pending", "last_error": ERROR})
    r.zadd(keys.dead, {"JOB003": 0, "JOB004": 0})


def error_cells(stdout: str) -> dict[str, str]:
    rows = table_rows(stdout, "ID")
    error_col = rows[0].index("LAST ERROR")
    return {row.split()[0]: row[error_col:] for row in rows[1:]}


def legend_of(stdout: str) -> list[str]:
    """The lines between the table and the footer."""
    lines = stdout.splitlines()
    after_table = lines[len(table_rows(stdout, "ID")) + 1:]
    return [line for line in after_table if line and " jobs 1-" not in line]


def test_piped_list_keeps_the_error_of_marked_rows_and_explains_the_markers(r, url, queue_name):
    marked_morgue(r, queue_name)
    result = morgue(url, "list", "--queue", queue_name)  # stdout is a pipe: LAST ERROR cut at 60
    assert result.returncode == 0, result.stderr
    cells = error_cells(result.stdout)
    assert cells["JOB001"].startswith(ERROR_HEAD)
    assert cells["JOB002"].startswith(f"[not dead: 'active'] {ERROR_HEAD}"), cells
    assert cells["JOB003"].startswith(f"[ghost row] {ERROR_HEAD}"), cells
    assert cells["JOB004"].startswith(f"[not dead: 'pending'] [ghost row] {ERROR_HEAD}"), cells

    legend = legend_of(result.stdout)
    text = " ".join(line.strip() for line in legend)
    # each key once, though two rows carry each marker
    assert [line.split("  ")[0] for line in legend if line.startswith("[")] == ["[not dead: 'S']", "[ghost row]"]
    assert "the row's state is S, not dead" in text and "replay and purge leave it in the morgue" in text
    assert "no attempts and no payload" in text and "nothing to replay; purge it" in text
    assert all(len(line) <= 80 for line in legend), legend
    assert result.stdout.rstrip().endswith(f"queue {queue_name}: jobs 1-4 of 4")


def test_the_json_still_gives_the_state_and_the_warning_whole(r, url, queue_name):
    marked_morgue(r, queue_name)
    result = morgue(url, "list", "--queue", queue_name, "-o", "json")
    assert result.returncode == 0, result.stderr
    jobs = {job["id"]: job for job in json.loads(result.stdout)["jobs"]}
    assert {job["last_error"] for job in jobs.values()} == {ERROR}
    assert (jobs["JOB002"]["state"], jobs["JOB002"]["warning"]) == ("active", None)
    assert jobs["JOB004"]["state"] == "pending"
    assert jobs["JOB004"]["warning"].startswith("ghost row: no attempts and no payload")
    assert jobs["JOB004"]["warning"].endswith("nothing to replay; purge it")


def test_a_flow_child_is_marked_and_its_parent_named_as_waiting(r, url, queue_name):
    """EchoMQ's flows are outside the wire contract: a child the sweep
    dead-lettered leaves its parent waiting, which the list says."""
    keys = QueueKeys(queue_name)
    bury(r, queue_name, "JOB001", last_error=ERROR)
    bury(r, queue_name, "JOB002", last_error=ERROR)
    r.hset(keys.job("JOB002"), "parent", "JOB000")
    result = morgue(url, "list", "--queue", queue_name)
    assert result.returncode == 0, result.stderr
    cells = error_cells(result.stdout)
    assert cells["JOB001"].startswith(ERROR_HEAD) and cells["JOB002"].startswith(f"[flow child] {ERROR_HEAD}")
    text = " ".join(line.strip() for line in legend_of(result.stdout))
    assert text.startswith("[flow child]") and "its parent job waits for it" in text
    assert "replay it to let the parent go on" in text
    listed = json.loads(morgue(url, "list", "--queue", queue_name, "-o", "json").stdout)
    jobs = {job["id"]: job for job in listed["jobs"]}
    assert jobs["JOB001"]["warning"] is None and jobs["JOB002"]["warning"].startswith("flow child: ")


def test_a_long_state_is_cut_in_its_marker_not_in_the_json(r, url, queue_name):
    keys = QueueKeys(queue_name)
    state = "waiting-for-the-upstream-migration-to-finish"
    bury(r, queue_name, "JOB001", last_error=ERROR)
    r.hset(keys.job("JOB001"), "state", state)
    cells = error_cells(morgue(url, "list", "--queue", queue_name).stdout)
    assert cells["JOB001"].startswith(f"[not dead: 'waiting-for-the…'] {ERROR_HEAD}"), cells
    doc = json.loads(morgue(url, "list", "--queue", queue_name, "-o", "json").stdout)
    assert doc["jobs"][0]["state"] == state


def test_a_state_with_control_characters_is_cut_as_it_is_shown(r, url, queue_name):
    """Escaped, a control character takes four columns (``\\x1b``): the marker is
    cut to its 16 columns as shown, not as stored."""
    keys = QueueKeys(queue_name)
    bury(r, queue_name, "JOB001", last_error=ERROR)
    r.hset(keys.job("JOB001"), "state", "\x1b[31mred\x1b[0m\x1b[1mbold\x1b[0m")
    cell = error_cells(morgue(url, "list", "--queue", queue_name).stdout)["JOB001"]
    assert cell.startswith("[not dead: '\\x1b[31mred\\x1b…'] " + ERROR_HEAD), cell


def test_unmarked_rows_get_no_legend(r, url, queue_name):
    bury(r, queue_name, "JOB001", last_error=ERROR)
    result = morgue(url, "list", "--queue", queue_name)
    assert result.returncode == 0, result.stderr
    assert legend_of(result.stdout) == []
    assert "not dead" not in result.stdout and "[" not in result.stdout


def test_an_80_column_terminal_shows_the_error_of_a_marked_row(r, url, queue_name):
    """On a terminal the column takes what the others leave of its width."""
    marked_morgue(r, queue_name)
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STALLEDPOLICY_")}
    env.update(COLUMNS="80", LINES="24")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "stalledpolicy", "morgue", "list", "--queue", queue_name, "--redis-url", url],
            stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE, env=env, timeout=60,
        )
        os.close(slave)
        slave = None
        chunks = []
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the writer is gone and everything was read
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    assert proc.returncode == 0, proc.stderr
    stdout = b"".join(chunks).decode().replace("\r\n", "\n")
    assert all(len(line) <= 80 for line in stdout.splitlines()), stdout
    cells = error_cells(stdout)
    assert cells["JOB002"].startswith(f"[not dead: 'active'] {ERROR_HEAD}"), cells
    assert cells["JOB003"].startswith(f"[ghost row] {ERROR_HEAD}"), cells
    assert legend_of(stdout)[0].startswith("[not dead: 'S']  the row's state is S")
