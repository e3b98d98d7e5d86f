"""``stats`` and ``list``: the read-only views of the morgue, as tables or JSON."""

from __future__ import annotations

import argparse
import shutil
import textwrap
from typing import IO, Any

from stalledpolicy import tables
from stalledpolicy.keyspace import QueueKeys
from stalledpolicy.morgue.exit_codes import EXIT_OK
from stalledpolicy.morgue.prompt import is_interactive
from stalledpolicy.morgue.render import (
    EXACT_COLUMNS,
    age_seconds,
    emit_json,
    iso_time,
    lane_cell,
    lane_label,
    lane_rows,
)
from stalledpolicy.redis_url.redaction import redact_urls

LAST_ERROR_MIN_WIDTH = 20
# LANE of a row that is missing or not a hash (its LAST ERROR says which): in no
# lane, as stats and the previews say; ``-`` is the flat jobs, which --lane '' selects
NO_LANE_SHORT = "[no lane]"
LAST_ERROR_DEFAULT_WIDTH = 60
# a marker's state or warning name is cut to this many columns: a long one
# would leave no room for the error the column is for (JSON has it whole)
MARKER_LABEL_WIDTH = 16
# the legend under `list`'s table fits an 80-column terminal
LEGEND_WIDTH = 80


def server_now_ms(client: Any, queue: str) -> int:
    """Ages are measured on the clock that stamped the deaths: the server
    holding the queue's slot (on a cluster, not whichever node TIME lands on)."""
    if hasattr(client, "get_node_from_key"):
        node = client.get_node_from_key(QueueKeys(queue).dead)
        seconds, micros = client.time(target_nodes=node)
    else:
        seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def show_stats(client: Any, args: argparse.Namespace, engine: Any, out: IO[str]) -> int:
    stats = engine.morgue_stats(client, args.queue)
    now_ms = server_now_ms(client, args.queue)
    oldest_age = age_seconds(now_ms, stats.oldest_dead_at_ms)
    note = None if stats.size else unknown_queue_note(client, args.queue)
    if args.output == "json":
        emit_json(with_note({
            "queue": args.queue,
            "size": stats.size,
            "lanes": {name: count for name, count in stats.lanes.items()},
            "oldest_dead_at_ms": stats.oldest_dead_at_ms,
            "oldest_dead_at": iso_time(stats.oldest_dead_at_ms),
            "oldest_age_s": oldest_age,
            "unreadable": stats.unreadable,
            "error": None,
        }, note), out)
        return EXIT_OK
    oldest = "-" if oldest_age is None else (
        f"{tables.format_age(oldest_age)} ({iso_time(stats.oldest_dead_at_ms)})"
    )
    pairs: list[tuple[str, Any]] = [("queue", args.queue), ("dead jobs", stats.size), ("oldest death", oldest)]
    if note:
        pairs.append(("note", note))
    if stats.unreadable:
        pairs.append(("unreadable rows", f"{stats.unreadable} (missing or not a hash: in no lane; "
                                         "`list` shows them, `purge --id` removes them)"))
    out.write(tables.render_pairs(pairs) + "\n")
    if stats.lanes:
        out.write("\n" + tables.render_table(("LANE", "DEAD"), lane_rows(stats.lanes), right=("DEAD",),
                                                  exact=EXACT_COLUMNS) + "\n")
    return EXIT_OK


def report_view_failure(args: argparse.Namespace, out: IO[str], error: str) -> None:
    """With ``-o json``, the document of a ``stats`` or ``list`` that ended on
    an error or a signal (every exit but bad usage, 2), as replay and purge
    print theirs: the shape of a good run, what was not read ``null``, and
    ``error`` saying why (stderr says it too). Tables print nothing here."""
    if args.output != "json":
        return
    if args.morgue_action == "stats":
        document: dict[str, Any] = {
            "queue": args.queue, "size": None, "lanes": None, "oldest_dead_at_ms": None, "oldest_dead_at": None,
            "oldest_age_s": None, "unreadable": None,
        }
    else:
        document = {"queue": args.queue, "lane": args.lane, "total": None, "offset": args.offset,
                    "limit": args.limit, "jobs": None}
    document["error"] = error
    emit_json(document, out)


# what a row whose state is not dead means, in the legend under the table
_NOT_DEAD_MEANING = ("the row's state is S, not dead (the row says the job is elsewhere): replay and purge "
                     "leave it in the morgue")


def _markers(job: Any) -> list[tuple[str, str, str]]:
    """The short markers of a readable row, each as (marker, its legend key,
    what the key means): a state other than ``dead`` (replay and purge leave
    it in the morgue: the row says the job lives elsewhere), a warning (a
    ghost row, which the replay leaves too, or a flow child; the scripts write
    one as ``name: explanation``, its name is the marker)."""
    markers = []
    state = getattr(job, "state", None)
    if state is not None and state != "dead":
        # quoted as the replay's and the purge's reasons quote it (an empty state shows '')
        markers.append((f"[not dead: '{tables.truncate_unescaped(state, MARKER_LABEL_WIDTH)}']", "[not dead: 'S']",
                        _NOT_DEAD_MEANING))
    warning = getattr(job, "warning", None)
    if warning:
        name, _, explanation = warning.partition(": ")
        marker = f"[{tables.truncate_unescaped(name, MARKER_LABEL_WIDTH)}]"
        markers.append((marker, marker, explanation or warning))
    return markers


def _error_cell(job: Any) -> str | None:
    """LAST ERROR, after the row's :func:`_markers`, or the reason a row is
    unreadable. The markers are short so that the column cut for a pipe still
    shows the error; :func:`_legend` explains them under the table."""
    problem = getattr(job, "problem", None)
    if problem:
        # a row missing or not a hash has no error to show: the reason is the whole cell
        return f"[unreadable row: {problem}]"
    markers = [marker for marker, _, _ in _markers(job)]
    if not markers:
        return _shown_error(job)
    return " ".join([*markers, _shown_error(job) or ""]).rstrip()


def _shown_error(job: Any) -> str | None:
    """The row's last error as shown (table and JSON): a worker's error may
    quote a URL with a password (``Timeout talking to redis://:pw@db``); it
    is masked, the rest kept as written."""
    return None if job.last_error is None else redact_urls(job.last_error)


def _legend(jobs: list[Any]) -> list[str]:
    """One line per legend key of the markers on the page, with what it means
    (``-o json`` gives the row's ``state`` and ``warning`` whole), wrapped to
    LEGEND_WIDTH columns; none when no row is marked."""
    meanings: dict[str, str] = {}
    for job in jobs:
        if getattr(job, "problem", None):
            continue
        for _, key, meaning in _markers(job):
            meanings.setdefault(tables.printable(key), tables.printable(meaning))
    if not meanings:
        return []
    key_width = max(tables.display_width(key) for key in meanings)
    indent = " " * (key_width + len(tables.GAP))
    lines = []
    for key, meaning in meanings.items():
        first, *rest = textwrap.wrap(meaning, width=LEGEND_WIDTH - len(indent)) or [""]
        lines.append(key + " " * (key_width - tables.display_width(key)) + tables.GAP + first)
        lines.extend(indent + line for line in rest)
    return lines


def _last_error_width(out: IO[str], other_columns: int) -> int:
    """LAST ERROR fills the terminal's width; piped output gets a fixed cut."""
    if not is_interactive(out):
        return LAST_ERROR_DEFAULT_WIDTH
    columns = shutil.get_terminal_size((120, 24)).columns
    return max(LAST_ERROR_MIN_WIDTH, columns - other_columns)


def unknown_queue_note(client: Any, queue: str) -> str | None:
    """For an empty morgue: a note when no key of ``queue`` exists on this database
    at all (a mistyped --queue or database looks like an empty morgue), else None."""
    import redis  # deferred: every command imports this module (through morgue.cli), few talk to Redis

    try:
        if client.exists(*QueueKeys(queue).fixed_keys()):
            return None
    except redis.ResponseError:  # EXISTS not granted: no note, the morgue is still empty
        return None
    return (f"no key of queue {queue} exists on this database (emq:{{{queue}}}:*): "
            "check --queue and the URL's database")


def empty_lane_note(client: Any, engine: Any, queue: str, lane: str | None) -> str | None:
    """For a replay or purge of ``lane`` that selected nothing: a note when the
    lane holds no dead job at all while the morgue holds some (a mistyped --lane
    reads as "nothing to do"), else None. One walk of the morgue, only then."""
    if lane is None:
        return None
    size = int(client.zcard(QueueKeys(queue).dead))
    if not size or engine.morgue_page(client, queue, lane=lane, limit=1).total:
        return None
    return (f"no dead job is in lane {lane_label(lane)}; the morgue holds {size} in other lanes "
            f"(morgue stats --queue {queue} lists them)")


def with_note(document: dict[str, Any], note: str | None) -> dict[str, Any]:
    """``document`` with the :func:`unknown_queue_note` of an empty selection as
    its ``note`` member, just before ``error`` (no member when there is no note):
    the JSON says what the table says, so a script can tell a mistyped queue
    from an empty morgue."""
    if not note:
        return document
    noted: dict[str, Any] = {}
    for key, value in document.items():
        if key == "error":
            noted["note"] = note
        noted[key] = value
    noted.setdefault("note", note)
    return noted


def _nothing_listed(client: Any, args: argparse.Namespace, where: str, total: int) -> str:
    """Why a page is empty: past the end, an empty lane (of a morgue that
    holds jobs elsewhere), or an empty morgue."""
    if total:
        return f"{where}: no jobs at offset {args.offset} (total {total})"
    if args.lane is not None:
        size = int(client.zcard(QueueKeys(args.queue).dead))
        if size:
            return f"queue {args.queue}: no jobs in lane {lane_label(args.lane)} (the morgue holds {size})"
    note = unknown_queue_note(client, args.queue)
    return f"{where}: the morgue is empty" + (f"; {note}" if note else "")


def show_list(client: Any, args: argparse.Namespace, engine: Any, out: IO[str]) -> int:
    # with a lane, one (bounded, batched) walk of the morgue gives the page and the lane's total
    page = engine.morgue_page(client, args.queue, lane=args.lane, limit=args.limit, offset=args.offset)
    jobs, total = page.jobs, page.total
    now_ms = server_now_ms(client, args.queue)
    if args.output == "json":
        emit_json(with_note({
            "queue": args.queue,
            "lane": args.lane,
            "total": total,
            "offset": args.offset,
            "limit": args.limit,
            "jobs": [
                {
                    # "" a flat job (as stats and replay write it), null a row in no lane
                    "id": job.id, "lane": None if getattr(job, "problem", None) else job.lane or "",
                    "state": job.state, "stalled": job.stalled,
                    "attempts": job.attempts, "last_error": _shown_error(job),
                    "dead_at_ms": job.dead_at_ms, "dead_at": iso_time(job.dead_at_ms),
                    "age_s": age_seconds(now_ms, job.dead_at_ms),
                    "problem": getattr(job, "problem", None),
                    "warning": getattr(job, "warning", None),
                }
                for job in jobs
            ],
            "error": None,
        }, None if total else unknown_queue_note(client, args.queue)), out)
        return EXIT_OK
    where = f"queue {args.queue}" + (f", lane {lane_label(args.lane)}" if args.lane is not None else "")
    if not jobs:
        out.write(_nothing_listed(client, args, where, total) + "\n")
        return EXIT_OK
    headers = ("ID", "LANE", "STALLED", "ATTEMPTS", "DIED", "LAST ERROR")
    rows = [
        (job.id, NO_LANE_SHORT if getattr(job, "problem", None) else lane_cell(job.lane), job.stalled, job.attempts,
         tables.format_age(age_seconds(now_ms, job.dead_at_ms)), _error_cell(job))
        for job in jobs
    ]
    # the widest line, not the header: lines are right-stripped, and DIED's
    # header is narrower than its ages
    fixed = tables.render_table(headers[:-1], [row[:-1] for row in rows], exact=EXACT_COLUMNS).splitlines()
    width = _last_error_width(out, max(map(tables.display_width, fixed)) + len(tables.GAP))
    out.write(tables.render_table(
        headers, rows, right=("STALLED", "ATTEMPTS"), max_widths={"LAST ERROR": width}, exact=EXACT_COLUMNS,
    ) + "\n")
    legend = _legend(jobs)
    if legend:
        out.write("\n" + "\n".join(legend) + "\n")
    first, last = args.offset + 1, args.offset + len(jobs)
    footer = f"{where}: jobs {first}-{last} of {total}"
    if last < total:
        footer += f"; next page: --offset {last}"
    out.write("\n" + footer + "\n")
    return EXIT_OK
