"""``stalledpolicy sweep`` as a real process against a real redis-server (and a
TCP server that never answers): lane names that are not UTF-8, a missing
database, fatal errors in JSON logs, signals while a reply hangs (no retry
after them), lanes kept apart by their bytes, the metrics address in every mode."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from stalledpolicy.devenv.ports import free_port
from stalledpolicy.keyspace import QueueKeys

pytestmark = pytest.mark.redis

SWEEP = [sys.executable, "-m", "stalledpolicy", "sweep"]
EXPIRED = 1000  # a lease deadline long past (ms since epoch)


def clean_env(**extra: str | bytes) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STALLEDPOLICY_")}
    env.update(extra)
    return env


def sweep(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*SWEEP, *args], env=env if env is not None else clean_env(), capture_output=True,
                          text=True, errors="backslashreplace", timeout=timeout, stdin=subprocess.DEVNULL)


# ------------------------------------------------ 1. a lane name that is not UTF-8


@pytest.mark.parametrize("how", ["flag", "variable"])
@pytest.mark.parametrize("once", [True, False])
def test_a_lane_name_with_an_undecodable_byte_is_refused_at_start(redis_server, queue_name, how, once):
    """Before: accepted at start; then every pass failed with UnicodeEncodeError
    (a traceback; /readyz 503 for ever, or --once exit 1)."""
    args = ["--redis-url", redis_server.url, "--queue", queue_name, "--interval", "1s", "--metrics-port", "0"]
    env = clean_env()
    if how == "flag":
        args += ["--lane", "l\udcfe=1"]  # the byte 0xfe on the command line
    else:
        env = {**{k.encode(): v.encode() for k, v in env.items()}, b"STALLEDPOLICY_LANES": b"l\xfe=1"}
    if once:
        args.append("--once")
    done = sweep(*args, env=env, timeout=30)  # the long-running mode would never end here before the fix
    assert done.returncode == 2, done.stderr
    assert "--lane (STALLEDPOLICY_LANES): " in done.stderr and "an undecodable byte" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


# ------------------------------------------- 2. a database the server does not have


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_once_on_a_database_the_server_lacks_exits_2_and_says_2(redis_server, queue_name, log_format):
    """Before: the log line said "--once exits 1", the process exited 2, and with
    --log-format json its last line was plain text."""
    url = f"redis://127.0.0.1:{redis_server.port}/16"  # a default server has 0..15
    done = sweep("--once", "--redis-url", url, "--queue", queue_name, "--log-format", log_format)
    assert done.returncode == 2, done.stderr
    assert "exits 1" not in done.stderr
    assert "--once exits 2" in done.stderr
    lines = done.stderr.strip().splitlines()
    if log_format == "json":
        entries = [json.loads(line) for line in lines]  # every line JSON, the last one too
        last = entries[-1]
        assert last["level"] == "error" and last["exit_code"] == 2
        assert last["msg"].startswith("--redis-url (STALLEDPOLICY_REDIS_URL) ") and "database 16" in last["msg"]
    else:
        assert lines[-1].startswith("stalledpolicy sweep: error: --redis-url (STALLEDPOLICY_REDIS_URL) ")
        assert "database 16" in lines[-1]
    assert done.stdout == ""  # exit 2 is a bad setting: no result line, as for the other bad settings


def test_a_fatal_listen_error_is_json_with_json_logs(redis_server, queue_name):
    """The other exit 2 found after start (the metrics port taken) is a JSON line too."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = sweep("--redis-url", redis_server.url, "--queue", queue_name, "--metrics-address", "127.0.0.1",
                     "--metrics-port", str(port), "--log-format", "json", timeout=30)
    assert done.returncode == 2, done.stderr
    last = json.loads(done.stderr.strip().splitlines()[-1])
    assert last["exit_code"] == 2 and last["msg"].startswith("--metrics-port (STALLEDPOLICY_METRICS_PORT): ")


# ----------------------------------------------- 3. SIGTERM while a reply hangs


class SilentServer:
    """A TCP server that accepts, reads what it is sent, and never answers."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections: list[socket.socket] = []
        self.asked = threading.Event()  # a command arrived on some connection
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        try:
            while conn.recv(4096):
                self.asked.set()
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
        for conn in self.connections:
            conn.close()


@pytest.fixture
def silent_server():
    server = SilentServer()
    yield server
    server.close()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_once_signalled_while_a_reply_hangs_exits_with_the_signal(silent_server, queue_name, sig, code):
    """Before: the signal was swallowed; a second connection was made and waited
    its timeout too (~10.5 s), then exit 1, "stopped_early": false, the signal
    not said. Now the call in flight ends at its timeout (5 s), no other is
    made, and the exit is the signal's."""
    process = subprocess.Popen(
        [*SWEEP, "--once", "--queue", queue_name, "--redis-url", f"redis://127.0.0.1:{silent_server.port}/0"],
        env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert silent_server.asked.wait(30), "the sweeper never sent its first command"
        process.send_signal(sig)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == code, err
    assert len(silent_server.connections) == 1, "a retry was started after the signal"
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["stopped_early"] is True
    assert summary["error"] and "Timeout" in summary["error"]
    assert "stopped by a signal before the pass finished" in err and f"signal={sig.name}" in err
    assert "exits 1" not in err


def test_the_long_running_sweeper_makes_no_retry_after_sigterm(silent_server, queue_name):
    process = subprocess.Popen(
        [*SWEEP, "--queue", queue_name, "--metrics-port", "0",
         "--redis-url", f"redis://127.0.0.1:{silent_server.port}/0"],
        env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert silent_server.asked.wait(30), "the sweeper never sent its first command"
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert len(silent_server.connections) == 1, "a retry was started after the signal"
    assert "sweeper stopped" in err and "signal=SIGTERM" in err


# ------------------------------------------- 5. lanes whose names are not UTF-8


def test_once_keeps_lanes_that_differ_in_bytes_that_are_not_utf8_apart(redis_server, r_bytes, queue_name):
    """Before: b'l\\xfe', b'l\\xff' and a real 'l\\ufffd' were one key "l\\ufffd"."""
    prefix = QueueKeys(queue_name).prefix.encode()
    jobs = ((b"J1", b"l\xfe"), (b"J2", b"l\xff"), (b"J3", b"l\xff"), (b"J4", "l\ufffd".encode()))
    for job_id, lane in jobs:
        r_bytes.hset(prefix + b"job:" + job_id, mapping={b"state": b"active", b"attempts": b"1",
                                                         b"payload": b"p", b"group": lane})
        r_bytes.zadd(prefix + b"active", {job_id: EXPIRED})
        r_bytes.hincrby(prefix + b"gactive", lane, 1)
    done = sweep("--once", "--redis-url", redis_server.url, "--queue", queue_name, "--max-stalled", "2")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["recovered"] == 4
    assert summary["lanes"] == {
        "l\udcfe": {"recovered": 1, "dead_lettered": 0},
        "l\udcff": {"recovered": 2, "dead_lettered": 0},  # noqa: F601 (ruff sees lone surrogates as one key)
        "l\ufffd": {"recovered": 1, "dead_lettered": 0},  # noqa: F601 (ruff sees lone surrogates as one key)
    }
    assert '"l\\udcfe"' in done.stdout and '"l\\udcff"' in done.stdout  # as the morgue's JSON writes them
    # the log line: as the morgue's tables show a lane
    [line] = [line for line in done.stderr.splitlines() if "sweep pass" in line]
    assert "l\\xfe:1/0" in line and "l\\xff:2/0" in line and "l\ufffd:1/0" in line
    # each job went to its own lane's pending set, under its own bytes
    for lane, count in ((b"l\xfe", 1), (b"l\xff", 2), ("l\ufffd".encode(), 1)):
        assert r_bytes.zcard(prefix + b"g:" + lane + b":pending") == count


def test_once_with_a_configured_lane_still_sweeps_with_its_budget(redis_server, r_bytes, queue_name):
    """The decoding client sends a configured lane's name as it is given."""
    prefix = QueueKeys(queue_name).prefix.encode()
    r_bytes.hset(prefix + b"job:J1", mapping={b"state": b"active", b"attempts": b"1", b"payload": b"p",
                                              b"group": "caf\u00e9".encode()})
    r_bytes.zadd(prefix + b"active", {b"J1": EXPIRED})
    r_bytes.hincrby(prefix + b"gactive", "caf\u00e9".encode(), 1)
    done = sweep("--once", "--redis-url", redis_server.url, "--queue", queue_name, "--max-stalled", "5",
                 "--lane", "caf\u00e9=1")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["lanes"] == {"caf\u00e9": {"recovered": 0, "dead_lettered": 1}}


# ------------------------------------------------ 6. --metrics-address with --once


@pytest.mark.parametrize("extra", [["--once"], ["--metrics-port", "0"], []])
def test_a_malformed_metrics_address_is_refused_in_every_mode(redis_server, queue_name, extra):
    """Before: --once (and --metrics-port 0) took 1.2.3.999 without a word."""
    port = [] if "--metrics-port" in extra else ["--metrics-port", str(free_port())]
    done = sweep("--redis-url", redis_server.url, "--queue", queue_name, "--metrics-address", "1.2.3.999",
                 *port, *extra, timeout=30)
    assert done.returncode == 2, done.stderr
    assert "--metrics-address (STALLEDPOLICY_METRICS_ADDRESS): '1.2.3.999' is not an IP address" in done.stderr
    assert done.stdout == ""


def test_once_with_a_good_metrics_address_in_use_elsewhere_still_runs(redis_server, queue_name):
    """--once serves nothing: a port another sweeper holds does not stop it."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = sweep("--once", "--redis-url", redis_server.url, "--queue", queue_name,
                     "--metrics-address", "127.0.0.1", "--metrics-port", str(port))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["error"] is None
