"""The sweeper's Prometheus metrics and its one small HTTP server.

``/metrics`` (Prometheus text), ``/healthz`` (the loop is alive: its heartbeat
is recent) and ``/readyz`` (Redis answered and the last pass succeeded, or in
the first drain a script call) are served by one ``ThreadingHTTPServer`` on a
daemon thread.

Counters count what *this* process did; the totals every replica shares live
in Redis (``emq:{q}:sweeper:totals``, read with ``engine.queue_snapshot``).
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

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
        # Series exist from the start, at 0, so dashboards and rate() see them.
        for lane in (FLAT_LANE, *lanes, OTHER_LANES):
            self.recovered.labels(queue, lane)
            self.dead_lettered.labels(queue, lane)
        self.orphans.labels(queue)
        self.quarantined.labels(queue)
        self.leases_held.labels(queue)
        self.lapses_uncounted.labels(queue)
        self.redis_up.labels(queue).set(0)
        self.key_problems.labels(queue).set(0)

    def count_call(self, result: Any, seconds: float) -> None:
        """Add one script call's result (an ``engine.SweepResult``)."""
        self.call_duration.observe(seconds)
        q = self.queue
        for lane, counts in per_lane(result).items():
            label = lane if lane in self.lanes else OTHER_LANES
            if counts[0]:
                self.recovered.labels(q, label).inc(counts[0])
            if counts[1]:
                self.dead_lettered.labels(q, label).inc(counts[1])
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


class _Handler(BaseHTTPRequestHandler):
    metrics: Any  # has exposition() -> bytes: SweeperMetrics, or the operator's OperatorMetrics
    health: Health | None  # None: /metrics only (the operator: kopf serves its liveness)
    # a connection that sends nothing (or half a request) is closed after this
    # many seconds: each held a thread and ~26 KB for good, and a few thousand
    # idle ones from anywhere in the cluster network OOM-killed the pod
    timeout = 10

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


class _Server(ThreadingHTTPServer):
    """ThreadingHTTPServer on a socket already listening (:func:`listening_socket`:
    where and how it listens is decided there, for the operator's servers too)."""

    daemon_threads = True

    def __init__(self, sock: socket.socket, handler: type) -> None:
        self.address_family = sock.family
        super().__init__(sock.getsockname()[:2], handler, bind_and_activate=False)
        self.socket.close()  # the one made by the constructor, never bound
        self.socket = sock
        self.server_address = sock.getsockname()
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A scraper or probe that hangs up (a TCP health check closing with a
        reset, a port scan) is nobody's problem; anything else is logged as one
        line of our format (socketserver's default writes a bare traceback to
        stderr, which breaks JSON logs)."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        log.warning("metrics request failed", extra={"client": str(client_address[0])}, exc_info=True)


def _bound_server(address: str, port: int, handler: type) -> _Server:
    return _Server(listening_socket(address, port), handler)


class StatusServer:
    """/metrics, /healthz and /readyz on one port (IPv4 or IPv6); :meth:`stop` on shutdown.
    Without ``health``, /metrics only (the operator's metrics server)."""

    def __init__(self, address: str, port: int, metrics: Any, health: Health | None = None):
        handler = type("Handler", (_Handler,), {"metrics": metrics, "health": health})
        self._server = _bound_server(address, port, handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="status-http", daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def start(self) -> "StatusServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
