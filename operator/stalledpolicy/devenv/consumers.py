"""EchoMQ's standalone consumer loop, modelled: what reaps a queue in the field.

A :class:`Consumer` runs in its own thread over its own connection, looping as
``EchoMQ.Consumer`` does (shared/echomq-wire.md, "Who runs the reaper"): reap
(one call: lapsed leases back to pending, uncounted), promote due scheduled
jobs, claim and settle jobs until a claim finds nothing, park in
``BLPOP emq:{q}:wake <beat>``, loop. So K idle consumers reap a queue about K
times a beat, and once more per wake.

A handler decides each job's fate: :data:`COMPLETE` (or None), :data:`RETRY`
(EchoMQ's retry: to ``schedule`` after a delay, or to ``dead`` at
``max_attempts``; a handler that raises retries too, as EchoMQ rescues it) or
:data:`DIE`: the worker process crashes holding the lease. The job is abandoned
(no completion, no heartbeat: the lease lapses later, for a reap or a sweep)
and the consumer restarts at once on a fresh connection, as EchoMQ's supervisor
restarts a crashed loop with its connector; the new loop starts with a reap.
Any other error of the loop (the server gone, a verdict that is not one of the
three) crashes it the same way, restarted after one beat.

:class:`ConsumerPool` runs K consumers over one :class:`ConsumerStats` and one
stop :class:`threading.Event`; a parked consumer sees the stop within a beat.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from stalledpolicy.devenv.echomq import REAP_BATCH, Claim, EchoMQ, Ledger, StaleToken

COMPLETE = "complete"
RETRY = "retry"
DIE = "die"

#: our lease default, short for tests and benchmarks (EchoMQ's is 30 s)
LEASE_MS = 2_000
#: EchoMQ's default beat: the longest park in BLPOP on ``wake``
BEAT_MS = 1_000
#: kept in :attr:`ConsumerStats.errors`, the latest last
ERRORS_KEPT = 100

#: a job's fate: COMPLETE (or None), RETRY or DIE
Handler = Callable[[Claim], "str | None"]


def complete_all(claim: Claim) -> str:
    """The handler of a healthy worker: every job completes."""
    return COMPLETE


def die_on(poison: Collection[str] | Callable[[Claim], bool], otherwise: Handler = complete_all) -> Handler:
    """A handler whose worker crashes on every claim of a poison job (ids, or a
    predicate on the claim) and leaves the others to ``otherwise``."""
    is_poison = poison if callable(poison) else (lambda claim: claim.id in poison)

    def handler(claim: Claim) -> str | None:
        return DIE if is_poison(claim) else otherwise(claim)

    return handler


@dataclass
class ConsumerStats:
    """What the consumers of a pool did, counted as they go (thread-safe; read
    a running pool through :meth:`snapshot` or :meth:`totals`). Counters are per
    job id: ``claims`` (every claim), ``deaths`` (a worker died holding it),
    ``completions``, ``retries`` (EchoMQ's retry, scheduled or dead),
    ``dead_lettered`` (the retries that went to ``dead``), ``reaped`` (the
    reaper returned it). ``reaps`` counts reap calls, ``stale`` settlements
    refused (token moved on, or row gone), ``restarts`` loops started again
    after a death or a crash, ``wakes`` parks ended by a wake token."""

    claims: Counter[str] = field(default_factory=Counter)
    deaths: Counter[str] = field(default_factory=Counter)
    completions: Counter[str] = field(default_factory=Counter)
    retries: Counter[str] = field(default_factory=Counter)
    dead_lettered: Counter[str] = field(default_factory=Counter)
    reaped: Counter[str] = field(default_factory=Counter)
    reaps: int = 0
    stale: int = 0
    restarts: int = 0
    wakes: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def snapshot(self) -> ConsumerStats:
        """A consistent copy, safe to read while the consumers run."""
        with self.lock:
            copied = copy.copy(self)
            for name in ("claims", "deaths", "completions", "retries", "dead_lettered", "reaped"):
                setattr(copied, name, Counter(getattr(self, name)))
            copied.errors = list(self.errors)
        copied.lock = threading.Lock()
        return copied

    def totals(self) -> dict[str, int]:
        """Every counter summed over the job ids, and the plain counts."""
        with self.lock:
            summed = {name: sum(getattr(self, name).values()) for name in
                      ("claims", "deaths", "completions", "retries", "dead_lettered", "reaped")}
            return {**summed, "reaps": self.reaps, "stale": self.stale, "restarts": self.restarts,
                    "wakes": self.wakes, "errors": len(self.errors)}

    def _count(self, name: str, job_id: str) -> None:
        with self.lock:
            getattr(self, name)[job_id] += 1

    def _add(self, name: str, amount: int = 1) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + amount)

    def _reaped(self, ids: list[str]) -> None:
        with self.lock:
            self.reaps += 1
            self.reaped.update(ids)

    def _error(self, text: str) -> None:
        with self.lock:
            self.errors.append(text)
            del self.errors[:-ERRORS_KEPT]


class _Died(Exception):
    """The worker process crashed holding a lease (the handler said DIE)."""


class Consumer:
    """One EchoMQ standalone consumer of ``queue``: a thread looping over a
    connection of its own from ``connect()`` (whose socket timeout, if any,
    must exceed the beat by more than 1 s; redis-py's default is 5 s). ``claim_mode`` is the model's (``any``: the ring
    first, then the flat pending; EchoMQ's own consumer claims through the
    ring only, ``grouped``). ``retry_delay_ms`` and ``max_attempts`` are
    EchoMQ's retry's, ``pump_batch`` the most due jobs promoted per loop.
    Completions are recorded in ``ledger`` (share the producer's for audits)."""

    def __init__(self, connect: Callable[[], Any], queue: str, handler: Handler = complete_all, *,
                 ledger: Ledger | None = None, lease_ms: int = LEASE_MS, beat_ms: int = BEAT_MS,
                 claim_mode: str = "any", retry_delay_ms: int = 1_000, max_attempts: int = 3,
                 pump_batch: int = 100, stats: ConsumerStats | None = None,
                 stop: threading.Event | None = None, name: str | None = None) -> None:
        if claim_mode not in ("flat", "grouped", "any"):
            raise ValueError("claim_mode: must be 'flat', 'grouped' or 'any'")
        if int(lease_ms) <= 0 or int(beat_ms) <= 0:
            raise ValueError("lease_ms and beat_ms: must be > 0")
        self.connect = connect
        self.queue = queue
        self.handler = handler
        self.ledger = ledger if ledger is not None else Ledger()
        self.lease_ms = int(lease_ms)
        self.beat_ms = int(beat_ms)
        self.claim_mode = claim_mode
        self.retry_delay_ms = int(retry_delay_ms)
        self.max_attempts = int(max_attempts)
        self.pump_batch = int(pump_batch)
        self.stats = stats if stats is not None else ConsumerStats()
        self.stop_event = stop if stop is not None else threading.Event()
        self.name = name or f"echomq-consumer-{queue}"
        self.thread: threading.Thread | None = None

    # -- the thread ------------------------------------------------------------

    def start(self) -> Consumer:
        """Start the thread; ValueError first if ``connect()`` gives a client
        whose socket timeout would cut the park short."""
        probe = self.connect()  # a redis-py client connects on its first command: no socket yet
        try:
            _check_socket_timeout(probe, self.beat_ms)
        finally:
            _close(probe)
        self.thread = threading.Thread(target=self.run, name=self.name, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        """Ask the loop to stop (it settles the job in hand; a park ends within a beat)."""
        self.stop_event.set()

    def join(self, timeout: float | None = None) -> bool:
        """True once the thread has ended."""
        if self.thread is not None:
            self.thread.join(timeout)
        return self.thread is None or not self.thread.is_alive()

    def run(self) -> None:
        """The supervisor: run the loop until stopped, restarting it on a fresh
        connection at once after a death, one beat after any other crash."""
        first = True
        while not self.stop_event.is_set():
            if not first:
                self.stats._add("restarts")
            first = False
            client = None
            try:
                client = self.connect()
                _check_socket_timeout(client, self.beat_ms)
                self._loop(EchoMQ(client, self.queue, self.ledger))
            except _Died:
                pass
            except Exception as exc:  # a crash of the loop: recorded, restarted after a beat
                self.stats._error(f"{self.name}: {type(exc).__name__}: {exc}")
                self.stop_event.wait(self.beat_ms / 1000)
            finally:
                if client is not None:
                    _close(client)

    # -- EchoMQ's loop -----------------------------------------------------------

    def _loop(self, mq: EchoMQ) -> None:
        """Reap, promote, drain, park, until stopped; raises :class:`_Died`."""
        while not self.stop_event.is_set():
            self.stats._reaped(mq.reap(REAP_BATCH))
            mq.promote(self.pump_batch)
            self._drain(mq)
            if self.stop_event.is_set():
                return
            if mq.client.blpop([mq.keys.wake], timeout=self.beat_ms / 1000):
                self.stats._add("wakes")

    def _drain(self, mq: EchoMQ) -> None:
        while not self.stop_event.is_set():
            claim = mq.claim(self.lease_ms, self.claim_mode)
            if claim is None:
                return
            self.stats._count("claims", claim.id)
            reason = "retry"
            try:
                verdict = self.handler(claim)
            except Exception as exc:  # EchoMQ rescues a raising handler into a retry
                verdict, reason = RETRY, f"{type(exc).__name__}: {exc}"
            if verdict == DIE:
                self.stats._count("deaths", claim.id)
                raise _Died(claim.id)
            if verdict not in (None, COMPLETE, RETRY):
                raise ValueError(f"handler answered {verdict!r} for {claim.id}")
            self._settle(mq, claim, verdict or COMPLETE, reason)

    def _settle(self, mq: EchoMQ, claim: Claim, verdict: str, reason: str) -> None:
        try:
            if verdict == COMPLETE:
                if mq.complete(claim):
                    self.stats._count("completions", claim.id)
                else:
                    self.stats._add("stale")
                return
            fate = mq.fail(claim, error=reason, delay_ms=self.retry_delay_ms, max_attempts=self.max_attempts)
            self.stats._count("retries", claim.id)
            if fate == "dead":
                self.stats._count("dead_lettered", claim.id)
        except StaleToken:
            self.stats._add("stale")


def _check_socket_timeout(client: Any, beat_ms: int) -> None:
    """A park is a BLPOP of one beat: a socket timeout no longer than that
    (redis-py's default is 5 s) would break it off and retry it, for ever."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    timeout = kwargs.get("socket_timeout")
    if timeout is not None and timeout * 1000 <= beat_ms + 1_000:
        raise ValueError(f"socket_timeout={timeout} s: must exceed the beat ({beat_ms} ms) by more than "
                         "1 s, or be None")


def _close(client: Any) -> None:
    try:
        client.close()
    except Exception:  # closing a dead connection: nothing left to release
        pass


class ConsumerPool:
    """``count`` :class:`Consumer` threads on ``queue``, sharing ``stats`` and
    one stop event; ``options`` are the consumer's (lease_ms, beat_ms,
    claim_mode, ...). A context manager: started on entry, stopped on exit."""

    def __init__(self, connect: Callable[[], Any], queue: str, handler: Handler = complete_all,
                 count: int = 2, *, ledger: Ledger | None = None, **options: Any) -> None:
        if count < 1:
            raise ValueError("count: must be >= 1")
        self.stop_event = threading.Event()
        self.stats = ConsumerStats()
        self.ledger = ledger if ledger is not None else Ledger()
        self.consumers = [
            Consumer(connect, queue, handler, ledger=self.ledger, stats=self.stats, stop=self.stop_event,
                     name=f"echomq-consumer-{queue}-{i}", **options)
            for i in range(count)
        ]

    def start(self) -> ConsumerPool:
        for consumer in self.consumers:
            consumer.start()
        return self

    def stop(self, timeout: float | None = None) -> bool:
        """Stop every consumer and wait for their threads (at most ``timeout``
        seconds in all; default a beat plus 5 s for jobs in hand). True when
        all have ended."""
        self.stop_event.set()
        if timeout is None:
            timeout = max(c.beat_ms for c in self.consumers) / 1000 + 5
        deadline = time.monotonic() + timeout
        return all([c.join(max(0.0, deadline - time.monotonic())) for c in self.consumers])

    def alive(self) -> int:
        """How many consumer threads are running."""
        return sum(1 for c in self.consumers if c.thread is not None and c.thread.is_alive())

    def __enter__(self) -> ConsumerPool:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


__all__ = [
    "BEAT_MS", "COMPLETE", "DIE", "LEASE_MS", "RETRY", "Consumer", "ConsumerPool", "ConsumerStats",
    "Handler", "complete_all", "die_on",
]
