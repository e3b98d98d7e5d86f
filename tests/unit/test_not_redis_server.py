"""A URL that points at a service that is not Redis (a wrong Service port, an HTTP
proxy) is said in our words and handled as an unreachable Redis: it was a raw
"Protocol Error: b'HTTP/1.1 400 ...'" and, for the sweeper, a failed pass retried
at every interval instead of an outage with its backoff."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stalledpolicy.redis_url.errors import NOT_REDIS_PROBLEM, refusal_in_our_words, unreachable_errors
from tests.fake_servers import answering


@pytest.fixture
def http_port():
    """A TCP server that answers whatever it is sent as an HTTP server does."""
    with answering(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n") as port:
        yield port


def test_an_answer_that_is_not_redis_is_named_and_counts_as_unreachable(http_port):
    import redis

    with pytest.raises(redis.RedisError) as caught:
        redis.Redis(port=http_port, socket_timeout=5).ping()
    assert isinstance(caught.value, unreachable_errors())
    assert refusal_in_our_words(caught.value, f"redis://127.0.0.1:{http_port}/0") == NOT_REDIS_PROBLEM


def test_sweep_once_says_the_server_is_not_redis(http_port):
    result = subprocess.run(
        [sys.executable, "-m", "stalledpolicy", "sweep", "--queue", "q", "--once", "--metrics-port", "0",
         "--redis-url", f"redis://:s3cret@127.0.0.1:{http_port}/0"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["error"] == f"redis unreachable: {NOT_REDIS_PROBLEM}"
    assert "error_type=InvalidResponse" in result.stderr and "Traceback" not in result.stderr
    assert "s3cret" not in result.stdout + result.stderr


def test_morgue_says_the_server_is_not_redis_and_exits_unreachable(http_port):
    result = subprocess.run(
        [sys.executable, "-m", "stalledpolicy", "morgue", "stats", "--queue", "q",
         "--redis-url", f"redis://:s3cret@127.0.0.1:{http_port}/0"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, result.stdout + result.stderr  # unreachable, as docs/cli.md's table says
    assert NOT_REDIS_PROBLEM in result.stderr and "Protocol Error" not in result.stderr
    assert "s3cret" not in result.stdout + result.stderr
