"""The engine: Python calls over our Lua scripts (semantics in docs/scripts.md).

Every function takes a redis-py ``Redis`` or ``RedisCluster`` client with either
``decode_responses`` setting; every key name comes from :class:`QueueKeys`.
Each script call is bounded; the functions that may touch many jobs loop over
bounded calls so Redis is never blocked for long.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from redis.exceptions import NoPermissionError, ResponseError

from stalledpolicy.keyspace import QueueKeys
from stalledpolicy.lua import script

#: ids per morgue script call (replay, purge, list pages, stats scans)
MORGUE_BATCH = 500


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


# a counter as the scripts read one (lib/counters.lua): what HINCRBY writes,
# at most 15 digits; Python's int() would also take " 12", "1_0" or "١٢"
_COUNTER = re.compile(r"0|[1-9][0-9]{0,14}")


def _int(value: Any) -> int | None:
    value = _text(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, str) or not _COUNTER.fullmatch(value):
        return None
    return int(value)


def _check_budget(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}: budget must be an integer >= 0 (0 = never dead-letter), got {value!r}")
    return value


def _check_positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
    return value


# --------------------------------------------------------------------------- ACL


class AclRefused(NoPermissionError):
    """The Redis ACL refused a script call of a queue: its keys (the user's key
    patterns leave them out, or allow only reading to a script that writes) or
    a command. The message is ``EMQNOPERM ...`` naming the queue's key pattern
    and the grant that fixes it, as the scripts' own refusals do (lib/refusals)."""


# what Redis says when the ACL refuses a key or a command: to EVALSHA's own
# arguments (redis-py strips the NOPERM), or to a command run inside the script
_KEY_REFUSALS = ("no permissions to access one of the keys", "can't access at least one of the keys")
_COMMAND_REFUSAL = re.compile(r"no permissions to run the '([^']+)' command|can't run this command")


def is_acl_refusal(exc: BaseException) -> bool:
    """Whether ``exc`` is the Redis ACL refusing a script call (ours, or Redis's own words)."""
    return isinstance(exc, NoPermissionError) or str(exc).startswith("EMQNOPERM")


def _acl_refusal(exc: ResponseError, prefix: str, read_only: bool) -> str | None:
    text = str(exc)
    grant = f"ACL SETUSER <user> ~{prefix}* &{prefix}events +@all"
    if any(words in text for words in _KEY_REFUSALS):
        if read_only:
            return (f"EMQNOPERM the Redis user may not read the queue's keys {prefix}* (ACL): nothing was read; "
                    f"grant it read access to them at least (e.g. ACL SETUSER <user> %R~{prefix}*), or the "
                    f"queue's keys, channel and commands to also sweep, replay and purge (e.g. {grant})")
        return (f"EMQNOPERM the Redis user may not read and write the queue's keys {prefix}* (ACL): nothing was "
                f"changed; grant it the queue's keys, channel and commands (e.g. {grant}; read-only "
                f"keys, %R~{prefix}*, are not enough: the script writes)")
    command = _COMMAND_REFUSAL.search(text)
    if command is None:
        return None
    what = command.group(1).upper() if command.group(1) else "a command of the script"
    return (f"EMQNOPERM the Redis user may not run {what} (ACL): nothing was changed; grant it the queue's "
            f"keys, channel and commands (e.g. {grant})")


def _run_script(name: str, client: Any, keys: QueueKeys, key_names: Sequence[str], args: Sequence[Any]) -> Any:
    """Call script ``name``; an ACL refusal of its keys or commands is raised as
    :class:`AclRefused`, naming the grant (Redis's own words name neither)."""
    loaded = script(name)
    try:
        return loaded(client, key_names, args)
    except ResponseError as exc:
        refusal = None if str(exc).startswith("EMQNOPERM") else _acl_refusal(exc, keys.prefix, loaded.read_only)
        if refusal is None:
            raise
        raise AclRefused(refusal) from exc


# --------------------------------------------------------------------------- sweep


@dataclass(frozen=True)
class Budgets:
    """Stall budgets: dead-letter on the stall that reaches the budget; 0 = never."""

    default: int
    lanes: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_budget("maxStalled", self.default)
        for lane, budget in self.lanes.items():
            if not isinstance(lane, str) or not lane:
                raise ValueError(f"lanes: lane name must be a non-empty string, got {lane!r}")
            _check_budget(f"lanes[{lane}]", budget)

    def for_lane(self, lane: str | None) -> int:
        return self.lanes.get(lane, self.default) if lane else self.default


@dataclass
class LaneCounts:
    recovered: int = 0
    dead_lettered: int = 0


@dataclass
class SweepResult:
    recovered: int = 0
    dead_lettered: int = 0
    orphans: int = 0
    quarantined: int = 0
    lanes: dict[str, LaneCounts] = field(default_factory=dict)
    more: bool = False
    calls: int = 0
    #: shared keys of the wrong type met after the moves (every job is in its
    #: set; the bookkeeping named was skipped): one line each, naming the key
    problems: list[str] = field(default_factory=list)

    @property
    def moved(self) -> int:
        return self.recovered + self.dead_lettered + self.orphans + self.quarantined

    def merge(self, other: "SweepResult") -> "SweepResult":
        lanes = {name: LaneCounts(c.recovered, c.dead_lettered) for name, c in self.lanes.items()}
        for name, counts in other.lanes.items():
            mine = lanes.setdefault(name, LaneCounts())
            mine.recovered += counts.recovered
            mine.dead_lettered += counts.dead_lettered
        return SweepResult(
            recovered=self.recovered + other.recovered,
            dead_lettered=self.dead_lettered + other.dead_lettered,
            orphans=self.orphans + other.orphans,
            quarantined=self.quarantined + other.quarantined,
            lanes=lanes,
            more=other.more,
            calls=self.calls + other.calls,
            problems=_union(self.problems, other.problems),
        )


def _union(first: list[str], second: Iterable[str]) -> list[str]:
    return list(dict.fromkeys([*first, *second]))


def _sweep_keys(keys: QueueKeys) -> list[str]:
    return [
        keys.active, keys.pending, keys.dead, keys.ring, keys.gactive, keys.glimit,
        keys.paused, keys.wake, keys.metrics_failed, keys.sweeper_totals,
    ]


def sweep_batch(client: Any, queue: str, budgets: Budgets, limit: int) -> SweepResult:
    """One bounded sweep call over at most ``limit`` expired jobs of ``queue``."""
    _check_positive("batch size", limit)
    keys = QueueKeys(queue)
    args: list[Any] = [keys.prefix, limit, budgets.default, keys.events]
    for lane, budget in budgets.lanes.items():
        args += [lane, budget]
    reply = _run_script("sweep", client, keys, _sweep_keys(keys), args)
    recovered, dead_lettered, orphans, quarantined, more, flat_lanes, problems = reply
    # Lane names are shown decoded (a byte that is not UTF-8 becomes U+FFFD), so
    # two distinct lanes can end up under one name: their counts add up rather
    # than one lane's replacing the other's (the totals must match the jobs moved).
    lanes: dict[str, LaneCounts] = {}
    for i in range(0, len(flat_lanes), 3):
        counts = lanes.setdefault(_text(flat_lanes[i]), LaneCounts())
        counts.recovered += int(flat_lanes[i + 1])
        counts.dead_lettered += int(flat_lanes[i + 2])
    return SweepResult(
        recovered=int(recovered),
        dead_lettered=int(dead_lettered),
        orphans=int(orphans),
        quarantined=int(quarantined),
        lanes=lanes,
        more=bool(more),
        calls=1,
        problems=[_text(p) for p in problems],
    )


def drain(
    client: Any,
    queue: str,
    budgets: Budgets,
    batch_size: int,
    should_stop: Callable[[], bool] = lambda: False,
    on_call: Callable[[SweepResult, float], None] | None = None,
) -> SweepResult:
    """Bounded sweep calls until the expired prefix is empty or ``should_stop()``.

    ``should_stop`` is checked between calls only: a call in flight always
    finishes (each call is atomic, so stopping never loses a job).
    """
    total = SweepResult()
    while not should_stop():
        started = time.perf_counter()
        result = sweep_batch(client, queue, budgets, batch_size)
        if on_call is not None:
            on_call(result, time.perf_counter() - started)
        total = total.merge(result)
        if not result.more:
            break
    return total


# --------------------------------------------------------------------------- snapshot


@dataclass
class LaneSnapshot:
    name: str
    pending: int
    recovered_total: int
    dead_lettered_total: int


@dataclass
class QueueSnapshot:
    dead: int
    pending: int
    active: int
    recovered_total: int
    dead_lettered_total: int
    orphans_total: int
    quarantined_total: int
    lanes: list[LaneSnapshot]


def queue_snapshot(client: Any, queue: str, lanes: Iterable[str] = ()) -> QueueSnapshot:
    """Sizes and sweeper totals of ``queue`` in one non-transactional pipeline."""
    keys = QueueKeys(queue)
    lanes = list(lanes)
    pipe = client.pipeline(transaction=False)
    pipe.zcard(keys.dead)
    pipe.zcard(keys.pending)
    pipe.zcard(keys.active)
    pipe.hgetall(keys.sweeper_totals)
    for lane in lanes:
        pipe.zcard(keys.lane_pending(lane))
    dead, pending, active, raw_totals, *lane_sizes = pipe.execute()
    totals = {_text(k): _int(v) or 0 for k, v in raw_totals.items()}
    return QueueSnapshot(
        dead=int(dead),
        pending=int(pending),
        active=int(active),
        recovered_total=totals.get("recovered", 0),
        dead_lettered_total=totals.get("dead_lettered", 0),
        orphans_total=totals.get("orphans", 0),
        quarantined_total=totals.get("quarantined", 0),
        lanes=[
            LaneSnapshot(
                name=lane,
                pending=int(size),
                recovered_total=totals.get(f"lane:{lane}:recovered", 0),
                dead_lettered_total=totals.get(f"lane:{lane}:dead_lettered", 0),
            )
            for lane, size in zip(lanes, lane_sizes)
        ],
    )


# --------------------------------------------------------------------------- morgue


@dataclass
class DeadJob:
    id: str
    lane: str | None
    stalled: int | None
    attempts: int | None
    last_error: str | None
    dead_at_ms: int | None
    state: str | None
    #: set when the row cannot be read as a job: missing, or not a hash
    problem: str | None = None


def lane_of(job: DeadJob) -> str | None:
    """The lane a ``lane`` filter (``--lane``) matches ``job`` by, the one rule
    of the scripts (replay, purge) and of :func:`morgue_stats` and
    :func:`morgue_list`: the job's lane, ``""`` for a flat job, None for an
    entry whose row is missing or not a hash: it is in no lane, flat included,
    so only ids or the whole morgue select it."""
    return None if job.problem else (job.lane or "")


@dataclass
class MorgueStats:
    size: int
    lanes: dict[str, int]  # lane -> dead jobs; "" = flat jobs
    oldest_dead_at_ms: int | None
    #: entries whose job row is missing or not a hash: in no lane (:func:`lane_of`), so a
    #: ``--lane`` (flat included) never selects them; ``--id`` or ``--all`` does
    unreadable: int = 0


@dataclass
class ReplayResult:
    replayed: int
    ids: list[str]
    lanes: dict[str, int]  # lane -> jobs (to be) replayed; "" = flat
    missing: list[str]
    #: dead ids left in the morgue because they cannot be replayed safely (id -> why)
    unreplayable: dict[str, str] = field(default_factory=dict)
    #: as :attr:`SweepResult.problems`
    problems: list[str] = field(default_factory=list)


@dataclass
class PurgeResult:
    purged: int
    ids: list[str]
    missing: list[str] = field(default_factory=list)
    #: ids kept and why: deleting them could drop a live job, or (ids given with a
    #: lane filter) they are not in that lane (id -> why)
    kept: dict[str, str] = field(default_factory=dict)
    #: entries an age purge kept for want of a valid time of death (no ``dead_at``, a
    #: malformed one, or one later than now) whose row exists and is a hash: dated now
    #: (``dead_at`` = the server's now; not in a dry run), so a later age purge can remove them
    undated: int = 0
    #: as :attr:`SweepResult.problems`
    problems: list[str] = field(default_factory=list)
    #: entries an age purge kept because their row is missing or not a hash: they have
    #: no time of death and cannot get one; only a purge without an age and without a lane
    #: (by id, or of the whole morgue) removes them
    undatable: int = 0
    #: lane -> jobs (to be) purged; "" = flat, None = in no lane (row missing or not a hash),
    #: as :func:`lane_of` reads them
    lanes: dict[str | None, int] = field(default_factory=dict)


def _lane_filter(lane: str | None) -> str:
    return "" if lane is None else "=" + lane


def _unique(ids: Iterable[str]) -> list[str]:
    unique = list(dict.fromkeys(_text(i) for i in ids))
    for job_id in unique:
        if not isinstance(job_id, str) or not job_id:
            raise ValueError(f"ids: every id must be a non-empty string, got {job_id!r}")
    return unique


def _pairs(flat: Sequence[Any]) -> list[tuple[str, str]]:
    return [(_text(flat[i]), _text(flat[i + 1])) for i in range(0, len(flat), 2)]


def _scan(client: Any, keys: QueueKeys, mode: str, cursor: str | bytes, count: int
          ) -> tuple[list[DeadJob], str | bytes]:
    rows, next_cursor = _run_script("morgue_scan", client, keys, [keys.dead], [keys.prefix, mode, cursor, count])
    jobs = []
    for raw in rows:
        job_id, group, stalled, attempts, last_error, dead_at, state, problem = (_text(v) for v in raw)
        jobs.append(DeadJob(
            id=job_id, lane=group or None, stalled=_int(stalled), attempts=_int(attempts),
            last_error=last_error, dead_at_ms=_int(dead_at), state=state, problem=problem,
        ))
    return jobs, next_cursor  # as sent: a decoded non-UTF-8 id would point elsewhere in `dead`


def _scan_all(client: Any, keys: QueueKeys) -> Iterable[DeadJob]:
    cursor = ""
    while True:
        jobs, cursor = _scan(client, keys, "lex", cursor, MORGUE_BATCH)
        yield from jobs
        if not cursor:
            return


def morgue_stats(client: Any, queue: str) -> MorgueStats:
    """Size, dead jobs per lane and the oldest time of death (bounded calls)."""
    keys = QueueKeys(queue)
    lanes: dict[str, int] = {}
    unreadable = 0
    oldest: int | None = None
    for job in _scan_all(client, keys):
        name = lane_of(job)
        if name is None:
            unreadable += 1
            continue
        lanes[name] = lanes.get(name, 0) + 1
        if job.dead_at_ms is not None and (oldest is None or job.dead_at_ms < oldest):
            oldest = job.dead_at_ms
    return MorgueStats(size=int(client.zcard(keys.dead)), lanes=lanes, oldest_dead_at_ms=oldest,
                       unreadable=unreadable)


def morgue_list(client: Any, queue: str, *, lane: str | None = None, limit: int = 100,
                offset: int = 0) -> list[DeadJob]:
    """A page of the morgue in id (= mint) order; ``lane`` as replay and purge
    read it (:func:`lane_of`: ``""`` selects flat jobs, and an entry whose row
    is missing or not a hash is in no lane)."""
    _check_positive("limit", limit)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset: must be an integer >= 0, got {offset!r}")
    keys = QueueKeys(queue)
    page: list[DeadJob] = []
    if lane is None:
        start = offset
        while len(page) < limit:
            jobs, more = _scan(client, keys, "index", str(start), min(MORGUE_BATCH, limit - len(page)))
            page += jobs
            start += len(jobs)
            if not more:
                break
        return page
    skipped = 0
    for job in _scan_all(client, keys):
        if lane_of(job) != lane:
            continue
        if skipped < offset:
            skipped += 1
            continue
        page.append(job)
        if len(page) >= limit:
            break
    return page


def _replay_keys(keys: QueueKeys) -> list[str]:
    return [keys.dead, keys.pending, keys.ring, keys.gactive, keys.glimit, keys.paused, keys.wake,
            keys.sweeper_totals]


def morgue_replay(client: Any, queue: str, *, lane: str | None = None, ids: Sequence[str] | None = None,
                  limit: int | None = None, dry_run: bool = False,
                  progress: Callable[[ReplayResult], None] | None = None,
                  should_stop: Callable[[], bool] = lambda: False) -> ReplayResult:
    """Move dead jobs back to their lane (or ``pending``) with the stall count reset.

    Selection: ``ids`` (only those; ids not in the morgue come back in
    ``missing``), else every dead job of ``lane`` (``""`` = flat jobs), else the
    whole morgue; at most ``limit`` jobs. Each script call is bounded, and
    ``progress`` (if given) sees the result so far after each one: a caller
    that meets an error half-way knows what already moved. ``should_stop`` is
    asked between calls only, as in :func:`drain` (never after the last one):
    once it says yes, no other call is sent and the result so far is returned.
    """
    if limit is not None:
        _check_positive("limit", limit)
    keys = QueueKeys(queue)
    result = ReplayResult(replayed=0, ids=[], lanes={}, missing=[])
    dry = "1" if dry_run else "0"

    def call(mode: str, cursor: str | bytes, chunk: Sequence[str]) -> str | bytes:
        budget = MORGUE_BATCH if limit is None else min(MORGUE_BATCH, limit - result.replayed)
        args = [keys.prefix, dry, _lane_filter(lane), mode, cursor, MORGUE_BATCH, budget, *chunk]
        replayed, refused, missing, next_cursor, problems = _run_script(
            "morgue_replay", client, keys, _replay_keys(keys), args)
        for job_id, job_lane in _pairs(replayed):
            result.ids.append(job_id)
            result.lanes[job_lane] = result.lanes.get(job_lane, 0) + 1
        result.replayed = len(result.ids)
        result.unreplayable.update(_pairs(refused))
        result.missing += [_text(m) for m in missing]
        result.problems = _union(result.problems, (_text(p) for p in problems))
        if progress is not None:
            progress(result)
        return next_cursor  # as sent (see _scan)

    if ids is not None:
        wanted = _unique(ids)
        for start in range(0, len(wanted), MORGUE_BATCH):
            if limit is not None and result.replayed >= limit:
                break
            if start and should_stop():
                break
            call("ids", "", wanted[start:start + MORGUE_BATCH])
        return result
    cursor = call("scan", "", ())
    while cursor and (limit is None or result.replayed < limit) and not should_stop():
        cursor = call("scan", cursor, ())
    return result


def morgue_purge(client: Any, queue: str, *, older_than_s: float | None = None, lane: str | None = None,
                 ids: Sequence[str] | None = None, dry_run: bool = False,
                 progress: Callable[[PurgeResult], None] | None = None,
                 should_stop: Callable[[], bool] = lambda: False) -> PurgeResult:
    """Delete dead jobs (the morgue entry and the row) for good.

    Selection as :func:`morgue_replay`, narrowed by ``older_than_s``: only jobs
    whose ``dead_at`` is at least that old on the server clock. The others
    without a valid ``dead_at`` are kept and counted: ``undated`` (dated now)
    and ``undatable`` (their row is missing or not a hash). ``progress`` and
    ``should_stop`` as in :func:`morgue_replay`.
    """
    min_age = ""
    if older_than_s is not None:
        if isinstance(older_than_s, bool) or not isinstance(older_than_s, (int, float)) or older_than_s < 0:
            raise ValueError(f"older than: must be a duration >= 0 seconds, got {older_than_s!r}")
        min_age = str(int(older_than_s * 1000))
    keys = QueueKeys(queue)
    result = PurgeResult(purged=0, ids=[])
    dry = "1" if dry_run else "0"

    def call(mode: str, cursor: str | bytes, chunk: Sequence[str]) -> str | bytes:
        args = [keys.prefix, dry, _lane_filter(lane), mode, min_age, cursor, MORGUE_BATCH, *chunk]
        purged, kept, missing, undated, next_cursor, problems, undatable, lanes = _run_script(
            "morgue_purge", client, keys, [keys.dead, keys.sweeper_totals], args)
        result.ids += [_text(p) for p in purged]
        for raw in lanes:
            # '=' .. group, '=' flat, '' in no lane: the script's reading of the lane filter
            label = _text(raw)
            name = label[1:] if label else None
            result.lanes[name] = result.lanes.get(name, 0) + 1
        result.purged = len(result.ids)
        result.kept.update(_pairs(kept))
        result.missing += [_text(m) for m in missing]
        result.undated += int(undated)
        result.undatable += int(undatable)
        result.problems = _union(result.problems, (_text(p) for p in problems))
        if progress is not None:
            progress(result)
        return next_cursor  # as sent (see _scan)

    if ids is not None:
        wanted = _unique(ids)
        for start in range(0, len(wanted), MORGUE_BATCH):
            if start and should_stop():
                break
            call("ids", "", wanted[start:start + MORGUE_BATCH])
        return result
    cursor = call("scan", "", ())
    while cursor and not should_stop():
        cursor = call("scan", cursor, ())
    return result
