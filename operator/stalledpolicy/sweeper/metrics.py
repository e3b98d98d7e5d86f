"""The sweeper's Prometheus metrics and its one small HTTP server.

``/metrics`` (Prometheus text), ``/healthz`` (the loop is alive: its heartbeat
is recent) and ``/readyz`` (Redis answered and the last pass succeeded, or in
the first drain a script call) are served by one small HTTP server on a daemon
thread, a thread per connection within limits (``MAX_CONNECTIONS``, deadlines).

Counters count what *this* process did; the totals every replica shares live
in Redis (``emq:{q}:sweeper:totals``, read with ``engine.queue_snapshot``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from stalledpolicy.listen import listening_socket

# Counters' and histograms' *_created series (prometheus_client's default: each
# series' start time, as a gauge of its own in the text format) are read by no
# alert or dashboard of ours and nearly doubled what /metrics lists.
disable_created_metrics()

log = logging.getLogger("stalledpolicy.metrics")

FLAT_LANE = ""  # the lane label of jobs without a group
# The lane label of every lane not configured (--lane, spec.lanes): EchoMQ groups
# are often one per tenant, and a series per group would grow without bound. A
# space never appears in a lane name, so no configured lane can take this label.
OTHER_LANES = "(other lanes)"

# Script calls are bounded (milliseconds); passes drain a backlog (up to seconds).
_CALL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_PASS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def http_dropped_counter(prefix: str, registry: CollectorRegistry) -> Counter:
    """``<prefix>_http_connections_dropped_total{reason}``, every reason at 0: what the
    status server closed early (see MAX_CONNECTIONS), for the sweeper's and the operator's."""
    counter = Counter(
        f"{prefix}_http_connections_dropped",
        "Connections to this process's HTTP server it closed early, by reason: deadline (the request, or "
        "its answer, took longer than 10 s), evicted (the longest reader, to make room at the connection "
        "limit), refused (at the limit, with no reader to evict)", ["reason"], registry=registry)
    for reason in HTTP_DROP_REASONS:
        counter.labels(reason)
    return counter


class SweeperMetrics:
    def __init__(self, queue: str, lanes: tuple[str, ...] = ()):
        self.queue = queue
        self.lanes = frozenset((FLAT_LANE, *lanes))
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.recovered = Counter(
            "stalledpolicy_recovered", "Stalled jobs this process returned to pending or their lane",
            ["queue", "lane"], registry=r)
        self.dead_lettered = Counter(
            "stalledpolicy_dead_lettered", "Stalled jobs this process moved to the morgue at their budget",
            ["queue", "lane"], registry=r)
        self.orphans = Counter(
            "stalledpolicy_orphans", "Ids in active whose job row was gone (removed, no ghost row made)",
            ["queue"], registry=r)
        self.quarantined = Counter(
            "stalledpolicy_quarantined", "Malformed job rows moved to the morgue instead of aborting the batch",
            ["queue"], registry=r)
        self.leases_held = Counter(
            "stalledpolicy_leases_held",
            "Leases this process held in their last moments, so their lapse is counted before EchoMQ's "
            "reapers can return it", ["queue"], registry=r)
        self.lapses_uncounted = Counter(
            "stalledpolicy_lapses_uncounted",
            "Held leases that lapsed and were returned by another reaper before this process counted the "
            "stall (the budget leaks: the sweeper was late; see docs)", ["queue"], registry=r)
        self.pass_duration = Histogram(
            "stalledpolicy_pass_duration_seconds", "Duration of one sweep pass (a full drain)",
            registry=r, buckets=_PASS_BUCKETS)
        self.call_duration = Histogram(
            "stalledpolicy_script_call_duration_seconds", "Duration of one bounded sweep script call",
            registry=r, buckets=_CALL_BUCKETS)
        self.morgue_size = Gauge(
            "stalledpolicy_morgue_size", "Jobs in the queue's morgue (emq:{q}:dead)", ["queue"], registry=r)
        self.pending = Gauge(
            "stalledpolicy_pending", "Jobs in the queue's flat pending set", ["queue"], registry=r)
        self.lane_pending = Gauge(
            "stalledpolicy_lane_pending", "Jobs in a configured lane's pending set", ["queue", "lane"],
            registry=r)
        self.active = Gauge(
            "stalledpolicy_active", "Jobs claimed by workers (emq:{q}:active)", ["queue"], registry=r)
        self.redis_up = Gauge(
            "stalledpolicy_redis_up", "1 when the last Redis round trip succeeded", ["queue"], registry=r)
        self.key_problems = Gauge(
            "stalledpolicy_key_problems",
            "Problems met in the last pass: shared keys of the queue of the wrong type, or a step or PUBLISH "
            "the Redis ACL refuses (jobs still moved; that bookkeeping was skipped: see the sweeper's "
            "warnings)", ["queue"], registry=r)
        self.last_pass = Gauge(
            "stalledpolicy_last_pass_timestamp_seconds", "Unix time of the last successful pass", registry=r)
        self.http_dropped = http_dropped_counter("stalledpolicy", r)
        # Series exist from the start, at 0, so dashboards and rate() see them.
        #: each lane label's (recovered, dead-lettered) series, as count_call uses them
        self._lane_series = {lane: (self.recovered.labels(queue, lane), self.dead_lettered.labels(queue, lane))
                             for lane in (FLAT_LANE, *lanes, OTHER_LANES)}
        self.orphans.labels(queue)
        self.quarantined.labels(queue)
        self.leases_held.labels(queue)
        self.lapses_uncounted.labels(queue)
        self.redis_up.labels(queue).set(0)
        self.key_problems.labels(queue).set(0)

    def count_call(self, result: Any, seconds: float) -> None:
        """Add one script call's result (an ``engine.SweepResult``). Its lanes are
        summed by label first (every lane not configured is one label): one
        increment per label and counter, not per lane (a call between calls of a
        drain: Redis waits for it)."""
        self.call_duration.observe(seconds)
        by_label: dict[str, list[int]] = {}
        for lane, (recovered, dead_lettered) in per_lane(result).items():
            label = lane if lane in self.lanes else OTHER_LANES
            sums = by_label.get(label)
            if sums is None:
                by_label[label] = [recovered, dead_lettered]
            else:
                sums[0] += recovered
                sums[1] += dead_lettered
        for label, (recovered, dead_lettered) in by_label.items():
            series = self._lane_series.get(label)
            if series is None:
                series = self._lane_series[label] = (self.recovered.labels(self.queue, label),
                                                     self.dead_lettered.labels(self.queue, label))
            if recovered:
                series[0].inc(recovered)
            if dead_lettered:
                series[1].inc(dead_lettered)
        q = self.queue
        if result.orphans:
            self.orphans.labels(q).inc(result.orphans)
        if result.quarantined:
            self.quarantined.labels(q).inc(result.quarantined)
        if result.held:
            self.leases_held.labels(q).inc(result.held)
        if result.uncounted:
            self.lapses_uncounted.labels(q).inc(result.uncounted)

    def observe_snapshot(self, snapshot: Any) -> None:
        self.morgue_size.labels(self.queue).set(snapshot.dead)
        self.pending.labels(self.queue).set(snapshot.pending)
        self.active.labels(self.queue).set(snapshot.active)
        for lane in getattr(snapshot, "lanes", None) or ():
            self.lane_pending.labels(self.queue, lane.name).set(lane.pending)

    def set_redis_up(self, up: bool) -> None:
        self.redis_up.labels(self.queue).set(1 if up else 0)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def per_lane(result: Any) -> dict[str, tuple[int, int]]:
    """(recovered, dead-lettered) per lane label; flat jobs are whatever the
    lanes do not account for, whether or not the engine lists them under ""."""
    lanes: dict[str, tuple[int, int]] = {}
    for name, counts in (result.lanes or {}).items():
        lanes[name or FLAT_LANE] = (counts.recovered, counts.dead_lettered)
    flat_recovered = result.recovered - sum(c[0] for c in lanes.values())
    flat_dead = result.dead_lettered - sum(c[1] for c in lanes.values())
    if flat_recovered > 0 or flat_dead > 0:
        known = lanes.get(FLAT_LANE, (0, 0))
        lanes[FLAT_LANE] = (known[0] + max(flat_recovered, 0), known[1] + max(flat_dead, 0))
    return lanes


class Health:
    """What /healthz and /readyz answer; written by the loop, read by the server."""

    def __init__(self, stale_after_s: float, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self.stale_after_s = stale_after_s
        self.heartbeat = clock()
        self.redis_up = False
        self.last_pass_ok = False
        self.reason = "no pass yet"

    def beat(self) -> None:
        self.heartbeat = self._clock()

    def alive(self) -> tuple[bool, str]:
        age = self._clock() - self.heartbeat
        if age > self.stale_after_s:
            return False, f"loop heartbeat is {age:.0f}s old (limit {self.stale_after_s:.0f}s)"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        if not self.redis_up:
            return False, self.reason or "redis unreachable"
        if not self.last_pass_ok:
            return False, self.reason or "last pass failed"
        return True, "ok"


# -- the status server's limits (the sweeper's /metrics, /healthz, /readyz and the operator's /metrics)
#
# A connection carries one request (HTTP/1.0, no keep-alive) and has one handler thread. Its request line and
# headers must all arrive within REQUEST_DEADLINE_S of the accept (in total: a client trickling a header line
# every few seconds used to keep a thread for ever, the socket timeout being per read), and its answer must be
# written within RESPONSE_DEADLINE_S after that; past either it is closed (with a 408 while still reading).
# At most MAX_CONNECTIONS are open at once: a scrape or a probe holds one for milliseconds, so 64 is far more
# than Prometheus and the kubelet ever need, and it caps the threads (and memory) slow clients can hold.
# At the cap a new connection is not refused but evicts the connection that has been reading its request the
# longest (a 408): a client that sends its request at once (the kubelet, Prometheus) is never that one, so the
# probes keep answering while slow clients fill every slot, even clients that reconnect at once; refusing
# would let them fail the liveness probe and restart the pod. Only when no connection is reading (all are
# answering, bounded by RESPONSE_DEADLINE_S) is a new one closed at once, unanswered and without a thread.
# Even without eviction, a reader's slot is free 10 s after its accept: well inside the window in which the
# kubelet restarts a sweeper (3 failed liveness probes, 10 s apart).
MAX_CONNECTIONS = 64
REQUEST_DEADLINE_S = 10.0
RESPONSE_DEADLINE_S = 10.0
# How long an accept waits for the thread of the connection it evicted to end (it ends at once: its read
# returns when its socket is shut down) before the new connection is closed instead.
_EVICTION_WAIT_S = 1.0
# Connections closed early are counted (the http_connections_dropped counter) and logged in one line at most
# this often, with the numbers since the last line: a flood of them writes no flood of lines.
_DROPS_LOGGED_EVERY_S = 60.0
# The reasons of the dropped-connections counter (its label values).
HTTP_DROP_REASONS = ("deadline", "evicted", "refused")
_REQUEST_TIMEOUT = b"HTTP/1.0 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_DONT_WAIT = getattr(socket, "MSG_DONTWAIT", 0)  # the 408 goes into an empty send buffer, or not at all


class _Connection:
    """One accepted connection: reading its request until :attr:`deadline`, then answering until a new
    one. :meth:`cut` (from the server's thread) shuts its socket down, which wakes its handler's read or
    write at once; the socket itself is closed by its handler thread only."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.answering = False
        self.cut_off = False
        self.thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def begin_answer(self, deadline: float) -> bool:
        """The request is read (or refused): the answer may be written until ``deadline``. False if
        the connection was cut, and nothing may be written."""
        with self._lock:
            if self.cut_off:
                return False
            if not self.answering:
                self.answering, self.deadline = True, deadline
            return True

    def cut(self, only_reading: bool = False) -> bool:
        """Shut the connection down (a 408 first if it is still reading its request); False if it was
        already cut, or if ``only_reading`` and it is answering."""
        with self._lock:
            if self.cut_off or (only_reading and self.answering):
                return False
            self.cut_off = True
            if not self.answering:  # nothing was written yet: the 408 cannot mix with an answer
                with contextlib.suppress(OSError):
                    self.sock.send(_REQUEST_TIMEOUT, _DONT_WAIT)
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            return True


class _Handler(BaseHTTPRequestHandler):
    metrics: Any  # has exposition() -> bytes: SweeperMetrics, or the operator's OperatorMetrics
    health: Health | None  # None: /metrics only (the operator: kopf serves its liveness)
    server: _Server
    # a connection that sends nothing (or half a request) is closed after this
    # many seconds: each held a thread and ~26 KB for good, and a few thousand
    # idle ones from anywhere in the cluster network OOM-killed the pod (per read:
    # the whole request has REQUEST_DEADLINE_S, enforced by the server)
    timeout = 10

    def parse_request(self) -> bool:
        # the request is read: from here its answer has RESPONSE_DEADLINE_S (a cut one is not answered)
        return super().parse_request() and self.server.begin_answer(self.request)

    def send_response_only(self, code: int, message: str | None = None) -> None:
        # every answer starts here (send_error's for a bad request too): none after a 408 of the server's
        if not self.server.begin_answer(self.request):
            raise ConnectionAbortedError("closed by the status server")
        super().send_response_only(code, message)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, self.metrics.exposition(), CONTENT_TYPE_LATEST)
        elif path == "/healthz" and self.health is not None:
            self._status(*self.health.alive())
        elif path == "/readyz" and self.health is not None:
            self._status(*self.health.ready())
        elif self.health is None:
            self._send(404, b"not found: try /metrics\n", "text/plain")
        else:
            self._send(404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain")

    def _status(self, ok: bool, reason: str) -> None:
        body = json.dumps({"status": "ok" if ok else "fail", "reason": reason}).encode() + b"\n"
        self._send(200 if ok else 503, body, "application/json")

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # probes every few seconds would drown the sweep's own lines


class _Server(HTTPServer):
    """An HTTPServer on a socket already listening (:func:`listening_socket`: where
    and how it listens is decided there, for the operator's servers too), one daemon
    thread per connection, within the limits above (MAX_CONNECTIONS and the
    deadlines, checked by :meth:`service_actions` in the serving thread).

    ``dropped``: a counter with a ``reason`` label (HTTP_DROP_REASONS), or None."""

    def __init__(self, sock: socket.socket, handler: type, *, max_connections: int = MAX_CONNECTIONS,
                 request_deadline_s: float = REQUEST_DEADLINE_S, response_deadline_s: float = RESPONSE_DEADLINE_S,
                 dropped: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.address_family = sock.family
        super().__init__(sock.getsockname()[:2], handler, bind_and_activate=False)
        self.socket.close()  # the one made by the constructor, never bound
        self.socket = sock
        self.server_address = sock.getsockname()
        self.server_name, self.server_port = sock.getsockname()[:2]
        self.max_connections = max_connections
        self.request_deadline_s = request_deadline_s
        self.response_deadline_s = response_deadline_s
        self._dropped = dropped
        self._clock = clock
        self._lock = threading.Lock()
        self._connections: dict[socket.socket, _Connection] = {}  # open ones, in the order accepted
        self._drops = dict.fromkeys(HTTP_DROP_REASONS, 0)  # since the last line logged
        self._drops_logged_at: float | None = None

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        """In the serving thread, for each accepted connection: a thread of its own
        within MAX_CONNECTIONS (evicting the longest reader at the cap), or closed."""
        connection = _Connection(request, self._clock() + self.request_deadline_s)
        if not self._take_slot(connection):
            self._drop("refused")
            self.shutdown_request(request)
            return
        thread = threading.Thread(target=self._serve, args=(connection, client_address),
                                  name="status-http-connection", daemon=True)
        connection.thread = thread
        try:
            thread.start()
        except BaseException:  # no thread to be had (RuntimeError): the slot is given back
            self._release(connection)
            self.shutdown_request(request)
            raise

    def _take_slot(self, connection: _Connection) -> bool:
        with self._lock:
            if len(self._connections) < self.max_connections:
                self._connections[connection.sock] = connection
                return True
            readers = [c for c in self._connections.values() if not c.answering]
        # the first still reading is the one accepted first: the longest reader
        victim = next((c for c in readers if c.cut(only_reading=True)), None)
        if victim is not None:
            self._drop("evicted")
        else:  # one cut already (at its deadline) whose thread is ending, if any
            victim = next((c for c in readers if c.cut_off), None)
        if victim is None:
            return False
        if victim.thread is not None:
            victim.thread.join(_EVICTION_WAIT_S)
        with self._lock:
            if len(self._connections) < self.max_connections:
                self._connections[connection.sock] = connection
                return True
        return False

    def _release(self, connection: _Connection) -> None:
        with self._lock:
            self._connections.pop(connection.sock, None)

    def _serve(self, connection: _Connection, client_address: Any) -> None:
        try:
            self.finish_request(connection.sock, client_address)
        except Exception:
            self.handle_error(connection.sock, client_address)
        finally:
            self.shutdown_request(connection.sock)
            self._release(connection)

    def begin_answer(self, sock: socket.socket) -> bool:
        """For the handler: its request is read; False if its connection was cut."""
        with self._lock:
            connection = self._connections.get(sock)
        return connection is None or connection.begin_answer(self._clock() + self.response_deadline_s)

    def service_actions(self) -> None:
        """Every poll of serve_forever (half a second): connections past their deadline are cut."""
        now = self._clock()
        with self._lock:
            late = [c for c in self._connections.values() if c.deadline <= now]
        for connection in late:
            if connection.cut():
                self._drop("deadline")
        self._log_drops(now)

    def _drop(self, reason: str) -> None:
        self._drops[reason] += 1  # the serving thread's alone
        if self._dropped is not None:
            self._dropped.labels(reason).inc()

    def _log_drops(self, now: float) -> None:
        if not any(self._drops.values()):
            return
        if self._drops_logged_at is not None and now - self._drops_logged_at < _DROPS_LOGGED_EVERY_S:
            return
        log.warning("connections to the status server closed early (logged at most once a minute)", extra={
            "port": self.server_port, "deadline_cut": self._drops["deadline"], "evicted": self._drops["evicted"],
            "refused": self._drops["refused"], "max_connections": self.max_connections,
            "request_deadline_s": self.request_deadline_s})
        self._drops = dict.fromkeys(HTTP_DROP_REASONS, 0)
        self._drops_logged_at = now

    def close_connections(self, wait_s: float) -> None:
        """Cut every open connection and wait up to ``wait_s`` in all for their threads."""
        with self._lock:
            connections = list(self._connections.values())
        for connection in connections:
            connection.cut()
        deadline = self._clock() + wait_s
        for connection in connections:
            if connection.thread is not None:
                connection.thread.join(max(0.0, deadline - self._clock()))

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A scraper or probe that hangs up (a TCP health check closing with a
        reset, a port scan) is nobody's problem; anything else is logged as one
        line of our format (socketserver's default writes a bare traceback to
        stderr, which breaks JSON logs)."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        log.warning("metrics request failed", extra={"client": str(client_address[0])}, exc_info=True)


def _bound_server(address: str, port: int, handler: type, **limits: Any) -> _Server:
    return _Server(listening_socket(address, port), handler, **limits)


class StatusServer:
    """/metrics, /healthz and /readyz on one port (IPv4 or IPv6); :meth:`stop` on shutdown.
    Without ``health``, /metrics only (the operator's metrics server). ``limits``:
    max_connections, request_deadline_s, response_deadline_s (tests; see MAX_CONNECTIONS).
    Connections closed early are counted by ``metrics.http_dropped`` if it has one."""

    def __init__(self, address: str, port: int, metrics: Any, health: Health | None = None, **limits: Any):
        handler = type("Handler", (_Handler,), {"metrics": metrics, "health": health})
        self._server = _bound_server(address, port, handler, dropped=getattr(metrics, "http_dropped", None),
                                     **limits)
        self._thread = threading.Thread(target=self._server.serve_forever, name="status-http", daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def open_connections(self) -> int:
        return self._server.open_connections

    def start(self) -> StatusServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops serving, then cuts the connections still open (slow clients included:
        it does not wait for them) and waits for their threads a moment."""
        self._server.shutdown()
        self._server.server_close()
        self._server.close_connections(wait_s=2.0)
        self._thread.join(5)
