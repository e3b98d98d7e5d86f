"""An EchoMQ-shaped producer/worker: our own model of programs we do not own.

EchoMQ (Elixir) is the real producer and worker of the queues we sweep. Tests,
the demo and the benchmarks need its side of the contract
(``shared/echomq-wire.md``) on a real server: enqueue, claim (flat, or grouped
by rotating the ring), lease extension, completion, failure, the reaper, lane
limits, pauses and the reprocess of a dead job. Every transition is one atomic
Lua script on the server clock, shaped after EchoMQ's own (including its
quirks: its reaper returns lapsed leases uncounted, completion is fenced by the
``attempts`` token alone, its lease extension re-adds an id to ``active``
whatever set holds it now, and its reprocess puts a grouped job in the flat
``pending``). EchoMQ's consumer loop, which runs the reaper, is in
:mod:`stalledpolicy.devenv.consumers`.

:func:`audit` is the referee of the proofs: it reads a whole queue in one
atomic script and lists every broken invariant (a job in two places, a job
lost, a ghost row, a drifted ``gactive``, a serviceable lane missing from the
ring, ...). ``seed_*`` build large realistic states fast, in bulk script
calls, for the demo and the benchmarks.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from stalledpolicy import lua
from stalledpolicy.keyspace import QueueKeys

SCRIPTS_PACKAGE = "stalledpolicy.devenv.echomq_scripts"
WAKE_MAX = 64
ID_DIGITS = 20
#: EchoMQ's reaper returns at most this many expired leases per call
REAP_BATCH = 100


class StaleToken(Exception):
    """EchoMQ's ``EMQSTALE``: the caller's token is no longer the job's."""


def _script(name: str) -> lua.LuaScript:
    return lua.script(name, package=SCRIPTS_PACKAGE)


def _text(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, list):
        return [_text(v) for v in value]
    return value


def _call(name: str, client: Any, keys: Sequence[str], args: Sequence[Any] = ()) -> Any:
    try:
        return _text(_script(name)(client, keys, args))
    except ResponseError as err:
        if str(err).startswith("EMQSTALE"):
            raise StaleToken(str(err)) from None
        raise


# -- ids --------------------------------------------------------------------

_mint_lock = threading.Lock()
_last_minted = 0


def mint_id() -> str:
    """``JOB`` + zero-padded microseconds, strictly increasing in this process,
    so byte order is mint order (EchoMQ's rule). Another process minting the
    same id is refused by enqueue as a duplicate and the caller mints again."""
    global _last_minted
    with _mint_lock:
        _last_minted = max(_last_minted + 1, time.time_ns() // 1000)
        return f"JOB{_last_minted:0{ID_DIGITS}d}"


def mint_ids(n: int) -> list[str]:
    global _last_minted
    with _mint_lock:
        start = max(_last_minted + 1, time.time_ns() // 1000)
        _last_minted = start + n - 1
    return [f"JOB{start + i:0{ID_DIGITS}d}" for i in range(n)]


# -- key stems the scripts derive per-job and per-lane keys from --------------

@dataclass(frozen=True)
class _Stems:
    row: str
    lane_head: str
    lane_tail: str

    @classmethod
    def of(cls, keys: QueueKeys) -> _Stems:
        # Derived from QueueKeys itself, so the scripts follow the keyspace.
        marker = "\x00"
        head, tail = keys.lane_pending(marker).split(marker)
        return cls(row=keys.job(""), lane_head=head, lane_tail=tail)


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


# -- the model ---------------------------------------------------------------

@dataclass(frozen=True)
class Claim:
    id: str
    token: int
    group: str | None
    payload: str = ""


@dataclass
class Ledger:
    """What the producers and workers know: every id ever minted, and the ids
    whose completion the server confirmed (or that were purged on purpose).
    Shared by every client of a test."""

    minted: set[str] = field(default_factory=set)
    completed: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_minted(self, ids: Iterable[str]) -> None:
        with self.lock:
            self.minted.update(ids)

    def add_completed(self, job_id: str) -> None:
        with self.lock:
            self.completed.add(job_id)

    def retire(self, ids: Iterable[str]) -> None:
        """Jobs that left the queue on purpose without completing (a morgue purge)."""
        with self.lock:
            self.completed.update(ids)


class EchoMQ:
    """One producer/worker connection to queue ``queue``."""

    def __init__(self, client: Any, queue: str, ledger: Ledger | None = None) -> None:
        self.client = client
        self.queue = queue
        self.keys = QueueKeys(queue)
        self.stems = _Stems.of(self.keys)
        self.ledger = ledger if ledger is not None else Ledger()

    def sibling(self, client: Any) -> EchoMQ:
        """The same queue and ledger over another connection (another worker)."""
        return EchoMQ(client, self.queue, self.ledger)

    # producer ---------------------------------------------------------------

    def enqueue(self, payload: str = "{}", group: str | None = None) -> str:
        while True:
            admitted = self._admit([mint_id()], payload, group)
            if admitted:
                return admitted[0]

    def enqueue_many(self, count: int, group: str | None = None, payload: str = "{}",
                     chunk: int = 1_000) -> list[str]:
        """``count`` jobs, one script call per ``chunk`` (works on a cluster,
        where pipelined EVALSHA is not allowed)."""
        admitted: list[str] = []
        while len(admitted) < count:
            wanted = min(chunk, count - len(admitted))
            admitted += self._admit(mint_ids(wanted), payload, group)
        return admitted

    def _admit(self, ids: list[str], payload: str, group: str | None) -> list[str]:
        k = self.keys
        target = k.lane_pending(group) if group else k.pending
        admitted = _call(
            "enqueue", self.client, [target, k.ring, k.paused, k.glimit, k.gactive, k.wake],
            [self.stems.row, payload, group or "", *ids],
        ) or []
        self.ledger.add_minted(admitted)
        return list(admitted)

    # worker -----------------------------------------------------------------

    def claim(self, lease_ms: int = 30_000, group_mode: str = "any") -> Claim | None:
        """``group_mode``: ``flat`` (pending only), ``grouped`` (the ring only),
        or ``any`` (the ring first, then pending)."""
        if group_mode not in ("flat", "grouped", "any"):
            raise ValueError("group_mode: must be 'flat', 'grouped' or 'any'")
        if group_mode in ("grouped", "any"):
            claimed = self._claim_grouped(lease_ms)
            if claimed or group_mode == "grouped":
                return claimed
        return self._claim_flat(lease_ms)

    def _claim_flat(self, lease_ms: int) -> Claim | None:
        got = _call("claim", self.client, [self.keys.pending, self.keys.active],
                    [self.stems.row, int(lease_ms)])
        if not got:
            return None
        return Claim(id=got[0], token=int(got[1]), group=None, payload=got[2])

    def _claim_grouped(self, lease_ms: int) -> Claim | None:
        k, s = self.keys, self.stems
        # A rotation may land on a lane emptied meanwhile (EchoMQ then drops it
        # and answers empty); a few more turns find a live lane if there is one.
        for _ in range(8):
            got = _call("gclaim", self.client, [k.ring, k.active, k.gactive, k.glimit],
                        [s.row, s.lane_head, s.lane_tail, int(lease_ms)])
            if not got:
                return None
            if got[0]:
                return Claim(id=got[0], token=int(got[1]), group=got[3], payload=got[2])
        return None

    def extend(self, claim: Claim, lease_ms: int = 30_000, strict: bool = False) -> bool:
        """EchoMQ's extension (``strict=False``) re-adds the id to ``active``
        whenever the token matches, even after a sweep recovered the job to
        pending: the job then sits in two places. ``strict=True`` only
        re-scores an id still in ``active``. Raises :class:`StaleToken`."""
        done = _call("extend", self.client, [self.keys.active, self.keys.job(claim.id)],
                     [claim.id, claim.token, int(lease_ms), "1" if strict else "0"])
        return int(done) == 1

    def complete(self, claim: Claim) -> bool:
        """True when the row was retired, False when it was already gone.
        Raises :class:`StaleToken` when the job's token moved on."""
        k, s = self.keys, self.stems
        done = _call(
            "complete", self.client,
            [k.active, k.job(claim.id), k.pending, k.ring, k.gactive, k.glimit, k.paused,
             k.wake, k.metrics_completed],
            [claim.id, claim.token, s.lane_head, s.lane_tail],
        )
        if int(done) == 1:
            self.ledger.add_completed(claim.id)
            return True
        return False

    def fail(self, claim: Claim, error: str = "boom", delay_ms: int = 1_000,
             max_attempts: int = 3) -> str:
        """``scheduled`` or ``dead`` (attempts reached ``max_attempts``)."""
        k, s = self.keys, self.stems
        return _call(
            "retry", self.client,
            [k.active, k.schedule, k.dead, k.job(claim.id), k.pending, k.ring, k.gactive,
             k.glimit, k.paused, k.wake, k.metrics_failed],
            [claim.id, claim.token, int(delay_ms), int(max_attempts), error,
             s.lane_head, s.lane_tail],
        )

    def reprocess(self, job_id: str) -> bool:
        """EchoMQ's own reprocess of a dead job (not ours: the morgue replay is).
        As the contract says the reference does it: out of ``dead``,
        ``last_error`` deleted, ``state=pending``, into the *flat* ``pending``
        even for a grouped job; ``attempts``, ``stalled``, ``dead_at`` and
        ``dead_attempts`` kept. False when the row is gone or the id is not in
        ``dead`` (EchoMQ's ``EMQSTATE``); nothing is changed then."""
        k = self.keys
        try:
            done = _call("reprocess", self.client, [k.job(job_id), k.dead, k.pending], [job_id])
        except ResponseError as err:
            if str(err).startswith("EMQSTATE"):
                return False
            raise
        return int(done) == 1

    def promote(self, batch: int = 100) -> int:
        k, s = self.keys, self.stems
        return int(_call(
            "promote", self.client,
            [k.schedule, k.pending, k.ring, k.gactive, k.glimit, k.paused, k.wake],
            [s.row, s.lane_head, s.lane_tail, int(batch)],
        ))

    def reap(self, limit: int = REAP_BATCH) -> list[str]:
        """EchoMQ's reaper, the call every consumer makes at the top of its loop:
        up to ``limit`` leases lapsed on the server clock go back to pending (or
        their lane's, ring/wake rule) with ``state=pending``, uncounted:
        ``attempts`` and ``stalled`` unchanged, nothing published. Returns the
        ids reaped (EchoMQ's returns their count)."""
        k, s = self.keys, self.stems
        return list(_call(
            "reap", self.client, [k.active, k.pending, k.ring, k.gactive, k.glimit, k.paused, k.wake],
            [s.row, s.lane_head, s.lane_tail, int(limit)],
        ) or [])

    # lanes ------------------------------------------------------------------

    def set_lane_limit(self, group: str, limit: int) -> None:
        if int(limit) < 0:
            raise ValueError("limit: must be >= 0")
        k = self.keys
        _call("glimit", self.client,
              [k.glimit, k.gactive, k.ring, k.paused, k.wake, k.lane_pending(group)],
              [group, int(limit)])

    def pause(self, group: str) -> None:
        _call("gpause", self.client, [self.keys.paused, self.keys.ring], [group])

    def resume(self, group: str) -> None:
        k = self.keys
        _call("gresume", self.client,
              [k.paused, k.ring, k.glimit, k.gactive, k.wake, k.lane_pending(group)], [group])

    # test helpers -----------------------------------------------------------

    def expire(self, claim: Claim | str, past_ms: int = 1_000) -> bool:
        """Lapse one lease (as if its worker died). False if not in active."""
        job_id = claim.id if isinstance(claim, Claim) else claim
        return int(_call("expire", self.client, [self.keys.active], [int(past_ms), job_id])) == 1

    def expire_all(self, past_ms: int = 1_000) -> int:
        return int(_call("expire", self.client, [self.keys.active], [int(past_ms)]))

    def where_is(self, job_id: str) -> Whereabouts:
        k, s = self.keys, self.stems
        places, state, group = _call(
            "where", self.client, [k.job(job_id), k.pending, k.active, k.schedule, k.dead],
            [job_id, s.lane_head, s.lane_tail],
        )
        return Whereabouts(places=list(places or []), state=state or None, group=group or None)

    def snapshot(self) -> QueueState:
        return read_state(self.client, self.queue)

    def audit(self, check_ledger: bool = True, *, grouped_in_flat: Collection[str] = (),
              undercounted_lanes: Collection[str] = ()) -> list[str]:
        return audit(self.client, self.queue, ledger=self.ledger if check_ledger else None,
                     grouped_in_flat=grouped_in_flat, undercounted_lanes=undercounted_lanes)

    def seed_stalled(self, n: int, **kwargs: Any) -> Seeded:
        seeded = seed_stalled(self.client, self.queue, n, **kwargs)
        self.ledger.add_minted(seeded.ids)
        return seeded


@dataclass(frozen=True)
class Whereabouts:
    places: list[str]
    state: str | None
    group: str | None


# -- the audit ---------------------------------------------------------------

@dataclass
class Row:
    id: str
    kind: str
    state: str | None
    group: str | None
    attempts: str | None
    stalled: str | None


@dataclass
class QueueState:
    """One atomic picture of a queue (see ``snapshot.lua``)."""

    pending: list[str]
    active: dict[str, float]
    schedule: list[str]
    dead: dict[str, float]
    ring: list[str]
    gactive: dict[str, str]
    glimit: dict[str, str]
    paused: set[str]
    wake_len: int
    rows: dict[str, Row]
    lanes: dict[str, list[str]]

    def places(self) -> dict[str, list[str]]:
        where: dict[str, list[str]] = {}
        for job_id in self.pending:
            where.setdefault(job_id, []).append("pending")
        for job_id in self.active:
            where.setdefault(job_id, []).append("active")
        for job_id in self.schedule:
            where.setdefault(job_id, []).append("schedule")
        for job_id in self.dead:
            where.setdefault(job_id, []).append("dead")
        for group, members in self.lanes.items():
            for job_id in members:
                where.setdefault(job_id, []).append(f"lane:{group}")
        return where


def _pairs(flat: list[Any]) -> dict[str, str]:
    return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}


#: above this many ids in the queue's sets, read_state reads in chunks (one
#: script over a big queue would block the server for seconds)
ATOMIC_READ_MAX = 20_000


def read_state(client: Any, queue: str, atomic: bool | None = None) -> QueueState:
    """The whole queue: in one atomic script (``atomic=True``, the default for
    small queues), or in bounded chunks, consistent only while nothing writes
    (``atomic=False``, the default above :data:`ATOMIC_READ_MAX` ids)."""
    k = QueueKeys(queue)
    if atomic is None:
        pipe = client.pipeline(transaction=False)
        for key in (k.pending, k.active, k.schedule, k.dead):
            pipe.zcard(key)
        atomic = sum(pipe.execute()) <= ATOMIC_READ_MAX
    return _read_atomic(client, k) if atomic else _read_chunked(client, k)


def _patterns(k: QueueKeys) -> tuple[_Stems, str, str]:
    s = _Stems.of(k)
    return (s, _glob_escape(s.row) + "*",
            _glob_escape(s.lane_head) + "*" + _glob_escape(s.lane_tail))


def _row(job_id: str, kind: str, fields: Sequence[Any]) -> Row:
    state, group, attempts, stalled = (_text(f) for f in fields) if fields else (None,) * 4
    return Row(id=job_id, kind=kind, state=state or None, group=group,
               attempts=attempts or None, stalled=stalled or None)


def _read_atomic(client: Any, k: QueueKeys) -> QueueState:
    s, row_pattern, lane_pattern = _patterns(k)
    raw = _call(
        "snapshot", client,
        [k.pending, k.active, k.schedule, k.dead, k.ring, k.gactive, k.glimit, k.paused, k.wake],
        [row_pattern, lane_pattern, s.row, s.lane_head, s.lane_tail],
    )
    pending, active, schedule, dead, ring, gactive, glimit, paused, wake_len, rows, lanes = raw
    parsed_rows = {}
    for i in range(0, len(rows), 7):
        job_id, kind, state, group, attempts, stalled, has_group = rows[i:i + 7]
        parsed_rows[job_id] = _row(job_id, kind, [state, group if has_group == "1" else None,
                                                  attempts, stalled])
    return QueueState(
        pending=list(pending),
        active={m: float(sc) for m, sc in _pairs(active).items()},
        schedule=list(schedule),
        dead={m: float(sc) for m, sc in _pairs(dead).items()},
        ring=list(ring),
        gactive=_pairs(gactive),
        glimit=_pairs(glimit),
        paused=set(paused),
        wake_len=int(wake_len),
        rows=parsed_rows,
        lanes={g: list(members) for g, members in lanes},
    )


def _read_chunked(client: Any, k: QueueKeys, chunk: int = 2_000) -> QueueState:
    s, row_pattern, lane_pattern = _patterns(k)

    def members(key: str) -> list[str]:
        return [_text(m) for m in client.zrange(key, 0, -1)]

    def scored(key: str) -> dict[str, float]:
        return {_text(m): float(sc) for m, sc in client.zrange(key, 0, -1, withscores=True)}

    def hash_of(key: str) -> dict[str, str]:
        return {_text(f): _text(v) for f, v in client.hgetall(key).items()}

    row_keys = [_text(key) for key in client.scan_iter(match=row_pattern, count=chunk)]
    rows: dict[str, Row] = {}
    for start in range(0, len(row_keys), chunk):
        keys = row_keys[start:start + chunk]
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, "state", "group", "attempts", "stalled")
        for key, fields in zip(keys, pipe.execute(raise_on_error=False)):
            job_id = key[len(s.row):]
            if isinstance(fields, ResponseError):  # WRONGTYPE: the key is no hash
                rows[job_id] = _row(job_id, _text(client.type(key)), [])
            else:
                rows[job_id] = _row(job_id, "hash", fields)
    lanes = {}
    for key in client.scan_iter(match=lane_pattern, count=chunk):
        key = _text(key)
        lanes[key[len(s.lane_head):len(key) - len(s.lane_tail)]] = members(key)
    return QueueState(
        pending=members(k.pending), active=scored(k.active), schedule=members(k.schedule),
        dead=scored(k.dead), ring=[_text(g) for g in client.lrange(k.ring, 0, -1)],
        gactive=hash_of(k.gactive), glimit=hash_of(k.glimit),
        paused={_text(g) for g in client.smembers(k.paused)}, wake_len=int(client.llen(k.wake)),
        rows=rows, lanes=lanes,
    )


_STATE_OF_PLACE = {"pending": "pending", "active": "active", "schedule": "scheduled",
                   "dead": "dead"}


def audit(client: Any, queue: str, ledger: Ledger | None = None,
          state: QueueState | None = None, *, grouped_in_flat: Collection[str] = (),
          undercounted_lanes: Collection[str] = ()) -> list[str]:
    """Every invariant of the contract the queue breaks right now (empty = sound).

    - each job in exactly one place (pending or its own lane, active, schedule,
      dead), with a row whose ``state`` matches the place;
    - no row without a place (a ghost, or a lost job), no place without a row
      (a dangling id); with a ledger, every minted id is placed or completed;
    - ``gactive`` of each lane equals its jobs in ``active`` (field deleted at 0);
    - the ring holds no duplicate, no paused lane, no lane at its limit, and every
      lane with work, spare capacity and no pause;
    - ``wake`` stays trimmed, ``stalled`` and ``attempts`` are integers.

    Two allowances, for EchoMQ's own known defect (its reprocess puts a
    grouped dead job in the flat ``pending``; shared/echomq-wire.md), given
    by a caller that knows which jobs it happened to: ``grouped_in_flat``,
    grouped ids allowed in the flat ``pending``; ``undercounted_lanes``, lanes
    whose ``gactive`` may count fewer jobs than are in flight (never more): a
    flat claim of such a job takes no lane slot, yet its completion, failure
    or sweep frees one. EchoMQ's completion and failure then compare the count
    below 0 (-1) with the limit before deleting the field, so they ring a lane
    whose limit is 0: such a lane, without a ``gactive`` field, may sit on the
    ring at its limit.
    """
    st = state or read_state(client, queue)
    problems: list[str] = []
    where = st.places()

    for job_id, places in sorted(where.items()):
        row = st.rows.get(job_id)
        if len(places) > 1:
            problems.append(f"{job_id}: in several places {places}")
        if row is None:
            problems.append(f"{job_id}: in {places} but its row is gone (dangling id)")
            continue
        if row.kind != "hash":
            problems.append(f"{job_id}: row is a {row.kind}, not a hash")
            continue
        for place in places:
            if place.startswith("lane:"):
                lane = place[len("lane:"):]
                if row.group != lane:
                    problems.append(f"{job_id}: in lane {lane!r} but its row's group is {row.group!r}")
                expected = "pending"
            else:
                if place == "pending" and row.group is not None and job_id not in grouped_in_flat:
                    problems.append(f"{job_id}: grouped ({row.group!r}) but in the flat pending set")
                expected = _STATE_OF_PLACE[place]
            if row.state != expected:
                problems.append(f"{job_id}: in {place} but state={row.state!r} (want {expected!r})")

    for job_id, row in sorted(st.rows.items()):
        if job_id not in where:
            problems.append(f"{job_id}: row (state={row.state!r}) is in no place (ghost or lost)")
        if row.kind == "hash":
            for name in ("attempts", "stalled"):
                value = getattr(row, name)
                if value is not None and not re.fullmatch(r"-?\d+", value):
                    problems.append(f"{job_id}: {name}={value!r} is not an integer")

    if ledger is not None:
        with ledger.lock:
            minted, completed = set(ledger.minted), set(ledger.completed)
        for job_id in sorted(minted - completed):
            if job_id not in where and job_id not in st.rows:
                problems.append(f"{job_id}: lost (never completed, in no place, no row)")
        for job_id in sorted(completed & set(where)):
            problems.append(f"{job_id}: completed but still in {where[job_id]}")

    in_flight = Counter(
        st.rows[j].group for j in st.active if j in st.rows and st.rows[j].group is not None
    )
    for group in sorted(set(in_flight) | set(st.gactive)):
        raw = st.gactive.get(group)
        counted = _as_int(raw)
        if raw is not None and (counted is None or counted <= 0):
            problems.append(f"lane {group!r}: gactive={raw!r} (must be a count above 0, or no field)")
        if group in undercounted_lanes:
            if (counted or 0) > in_flight.get(group, 0):
                problems.append(f"lane {group!r}: gactive={raw!r} but only {in_flight.get(group, 0)} in flight")
        elif (counted or 0) != in_flight.get(group, 0):
            problems.append(f"lane {group!r}: gactive={raw!r} but {in_flight.get(group, 0)} in flight")

    # A claim compares gactive with the limit after it popped the job: a limit
    # that is not a number fails it half-way (the job active with no worker).
    bad_limits = {group for group, raw in st.glimit.items() if _lua_number(raw) is None}
    for group in sorted(bad_limits):
        problems.append(f"lane {group!r}: glimit={st.glimit[group]!r} is not a number (a claim fails half-way on it)")
    ring_counts = Counter(st.ring)
    for group, count in sorted(ring_counts.items()):
        if count > 1:
            problems.append(f"lane {group!r}: on the ring {count} times")
        if group in st.paused:
            problems.append(f"lane {group!r}: paused but on the ring")
        if group in bad_limits:
            problems.append(f"lane {group!r}: on the ring with a glimit that is not a number")
        elif _at_limit(st, group) and not (group in undercounted_lanes and group not in st.gactive):
            problems.append(f"lane {group!r}: at its limit but on the ring (would over-admit)")
    for group, members in sorted(st.lanes.items()):
        if (members and group not in st.paused and group not in bad_limits and not _at_limit(st, group)
                and group not in ring_counts):
            problems.append(f"lane {group!r}: has work and spare capacity but is missing from the ring")

    if st.wake_len > WAKE_MAX:
        problems.append(f"wake list holds {st.wake_len} entries (trimmed to {WAKE_MAX})")
    return problems


def _as_int(value: str | None) -> int | None:
    return int(value) if value is not None and re.fullmatch(r"-?\d+", value) else None


def _lua_number(value: str) -> float | None:
    """``value`` as Lua's tonumber reads a decimal number (what EchoMQ's claim
    compares with), or None."""
    try:
        number = float(value)
    except ValueError:
        return None
    return number if re.fullmatch(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*", value) else None


def _at_limit(st: QueueState, group: str) -> bool:
    """No limit field: no limit. (A limit that is not a number is a problem of its own.)"""
    raw = st.glimit.get(group)
    limit = None if raw is None else _lua_number(raw)
    if limit is None:
        return False
    return (_as_int(st.gactive.get(group)) or 0) >= limit


# -- fast bulk seeding (demo, benchmarks, large tests) -----------------------

@dataclass
class Seeded:
    ids: list[str]
    groups: dict[str, str | None]            # id -> group (None = flat)
    stalled_before: dict[str, int]           # id -> the row's stalled count as seeded
    at_budget: set[str]                      # ids whose next stall reaches their budget


def server_now_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def seed_stalled(
    client: Any,
    queue: str,
    n: int,
    *,
    groups: Sequence[str] = (),
    grouped_fraction: float = 0.5,
    budget: int = 3,
    lane_budgets: Mapping[str, int] | None = None,
    at_budget_fraction: float = 0.1,
    lease_past_ms: int = 60_000,
    attempts: int = 1,
    payload: str = '{"seeded":true}',
    chunk: int = 5_000,
    seed: int | None = 0,
) -> Seeded:
    """``n`` expired active jobs, exactly as a dead worker leaves them: rows
    ``state=active`` with their token, leases ``lease_past_ms`` in the past (on
    the server clock), ``gactive`` counting the grouped ones. A share
    ``at_budget_fraction`` already carries ``stalled = budget - 1`` (the next
    sweep dead-letters them); the rest carry a lower count, 0 or no field at
    all. One script call per ``chunk`` jobs (also on a cluster)."""
    if n < 0:
        raise ValueError("n: must be >= 0")
    rng = random.Random(seed)
    keys = QueueKeys(queue)
    lane_budgets = dict(lane_budgets or {})
    deadline = server_now_ms(client) - int(lease_past_ms)
    ids = mint_ids(n)
    seeded = Seeded(ids=ids, groups={}, stalled_before={}, at_budget=set())
    for start in range(0, n, chunk):
        triples: list[str] = []
        for job_id in ids[start:start + chunk]:
            group = rng.choice(groups) if groups and rng.random() < grouped_fraction else None
            job_budget = lane_budgets.get(group, budget) if group else budget
            stalled = 0
            if job_budget > 0 and rng.random() < at_budget_fraction:
                stalled = job_budget - 1
            elif job_budget > 2 and rng.random() < 0.5:
                stalled = rng.randint(0, job_budget - 2)
            if job_budget > 0 and stalled + 1 >= job_budget:
                seeded.at_budget.add(job_id)
            # about half the unmarked rows carry no field at all, like fresh EchoMQ rows
            mark = str(stalled) if stalled or rng.random() < 0.5 else ""
            triples += [job_id, group or "", mark]
            seeded.groups[job_id] = group
            seeded.stalled_before[job_id] = stalled
        _call("seed", client, [keys.active, keys.gactive],
              [_Stems.of(keys).row, deadline, payload, int(attempts), *triples])
    return seeded


def seed_lane_backlog(mq: EchoMQ, group: str, count: int) -> list[str]:
    """Pending work in a lane, admitted the EchoMQ way (ring/wake rule)."""
    return mq.enqueue_many(count, group=group)


__all__ = [
    "REAP_BATCH", "Claim", "EchoMQ", "Ledger", "QueueState", "Seeded", "StaleToken", "Whereabouts",
    "audit", "mint_id", "mint_ids", "read_state", "seed_lane_backlog", "seed_stalled",
    "server_now_ms",
]
