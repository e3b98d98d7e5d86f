"""``replay`` and ``purge``: preview, confirmation, the real call.

A change shows a preview (count, lanes, first ids, what would be left alone;
``--dry-run`` stops there) and asks for confirmation unless ``--yes`` is given;
without a terminal to ask on and without ``--yes`` it refuses rather than guess.

What is confirmed is what runs: the preview's ids are pinned and the change is
applied to exactly those ids, so jobs dead-lettered while the prompt is open
are never swept up by a ``--lane`` or ``--all`` approved for fewer. An age
purge (``--older-than``) is the exception: it applies its rule when it runs
(a job can only join it by growing older, and the engine then records a time
of death on undated entries so that a later age purge can remove them). That
dating is a write too: when no job is old enough but some are undated, the real
call still runs, with the same consent (``--yes`` or the prompt); without
either, nothing is written and the note says so. Entries whose row is missing
or not a hash cannot be dated (``undatable``): they ask for no write, and the
note says only a purge by ``--id`` (or ``--all``) without ``--older-than``
removes them.

A SIGTERM or SIGINT during the real call stops it between two script calls
(``stopping``): what moved so far is reported and the exit code is 143 or 130.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import IO, Any

from stalledpolicy.durations import format_duration
from stalledpolicy.morgue.exit_codes import EXIT_ABORTED, EXIT_USAGE
from stalledpolicy.morgue.prompt import confirm, is_interactive
from stalledpolicy.morgue.render import jobs_phrase
from stalledpolicy.morgue.report import report_outcome, report_unfinished, show_preview
from stalledpolicy.morgue.stopping import Stopper
from stalledpolicy.morgue.views import empty_lane_note, unknown_queue_note


@dataclass
class ChangeRun:
    """How far the real (not dry-run) calls of one replay or purge got: what
    the CLI says when the command ends early (a signal, an error). Set here,
    read by ``cli``; the parsed arguments carry none of it."""

    started: bool = False  # the real calls have begun
    answered: bool = False  # one of them came back: the change has begun to apply
    changed: int = 0  # jobs replayed or purged by the real calls that came back
    #: what those calls changed (ids, lanes): the JSON of a run that ends early
    so_far: Outcome | None = None

    def outcome(self) -> Outcome:
        """What the real calls that came back changed (nothing when none did)."""
        if self.so_far is None:
            return Outcome(ids=[])
        return Outcome(ids=list(self.so_far.ids), lanes=dict(self.so_far.lanes))


@dataclass
class Outcome:
    """One engine call's answer, the same shape for replay and purge."""

    ids: list[str]  # changed (or, in a dry run, to be changed)
    # "" = flat; None (purge only) = in no lane: row missing or not a hash (engine.lane_of)
    lanes: dict[str | None, int] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)  # asked for by id, not in the morgue
    refused: dict[str, str] = field(default_factory=dict)  # left in the morgue, id -> why
    undated: int = 0  # age purge: entries without a valid time of death, dated by a real run (kept)
    undatable: int = 0  # age purge: entries whose row is missing or not a hash: never dated (kept)
    problems: list[str] = field(default_factory=list)  # keys of the wrong type met after the moves
    stopped_by: str | None = None  # the signal that stopped a real run between its calls


def _outcome(result: Any) -> Outcome:
    if hasattr(result, "unreplayable"):
        return Outcome(ids=list(result.ids), lanes=dict(result.lanes), missing=list(result.missing),
                       refused=dict(result.unreplayable), problems=list(result.problems))
    return Outcome(ids=list(result.ids), lanes=dict(result.lanes), missing=list(result.missing),
                   refused=dict(result.kept), undated=result.undated, undatable=result.undatable,
                   problems=list(result.problems))


def _call_engine(engine: Any, client: Any, args: argparse.Namespace, selection: dict[str, Any], run: ChangeRun, *,
                 ids: list[str] | None, dry_run: bool, stopper: Stopper | None = None) -> Outcome:
    """``ids`` replaces the lane filter: pinned ids were selected by it already.
    With a ``stopper``, a SIGTERM/SIGINT stops the engine between its calls and
    the outcome is what the calls made so far did (``stopped_by`` says so; a
    signal during the last call stopped nothing)."""
    lane = selection["lane"] if ids is None else None
    should_stop = stopper.should_stop if stopper is not None else (lambda: False)

    def answered(so_far: Any) -> None:
        if not dry_run:
            run.answered = True  # a real call came back: the change has begun to apply
            run.changed = len(so_far.ids)
            run.so_far = Outcome(ids=list(so_far.ids), lanes=dict(so_far.lanes))

    if args.morgue_action == "replay":
        result = engine.morgue_replay(client, args.queue, lane=lane, ids=ids, dry_run=dry_run,
                                      progress=answered, should_stop=should_stop)
    else:
        result = engine.morgue_purge(client, args.queue, older_than_s=selection["older_than_s"], lane=lane,
                                     ids=ids, dry_run=dry_run, progress=answered, should_stop=should_stop)
    outcome = _outcome(result)
    if stopper is not None and stopper.stopped_early:
        outcome.stopped_by = stopper.signal_name
    return outcome


def run_change(client: Any, args: argparse.Namespace, selection: dict[str, Any], engine: Any,
               out: IO[str], err: IO[str], stdin: IO[str], run: ChangeRun) -> int:
    """``run`` records how far the real calls got (for the caller's report
    of a command that ends early)."""
    replaying = args.morgue_action == "replay"
    verb, past = ("replay", "replayed") if replaying else ("purge", "purged")
    queue = args.queue
    older_than = selection.get("older_than_s")

    preview = _call_engine(engine, client, args, selection, run, ids=selection["ids"], dry_run=True)
    # An age purge writes even when no job is old enough: it records a time of
    # death on the undated entries (so a later age purge can remove them). That
    # write needs the real call, and the same consent as any change.
    dating_only = not preview.ids and older_than is not None and preview.undated > 0
    if args.dry_run or not (preview.ids or dating_only):
        # nothing selected: a queue with no key at all (a mistyped --queue or
        # database) says so, as stats and list do, rather than pass for an empty morgue
        note = None if preview.ids else (empty_lane_note(client, engine, queue, selection.get("lane"))
                                         or unknown_queue_note(client, queue))
        return report_outcome(args, out, err, preview, dry_run=args.dry_run, verb=verb, past=past, note=note)

    count = len(preview.ids)
    if not args.yes:
        if not is_interactive(stdin):
            if dating_only:
                # Nothing to purge, which is what was asked; the dating is left
                # undone, and the report says so.
                return report_outcome(args, out, err, preview, dry_run=False, verb=verb, past=past, dated=False)
            err.write(
                f"stalledpolicy morgue {verb}: refusing to {verb} {jobs_phrase(count)} of queue {queue} "
                "without confirmation: stdin is not a terminal; pass --yes to confirm "
                "(or --dry-run to preview)\n"
            )
            return EXIT_USAGE
        show_preview(err, args, preview, older_than=older_than)
        if dating_only:
            question = (f"Nothing to purge. Record now as the time of death of the {jobs_phrase(preview.undated)} "
                        "that have no valid one, so a later --older-than purge can remove them? (The purge runs "
                        "its age rule: a job that grew old enough meanwhile is purged.)")
        elif replaying:
            question = f"Replay {jobs_phrase(count)} of queue {queue}?"
        else:
            age = f" (dead for more than {format_duration(older_than)})" if older_than is not None else ""
            question = (f"Purge {jobs_phrase(count)} of queue {queue}{age}? This permanently deletes "
                        f"{'it' if count == 1 else 'them'} and cannot be undone.")
            if older_than is not None:
                question += (" (The purge applies its age rule when it runs: a job that grows old enough "
                             "meanwhile is purged too.)")
        if not confirm(question, stdin=stdin, stderr=err):
            aborted = f"aborted: nothing {'dated or ' if preview.undated else ''}{past}"
            err.write(aborted + "\n")
            report_unfinished(args, out, Outcome(ids=[]), error=aborted)
            return EXIT_ABORTED

    # From here on a signal (SIGTERM, Ctrl-C) lets the script call in progress
    # finish, sends no other, and the report says what moved so far.
    stopper = Stopper()
    with stopper.installed():
        run.started = True
        if older_than is not None:
            # An age purge applies its rule as it runs: a job can only join the
            # selection by growing older, which is what was asked; and the engine
            # records a time of death on undated entries so a later purge can age them.
            done = _call_engine(engine, client, args, selection, run, ids=None, dry_run=False, stopper=stopper)
            done.missing = preview.missing
            code = report_outcome(args, out, err, done, dry_run=False, verb=verb, past=past,
                                  previewed=None if done.stopped_by else count)
        else:
            # Otherwise what was confirmed is exactly what runs: jobs dead-lettered into
            # the lane (or the morgue) while the prompt was open are not swept along.
            done = _call_engine(engine, client, args, selection, run, ids=preview.ids, dry_run=False,
                                stopper=stopper)
            vanished, done.missing = done.missing, preview.missing
            reached = set(done.ids) | set(vanished) | set(done.refused)
            done.refused = {**preview.refused, **done.refused}
            not_reached = [job_id for job_id in preview.ids if job_id not in reached] if done.stopped_by else None
            code = report_outcome(args, out, err, done, dry_run=False, verb=verb, past=past, vanished=vanished,
                                  not_reached=not_reached)
    return stopper.exit_code if done.stopped_by else code
