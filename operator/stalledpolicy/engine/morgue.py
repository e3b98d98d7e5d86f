"""The morgue: stats, list, replay and purge, each over bounded script calls
(docs/scripts.md, morgue_*)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from stalledpolicy.engine.calls import as_counter, as_text, check_positive, merged_problems, run_script
from stalledpolicy.keyspace import QueueKeys

#: ids per morgue script call (replay, purge, list pages, stats scans)
MORGUE_BATCH = 500
#: ids per stats call: only counts come back, yet a larger window does not pay:
#: the server's per-row work dominates (bench/morgue.py, 300,000 entries: 1.2 s at
#: 500, 1.1 s at 2,000), and a call of 2,000 ids takes up to 12 ms, of 500 ~3 ms
MORGUE_STATS_BATCH = 500


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
class MorguePage:
    """A page of :func:`morgue_page`: its jobs, and how many the selection
    holds in all (the morgue's size, or the lane's dead jobs by :func:`lane_of`)."""
    jobs: list[DeadJob]
    total: int


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
    unique = list(dict.fromkeys(as_text(i) for i in ids))
    for job_id in unique:
        if not isinstance(job_id, str) or not job_id:
            raise ValueError(f"ids: every id must be a non-empty string, got {job_id!r}")
    return unique


def _pairs(flat: Sequence[Any]) -> list[tuple[str, str]]:
    return [(as_text(flat[i]), as_text(flat[i + 1])) for i in range(0, len(flat), 2)]


def _job(raw: Sequence[Any]) -> DeadJob:
    job_id, group, stalled, attempts, last_error, dead_at, state, problem = (as_text(v) for v in raw)
    return DeadJob(
        id=job_id, lane=group or None, stalled=as_counter(stalled), attempts=as_counter(attempts),
        last_error=last_error, dead_at_ms=as_counter(dead_at), state=state, problem=problem,
    )


def _scan(client: Any, keys: QueueKeys, mode: str, cursor: str | bytes, count: int
          ) -> tuple[list[DeadJob], str | bytes]:
    rows, next_cursor = run_script("morgue_scan", client, keys, [keys.dead], [keys.prefix, mode, cursor, count])
    return [_job(raw) for raw in rows], next_cursor  # as sent: a decoded non-UTF-8 id would point elsewhere in `dead`


def morgue_stats(client: Any, queue: str) -> MorgueStats:
    """Size, dead jobs per lane and the oldest time of death (bounded calls of
    MORGUE_STATS_BATCH ids: the script counts, only the counts come back)."""
    keys = QueueKeys(queue)
    lanes: dict[str, int] = {}
    unreadable = 0
    oldest: int | None = None
    cursor: str | bytes = ""
    while True:
        counts, unreadable_here, oldest_here, cursor = run_script(
            "morgue_scan", client, keys, [keys.dead], [keys.prefix, "stats", cursor, MORGUE_STATS_BATCH])
        for i in range(0, len(counts), 2):
            # lanes as the rows read them (as_text): two raw names may decode alike
            name = as_text(counts[i]) or ""
            lanes[name] = lanes.get(name, 0) + int(counts[i + 1])
        unreadable += int(unreadable_here)
        if oldest_here is not None and (oldest is None or int(oldest_here) < oldest):
            oldest = int(oldest_here)
        if not cursor:
            break
    return MorgueStats(size=int(client.zcard(keys.dead)), lanes=lanes, oldest_dead_at_ms=oldest,
                       unreadable=unreadable)


def _check_paging(limit: int, offset: int) -> None:
    check_positive("limit", limit)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset: must be an integer >= 0, got {offset!r}")


def _lane_walk(client: Any, keys: QueueKeys, lane: str, limit: int, offset: int, *, to_end: bool
               ) -> tuple[list[DeadJob], int]:
    """The page of ``lane`` (morgue_scan ``lane`` mode) and the lane's rows
    among the ids examined: to the end of the morgue with ``to_end`` (its
    total, from the same walk), else the walk stops once the page is full."""
    page: list[DeadJob] = []
    matched = 0
    cursor: str | bytes = ""
    to_skip = offset
    while True:
        rows, cursor, skipped, matched_here = run_script(
            "morgue_scan", client, keys, [keys.dead],
            [keys.prefix, "lane", cursor, MORGUE_BATCH, lane, to_skip, limit - len(page),
             "total" if to_end else ""])
        to_skip -= int(skipped)
        matched += int(matched_here)
        page += [_job(raw) for raw in rows]
        if not cursor or (len(page) >= limit and not to_end):
            return page, matched


def morgue_list(client: Any, queue: str, *, lane: str | None = None, limit: int = 100,
                offset: int = 0) -> list[DeadJob]:
    """A page of the morgue in id (= mint) order; ``lane`` as replay and purge
    read it (:func:`lane_of`: ``""`` selects flat jobs, and an entry whose row
    is missing or not a hash is in no lane): the script filters, only the
    page's rows come back."""
    _check_paging(limit, offset)
    keys = QueueKeys(queue)
    if lane is not None:
        return _lane_walk(client, keys, lane, limit, offset, to_end=False)[0]
    page: list[DeadJob] = []
    start = offset
    while len(page) < limit:
        jobs, more = _scan(client, keys, "index", str(start), min(MORGUE_BATCH, limit - len(page)))
        page += jobs
        start += len(jobs)
        if not more:
            break
    return page


def morgue_page(client: Any, queue: str, *, lane: str | None = None, limit: int = 100,
                offset: int = 0) -> MorguePage:
    """:func:`morgue_list`'s page and the selection's total, what ``morgue
    list`` shows. With ``lane``, one walk of the morgue gives both (the walk
    goes on past the page, counting: each call still examines one window), as
    :func:`morgue_stats`' count of the lane would; without, the total is the
    morgue's size."""
    _check_paging(limit, offset)
    keys = QueueKeys(queue)
    if lane is not None:
        jobs, total = _lane_walk(client, keys, lane, limit, offset, to_end=True)
        return MorguePage(jobs=jobs, total=total)
    jobs = morgue_list(client, queue, limit=limit, offset=offset)
    return MorguePage(jobs=jobs, total=int(client.zcard(keys.dead)))


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
        check_positive("limit", limit)
    keys = QueueKeys(queue)
    result = ReplayResult(replayed=0, ids=[], lanes={}, missing=[])
    dry = "1" if dry_run else "0"

    def call(mode: str, cursor: str | bytes, chunk: Sequence[str]) -> str | bytes:
        budget = MORGUE_BATCH if limit is None else min(MORGUE_BATCH, limit - result.replayed)
        args = [keys.prefix, dry, _lane_filter(lane), mode, cursor, MORGUE_BATCH, budget, *chunk]
        replayed, refused, missing, next_cursor, problems = run_script(
            "morgue_replay", client, keys, _replay_keys(keys), args)
        for job_id, job_lane in _pairs(replayed):
            result.ids.append(job_id)
            result.lanes[job_lane] = result.lanes.get(job_lane, 0) + 1
        result.replayed = len(result.ids)
        result.unreplayable.update(_pairs(refused))
        result.missing += [as_text(m) for m in missing]
        result.problems = merged_problems(result.problems, (as_text(p) for p in problems))
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
        purged, kept, missing, undated, next_cursor, problems, undatable, lanes = run_script(
            "morgue_purge", client, keys, [keys.dead, keys.sweeper_totals], args)
        result.ids += [as_text(p) for p in purged]
        for raw in lanes:
            # '=' .. group, '=' flat, '' in no lane: the script's reading of the lane filter
            label = as_text(raw)
            name = label[1:] if label else None
            result.lanes[name] = result.lanes.get(name, 0) + 1
        result.purged = len(result.ids)
        result.kept.update(_pairs(kept))
        result.missing += [as_text(m) for m in missing]
        result.undated += int(undated)
        result.undatable += int(undatable)
        result.problems = merged_problems(result.problems, (as_text(p) for p in problems))
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
