"""A morgue change whose reader goes away (``stalledpolicy morgue purge ... | head -1``):
the output is lost, the exit code is not. It says what happened to the data
(1: partly failed), as it does with the output read, and stderr still names
what failed. Both ways a closed pipe is met: at a write (unbuffered stdout)
and at the final flush (a pipe's stdout is block-buffered)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stalledpolicy.keyspace import QueueKeys
from tests.redis.test_morgue_cli import bury

pytestmark = pytest.mark.redis

BUFFERING = ["unbuffered", "buffered"]


def run_with_reader_gone(url: str, *args: str, buffering: str, stderr_too: bool = False):
    """The command with its stdout (and, ``stderr_too``, its stderr: ``2>&1 | head``)
    on a pipe whose reader is gone before the first byte: a certain EPIPE."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STALLEDPOLICY_") and k != "PYTHONUNBUFFERED"}
    if buffering == "unbuffered":
        env["PYTHONUNBUFFERED"] = "1"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "stalledpolicy", "morgue", *args, "--redis-url", url],
            stdin=subprocess.DEVNULL, stdout=write_end, stderr=write_end if stderr_too else subprocess.PIPE,
            text=True, env=env, timeout=60)
    finally:
        os.close(write_end)


def quiet(result) -> bool:
    text = result.stderr or ""
    return "Traceback" not in text and "Exception ignored" not in text and "Broken pipe" not in text


@pytest.mark.parametrize("buffering", BUFFERING)
@pytest.mark.parametrize("output", [[], ["-o", "json"]])
@pytest.mark.parametrize("action", ["purge", "replay"])
def test_a_change_that_partly_failed_exits_1_with_its_reader_gone(r, redis_server, queue_name, buffering,
                                                                   output, action):
    bury(r, queue_name, "JOB001")
    result = run_with_reader_gone(redis_server.url, action, "--queue", queue_name, "--id", "JOB001",
                                  "--id", "NOPE", "--yes", *output, buffering=buffering)
    assert result.returncode == 1, result.stderr
    assert "requested ids not in the morgue" in result.stderr and "NOPE" in result.stderr
    assert quiet(result), result.stderr
    assert r.zcard(QueueKeys(queue_name).dead) == 0  # the change itself was made


@pytest.mark.parametrize("buffering", BUFFERING)
def test_a_change_that_partly_failed_exits_1_with_stderr_gone_too(r, redis_server, queue_name, buffering):
    bury(r, queue_name, "JOB001")
    result = run_with_reader_gone(redis_server.url, "purge", "--queue", queue_name, "--id", "JOB001",
                                  "--id", "NOPE", "--yes", buffering=buffering, stderr_too=True)
    assert result.returncode == 1


@pytest.mark.parametrize("buffering", BUFFERING)
def test_a_change_that_succeeded_exits_0_with_its_reader_gone(r, redis_server, queue_name, buffering):
    bury(r, queue_name, "JOB001")
    result = run_with_reader_gone(redis_server.url, "purge", "--queue", queue_name, "--id", "JOB001", "--yes",
                                  buffering=buffering)
    assert result.returncode == 0, result.stderr
    assert quiet(result) and result.stderr == "", result.stderr


@pytest.mark.parametrize("buffering", BUFFERING)
@pytest.mark.parametrize("action", ["list", "stats"])
def test_a_read_with_its_reader_gone_exits_0_quietly(r, redis_server, queue_name, buffering, action):
    bury(r, queue_name, "JOB001")
    result = run_with_reader_gone(redis_server.url, action, "--queue", queue_name, buffering=buffering)
    assert result.returncode == 0, result.stderr
    assert quiet(result) and result.stderr == "", result.stderr
