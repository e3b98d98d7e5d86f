"""The morgue's changes: replay and purge, each over bounded script calls
(docs/scripts.md, morgue_replay and morgue_purge); what they select by is read
as :mod:`stalledpolicy.engine.morgue` reads it for stats and list."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stalledpolicy.engine import morgue
from stalledpolicy.engine.calls import as_text, check_positive, merged_problems, run_script
from stalledpolicy.keyspace import QueueKeys

# The batch is read as ``morgue.MORGUE_BATCH`` at each call, never imported by
# name: one setting for the reads and the changes, which tests set on
# engine.morgue.


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


def _unique(ids: Iterable[str | bytes]) -> list[str | bytes]:
    """The ids once each, as given: a bytes id is sent as it is (decoded, a byte
    that is not UTF-8 would become U+FFFD: another job's id, or none)."""
    unique = list(dict.fromkeys(ids))
    for job_id in unique:
        if not isinstance(job_id, (str, bytes)) or not job_id:
            raise ValueError(f"ids: every id must be a non-empty string, got {job_id!r}")
    return unique


def _pairs(flat: Sequence[Any]) -> list[tuple[str, str]]:
    return [(as_text(flat[i]), as_text(flat[i + 1])) for i in range(0, len(flat), 2)]


def _replay_keys(keys: QueueKeys) -> list[str]:
    return [keys.dead, keys.pending, keys.ring, keys.gactive, keys.glimit, keys.paused, keys.wake,
            keys.sweeper_totals]


def _call_answered(result: ReplayResult | PurgeResult, missing: Sequence[Any], problems: Sequence[Any],
                   progress: Callable[[Any], None] | None) -> None:
    """What a replay call and a purge call both answer, added to ``result``;
    then ``progress`` sees the result so far."""
    result.missing += [as_text(m) for m in missing]
    result.problems = merged_problems(result.problems, (as_text(p) for p in problems))
    if progress is not None:
        progress(result)


def _run_calls(call: Callable[[str, str | bytes, Sequence[str | bytes]], str | bytes], ids: Sequence[str] | None,
               should_stop: Callable[[], bool], wants_more: Callable[[], bool] = lambda: True) -> None:
    """The calls of one change: ``ids`` a batch a call, else a walk of the
    whole morgue from cursor to cursor. ``wants_more`` (room left under a
    limit) is asked before ``should_stop``, which is asked between calls only."""
    if ids is not None:
        wanted = _unique(ids)
        for start in range(0, len(wanted), morgue.MORGUE_BATCH):
            if not wants_more():
                break
            if start and should_stop():
                break
            call("ids", "", wanted[start:start + morgue.MORGUE_BATCH])
        return
    cursor = call("scan", "", ())
    while cursor and wants_more() and not should_stop():
        cursor = call("scan", cursor, ())


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

    def call(mode: str, cursor: str | bytes, chunk: Sequence[str | bytes]) -> str | bytes:
        batch = morgue.MORGUE_BATCH
        budget = batch if limit is None else min(batch, limit - result.replayed)
        args = [keys.prefix, dry, _lane_filter(lane), mode, cursor, batch, budget, *chunk]
        replayed, refused, missing, next_cursor, problems = run_script(
            "morgue_replay", client, keys, _replay_keys(keys), args)
        for job_id, job_lane in _pairs(replayed):
            result.ids.append(job_id)
            result.lanes[job_lane] = result.lanes.get(job_lane, 0) + 1
        result.replayed = len(result.ids)
        result.unreplayable.update(_pairs(refused))
        _call_answered(result, missing, problems, progress)
        cursor_sent: str | bytes = next_cursor  # as sent (see morgue._scan)
        return cursor_sent

    _run_calls(call, ids, should_stop, wants_more=lambda: limit is None or result.replayed < limit)
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

    def call(mode: str, cursor: str | bytes, chunk: Sequence[str | bytes]) -> str | bytes:
        args = [keys.prefix, dry, _lane_filter(lane), mode, min_age, cursor, morgue.MORGUE_BATCH, *chunk]
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
        result.undated += int(undated)
        result.undatable += int(undatable)
        _call_answered(result, missing, problems, progress)
        cursor_sent: str | bytes = next_cursor  # as sent (see morgue._scan)
        return cursor_sent

    _run_calls(call, ids, should_stop)
    return result
