"""The morgue read: stats, list and a page with its total, each over bounded
script calls (docs/scripts.md, morgue_scan); replay and purge, which change
it, are in :mod:`stalledpolicy.engine.morgue_change`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stalledpolicy.engine.calls import as_counter, as_text, check_positive, run_script
from stalledpolicy.keyspace import QueueKeys

#: ids per morgue script call (replay, purge, list pages; stats: MORGUE_STATS_BATCH)
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
    #: set for a row the replay refuses though it reads as a job (a ghost row),
    #: or for a flow child whose parent waits for it
    warning: str | None = None


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


def _job(raw: Sequence[Any]) -> DeadJob:
    job_id, group, stalled, attempts, last_error, dead_at, state, problem, warning = (as_text(v) for v in raw)
    return DeadJob(
        id=job_id, lane=group or None, stalled=as_counter(stalled), attempts=as_counter(attempts),
        last_error=last_error, dead_at_ms=as_counter(dead_at), state=state, problem=problem,
        warning=warning,
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
