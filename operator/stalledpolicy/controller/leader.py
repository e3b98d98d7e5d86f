"""Leader election on a coordination.k8s.io Lease (``--leader-election-lease NS/NAME``):
several operator replicas, one acting at a time, the others waiting to take over.

The Lease is read and written as client-go's leader election does: the holder
renews ``renewTime`` every RETRY_SECONDS; a replica takes the Lease once it has
seen it unchanged for a whole duration by its own clock (or released), each
write made with the ``resourceVersion`` it read, so two replicas never both win.
The holder's ``renewTime`` is never compared with this replica's clock: two
nodes' clocks apart by more than a duration would have handed a live Lease
over. A replica that starts therefore waits a whole duration before it takes a
Lease its holder did not release. A holder not renewed within two thirds of the
duration (the API server unreachable or hung, the Lease taken) ends at once
(``Leadership``): it may no longer be the only one acting. A holder shutting
down releases the Lease, so a waiting replica takes over at its next try rather
than a duration later.

``decide`` is the pure rule; ``LeaseElector`` does the API calls with it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from stalledpolicy.controller.api_errors import describe_api_error
from stalledpolicy.controller.config import OperatorConfig, parse_lease
from stalledpolicy.controller.wiring import kubernetes_api_client

log = logging.getLogger("stalledpolicy.operator")

DEFAULT_LEASE_SECONDS = 15.0
# A replica waiting for the Lease asks again this often (client-go's retry period).
RETRY_SECONDS = 2.0


def identity() -> str:
    """Who holds the Lease: the pod's name (the chart sets POD_NAME) or the host's,
    with a random suffix so that two processes on one host are two candidates."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def _time(value: Any) -> dt.datetime | None:
    if value is None or isinstance(value, dt.datetime):
        return value
    return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _stamp(when: dt.datetime) -> str:
    """A Lease's MicroTime, in UTC."""
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _spec_of(lease: Any) -> dict[str, Any]:
    """The Lease's spec in the API's own field names (what ``decide`` reads)."""
    spec = lease.to_dict().get("spec") or {}
    return {"holderIdentity": spec.get("holder_identity"), "renewTime": spec.get("renew_time"),
            "acquireTime": spec.get("acquire_time"), "leaseDurationSeconds": spec.get("lease_duration_seconds"),
            "leaseTransitions": spec.get("lease_transitions")}


def decide(spec: dict[str, Any] | None, me: str, unchanged_for: float, duration: float) -> str:
    """What a candidate does with the Lease's ``spec`` (None: no Lease yet), which
    it has seen unchanged for ``unchanged_for`` seconds of its own clock: ``create``
    it, ``renew`` it (ours), ``take`` it (released, or not renewed for the Lease's
    whole duration), or ``wait``."""
    if spec is None:
        return "create"
    holder = spec.get("holderIdentity") or ""
    if holder == me:
        return "renew"
    lasts = float(spec.get("leaseDurationSeconds") or duration)
    if not holder or unchanged_for > lasts:
        return "take"
    return "wait"


class LeaseElector:
    """One candidate for the Lease ``namespace/name``; ``coordination``: a
    CoordinationV1Api. ``try_hold()`` is one round (read, decide, write)."""

    def __init__(self, coordination: Any, namespace: str, name: str, me: str, duration: float = DEFAULT_LEASE_SECONDS,
                 now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
                 clock: Callable[[], float] | None = None) -> None:
        self.api, self.namespace, self.name, self.me = coordination, namespace, name, me
        self.duration, self._now, self._clock = duration, now, clock or time.monotonic
        self.holder: str | None = None  # the holder seen at the last round
        self.held = False
        self._seen: tuple[Any, ...] | None = None  # the Lease record last seen, and when (this clock)
        self._seen_at = 0.0

    def _unchanged_for(self, lease: Any, spec: dict[str, Any] | None) -> float:
        """Seconds (this replica's clock) since the Lease last changed (any write:
        its resourceVersion, or its record)."""
        record = None if spec is None else (lease.metadata.resource_version,
                                            *(str(spec.get(k)) for k in sorted(spec)))
        now = self._clock()
        if record != self._seen:
            self._seen, self._seen_at = record, now
        return now - self._seen_at

    def try_hold(self) -> bool:
        """Acquire or renew the Lease; True when this candidate holds it now. A
        conflict (another candidate wrote first) is a round lost; any other API
        error is raised, for the caller to log and count as a round lost."""
        from kubernetes.client.exceptions import ApiException  # deferred: the kubernetes client takes 0.4 s to import

        now = self._now()
        try:
            try:
                lease = self.api.read_namespaced_lease(self.name, self.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                lease = None
            spec = None if lease is None else _spec_of(lease)
            action = decide(spec, self.me, self._unchanged_for(lease, spec), self.duration)
            self.holder = (spec or {}).get("holderIdentity") or None
            if action == "wait":
                self.held = False
                return False
            stamp = _stamp(now)
            body: dict[str, Any] = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {"holderIdentity": self.me, "leaseDurationSeconds": int(round(self.duration)),
                             "renewTime": stamp}}
            if action == "create":
                body["spec"].update(acquireTime=stamp, leaseTransitions=0)
                self.api.create_namespaced_lease(self.namespace, body)
            else:
                body["metadata"]["resourceVersion"] = lease.metadata.resource_version
                acquired = _time((spec or {}).get("acquireTime")) or now
                body["spec"]["acquireTime"] = stamp if action == "take" else _stamp(acquired)
                transitions = int((spec or {}).get("leaseTransitions") or 0)
                body["spec"]["leaseTransitions"] = transitions + (1 if action == "take" else 0)
                self.api.replace_namespaced_lease(self.name, self.namespace, body)
        except ApiException as exc:
            if exc.status == 409:  # another candidate wrote first: it won this round
                self.held = False
                return False
            raise
        self.holder, self.held = self.me, True
        return True

    def release(self) -> None:
        """Give the Lease up (shutting down): a waiting replica takes it at its next try."""
        if not self.held:
            return
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec.holder_identity != self.me:
                return
            lease.spec.holder_identity = None
            self.api.replace_namespaced_lease(self.name, self.namespace, lease)
            log.info("leader lease released", extra={"lease": f"{self.namespace}/{self.name}"})
        except Exception as exc:  # noqa: BLE001 - shutting down: the lease expires on its own
            log.warning("could not release the leader lease (it expires on its own): %s", exc,
                        extra={"lease": f"{self.namespace}/{self.name}"})
        self.held = False


class Leadership:
    """The Lease held for the operator's life: ``await acquire()`` before anything
    acts (kopf's startup), renewed every RETRY_SECONDS on a thread from then on,
    released by ``stop()`` at shutdown.

    A watchdog declares the Lease lost two thirds of its duration after the last
    round that renewed it began, even while a call hangs (the API server slow or
    frozen): another replica may take it a duration after it last saw it change.
    ``on_lost`` then ends the process at once (``exit_now``, exit 1: nothing of
    this replica may act any more; kopf's graceful stop let handlers and the
    status loop write on for seconds). ``on_misconfigured`` ends it when the API
    refuses the Lease outright while waiting (no grant, no such namespace: exit 2,
    a crash loop that shows, where a replica waiting for ever looked healthy)."""

    def __init__(self, elector: LeaseElector, on_lost: Callable[[], None] | None = None,
                 on_misconfigured: Callable[[], None] | None = None, clock: Callable[[], float] | None = None):

        self.elector = elector
        self._on_lost = on_lost or (lambda: exit_now(1))
        self._on_misconfigured = on_misconfigured or (lambda: exit_now(2))
        self._clock = clock or time.monotonic
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._renewed_at = 0.0
        self.waiting = False
        self.lost = False
        self._problem: str | None = None

    @property
    def where(self) -> str:
        return f"{self.elector.namespace}/{self.elector.name}"

    @property
    def held(self) -> bool:
        return self.elector.held and not self.lost

    @property
    def deadline(self) -> float:
        return self.elector.duration * 2 / 3

    def _round(self, waiting: bool = False) -> bool:
        try:
            held = self.elector.try_hold()
        except Exception as exc:  # noqa: BLE001 - the API server unreachable or refusing: a round lost
            status = getattr(exc, "status", None)
            problem = describe_api_error(exc)  # the API's words name the user, verb and resource
            if waiting and (status in (401, 403) or (status == 404 and "namespace" in problem.lower())):
                log.error("leader lease: the API server refuses this replica the Lease (%s): grant the "
                          "ServiceAccount leases create, get and update in namespace %s (the chart's "
                          "<release>-leader Role), or name a Lease it may use", problem,
                          self.elector.namespace, extra={"lease": self.where})
                self._on_misconfigured()
                return False
            if problem != self._problem:  # once while it lasts
                self._problem = problem
                log.warning("leader lease: the API server refused or failed a request (%s); retrying", problem,
                            extra={"lease": self.where})
            return False
        self._problem = None
        return held

    async def acquire(self) -> None:

        self.waiting = True
        told = None
        try:
            while True:
                started = self._clock()
                if await asyncio.to_thread(self._round, True):
                    break
                if self.elector.holder != told:
                    told = self.elector.holder
                    log.info("waiting for the leader lease: another operator replica acts", extra={
                        "lease": self.where, "holder": told, "identity": self.elector.me})
                await asyncio.sleep(RETRY_SECONDS)
        except asyncio.CancelledError:
            # a waiting replica stopped (SIGTERM): nothing of it acted, nothing to release
            log.info("stopping while waiting for the leader lease", extra={"lease": self.where})
            raise
        finally:
            self.waiting = False
        self._renewed_at = started
        log.info("leader lease acquired: this replica acts", extra={"lease": self.where,
                                                                   "identity": self.elector.me})
        for target, name in ((self._renew, "leader-lease"), (self._watch, "leader-lease-watchdog")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _renew(self) -> None:
        while not self._stop.wait(min(RETRY_SECONDS, self.elector.duration / 3)):
            started = self._clock()
            if self._round():
                with self._lock:
                    self._renewed_at = max(self._renewed_at, started)
            elif self.elector.holder not in (None, self.elector.me):
                self._lose(f"taken by {self.elector.holder}")
                return

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            with self._lock:
                late = self._clock() - self._renewed_at
            if late > self.deadline:
                self._lose(f"not renewed for {late:.1f} s (at most {self.deadline:g} s)")
                return

    def _lose(self, why: str) -> None:
        with self._lock:
            if self.lost or self._stop.is_set():  # a shutdown is no loss: stop() releases
                return
            self.lost = True
        log.error("leader lease lost (%s): this replica stops acting now", why,
                  extra={"lease": self.where, "holder": self.elector.holder})
        self._on_lost()

    def stop(self) -> None:
        """Shutting down: stop renewing, and release the Lease unless it was lost or
        a renewal is still in flight (then it lapses on its own)."""
        with self._lock:
            self._stop.set()
        for thread in self._threads:
            thread.join(timeout=RETRY_SECONDS * 2)
        if not self.lost and not any(t.is_alive() for t in self._threads):
            self.elector.release()  # if it holds the Lease


def exit_now(code: int) -> None:
    """End the process at once (no kopf cleanup: nothing more may be written),
    after the log lines said why."""
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
    sys.stderr.flush()
    os._exit(code)


def leadership(config: OperatorConfig) -> Leadership:
    """The operator's Leadership for ``config.leader_lease``."""
    from kubernetes import client  # deferred: the kubernetes client takes 0.4 s to import


    namespace, name = parse_lease(config.leader_lease or "")  # set: main asks for leadership only then
    # One attempt per call (urllib3 retried a timed-out read 3 times: a 2 s call took
    # 8 s), within a retry period: the watchdog judges the lease, not the calls.
    api = client.CoordinationV1Api(kubernetes_api_client(2, min(RETRY_SECONDS, config.lease_seconds / 3),
                                                         retries=False))
    elector = LeaseElector(api, namespace, name, identity(), config.lease_seconds)
    return Leadership(elector)
