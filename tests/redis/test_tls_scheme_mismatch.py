"""A Redis URL whose scheme does not match the server's TLS: ``rediss://`` to a
server without TLS, ``redis://`` to a TLS-only one. redis-py reports both as an
outage ("Timeout connecting to server", "Connection reset by peer"); the
sweeper's outage log, /readyz, ``sweep --once`` and the morgue CLI ask whether
the server speaks TLS and name the scheme to use.

The TLS server is Debian's redis-server (built with TLS) on ``--tls-port``
only, with a self-signed certificate made by ``openssl`` here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import redis

from stalledpolicy.devenv.ports import free_port
from stalledpolicy.devenv.redis_server import redis_server_binary
from tests.fake_servers import answering
from tests.redis.test_morgue_cli import morgue
from tests.redis.test_sweeper_process import SweeperProcess, eventually

pytestmark = pytest.mark.redis

PLAIN_SERVER = "is the server speaking TLS? rediss:// needs the server's TLS port (tls-port); " \
               "a server without TLS takes redis://"
TLS_SERVER = ("is the server speaking TLS only? then use rediss:// (and the server's TLS port); "
              "else check that the host and port are a Redis server's")


@pytest.fixture(scope="module")
def tls_port():
    """A redis-server that speaks TLS only (``--port 0 --tls-port N``)."""
    if not shutil.which("openssl"):
        pytest.fail("openssl is missing: apt-get install -y openssl")
    workdir = Path(tempfile.mkdtemp(prefix="stalledpolicy-tls-"))
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-keyout", str(workdir / "key.pem"),
                    "-out", str(workdir / "cert.pem")], check=True, capture_output=True, timeout=60)
    port = free_port()
    process = subprocess.Popen(
        [redis_server_binary(), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(workdir / "cert.pem"), "--tls-key-file", str(workdir / "key.pem"),
         "--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", str(workdir),
         "--logfile", str(workdir / "redis.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    probe = redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_cert_reqs="none", socket_timeout=1)
    try:
        deadline = time.monotonic() + 15
        while True:
            if process.poll() is not None:
                pytest.fail(f"redis-server with --tls-port exited with {process.returncode}: "
                            f"{(workdir / 'redis.log').read_text(errors='replace')[-2000:]}")
            try:
                if probe.ping():
                    break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield port
    finally:
        probe.close()
        process.terminate()
        process.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def mismatched(direction: str, redis_server, tls_port: int) -> tuple[str, str, str]:
    """(url, the morgue's words, the sweeper's words) for one direction."""
    if direction == "rediss-to-plain":
        # the handshake waits the answer's timeout (1 s), not the connect timeout (3 s)
        return (f"rediss://127.0.0.1:{redis_server.port}/0?socket_timeout=1&socket_connect_timeout=3",
                f"no answer to the TLS handshake within 1 s: {PLAIN_SERVER}",
                f"no answer to the TLS handshake: {PLAIN_SERVER}")
    words = f"the server closed the connection without an answer: {TLS_SERVER}"
    return f"redis://127.0.0.1:{tls_port}/0", words, words


DIRECTIONS = ["rediss-to-plain", "redis-to-tls"]


def test_the_matching_schemes_work(redis_server, tls_port):
    """The servers are what the tests take them for."""
    assert morgue(f"rediss://127.0.0.1:{tls_port}/0?ssl_cert_reqs=none", "stats", "--queue", "q").returncode == 0
    assert morgue(redis_server.url, "stats", "--queue", "q").returncode == 0


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("action", [["stats"], ["replay", "--all", "--yes"]])
def test_the_morgue_asks_whether_the_server_speaks_tls(redis_server, tls_port, direction, action):
    url, asked, _ = mismatched(direction, redis_server, tls_port)
    result = morgue(url, *action, "--queue", "orders")
    assert result.returncode == 3, result.stderr
    assert f"cannot reach Redis at {url}: {asked}" in result.stderr
    assert "Traceback" not in result.stderr and "partly applied" not in result.stderr


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_sweep_once_asks_whether_the_server_speaks_tls(redis_server, tls_port, direction):
    url, _, asked = mismatched(direction, redis_server, tls_port)
    sweeper = SweeperProcess("--redis-url", url, "--queue", "orders", "--once", "--metrics-port", "0")
    try:
        assert sweeper.wait(60) == 1, sweeper.stderr
        [line] = sweeper.lines_with("redis unreachable; the pass failed and --once exits 1")
        assert f'error="{asked}"' in line, sweeper.stderr
    finally:
        sweeper.close()


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_the_outage_log_and_readyz_ask_whether_the_server_speaks_tls(redis_server, tls_port, direction):
    url, _, asked = mismatched(direction, redis_server, tls_port)
    sweeper = SweeperProcess("--redis-url", url, "--queue", "orders", "--interval", "1s")
    try:
        [line] = eventually(lambda: sweeper.lines_with("redis unreachable; retrying with backoff"),
                            what="the outage line")
        assert f'error="{asked}"' in line, sweeper.stderr
        _, body = eventually(lambda: (lambda got: got if got[0] == 503 else None)(sweeper.get("/readyz")),
                             what="/readyz 503")
        assert json.loads(body) == {"status": "fail", "reason": f"redis unreachable: {asked}"}
    finally:
        sweeper.close()


def test_an_untrusted_certificate_is_not_taken_for_a_plain_server(tls_port):
    """A TLS server the client does not trust speaks TLS: redis-py's words (the certificate) stay."""
    result = morgue(f"rediss://127.0.0.1:{tls_port}/0", "stats", "--queue", "orders")
    assert result.returncode == 3
    assert "CERTIFICATE_VERIFY_FAILED" in result.stderr and "speaking TLS" not in result.stderr


def test_a_closed_port_is_no_tls_question():
    for scheme in ("redis", "rediss"):
        result = morgue(f"{scheme}://127.0.0.1:{free_port()}/0", "stats", "--queue", "orders")
        assert result.returncode == 3 and "speaking TLS" not in result.stderr, result.stderr


@pytest.fixture
def answers_in_plain():
    """A plain server that answers the first bytes it gets with an error line
    (a plain Redis whose inline parser met a newline in the TLS hello)."""
    with answering(b"-ERR unknown command\r\n") as port:
        yield port


def test_a_plain_answer_to_the_tls_handshake_asks_whether_the_server_speaks_tls(answers_in_plain):
    url = f"rediss://127.0.0.1:{answers_in_plain}/0"
    result = morgue(url, "stats", "--queue", "orders")
    assert result.returncode == 3
    assert f"cannot reach Redis at {url}: the answer to the TLS handshake is not TLS: {PLAIN_SERVER}" \
        in result.stderr, result.stderr
