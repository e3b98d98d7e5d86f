"""``stalledpolicy sweep`` as a real process against real redis-servers.

The process is started with ``python -m stalledpolicy sweep``; jobs are laid
out directly with :class:`QueueKeys` the way EchoMQ workers leave them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stalledpolicy.devenv.ports import free_port
from stalledpolicy.devenv.redis_server import start_redis
from stalledpolicy.keyspace import QueueKeys

pytestmark = pytest.mark.redis

SWEEP = [sys.executable, "-m", "stalledpolicy", "sweep"]
OUTAGE_LINE = "redis unreachable; retrying with backoff"
ONCE_OUTAGE_LINE = "redis unreachable; the pass failed and --once exits 1"
RECOVERY_LINE = "redis reachable again"


# --------------------------------------------------------------------------- helpers


def eventually(check: Callable[[], object], timeout: float = 20.0, what: str = "condition"):
    """Poll ``check`` until it returns a truthy value (a wait bound, not a timing assert)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def add_active(client, queue: str, job_id: str, *, lease_ms: int = 1000, stalled: int | None = None,
               group: str | None = None, attempts: int = 1) -> None:
    """A claimed job as a worker leaves it; ``lease_ms`` is the lease deadline (ms since epoch)."""
    keys = QueueKeys(queue)
    row = {"state": "active", "attempts": attempts, "payload": f"payload of {job_id}"}
    if stalled is not None:
        row["stalled"] = stalled
    if group is not None:
        row["group"] = group
        client.hincrby(keys.gactive, group, 1)
    client.hset(keys.job(job_id), mapping=row)
    client.zadd(keys.active, {job_id: lease_ms})


def far_future_ms() -> int:
    return int(time.time() * 1000) + 3_600_000


class SweeperProcess:
    """One sweeper subprocess; stderr (the logs) goes to a file so it never blocks."""

    def __init__(self, *args: str, env: dict | None = None):
        self.metrics_port = free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="sweeper-test-"))
        self._stderr_path = self._dir / "stderr"
        self._stdout_path = self._dir / "stdout"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("STALLEDPOLICY_")}
        full_env.update(env or {})
        full_env.setdefault("STALLEDPOLICY_METRICS_PORT", str(self.metrics_port))
        full_env.setdefault("STALLEDPOLICY_METRICS_ADDRESS", "127.0.0.1")
        with open(self._stderr_path, "wb") as err, open(self._stdout_path, "wb") as out:
            self.process = subprocess.Popen([*SWEEP, *args], stdout=out, stderr=err, env=full_env)

    @property
    def stderr(self) -> str:
        return self._stderr_path.read_text(errors="replace")

    @property
    def stdout(self) -> str:
        return self._stdout_path.read_text(errors="replace")

    def lines_with(self, text: str) -> list[str]:
        return [line for line in self.stderr.splitlines() if text in line]

    def get(self, path: str) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.metrics_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except (urllib.error.URLError, ConnectionError):
            return 0, ""

    def status(self, path: str) -> int:
        return self.get(path)[0]

    def metric(self, name: str, **labels: str) -> float | None:
        code, body = self.get("/metrics")
        if code != 200:
            return None
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return sample.value
        return None

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout)

    def terminate(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(15)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self._dir, ignore_errors=True)


@pytest.fixture
def sweepers():
    started: list[SweeperProcess] = []

    def start(*args: str, env: dict | None = None) -> SweeperProcess:
        process = SweeperProcess(*args, env=env)
        started.append(process)
        return process

    yield start
    for process in started:
        process.close()


@pytest.fixture
def own_redis(server_binaries):
    """A server of this test alone (outage tests stop and restart it)."""
    servers = []

    def start(extra_args: list[str] | None = None):
        server = start_redis(extra_args, binaries=server_binaries)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
        shutil.rmtree(server.workdir, ignore_errors=True)


# --------------------------------------------------------------------------- --once


def test_once_sweeps_the_expired_jobs_and_exits_0(redis_server, r, queue_name, sweepers):
    keys = QueueKeys(queue_name)
    add_active(r, queue_name, "JOB0001")                            # first stall: recovered
    add_active(r, queue_name, "JOB0002", stalled=1)                 # reaches budget 2: dead
    add_active(r, queue_name, "JOB0003", group="acme")              # lane job: back to its lane
    add_active(r, queue_name, "JOB0004", group="imports")           # lane budget 1: dead
    add_active(r, queue_name, "JOB0005", lease_ms=far_future_ms())  # lease still valid: untouched

    sweeper = sweepers("--redis-url", redis_server.url, "--queue", queue_name, "--max-stalled", "2",
                       "--lane", "imports=1", "--batch-size", "2", "--once")
    assert sweeper.wait(60) == 0, sweeper.stderr

    summary = json.loads(sweeper.stdout.strip().splitlines()[-1])
    assert summary["queue"] == queue_name
    assert (summary["recovered"], summary["dead_lettered"]) == (2, 2)
    assert summary["lanes"]["acme"] == {"recovered": 1, "dead_lettered": 0}
    assert summary["lanes"]["imports"] == {"recovered": 0, "dead_lettered": 1}
    assert summary["calls"] >= 2  # batch size 2 over 4 expired jobs: more than one bounded call

    assert r.zrange(keys.pending, 0, -1) == ["JOB0001"]
    assert r.zrange(keys.lane_pending("acme"), 0, -1) == ["JOB0003"]
    assert sorted(r.zrange(keys.dead, 0, -1)) == ["JOB0002", "JOB0004"]
    assert r.zrange(keys.active, 0, -1) == ["JOB0005"]
    assert r.hget(keys.job("JOB0001"), "stalled") == "1"
    assert r.hget(keys.job("JOB0002"), "state") == "dead"
    assert len(sweeper.lines_with("sweep pass")) == 1


def test_once_with_nothing_expired_exits_0_and_moves_nothing(redis_server, r, queue_name, sweepers):
    keys = QueueKeys(queue_name)
    add_active(r, queue_name, "JOB0001", lease_ms=far_future_ms())
    sweeper = sweepers("--queue", queue_name, "--once", env={"STALLEDPOLICY_REDIS_URL": redis_server.url})
    assert sweeper.wait(60) == 0, sweeper.stderr
    summary = json.loads(sweeper.stdout.strip().splitlines()[-1])
    assert (summary["recovered"], summary["dead_lettered"], summary["orphans"]) == (0, 0, 0)
    assert r.zrange(keys.active, 0, -1) == ["JOB0001"]
    # Nothing done: the pass line is debug, not info.
    assert sweeper.lines_with("sweep pass") == []


def test_once_exits_1_when_redis_is_unreachable(queue_name, sweepers):
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    sweeper = sweepers("--redis-url", nobody, "--queue", queue_name, "--once")
    assert sweeper.wait(60) == 1
    assert len(sweeper.lines_with(ONCE_OUTAGE_LINE)) == 1
    assert "retrying" not in sweeper.stderr
    # the one JSON line on failure too (for `| jq`): the error, nothing moved
    summary = json.loads(sweeper.stdout)
    assert summary["error"].startswith("redis unreachable: ") and summary["calls"] == 0


def test_once_logs_json_when_asked(redis_server, r, queue_name, sweepers):
    add_active(r, queue_name, "JOB0001")
    sweeper = sweepers("--redis-url", redis_server.url, "--queue", queue_name, "--once",
                       "--log-format", "json")
    assert sweeper.wait(60) == 0, sweeper.stderr
    entries = [json.loads(line) for line in sweeper.stderr.splitlines() if line.strip()]
    [pass_line] = [e for e in entries if e["msg"] == "sweep pass"]
    assert pass_line["level"] == "info"
    assert pass_line["queue"] == queue_name
    # The default budget is 1: the first stall dead-letters.
    assert (pass_line["recovered"], pass_line["dead_lettered"]) == (0, 1)


def test_once_exits_1_on_a_script_error(redis_server, r, queue_name, sweepers):
    r.set(QueueKeys(queue_name).active, "not a sorted set")
    sweeper = sweepers("--redis-url", redis_server.url, "--queue", queue_name, "--once")
    assert sweeper.wait(60) == 1
    assert len(sweeper.lines_with("sweep pass failed; --once exits 1")) == 1
    assert "retrying" not in sweeper.stderr
    summary = json.loads(sweeper.stdout)
    assert "EMQWRONGTYPE" in summary["error"] and (summary["recovered"], summary["dead_lettered"]) == (0, 0)


def test_once_with_a_totals_hash_of_the_wrong_type_reports_what_moved_and_warns(redis_server, r, queue_name,
                                                                                 sweepers):
    """The sweep takes the totals hash of the wrong type as a key problem and moves
    the jobs; the snapshot read after it (for the gauges) failed the whole pass:
    exit 1, nothing printed of what moved, no warning naming the key."""
    keys = QueueKeys(queue_name)
    r.set(keys.sweeper_totals, "not a hash")
    add_active(r, queue_name, "JOB0001")
    sweeper = sweepers("--redis-url", redis_server.url, "--queue", queue_name, "--once")
    assert sweeper.wait(60) == 0, sweeper.stderr
    assert json.loads(sweeper.stdout.strip().splitlines()[-1])["dead_lettered"] == 1
    assert r.zrange(keys.dead, 0, -1) == ["JOB0001"]
    assert sweeper.lines_with(keys.sweeper_totals) and not sweeper.lines_with("sweep pass failed")


def test_a_metrics_port_in_use_is_refused_with_exit_2(redis_server, queue_name, sweepers):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sweeper = sweepers("--redis-url", redis_server.url, "--queue", queue_name,
                           "--metrics-port", str(port))
        assert sweeper.wait(30) == 2
    assert (f"--metrics-port (STALLEDPOLICY_METRICS_PORT): port {port} is already in use on 127.0.0.1"
            in sweeper.stderr)


def test_an_address_not_of_this_host_blames_the_address_not_the_port(redis_server, queue_name, sweepers):
    sweeper = sweepers("--redis-url", redis_server.url, "--queue", queue_name,
                       env={"STALLEDPOLICY_METRICS_ADDRESS": "192.0.2.7"})  # TEST-NET-1: never local
    assert sweeper.wait(30) == 2
    assert ("--metrics-address (STALLEDPOLICY_METRICS_ADDRESS): 192.0.2.7 is not an address of this host"
            in sweeper.stderr)
    assert "--metrics-port" not in sweeper.stderr


@pytest.mark.parametrize("address", ["::", "::1"])
def test_the_metrics_server_listens_on_ipv6(redis_server, queue_name, sweepers, address):
    sweeper = sweepers("--redis-url", redis_server.url, "--queue", queue_name, "--interval", "1h",
                       env={"STALLEDPOLICY_METRICS_ADDRESS": address})

    def ready() -> int:
        try:
            with urllib.request.urlopen(f"http://[::1]:{sweeper.metrics_port}/readyz", timeout=5) as response:
                return response.status
        except (urllib.error.URLError, ConnectionError):
            return 0

    eventually(lambda: ready() == 200, what="/readyz 200 on [::1]")
    assert sweeper.terminate() == 0, sweeper.stderr


def fill_active(r, queue: str, total: int) -> None:
    keys = QueueKeys(queue)
    pipe = r.pipeline(transaction=False)
    for n in range(total):
        job_id = f"JOB{n:06d}"
        pipe.hset(keys.job(job_id), mapping={"state": "active", "attempts": 1, "payload": "p"})
        pipe.zadd(keys.active, {job_id: 1000 + n})
        if n % 1000 == 999:
            pipe.execute()
    pipe.execute()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_once_stopped_by_a_signal_mid_drain_exits_non_zero(redis_server, r, queue_name, sweepers, sig, code):
    """The pass did not finish: --once must not report success."""
    keys = QueueKeys(queue_name)
    total = 20_000
    fill_active(r, queue_name, total)
    sweeper = sweepers("--redis-url", redis_server.url, "--queue", queue_name, "--once",
                       "--batch-size", "1", "--max-stalled", "0")
    eventually(lambda: r.zcard(keys.pending) >= 100, what="the drain under way")
    sweeper.process.send_signal(sig)
    assert sweeper.wait(15) == code, sweeper.stderr
    assert r.zcard(keys.active) > 0, "the drain finished before the signal; nothing was proven"
    assert r.zcard(keys.pending) + r.zcard(keys.active) == total
    summary = json.loads(sweeper.stdout.strip().splitlines()[-1])
    assert summary["stopped_early"] is True and summary["recovered"] == r.zcard(keys.pending)
    assert sweeper.lines_with("stopped by a signal before the pass finished")


def test_once_into_a_closed_pipe_is_quiet(redis_server, r, queue_name):
    """`sweep --once | head -c0`: the reader left; no traceback for it."""
    add_active(r, queue_name, "JOB0001")
    read_end, write_end = os.pipe()
    os.close(read_end)  # gone before the first byte: a certain EPIPE
    env = {k: v for k, v in os.environ.items() if not k.startswith("STALLEDPOLICY_")}
    try:
        done = subprocess.run([*SWEEP, "--redis-url", redis_server.url, "--queue", queue_name, "--once"],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, env=env, timeout=60)
    finally:
        os.close(write_end)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr
    assert r.zcard(QueueKeys(queue_name).dead) == 1  # the pass itself ran


@pytest.mark.parametrize(("query", "needle"), [("?protocol=9", "protocol"), ("?socket_timeout=abc", "socket_timeout")])
def test_a_redis_url_option_redis_py_refuses_is_bad_usage_at_start(redis_server, queue_name, sweepers,
                                                                   query, needle):
    # before: protocol=9 read as an outage (retried forever), socket_timeout=abc as a failed pass
    sweeper = sweepers("--queue", queue_name, env={"STALLEDPOLICY_REDIS_URL": redis_server.url + query})
    assert sweeper.wait(30) == 2, sweeper.stderr
    assert "--redis-url (STALLEDPOLICY_REDIS_URL): " in sweeper.stderr and needle in sweeper.stderr


def test_bad_settings_exit_2_before_touching_redis(queue_name, sweepers):
    sweeper = sweepers("--queue", queue_name, "--once", env={"STALLEDPOLICY_MAX_STALLED": "-1"})
    assert sweeper.wait(30) == 2
    assert "--max-stalled (STALLEDPOLICY_MAX_STALLED): must be >= 0" in sweeper.stderr
    assert "got -1" in sweeper.stderr


# --------------------------------------------------------------------------- long-running


def test_sweeps_every_interval_and_serves_metrics_and_health(redis_server, r, queue_name, sweepers):
    keys = QueueKeys(queue_name)
    add_active(r, queue_name, "JOB0001")
    sweeper = sweepers("--redis-url", redis_server.url, "--queue", queue_name, "--interval", "1s",
                       "--max-stalled", "2", "--lane", "acme=3",
                       env={"STALLEDPOLICY_POLICY": "shop/orders-policy"})
    eventually(lambda: r.zrange(keys.pending, 0, -1) == ["JOB0001"], what="the first pass")
    assert "policy=shop/orders-policy" in sweeper.lines_with("sweeper started")[0]
    eventually(lambda: sweeper.status("/readyz") == 200, what="/readyz 200")
    assert sweeper.status("/healthz") == 200

    # Jobs that stall after the first pass are swept by a later one, unprompted.
    add_active(r, queue_name, "JOB0002", stalled=1)
    add_active(r, queue_name, "JOB0003", group="acme")
    eventually(lambda: r.zrange(keys.dead, 0, -1) == ["JOB0002"], what="a later pass")
    eventually(lambda: r.zrange(keys.lane_pending("acme"), 0, -1) == ["JOB0003"], what="the lane job")

    def counted() -> bool:
        return (
            sweeper.metric("stalledpolicy_recovered_total", queue=queue_name, lane="") == 1
            and sweeper.metric("stalledpolicy_recovered_total", queue=queue_name, lane="acme") == 1
            and sweeper.metric("stalledpolicy_dead_lettered_total", queue=queue_name, lane="") == 1
            and sweeper.metric("stalledpolicy_morgue_size", queue=queue_name) == 1
        )

    eventually(counted, what="the counters and the morgue gauge")
    assert sweeper.metric("stalledpolicy_redis_up", queue=queue_name) == 1
    assert sweeper.metric("stalledpolicy_pending", queue=queue_name) == 1
    assert sweeper.metric("stalledpolicy_active", queue=queue_name) == 0
    assert sweeper.metric("stalledpolicy_lane_pending", queue=queue_name, lane="acme") == 1
    assert sweeper.metric("stalledpolicy_orphans_total", queue=queue_name) == 0
    assert sweeper.metric("stalledpolicy_pass_duration_seconds_count") >= 2
    assert sweeper.metric("stalledpolicy_script_call_duration_seconds_count") >= 2
    assert sweeper.metric("stalledpolicy_last_pass_timestamp_seconds") > 0
    assert sweeper.status("/nope") == 404

    assert sweeper.terminate() == 0
    assert len(sweeper.lines_with("sweeper stopped")) == 1
    assert sweeper.status("/healthz") == 0  # the server went down with the process


def test_sigterm_exits_0_without_waiting_out_the_interval(redis_server, queue_name, sweepers):
    sweeper = sweepers("--redis-url", redis_server.url, "--queue", queue_name, "--interval", "1h")
    eventually(lambda: sweeper.status("/readyz") == 200, what="/readyz 200")
    sweeper.process.send_signal(signal.SIGTERM)
    # An hour-long interval: only an Event-based wait lets the process leave now.
    assert sweeper.wait(15) == 0
    assert "signal=SIGTERM" in sweeper.lines_with("sweeper stopped")[0]


def test_sigterm_in_the_middle_of_a_drain_stops_between_calls_and_loses_nothing(redis_server, r, queue_name,
                                                                                  sweepers):
    keys = QueueKeys(queue_name)
    total = 30_000
    fill_active(r, queue_name, total)
    # One job per script call: the drain takes many calls, so the signal lands inside it.
    sweeper = sweepers("--redis-url", redis_server.url, "--queue", queue_name, "--interval", "1h",
                       "--batch-size", "1", "--max-stalled", "0")
    eventually(lambda: r.zcard(keys.pending) >= 100, what="the drain under way")
    sweeper.process.send_signal(signal.SIGTERM)
    assert sweeper.wait(15) == 0
    pending, active = r.zcard(keys.pending), r.zcard(keys.active)
    assert active > 0, "the drain finished before the signal; nothing was proven"
    assert pending + active == total
    # Every job moved is whole: recovered, counted and pending.
    assert int(r.hget(keys.sweeper_totals, "recovered")) == pending
    assert "stopped_early=True" in sweeper.lines_with("sweep pass")[0]


def test_sigterm_exits_0_with_slow_clients_holding_the_metrics_port(redis_server, queue_name, sweepers):
    """Clients trickling a request (a header line every 0.5 s) do not hold the exit up:
    the server's stop cuts them, before their deadline (no 'closed early' line: that is
    what a cut at the deadline logs)."""
    sweeper = sweepers("--redis-url", redis_server.url, "--queue", queue_name, "--interval", "1h")
    eventually(lambda: sweeper.status("/readyz") == 200, what="/readyz 200")
    slow = [socket.create_connection(("127.0.0.1", sweeper.metrics_port), timeout=5) for _ in range(5)]
    try:
        for sock in slow:
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        sweeper.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while sweeper.process.poll() is None and time.monotonic() < deadline:
            for sock in slow:
                with contextlib.suppress(OSError):
                    sock.sendall(b"X-Slow: a\r\n")
            time.sleep(0.5)
        assert sweeper.wait(5) == 0
    finally:
        for sock in slow:
            sock.close()
    assert "signal=SIGTERM" in sweeper.lines_with("sweeper stopped")[0]
    assert not sweeper.lines_with("closed early"), sweeper.stderr


def test_sigint_exits_0_too(redis_server, queue_name, sweepers):
    sweeper = sweepers("--redis-url", redis_server.url, "--queue", queue_name, "--interval", "1h")
    eventually(lambda: sweeper.status("/readyz") == 200, what="/readyz 200")
    sweeper.process.send_signal(signal.SIGINT)
    assert sweeper.wait(15) == 0


def test_metrics_port_0_serves_nothing_and_still_sweeps(redis_server, r, queue_name, sweepers):
    keys = QueueKeys(queue_name)
    add_active(r, queue_name, "JOB0001")
    sweeper = sweepers("--redis-url", redis_server.url, "--queue", queue_name, "--interval", "1s",
                       "--metrics-port", "0", "--max-stalled", "0")
    eventually(lambda: r.zrange(keys.pending, 0, -1) == ["JOB0001"], what="a pass")
    assert sweeper.status("/healthz") == 0
    assert sweeper.terminate() == 0


# --------------------------------------------------------------------------- outage


def test_redis_outage_keeps_running_logs_once_and_recovers(own_redis, queue_name, sweepers):
    server = own_redis()
    client = server.client(decode_responses=True)
    keys = QueueKeys(queue_name)
    sweeper = sweepers("--redis-url", server.url, "--queue", queue_name, "--interval", "1s",
                       "--max-stalled", "2")
    eventually(lambda: sweeper.status("/readyz") == 200, what="/readyz 200")

    server.stop()
    eventually(lambda: sweeper.status("/readyz") == 503, what="/readyz 503 during the outage")
    eventually(lambda: sweeper.metric("stalledpolicy_redis_up", queue=queue_name) == 0, what="redis_up 0")
    # Several retries happen during the outage (backoff starts at 0.5s); still one line.
    time.sleep(4)
    assert sweeper.process.poll() is None, sweeper.stderr
    assert sweeper.status("/healthz") == 200
    assert len(sweeper.lines_with(OUTAGE_LINE)) == 1, sweeper.stderr
    assert sweeper.lines_with(RECOVERY_LINE) == []

    server.restart()
    eventually(lambda: sweeper.status("/readyz") == 200, timeout=60, what="/readyz 200 after the outage")
    assert len(sweeper.lines_with(RECOVERY_LINE)) == 1, sweeper.stderr
    assert sweeper.metric("stalledpolicy_redis_up", queue=queue_name) == 1

    add_active(client, queue_name, "JOB0001")
    eventually(lambda: client.zrange(keys.pending, 0, -1) == ["JOB0001"], what="a sweep after recovery")
    assert len(sweeper.lines_with(OUTAGE_LINE)) == 1
    assert sweeper.terminate() == 0


def test_sigterm_during_an_outage_exits_0(own_redis, queue_name, sweepers):
    server = own_redis()
    sweeper = sweepers("--redis-url", server.url, "--queue", queue_name, "--interval", "1s")
    eventually(lambda: sweeper.status("/readyz") == 200, what="/readyz 200")
    server.stop()
    eventually(lambda: sweeper.lines_with(OUTAGE_LINE), what="the outage line")
    assert sweeper.terminate() == 0


def test_starting_while_redis_is_down_waits_for_it(own_redis, queue_name, sweepers):
    server = own_redis()
    server.stop()
    sweeper = sweepers("--redis-url", server.url, "--queue", queue_name, "--interval", "1s")
    eventually(lambda: sweeper.lines_with(OUTAGE_LINE), what="the outage line")
    assert sweeper.status("/readyz") == 503
    server.restart()
    eventually(lambda: sweeper.status("/readyz") == 200, timeout=60, what="/readyz 200")
    assert len(sweeper.lines_with(RECOVERY_LINE)) == 1
    assert sweeper.terminate() == 0


# --------------------------------------------------------------------------- a script error


def test_a_script_error_is_logged_once_and_the_process_keeps_running(redis_server, r, queue_name, sweepers):
    keys = QueueKeys(queue_name)
    # `active` holding the wrong type makes every sweep call fail inside Redis.
    r.set(keys.active, "not a sorted set")
    sweeper = sweepers("--redis-url", redis_server.url, "--queue", queue_name, "--interval", "1s",
                       "--max-stalled", "3")
    eventually(lambda: sweeper.lines_with("sweep pass failed"), what="the error line")
    eventually(lambda: sweeper.status("/readyz") == 503, what="/readyz 503 after a failed pass")
    time.sleep(3)  # several more passes fail the same way
    assert sweeper.process.poll() is None
    assert len(sweeper.lines_with("sweep pass failed")) == 1, sweeper.stderr
    assert sweeper.lines_with(OUTAGE_LINE) == []
    assert sweeper.metric("stalledpolicy_redis_up", queue=queue_name) == 1

    r.delete(keys.active)
    add_active(r, queue_name, "JOB0001")
    eventually(lambda: r.zrange(keys.pending, 0, -1) == ["JOB0001"], what="a pass after the fix")
    eventually(lambda: sweeper.status("/readyz") == 200, what="/readyz 200 again")
    assert sweeper.terminate() == 0


# --------------------------------------------------------------------------- secrets


SECRET = "s3cr3t-Pa55word-never-printed"


def test_the_password_is_never_printed(own_redis, queue_name, sweepers):
    server = own_redis(["--requirepass", SECRET])
    client = server.client(password=SECRET, decode_responses=True)
    keys = QueueKeys(queue_name)
    add_active(client, queue_name, "JOB0001")
    url = f"redis://:{SECRET}@127.0.0.1:{server.port}/0"

    once = sweepers("--queue", queue_name, "--once", "--log-level", "debug", "--max-stalled", "2",
                    env={"STALLEDPOLICY_REDIS_URL": url})
    assert once.wait(60) == 0, once.stderr
    assert client.zrange(keys.pending, 0, -1) == ["JOB0001"]
    assert f"redis://:***@127.0.0.1:{server.port}/0" in once.stderr
    assert SECRET not in once.stderr + once.stdout

    # A long-running one through an outage, at debug level (every retry logged).
    running = sweepers("--redis-url", url, "--queue", queue_name, "--interval", "1s", "--log-level", "debug")
    eventually(lambda: running.status("/readyz") == 200, what="/readyz 200")
    server.stop()
    eventually(lambda: running.lines_with(OUTAGE_LINE), what="the outage line")
    server.restart()
    eventually(lambda: running.lines_with(RECOVERY_LINE), timeout=60, what="the recovery line")
    _, body = running.get("/metrics")
    _, ready = running.get("/readyz")
    assert running.terminate() == 0
    assert SECRET not in running.stderr + running.stdout + body + ready


CREDENTIALS_LINE = "Redis refused the credentials of the Redis URL; nothing was moved"


def test_a_wrong_password_is_a_bad_setting_and_is_not_printed(own_redis, queue_name, sweepers):
    """Redis answered, refusing the URL's password: a bad setting (--once exits
    2, as for a database the server lacks), not an outage (it was 'redis
    unreachable', exit 1, redis_up 0)."""
    server = own_redis(["--requirepass", SECRET])
    wrong = "not-the-password-either-9f8e7d"
    url = f"redis://:{wrong}@127.0.0.1:{server.port}/0"
    sweeper = sweepers("--queue", queue_name, "--once", env={"STALLEDPOLICY_REDIS_URL": url})
    assert sweeper.wait(60) == 2
    assert len(sweeper.lines_with(CREDENTIALS_LINE)) == 1 and not sweeper.lines_with(ONCE_OUTAGE_LINE)
    assert re.search(r"error_type=\w*Auth", sweeper.stderr), sweeper.stderr
    assert "requires a password (or refused this user/password): put them in the URL" in sweeper.stderr
    assert wrong not in sweeper.stderr + sweeper.stdout
    # no password at all: the same words, not redis-py's ("HELLO must be called ...")
    bare = sweepers("--queue", queue_name, "--once",
                    env={"STALLEDPOLICY_REDIS_URL": f"redis://127.0.0.1:{server.port}/0"})
    assert bare.wait(60) == 2
    assert "requires a password" in bare.stderr and "HELLO" not in bare.stderr, bare.stderr

    running = sweepers("--queue", queue_name, "--interval", "1s", env={"STALLEDPOLICY_REDIS_URL": url})
    eventually(lambda: running.lines_with(CREDENTIALS_LINE), what="the credentials line")
    status, ready = running.get("/readyz")
    _, metrics = running.get("/metrics")
    assert running.terminate() == 0
    assert status == 503 and "refused this user/password" in ready, ready
    assert f'stalledpolicy_redis_up{{queue="{queue_name}"}} 1.0' in metrics
    assert not running.lines_with(OUTAGE_LINE) and len(running.lines_with(CREDENTIALS_LINE)) == 1
    assert wrong not in running.stderr + ready + metrics


# --------------------------------------------------------------------------- cluster


@pytest.mark.slow
def test_once_on_a_three_node_cluster_from_any_node(redis_cluster, queue_name, sweepers):
    client = redis_cluster.client(decode_responses=True)
    keys = QueueKeys(queue_name)
    # Each node's URL works (only one owns the queue's slot): the sweeper finds the cluster.
    for n, node in enumerate(redis_cluster.nodes):
        add_active(client, queue_name, f"JOB{n}01")
        add_active(client, queue_name, f"JOB{n}02", stalled=1)
        add_active(client, queue_name, f"JOB{n}03", group="acme")
        sweeper = sweepers("--redis-url", f"redis://127.0.0.1:{node.port}/0", "--queue", queue_name,
                           "--max-stalled", "2", "--once")
        assert sweeper.wait(60) == 0, sweeper.stderr
        summary = json.loads(sweeper.stdout.strip().splitlines()[-1])
        assert (summary["recovered"], summary["dead_lettered"]) == (2, 1)
    assert client.zrange(keys.pending, 0, -1) == ["JOB001", "JOB101", "JOB201"]
    assert client.zrange(keys.dead, 0, -1) == ["JOB002", "JOB102", "JOB202"]
    assert client.zrange(keys.lane_pending("acme"), 0, -1) == ["JOB003", "JOB103", "JOB203"]
    assert client.zcard(keys.active) == 0
