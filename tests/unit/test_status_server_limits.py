"""The status server's limits (sweeper/metrics.py, MAX_CONNECTIONS): a client that
trickles its request is cut at the whole-request deadline, however often it sends;
connections beyond the cap hold no thread (the longest reader is evicted, or the new
one closed); probes and scrapes answer throughout; stop() does not wait for tricklers.

Real sockets on 127.0.0.1. Deadlines are short here and the waits for what must
happen are generous (a bound, not a timing assert): a loaded 2-core host passes."""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

from stalledpolicy.sweeper import metrics as metrics_module
from stalledpolicy.sweeper.metrics import Health, StatusServer, SweeperMetrics

DROPPED = "stalledpolicy_http_connections_dropped_total"
CONNECTION_THREAD = "status-http-connection"
TRICKLE_EVERY_S = 0.5


def eventually(check: Callable[[], object], timeout: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def connection_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == CONNECTION_THREAD)


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def dropped(metrics: SweeperMetrics, reason: str) -> float:
    return metrics.registry.get_sample_value(DROPPED, {"reason": reason}) or 0.0


class Tricklers:
    """Clients that send a request line, then one header line every TRICKLE_EVERY_S,
    never the blank line that ends the request; a background thread trickles and
    notes what each received until the server closed it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.socks: list[socket.socket] = []
        self.received: dict[socket.socket, bytes] = {}
        self.closed: set[socket.socket] = set()  # by the server
        self.lines_sent: dict[socket.socket, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._trickle, daemon=True)
        self._thread.start()

    def open(self, n: int = 1) -> list[socket.socket]:
        new = []
        for _ in range(n):
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")
            with self._lock:
                self.socks.append(sock)
                self.received[sock] = b""
                self.lines_sent[sock] = 0
            new.append(sock)
        return new

    def open_ones(self) -> list[socket.socket]:
        with self._lock:
            return [s for s in self.socks if s not in self.closed]

    def _trickle(self) -> None:
        while not self._stop.wait(TRICKLE_EVERY_S):
            for sock in self.open_ones():
                self._read(sock)
                if sock in self.closed:
                    continue
                try:
                    sock.sendall(b"X-Slow: a\r\n")
                    with self._lock:
                        self.lines_sent[sock] += 1
                except OSError:
                    self._read(sock)

    def _read(self, sock: socket.socket) -> None:
        try:
            while select.select([sock], [], [], 0)[0]:
                data = sock.recv(4096)
                with self._lock:
                    if not data:
                        self.closed.add(sock)
                        return
                    self.received[sock] += data
        except OSError:
            with self._lock:
                self.closed.add(sock)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for sock in self.socks:
            sock.close()


@pytest.fixture
def tricklers():
    made: list[Tricklers] = []

    def make(port: int) -> Tricklers:
        made.append(Tricklers(port))
        return made[-1]

    yield make
    for t in made:
        t.close()


@pytest.fixture
def servers():
    started: list[StatusServer] = []

    def start(metrics: SweeperMetrics, **limits) -> StatusServer:
        health = Health(60.0)
        health.redis_up = health.last_pass_ok = True
        started.append(StatusServer("127.0.0.1", 0, metrics, health, **limits).start())
        return started[-1]

    yield start
    for server in started:
        server.stop()


def test_the_limits_as_shipped():
    assert 16 <= metrics_module.MAX_CONNECTIONS <= 256
    # well inside the sweeper's liveness window (3 failures 10 s apart), and more than a probe needs
    assert 1 < metrics_module.REQUEST_DEADLINE_S <= 10 and 1 < metrics_module.RESPONSE_DEADLINE_S <= 10


def test_a_trickling_client_is_cut_at_the_whole_request_deadline(servers, tricklers):
    """A header line every 0.5 s keeps each read well inside the 10 s socket timeout:
    only the deadline on the whole request ends it (with a 408), and its thread."""
    metrics = SweeperMetrics("orders")
    server = servers(metrics, request_deadline_s=1.5)
    slow = tricklers(server.port)
    [sock] = slow.open()
    eventually(lambda: sock in slow.closed, what="the trickler cut")
    assert slow.lines_sent[sock] >= 1  # it was trickling, each read in time
    assert slow.received[sock].startswith(b"HTTP/1.0 408 ")
    eventually(lambda: dropped(metrics, "deadline") == 1, what="counted")
    eventually(lambda: server.open_connections == 0 and connection_threads() == 0, what="its thread gone")
    status, body = get(server.port, "/metrics")  # and after it, the server still answers
    assert status == 200 and f'{DROPPED}{{reason="deadline"}} 1.0'.encode() in body


def test_tricklers_beyond_the_cap_hold_no_more_threads_than_the_cap(servers, tricklers):
    """Three more than the cap: the longest readers are evicted (a 408), the threads
    never outnumber the cap, and the probes answer while the cap is full."""
    metrics = SweeperMetrics("orders")
    cap = 4
    server = servers(metrics, max_connections=cap, request_deadline_s=120)
    slow = tricklers(server.port)
    first = slow.open(cap)
    eventually(lambda: server.open_connections == cap, what="the cap filled")
    for _sock in slow.open(3):
        assert connection_threads() <= cap and server.open_connections <= cap
        time.sleep(0.2)  # its accept, and what the trickle thread does meanwhile
        assert connection_threads() <= cap and server.open_connections <= cap
    eventually(lambda: set(first[:3]) <= slow.closed, what="the three oldest evicted")
    assert all(slow.received[s].startswith(b"HTTP/1.0 408 ") for s in first[:3])
    eventually(lambda: dropped(metrics, "evicted") == 3, what="counted")
    time.sleep(2 * TRICKLE_EVERY_S)
    assert len(slow.open_ones()) == cap  # the four newest are still there, trickling
    for path in ("/healthz", "/readyz", "/metrics"):
        assert get(server.port, path)[0] == 200, path  # the first at least evicted a trickler
        assert connection_threads() <= cap
    assert dropped(metrics, "evicted") >= 4 and dropped(metrics, "refused") == 0


def test_probes_answer_while_tricklers_keep_reconnecting(servers, tricklers):
    """Slow clients that keep opening connections (the cap full of them all the time,
    each new one evicting the oldest) do not fail a probe: a probe sends its request at
    once, and is never the longest reader."""
    metrics = SweeperMetrics("orders")
    cap = 8
    server = servers(metrics, max_connections=cap, request_deadline_s=120)
    slow = tricklers(server.port)
    slow.open(cap)
    stop = threading.Event()

    def reconnect():
        while not stop.is_set() and len(slow.socks) < 400:
            slow.open()
            time.sleep(0.1)

    thread = threading.Thread(target=reconnect, daemon=True)
    thread.start()
    try:
        for _ in range(10):
            assert get(server.port, "/healthz")[0] == 200
            assert connection_threads() <= cap
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join(10)
    assert dropped(metrics, "evicted") >= 1 and dropped(metrics, "refused") == 0


class BlockedExposition(SweeperMetrics):
    """/metrics that waits for ``release``: its connections are answering, not reading."""

    def __init__(self) -> None:
        super().__init__("orders")
        self.release = threading.Event()
        self._lock = threading.Lock()
        self.answering = 0  # connections inside exposition(): their request read, their answer begun

    def exposition(self) -> bytes:
        with self._lock:
            self.answering += 1
        self.release.wait(60)
        return super().exposition()


def test_at_the_cap_with_no_reader_to_evict_a_connection_is_closed_at_once(servers):
    metrics = BlockedExposition()
    cap = 2
    server = servers(metrics, max_connections=cap)
    answers: list[int] = []
    scrapes = [threading.Thread(target=lambda: answers.append(get(server.port, "/metrics")[0]), daemon=True)
               for _ in range(cap)]
    for scrape in scrapes:
        scrape.start()
    try:
        # answering, not only accepted: a scrape still reading its request would be
        # evicted to make room (a loaded host once got there first, and the test's
        # own connection was then served, not closed)
        eventually(lambda: server.open_connections == cap and metrics.answering == cap,
                   what="the cap filled with answering scrapes")
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            assert sock.recv(100) == b""  # closed at once, unanswered; no thread made for it
        eventually(lambda: dropped(metrics, "refused") == 1, what="counted")
        assert connection_threads() <= cap
    finally:
        metrics.release.set()
    for scrape in scrapes:
        scrape.join(20)
    assert answers == [200] * cap  # the scrapes in progress were not disturbed
    assert get(server.port, "/healthz")[0] == 200


def test_an_answer_is_bounded_too(servers):
    """An answer that takes longer than the response deadline is cut (no 408: it was
    answering), and its slot freed once its handler gives up."""
    metrics = BlockedExposition()
    server = servers(metrics, response_deadline_s=1.0)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        assert sock.recv(100) == b""  # cut at the deadline, nothing written
        eventually(lambda: dropped(metrics, "deadline") == 1, what="counted")
    metrics.release.set()
    eventually(lambda: server.open_connections == 0, what="the slot freed")


def test_stop_returns_with_tricklers_connected(tricklers):
    """stop() (on SIGTERM) cuts the tricklers rather than waiting for them: they are
    closed, and their threads gone, long before their deadline."""
    server = StatusServer("127.0.0.1", 0, SweeperMetrics("orders"), Health(60.0), request_deadline_s=600).start()
    slow = tricklers(server.port)
    slow.open(10)
    eventually(lambda: server.open_connections == 10, what="the tricklers accepted")
    stopper = threading.Thread(target=server.stop, daemon=True)
    stopper.start()
    stopper.join(60)  # far below the 600 s deadline: only cutting them ends it
    assert not stopper.is_alive(), "stop() waited for the tricklers"
    eventually(lambda: len(slow.closed) == 10, what="the tricklers closed")
    eventually(lambda: connection_threads() == 0, what="no connection thread left")


def test_drops_are_logged_in_one_line_at_most_once_a_minute(servers, tricklers, caplog):
    metrics = SweeperMetrics("orders")
    with caplog.at_level(logging.WARNING, logger="stalledpolicy.metrics"):
        server = servers(metrics, request_deadline_s=0.5)
        slow = tricklers(server.port)
        slow.open(5)
        eventually(lambda: dropped(metrics, "deadline") == 5, what="five cut")
        slow.open(5)
        eventually(lambda: dropped(metrics, "deadline") == 10, what="ten cut")
        time.sleep(1.0)  # a few more polls of the server: no more lines within the minute
    lines = [r for r in caplog.records if r.name == "stalledpolicy.metrics"]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert 1 <= lines[0].deadline_cut <= 5 and lines[0].evicted == 0 and lines[0].refused == 0
