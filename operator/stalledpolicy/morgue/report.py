"""What a replay or purge prints: the preview before the question (stderr),
then the outcome (stdout, a table or one JSON document) and the notes,
warnings and reasons (stderr). ``report_outcome`` also picks the exit code."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

from stalledpolicy import tables
from stalledpolicy.durations import format_duration
from stalledpolicy.morgue.exit_codes import EXIT_FAILED, EXIT_OK
from stalledpolicy.morgue.render import EXACT_COLUMNS, PREVIEW_IDS, emit_json, ids_preview, jobs_phrase, lane_rows
from stalledpolicy.morgue.views import with_note

if TYPE_CHECKING:  # change imports this module to report its outcomes
    from stalledpolicy.morgue.change import Outcome


PAST_TENSE = {"replay": "replayed", "purge": "purged"}  # of the morgue CLI's changes

# why an entry whose row is missing or not a hash outlives every age purge
_UNDATABLE = ("such an entry has no time of death and cannot be given one, so no --older-than purge "
              "removes it; purge it by --id (or with --all), without --older-than")


def show_preview(err: IO[str], args: argparse.Namespace, preview: Outcome, *,
                 older_than: float | None) -> None:
    """What the question is about, on stderr before it: count, lanes, first ids,
    and what would be left alone."""
    verb = args.morgue_action
    age = f" (dead for more than {format_duration(older_than)})" if older_than is not None else ""
    err.write(f"{verb} preview for queue {args.queue}{age}: {jobs_phrase(len(preview.ids))}\n")
    if preview.ids:
        if preview.lanes:
            err.write(tables.render_table(("LANE", "JOBS"), lane_rows(preview.lanes), right=("JOBS",),
                                          exact=EXACT_COLUMNS) + "\n")
        err.write(f"ids: {ids_preview(preview.ids)}\n")
    if preview.refused:
        err.write(f"{jobs_phrase(len(preview.refused))} would be left in the morgue (the reasons follow the "
                  f"{verb}): {ids_preview(list(preview.refused))}\n")
    if preview.missing:
        err.write(f"requested ids not in the morgue: {ids_preview(preview.missing)}\n")
    if preview.undated:
        its = "its" if preview.undated == 1 else "their"
        err.write(f"{jobs_phrase(preview.undated)} without a valid time of death would be kept and get "
                  f"now as {its} time of death\n")
    if preview.undatable:
        err.write(f"{jobs_phrase(preview.undatable)} whose row is missing or not a hash would be kept: "
                  f"{_UNDATABLE}\n")


def _document(args: argparse.Namespace, outcome: Outcome, *, dry_run: bool, verb: str, past: str,
              vanished: Sequence[str] = (), dated: bool = True, not_reached: Sequence[str] | None = None,
              error: str | None = None, outcome_unknown: bool = False, note: str | None = None
              ) -> dict[str, Any]:
    """The one JSON document of a replay or purge, whichever way it ended: done,
    stopped by a signal (before the change too: nothing changed), or ended by an
    error (``error``; ``outcome_unknown``: a call was sent and got no answer).
    ``note``: the :func:`views.unknown_queue_note` of an empty selection."""
    document: dict[str, Any] = {
        "queue": args.queue, "action": verb, "dry_run": dry_run,
        ("would_" + verb if dry_run else past): len(outcome.ids), "ids": outcome.ids,
    }
    # as stats writes them: flat jobs under "", rows missing or not a hash (in no
    # lane, which only a purge removes) counted apart
    document["lanes"] = {lane: count for lane, count in outcome.lanes.items() if lane is not None}
    if verb == "purge":
        document["unreadable"] = outcome.lanes.get(None, 0)
    document["missing"] = outcome.missing
    document["refused"] = outcome.refused
    document["vanished"] = list(vanished)
    document["problems"] = outcome.problems
    document["stopped_early"] = outcome.stopped_by is not None
    document["signal"] = outcome.stopped_by
    document["not_reached"] = None if not_reached is None else list(not_reached)
    if verb == "purge":
        document["undated"] = outcome.undated
        document["undated_dated"] = bool(outcome.undated) and not dry_run and dated
        document["undatable"] = outcome.undatable
    document["error"] = error
    document["outcome_unknown"] = outcome_unknown
    return with_note(document, note)


def _failure_summary(outcome: Outcome, *, dry_run: bool, verb: str, past: str, vanished: Sequence[str],
                     not_reached: Sequence[str] | None) -> str | None:
    """The ``error`` of a run that exits other than 0 though every call was
    answered: one sentence counting what failed (the members beside it say
    which ids and why); None when nothing did."""
    parts = []
    if outcome.missing:
        count = len(outcome.missing)
        parts.append(f"{count} id{'' if count == 1 else 's'} not in the morgue")
    if outcome.refused:
        parts.append(f"{jobs_phrase(len(outcome.refused))} {'would not be' if dry_run else 'not'} {past} "
                     "(left in the morgue)")
    if vanished:
        parts.append(f"{jobs_phrase(len(vanished))} left the morgue before the {verb} reached "
                     f"{'it' if len(vanished) == 1 else 'them'}")
    if outcome.problems:
        count = len(outcome.problems)
        parts.append(f"{count} problem{'' if count == 1 else 's'} (see problems)")
    if outcome.stopped_by:
        stopped = f"stopped by {outcome.stopped_by} with {jobs_phrase(len(outcome.ids))} {past}"
        if not_reached:
            stopped += f" and {jobs_phrase(len(not_reached))} not reached"
        elif not_reached is None:
            stopped += " (jobs not reached are still in the morgue)"
        parts.append(stopped)
    return "; ".join(parts) or None


def report_unfinished(args: argparse.Namespace, out: IO[str], outcome: Outcome, *, error: str | None = None,
                      outcome_unknown: bool = False) -> None:
    """With ``-o json``, the document of a replay or purge that ended before its
    report (a signal before or between calls, an error, the prompt declined):
    what the real calls answered so far changed (``outcome``, empty when nothing
    did), in the shape of every other run, so a script reads one document
    whatever happened. Tables print nothing here: stderr says it all."""
    if args.output != "json":
        return
    verb = args.morgue_action
    past = PAST_TENSE[verb]
    emit_json(_document(args, outcome, dry_run=args.dry_run, verb=verb, past=past, error=error,
                        outcome_unknown=outcome_unknown), out)


def report_outcome(args: argparse.Namespace, out: IO[str], err: IO[str], outcome: Outcome, *, dry_run: bool,
                   verb: str, past: str, vanished: Sequence[str] = (), previewed: int | None = None,
                   dated: bool = True, not_reached: Sequence[str] | None = None, note: str | None = None) -> int:
    """``dated``: in a real run, whether the call that ran recorded a time of
    death on the undated entries (False: only the preview ran). A run stopped
    by a signal (``outcome.stopped_by``) reports what it did so far and, for
    confirmed ids, those it did not reach (``not_reached``; None when the
    run applied a rule rather than pinned ids). ``note``: the
    :func:`views.unknown_queue_note` of an empty selection, after its first line
    (``note`` in JSON). ``error`` in JSON is null only when the run exits 0: it
    sums up what made it exit 1 (returned here) or a signal's 130/143 (the
    caller's to return)."""
    queue = args.queue
    ids = outcome.ids
    code = EXIT_FAILED if (outcome.missing or outcome.refused or vanished or outcome.problems) else EXIT_OK
    if args.output == "json":
        error = _failure_summary(outcome, dry_run=dry_run, verb=verb, past=past, vanished=vanished,
                                 not_reached=not_reached)
        emit_json(_document(args, outcome, dry_run=dry_run, verb=verb, past=past, vanished=vanished,
                            dated=dated, not_reached=not_reached, error=error, note=note), out)
    else:
        noted = f"; {note}" if note else ""
        if dry_run:
            out.write(f"dry run: would {verb} {jobs_phrase(len(ids))} of queue {queue} (nothing changed){noted}\n")
        elif not ids:
            out.write(f"nothing to {verb} in queue {queue}{noted}\n")
        else:
            early = f" (stopped early by {outcome.stopped_by})" if outcome.stopped_by else ""
            out.write(f"{past} {jobs_phrase(len(ids))} of queue {queue}{early}\n")
        if ids:
            if outcome.lanes:
                out.write(tables.render_table(("LANE", "JOBS"), lane_rows(outcome.lanes), right=("JOBS",),
                                              exact=EXACT_COLUMNS) + "\n")
            out.write(f"ids: {ids_preview(ids)}\n")
    if previewed is not None and previewed != len(ids):
        err.write(f"note: the preview counted {jobs_phrase(previewed)}; the morgue changed before the purge ran\n")
    if outcome.undated:
        one = outcome.undated == 1
        was, its = ("was", "its") if one else ("were", "their")
        if dry_run:
            note = (f"would be kept; a real run records now as {its} time of death, so a later "
                    f"--older-than purge can remove {'it' if one else 'them'}")
        elif dated:
            note = (f"{was} kept; {its} time of death is now recorded (the time of this run), so a "
                    f"later --older-than purge can remove {'it' if one else 'them'}")
        else:
            note = (f"{was} kept and not dated (nothing was written); run again with --yes to record "
                    f"now as {its} time of death, so a later --older-than purge can remove "
                    f"{'it' if one else 'them'}")
        err.write(f"note: {jobs_phrase(outcome.undated)} without a valid time of death {note}\n")
    if outcome.undatable:
        kept = "would be" if dry_run else ("was" if outcome.undatable == 1 else "were")
        err.write(f"note: {jobs_phrase(outcome.undatable)} whose row is missing or not a hash {kept} kept: "
                  f"{_UNDATABLE}\n")
    if outcome.missing:
        err.write(f"requested ids not in the morgue of queue {queue}: {ids_preview(outcome.missing)}\n")
    if outcome.refused:
        action = f"would not {verb}" if dry_run else f"did not {verb}"
        err.write(f"{action} {jobs_phrase(len(outcome.refused))} (left in the morgue):\n")
        reasons = [(job_id, why) for job_id, why in list(outcome.refused.items())[:PREVIEW_IDS]]
        err.write(tables.render_table(("ID", "WHY"), reasons, exact=EXACT_COLUMNS) + "\n")
        if len(outcome.refused) > PREVIEW_IDS:
            err.write(f"... and {len(outcome.refused) - PREVIEW_IDS} more (-o json lists all)\n")
    for problem in outcome.problems:
        err.write(f"warning: {tables.printable(problem)}\n")
    if vanished:
        err.write(f"{jobs_phrase(len(vanished))} left the morgue between the preview and the change "
                  f"(replayed or purged by someone else meanwhile): {ids_preview(vanished)}\n")
    if outcome.stopped_by:
        err.write(f"stopped by {outcome.stopped_by}: the script call in progress finished and no other was sent; "
                  f"{jobs_phrase(len(ids))} {past} so far\n")
        if not_reached:
            err.write(f"{jobs_phrase(len(not_reached))} confirmed but not reached (still in the morgue): "
                      f"{ids_preview(list(not_reached))}\n")
        elif not_reached is None:
            err.write(f"jobs not reached are still in the morgue; run the same command again to {verb} them\n")
    return code
