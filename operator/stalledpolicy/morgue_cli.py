"""``stalledpolicy morgue stats|list|replay|purge``: the on-call tool for dead letters.

Readable tables by default, ``-o json`` for scripts. ``replay`` and ``purge``
change the morgue, so they show a preview (count, lanes, first ids, what would
be left alone; ``--dry-run`` stops there) and ask for confirmation unless
``--yes`` is given; without a terminal to ask on and without ``--yes`` they
refuse rather than guess.

What is confirmed is what runs: the preview's ids are pinned and the change is
applied to exactly those ids, so jobs dead-lettered while the prompt is open
are never swept up by a ``--lane`` or ``--all`` approved for fewer. An age
purge (``--older-than``) is the exception: it applies its rule when it runs
(a job can only join it by growing older, and the engine then records a time
of death on undated entries so that a later age purge can remove them). That
dating is a write too: when no job is old enough but some are undated, the real
call still runs, with the same consent (``--yes`` or the prompt); without
either, nothing is written and the note says so.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import IO, Any, Sequence

from stalledpolicy import tables
from stalledpolicy.durations import format_duration, parse_duration
from stalledpolicy.keyspace import InvalidQueueName, QueueKeys, validate_queue_name
from stalledpolicy.redis_url import check_redis_url, connect, redact_url, scrub, unreachable_errors

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_ABORTED = 4
EXIT_INTERRUPTED = 130

ENV_REDIS_URL = "STALLEDPOLICY_REDIS_URL"
ENV_QUEUE = "STALLEDPOLICY_QUEUE"

# ids printed in a table-mode preview before "... and N more"
PREVIEW_IDS = 20
LIST_DEFAULT_LIMIT = 50
# rows read per pipeline for the lanes of a purge preview
MORGUE_BATCH_READ = 500
# --limit and --offset count members of one sorted set, which holds at most 2**32 - 1
ROWS_MAX = 2**32 - 1
LAST_ERROR_MIN_WIDTH = 20
LAST_ERROR_DEFAULT_WIDTH = 60
CONNECT_TIMEOUT_S = 5.0
# generous: a morgue call is bounded by the engine, but a busy server may be slow
SOCKET_TIMEOUT_S = 30.0

EXIT_CODES_EPILOG = """\
exit codes:
  0    success (also: nothing matched, nothing to do); a --dry-run exits
       with the code the real run would have
  1    the operation failed or partly failed: some --id not in the morgue,
       jobs left in the morgue because their row is unreadable or not dead
       (the reasons are printed), jobs changed by someone else meanwhile, or
       a key of the queue of the wrong type kept the lanes or the totals
       from being updated (the jobs moved; the key is named)
  2    bad usage: unknown option, bad --queue, --redis-url (scheme, host,
       port, database or query option) or duration, --limit/--offset out of
       range, or a change refused because stdin is not a terminal and --yes
       was not given
  3    Redis unreachable or refused our credentials (or the connection was
       lost during the operation)
  4    aborted at the confirmation prompt (nothing changed)
  130  interrupted (Ctrl-C)

environment:
  STALLEDPOLICY_REDIS_URL  default for --redis-url
  STALLEDPOLICY_QUEUE      default for --queue
"""


class UsageError(Exception):
    """Bad input found after argparse (env values, cross-option rules)."""


# ---------------------------------------------------------------- arguments


def _int_between(minimum: int, maximum: int):
    """An argparse type: a whole number from ``minimum`` to ``maximum`` (>= 0).
    A number of any length is judged by its digits (int() refuses 4,300 digits
    and more) and never echoed whole."""

    def parse(text: str) -> int:
        number = re.fullmatch(r"\s*([+-]?)([0-9]+)\s*", text)
        if number is None:
            raise argparse.ArgumentTypeError(f"{_shown_number(text)} is not a whole number")
        sign, digits = number.groups()
        digits = digits.lstrip("0") or "0"
        if len(digits) > len(str(maximum)):
            if sign == "-":
                raise argparse.ArgumentTypeError(f"must be at least {minimum} (got {_shown_number(text)})")
            value = maximum + 1
        else:
            value = int(sign + digits)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum} (got {value})")
        if value > maximum:
            raise argparse.ArgumentTypeError(
                f"must be at most {maximum}, the most jobs a Redis sorted set holds "
                f"(got {_shown_number(text)})")
        return value

    return parse


def _shown_number(text: str) -> str:
    """``text`` quoted, or its start and length when it is too long to show."""
    if len(text) <= 40:
        return repr(text)
    return f"{text[:20]!r}... ({len(text)} characters)"


def _duration(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be longer than zero")
    return seconds


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--redis-url", metavar="URL",
        help=f"redis://[:password@]host:port/db or rediss://... (env {ENV_REDIS_URL}); "
        "a Redis Cluster node is detected and used as a cluster",
    )
    parser.add_argument("--queue", metavar="NAME", help=f"EchoMQ queue name (env {ENV_QUEUE})")
    parser.add_argument(
        "-o", "--output", choices=("table", "json"), default="table",
        help="table for people (default), json for scripts (one document on stdout)",
    )


def _change_options(parser: argparse.ArgumentParser, verb: str) -> None:
    parser.add_argument("--lane", metavar="GROUP",
                        help=f"{verb} only jobs of this lane (group); --lane '' selects jobs without a lane")
    parser.add_argument(
        "--id", dest="ids", action="append", metavar="JOB_ID",
        help=f"{verb} this job (repeatable)",
    )
    parser.add_argument(
        "--all", action="store_true",
        help=f"{verb} every job in the morgue; required when no other selection is given",
    )
    parser.add_argument("--dry-run", action="store_true", help="show what would change; change nothing")
    parser.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXIT_CODES_EPILOG
    actions = parser.add_subparsers(dest="morgue_action", metavar="ACTION", required=True)

    def leaf(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = actions.add_parser(
            name, help=help_text, description=help_text, epilog=EXIT_CODES_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _common(sub)
        sub.set_defaults(_morgue_parser=sub)
        return sub

    leaf("stats", "size of the morgue, jobs per lane, age of the oldest death")

    listing = leaf("list", "dead-lettered jobs in morgue order (job id order)")
    listing.add_argument("--lane", metavar="GROUP",
                         help="only jobs of this lane (group); --lane '' lists jobs without a lane")
    listing.add_argument(
        "--limit", type=_int_between(1, ROWS_MAX), default=LIST_DEFAULT_LIMIT,
        help=f"at most this many rows (default {LIST_DEFAULT_LIMIT})",
    )
    listing.add_argument("--offset", type=_int_between(0, ROWS_MAX), default=0, help="skip this many rows first")

    replay = leaf(
        "replay",
        "move dead jobs back to their lane (or pending) with the stall count reset",
    )
    _change_options(replay, "replay")

    purge = leaf("purge", "permanently delete dead jobs (rows and morgue entries)")
    purge.add_argument(
        "--older-than", type=_duration, metavar="DURATION",
        help="only jobs dead for longer than this (30m, 12h, 7d); an entry with no recorded "
        "time of death is kept and gets one (now), so a later purge can age it out",
    )
    _change_options(purge, "purge")


# -------------------------------------------------------------- redis access


def open_client(url: str) -> Any:
    """A decoded client for ``url`` (a RedisCluster on a cluster node).

    Job ids, lanes and errors are written by other programs and need not be
    UTF-8. ``surrogateescape`` decodes every byte (an undecodable one becomes a
    lone surrogate, which ``tables.printable`` shows as ``\\xNN`` and JSON as
    ``\\udcNN``) and encodes it back to the same byte, so such a job can be
    listed, replayed and purged by the id the preview pinned (``errors="replace"``
    would turn it into another id, not in the morgue)."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # One quick retry replaces a stale pooled connection; an on-call engineer
    # facing an outage wants exit 3 now, not after a backoff schedule.
    return connect(url, retry=Retry(NoBackoff(), 1), decode_responses=True,
                   encoding_errors="surrogateescape",
                   socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=SOCKET_TIMEOUT_S)


def server_now_ms(client: Any, queue: str) -> int:
    """Ages are measured on the clock that stamped the deaths: the server
    holding the queue's slot (on a cluster, not whichever node TIME lands on)."""
    if hasattr(client, "get_node_from_key"):
        node = client.get_node_from_key(QueueKeys(queue).dead)
        seconds, micros = client.time(target_nodes=node)
    else:
        seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


# --------------------------------------------------------------- confirming


def is_interactive(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def confirm(question: str, *, stdin: IO[str], stderr: IO[str]) -> bool:
    """Ask ``question [y/N]`` on ``stderr`` (stdout may be a JSON document) and
    read one answer line; only ``y``/``yes`` agree, end of input declines."""
    stderr.write(f"{question} [y/N] ")
    stderr.flush()
    try:
        answer = stdin.readline()
    except KeyboardInterrupt:
        stderr.write("\n")
        return False
    if not answer.endswith("\n"):
        stderr.write("\n")
    return answer.strip().lower() in ("y", "yes")


# ------------------------------------------------------------------- output


def _emit_json(document: dict, out: IO[str]) -> None:
    out.write(json.dumps(document, indent=2, sort_keys=False) + "\n")


def _jobs(count: int) -> str:
    return f"{count} job" if count == 1 else f"{count} jobs"


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _age_s(now_ms: int, then_ms: int | None) -> float | None:
    return None if then_ms is None else max(0.0, (now_ms - then_ms) / 1000)


def _lane_label(lane: str | None) -> str:
    return tables.printable(lane) if lane else tables.EMPTY


def _lane_rows(lanes: dict[str, int]) -> list[tuple[str, int]]:
    return [
        (_lane_label(name), count)
        for name, count in sorted(lanes.items(), key=lambda kv: (-kv[1], kv[0] or ""))
    ]


def _last_error_width(out: IO[str], other_columns: int) -> int:
    """LAST ERROR fills the terminal's width; piped output gets a fixed cut."""
    if not is_interactive(out):
        return LAST_ERROR_DEFAULT_WIDTH
    columns = shutil.get_terminal_size((120, 24)).columns
    return max(LAST_ERROR_MIN_WIDTH, columns - other_columns)


# ------------------------------------------------------------------ actions


def _stats(client: Any, args: argparse.Namespace, engine: Any, out: IO[str]) -> int:
    stats = engine.morgue_stats(client, args.queue)
    now_ms = server_now_ms(client, args.queue)
    oldest_age = _age_s(now_ms, stats.oldest_dead_at_ms)
    if args.output == "json":
        _emit_json({
            "queue": args.queue,
            "size": stats.size,
            "lanes": {name: count for name, count in stats.lanes.items()},
            "oldest_dead_at_ms": stats.oldest_dead_at_ms,
            "oldest_dead_at": _iso(stats.oldest_dead_at_ms),
            "oldest_age_s": oldest_age,
        }, out)
        return EXIT_OK
    oldest = "-" if oldest_age is None else (
        f"{tables.format_age(oldest_age)} ({_iso(stats.oldest_dead_at_ms)})"
    )
    out.write(tables.render_pairs([
        ("queue", args.queue), ("dead jobs", stats.size), ("oldest death", oldest),
    ]) + "\n")
    if stats.lanes:
        out.write("\n" + tables.render_table(("LANE", "DEAD"), _lane_rows(stats.lanes), right=("DEAD",)) + "\n")
    return EXIT_OK


def _error_cell(job: Any) -> str | None:
    problem = getattr(job, "problem", None)
    return f"[unreadable row: {problem}]" if problem else job.last_error


def _list(client: Any, args: argparse.Namespace, engine: Any, out: IO[str]) -> int:
    jobs = engine.morgue_list(client, args.queue, lane=args.lane, limit=args.limit, offset=args.offset)
    if args.lane is None:
        total = int(client.zcard(QueueKeys(args.queue).dead))
    else:
        # per-lane counts need a (bounded, batched) walk of the morgue
        total = engine.morgue_stats(client, args.queue).lanes.get(args.lane, 0)
    now_ms = server_now_ms(client, args.queue)
    if args.output == "json":
        _emit_json({
            "queue": args.queue,
            "lane": args.lane,
            "total": total,
            "offset": args.offset,
            "limit": args.limit,
            "jobs": [
                {
                    "id": job.id, "lane": job.lane, "state": job.state, "stalled": job.stalled,
                    "attempts": job.attempts, "last_error": job.last_error,
                    "dead_at_ms": job.dead_at_ms, "dead_at": _iso(job.dead_at_ms),
                    "age_s": _age_s(now_ms, job.dead_at_ms),
                    "problem": getattr(job, "problem", None),
                }
                for job in jobs
            ],
        }, out)
        return EXIT_OK
    where = f"queue {args.queue}" + (f", lane {_lane_label(args.lane)}" if args.lane is not None else "")
    if not jobs:
        note = "the morgue is empty" if total == 0 else f"no jobs at offset {args.offset} (total {total})"
        out.write(f"{where}: {note}\n")
        return EXIT_OK
    headers = ("ID", "LANE", "STALLED", "ATTEMPTS", "DIED", "LAST ERROR")
    rows = [
        (job.id, _lane_label(job.lane), job.stalled, job.attempts,
         tables.format_age(_age_s(now_ms, job.dead_at_ms)), _error_cell(job))
        for job in jobs
    ]
    fixed = tables.render_table(headers[:-1], [row[:-1] for row in rows]).splitlines()[0]
    width = _last_error_width(out, tables.display_width(fixed) + len(tables.GAP))
    out.write(tables.render_table(
        headers, rows, right=("STALLED", "ATTEMPTS"), max_widths={"LAST ERROR": width},
    ) + "\n")
    first, last = args.offset + 1, args.offset + len(jobs)
    footer = f"{where}: jobs {first}-{last} of {total}"
    if last < total:
        footer += f"; next page: --offset {last}"
    out.write("\n" + footer + "\n")
    return EXIT_OK


def _selection(args: argparse.Namespace) -> dict[str, Any]:
    """The engine's filter keywords; refuses an empty or contradictory selection."""
    ids = list(dict.fromkeys(args.ids)) if args.ids else None
    older_than = getattr(args, "older_than", None)
    filters = [name for name, given in (
        ("--lane", args.lane is not None), ("--id", ids is not None), ("--older-than", older_than is not None),
    ) if given]
    if args.all and filters:
        raise UsageError(f"--all selects every job; it cannot be combined with {', '.join(filters)}")
    if not args.all and not filters:
        choices = "--lane, --id" + (", --older-than" if hasattr(args, "older_than") else "")
        raise UsageError(
            f"say which jobs to {args.morgue_action}: {choices}, or --all for the whole morgue"
        )
    if ids is not None and len(filters) > 1:
        others = ", ".join(f for f in filters if f != "--id")
        raise UsageError(f"--id cannot be combined with {others}; the ids already name the jobs")
    selection: dict[str, Any] = {"lane": args.lane, "ids": ids}
    if hasattr(args, "older_than"):
        selection["older_than_s"] = older_than
    return selection


def _ids_preview(ids: Sequence[str]) -> str:
    shown = ", ".join(tables.printable(i) for i in ids[:PREVIEW_IDS])
    more = len(ids) - PREVIEW_IDS
    return shown + (f", ... and {more} more (-o json lists all)" if more > 0 else "")


@dataclass
class Outcome:
    """One engine call's answer, the same shape for replay and purge."""

    ids: list[str]  # changed (or, in a dry run, to be changed)
    lanes: dict[str, int] = field(default_factory=dict)  # replay only; "" = flat
    missing: list[str] = field(default_factory=list)  # asked for by id, not in the morgue
    refused: dict[str, str] = field(default_factory=dict)  # left in the morgue, id -> why
    undated: int = 0  # age purge: entries without a time of death (kept)
    problems: list[str] = field(default_factory=list)  # keys of the wrong type met after the moves


def _engine_call(engine: Any, client: Any, args: argparse.Namespace, selection: dict[str, Any], *,
                 ids: list[str] | None, dry_run: bool) -> Outcome:
    """``ids`` replaces the lane filter: pinned ids were selected by it already."""
    lane = selection["lane"] if ids is None else None
    if args.morgue_action == "replay":
        result = engine.morgue_replay(client, args.queue, lane=lane, ids=ids, dry_run=dry_run)
        return Outcome(ids=list(result.ids), lanes=dict(result.lanes), missing=list(result.missing),
                       refused=dict(getattr(result, "unreplayable", {}) or {}),
                       problems=list(getattr(result, "problems", []) or []))
    result = engine.morgue_purge(client, args.queue, older_than_s=selection["older_than_s"], lane=lane,
                                 ids=ids, dry_run=dry_run)
    return Outcome(ids=list(result.ids), missing=list(getattr(result, "missing", []) or []),
                   refused=dict(getattr(result, "kept", {}) or {}),
                   undated=int(getattr(result, "undated", 0) or 0),
                   problems=list(getattr(result, "problems", []) or []))


def _purge_lanes(client: Any, queue: str, ids: Sequence[str]) -> dict[str, int]:
    """Jobs per lane among ``ids`` (the purge script reports ids only): for the
    preview shown before the question. A row that is gone or not a hash counts
    as no lane."""
    keys = QueueKeys(queue)
    lanes: dict[str, int] = {}
    for start in range(0, len(ids), MORGUE_BATCH_READ):
        pipe = client.pipeline(transaction=False)
        for job_id in ids[start:start + MORGUE_BATCH_READ]:
            pipe.hget(keys.job(job_id), "group")
        for group in pipe.execute(raise_on_error=False):
            name = group if isinstance(group, str) else ""
            lanes[name] = lanes.get(name, 0) + 1
    return lanes


def _show_preview(err: IO[str], args: argparse.Namespace, preview: Outcome, lanes: dict[str, int], *,
                  older_than: float | None) -> None:
    """What the question is about, on stderr before it: count, lanes, first ids,
    and what would be left alone."""
    verb = args.morgue_action
    age = f" (dead for more than {format_duration(older_than)})" if older_than is not None else ""
    err.write(f"{verb} preview for queue {args.queue}{age}: {_jobs(len(preview.ids))}\n")
    if preview.ids:
        if lanes:
            err.write(tables.render_table(("LANE", "JOBS"), _lane_rows(lanes), right=("JOBS",)) + "\n")
        err.write(f"ids: {_ids_preview(preview.ids)}\n")
    if preview.refused:
        err.write(f"{_jobs(len(preview.refused))} would be left in the morgue (the reasons follow the "
                  f"{verb}): {_ids_preview(list(preview.refused))}\n")
    if preview.missing:
        err.write(f"requested ids not in the morgue: {_ids_preview(preview.missing)}\n")
    if preview.undated:
        err.write(f"{_jobs(preview.undated)} without a recorded time of death would be kept and get "
                  "now as their time of death\n")


def _change(client: Any, args: argparse.Namespace, selection: dict[str, Any], engine: Any,
            out: IO[str], err: IO[str], stdin: IO[str]) -> int:
    replaying = args.morgue_action == "replay"
    verb, past = ("replay", "replayed") if replaying else ("purge", "purged")
    queue = args.queue
    older_than = selection.get("older_than_s")

    preview = _engine_call(engine, client, args, selection, ids=selection["ids"], dry_run=True)
    # An age purge writes even when no job is old enough: it records a time of
    # death on the undated entries (so a later age purge can remove them). That
    # write needs the real call, and the same consent as any change.
    dating_only = not preview.ids and older_than is not None and preview.undated > 0
    if args.dry_run or not (preview.ids or dating_only):
        return _report(args, out, err, preview, dry_run=args.dry_run, verb=verb, past=past)

    count = len(preview.ids)
    if not args.yes:
        if not is_interactive(stdin):
            if dating_only:
                # Nothing to purge, which is what was asked; the dating is left
                # undone, and the report says so.
                return _report(args, out, err, preview, dry_run=False, verb=verb, past=past, dated=False)
            err.write(
                f"stalledpolicy morgue {verb}: refusing to {verb} {_jobs(count)} of queue {queue} "
                "without confirmation: stdin is not a terminal; pass --yes to confirm "
                "(or --dry-run to preview)\n"
            )
            return EXIT_USAGE
        lanes = preview.lanes if replaying else _purge_lanes(client, queue, preview.ids)
        _show_preview(err, args, preview, lanes, older_than=older_than)
        if dating_only:
            question = (f"Nothing to purge. Record now as the time of death of the {_jobs(preview.undated)} "
                        "that have none, so a later --older-than purge can remove them? (The purge runs "
                        "its age rule: a job that grew old enough meanwhile is purged.)")
        elif replaying:
            question = f"Replay {_jobs(count)} of queue {queue}?"
        else:
            age = f" (dead for more than {format_duration(older_than)})" if older_than is not None else ""
            question = (f"Purge {_jobs(count)} of queue {queue}{age}? This permanently deletes "
                        f"{'it' if count == 1 else 'them'} and cannot be undone.")
        if not confirm(question, stdin=stdin, stderr=err):
            err.write(f"aborted: nothing {'dated or ' if preview.undated else ''}{past}\n")
            return EXIT_ABORTED

    if older_than is not None:
        # An age purge applies its rule as it runs: a job can only join the
        # selection by growing older, which is what was asked; and the engine
        # records a time of death on undated entries so a later purge can age them.
        done = _engine_call(engine, client, args, selection, ids=None, dry_run=False)
        done.missing = preview.missing
        return _report(args, out, err, done, dry_run=False, verb=verb, past=past, previewed=count)
    # Otherwise what was confirmed is exactly what runs: jobs dead-lettered into
    # the lane (or the morgue) while the prompt was open are not swept along.
    done = _engine_call(engine, client, args, selection, ids=preview.ids, dry_run=False)
    vanished, done.missing = done.missing, preview.missing
    done.refused = {**preview.refused, **done.refused}
    return _report(args, out, err, done, dry_run=False, verb=verb, past=past, vanished=vanished)


def _report(args: argparse.Namespace, out: IO[str], err: IO[str], outcome: Outcome, *, dry_run: bool,
            verb: str, past: str, vanished: Sequence[str] = (), previewed: int | None = None,
            dated: bool = True) -> int:
    """``dated``: in a real run, whether the call that ran recorded a time of
    death on the undated entries (False: only the preview ran)."""
    queue = args.queue
    ids = outcome.ids
    code = EXIT_FAILED if (outcome.missing or outcome.refused or vanished or outcome.problems) else EXIT_OK
    if args.output == "json":
        document: dict[str, Any] = {
            "queue": queue, "action": verb, "dry_run": dry_run,
            ("would_" + verb if dry_run else past): len(ids), "ids": ids,
        }
        if verb == "replay":
            document["lanes"] = outcome.lanes
        document["missing"] = outcome.missing
        document["refused"] = outcome.refused
        document["vanished"] = list(vanished)
        document["problems"] = outcome.problems
        if verb == "purge":
            document["undated"] = outcome.undated
            document["undated_dated"] = bool(outcome.undated) and not dry_run and dated
        _emit_json(document, out)
    else:
        if dry_run:
            out.write(f"dry run: would {verb} {_jobs(len(ids))} of queue {queue} (nothing changed)\n")
        elif not ids:
            out.write(f"nothing to {verb} in queue {queue}\n")
        else:
            out.write(f"{past} {_jobs(len(ids))} of queue {queue}\n")
        if ids:
            if outcome.lanes:
                out.write(tables.render_table(("LANE", "JOBS"), _lane_rows(outcome.lanes), right=("JOBS",)) + "\n")
            out.write(f"ids: {_ids_preview(ids)}\n")
    if previewed is not None and previewed != len(ids):
        err.write(f"note: the preview counted {_jobs(previewed)}; the morgue changed before the purge ran\n")
    if outcome.undated:
        one = outcome.undated == 1
        was, its = ("was", "its") if one else ("were", "their")
        if dry_run:
            note = (f"would be kept; a real run records now as {its} time of death, so a later "
                    f"--older-than purge can remove {'it' if one else 'them'}")
        elif dated:
            note = (f"{was} kept; {its} time of death is now recorded (the time of this run; not on a "
                    "row that is missing or unreadable), so a later --older-than purge can remove "
                    f"{'it' if one else 'them'}")
        else:
            note = (f"{was} kept and not dated (nothing was written); run again with --yes to record "
                    f"now as {its} time of death, so a later --older-than purge can remove "
                    f"{'it' if one else 'them'}")
        err.write(f"note: {_jobs(outcome.undated)} without a recorded time of death {note}\n")
    if outcome.missing:
        err.write(f"requested ids not in the morgue of queue {queue}: {_ids_preview(outcome.missing)}\n")
    if outcome.refused:
        action = f"would not {verb}" if dry_run else f"did not {verb}"
        err.write(f"{action} {_jobs(len(outcome.refused))} (left in the morgue):\n")
        reasons = [(job_id, why) for job_id, why in list(outcome.refused.items())[:PREVIEW_IDS]]
        err.write(tables.render_table(("ID", "WHY"), reasons) + "\n")
        if len(outcome.refused) > PREVIEW_IDS:
            err.write(f"... and {len(outcome.refused) - PREVIEW_IDS} more (-o json lists all)\n")
    for problem in outcome.problems:
        err.write(f"warning: {tables.printable(problem)}\n")
    if vanished:
        err.write(f"{_jobs(len(vanished))} left the morgue between the preview and the change "
                  f"(replayed or purged by someone else meanwhile): {_ids_preview(vanished)}\n")
    return code


ACTIONS = {"stats": _stats, "list": _list}


# ---------------------------------------------------------------------- run


def _resolve(args: argparse.Namespace) -> None:
    """Fill --redis-url/--queue from the environment and validate; UsageError names the setting."""
    args.redis_url = args.redis_url or os.environ.get(ENV_REDIS_URL) or None
    queue = args.queue if args.queue is not None else os.environ.get(ENV_QUEUE)
    if not args.redis_url:
        raise UsageError(f"--redis-url is required (or set {ENV_REDIS_URL}), e.g. redis://host:6379/0")
    problem = check_redis_url(args.redis_url)
    if problem is not None:
        # the problem names the part that is wrong; no part of the URL is shown
        # (a malformed one cannot be trusted to redact cleanly)
        raise UsageError(f"--redis-url (or {ENV_REDIS_URL}): {problem}")
    if queue is None:
        raise UsageError(f"--queue is required (or set {ENV_QUEUE})")
    try:
        args.queue = validate_queue_name(queue)
    except InvalidQueueName as exc:
        raise UsageError(f"--queue (or {ENV_QUEUE}): {exc}") from None


def run(args: argparse.Namespace, *, stdin: IO[str] | None = None, stdout: IO[str] | None = None,
        stderr: IO[str] | None = None) -> int:
    stdin = stdin or sys.stdin
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    for stream in (out, err):
        if stream in (sys.stdout, sys.stderr) and hasattr(stream, "reconfigure"):
            # the last guard for text from Redis that is not UTF-8 (kept as lone
            # surrogates, see open_client): shown escaped, never a UnicodeEncodeError
            stream.reconfigure(errors="backslashreplace")
    prog = f"stalledpolicy morgue {args.morgue_action}"
    changing = args.morgue_action not in ACTIONS
    try:
        _resolve(args)
        # a bad selection is refused before Redis is even contacted
        selection = _selection(args) if changing else None
    except UsageError as exc:
        err.write(f"{prog}: error: {exc}\n")
        return EXIT_USAGE

    import redis

    from stalledpolicy import engine

    url = args.redis_url
    where = redact_url(url)
    client = None
    try:
        client = open_client(url)
        if not changing:
            return ACTIONS[args.morgue_action](client, args, engine, out)
        return _change(client, args, selection, engine, out, err, stdin)
    except ValueError as exc:
        # before a client exists: redis-py's URL parser (bad port, db, option);
        # after: the engine refusing an argument (it names the field)
        subject = f"--redis-url {where}: " if client is None else ""
        err.write(f"{prog}: error: {subject}{scrub(str(exc), url)}\n")
        return EXIT_USAGE
    except BrokenPipeError:
        # the reader went away (`morgue list | head`): not an error worth a traceback;
        # point stdout at /dev/null so the interpreter's final flush stays quiet.
        # (Before the OSError of an outage: BrokenPipeError is one too.)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, out.fileno())
        except (AttributeError, OSError, ValueError):
            pass
        finally:
            os.close(devnull)
        return EXIT_OK
    except unreachable_errors() as exc:
        reason = scrub(str(exc), url) or type(exc).__name__
        if client is None:
            err.write(f"{prog}: cannot reach Redis at {where}: {reason}\n")
        else:
            err.write(f"{prog}: lost the connection to Redis at {where}: {reason}\n")
            if changing and not args.dry_run:
                err.write("the change may have been partly applied; check with "
                          "'stalledpolicy morgue stats' and 'list'\n")
        return EXIT_UNREACHABLE
    except redis.RedisError as exc:
        err.write(f"{prog}: failed: {scrub(str(exc), url)}\n")
        return EXIT_FAILED
    except KeyboardInterrupt:
        err.write(f"\n{prog}: interrupted\n")
        if changing and not args.dry_run:
            err.write("the change may have been partly applied; check with "
                      "'stalledpolicy morgue stats' and 'list'\n")
        return EXIT_INTERRUPTED
    finally:
        if client is not None:
            client.close()
