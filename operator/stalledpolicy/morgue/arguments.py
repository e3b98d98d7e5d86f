"""What the ``stalledpolicy morgue`` command line may say: the parser, the
defaults from the environment, and the rules argparse cannot express (which
raise ``UsageError``, exit 2, before Redis is contacted)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from stalledpolicy.durations import parse_duration
from stalledpolicy.keyspace import InvalidQueueName, validate_queue_name
from stalledpolicy.redis_url.redaction import holds_password, redact_value
from stalledpolicy.redis_url.validation import check_redis_url, stored_url
from stalledpolicy.sweeper.config import SETTINGS, NumberOutOfRange, whole_number
from stalledpolicy.tables import shown

# the sweeper's variables: the morgue reads the same ones, the same way (resolve_settings)
ENV_REDIS_URL = SETTINGS["redis_url"].env
ENV_QUEUE = SETTINGS["queue"].env

LIST_DEFAULT_LIMIT = 50
# --limit and --offset count members of one sorted set, which holds at most 2**32 - 1
ROWS_MAX = 2**32 - 1

EXIT_CODES_EPILOG = """\
exit codes:
  0    success (also: nothing matched, nothing to do); a --dry-run exits
       with the code the real run would have
  1    the operation failed or partly failed: some --id not in the morgue,
       jobs left in the morgue because their row is unreadable or not dead
       (the reasons are printed), jobs changed by someone else meanwhile, or
       a key of the queue of the wrong type kept the lanes or the totals
       from being updated (the jobs moved; the key is named), or the
       queue's slot is being migrated on a Redis Cluster (that call read or
       changed nothing; run the command again once the slot has moved)
  2    bad usage: unknown option, bad --queue, --redis-url (scheme, host,
       port, database or query option, or a database the server does not
       have) or duration, --limit/--offset out of range, or a change refused
       because stdin is not a terminal and --yes was not given
  3    Redis unreachable or refused our credentials, or the Redis user
       may not use the queue's keys or a command (ACL: EMQNOPERM names
       the key pattern and the grant), or a change sent to a
       read-only replica (point --redis-url at the primary); or the
       connection was lost, or no answer came in time, before a change was
       sent (the preview, a read); a change whose earlier calls were applied
       says so: check what it did with stats and list
  4    aborted: the confirmation prompt got an answer other than y or
       yes, or end of input (Ctrl-D); nothing changed
  5    outcome unknown: a replay or purge call was sent and no answer came
       (the answer timeout, or the connection lost while waiting): it may
       have run on the server. It is never sent again and no further call
       is sent; the jobs changed by the calls answered before it are
       counted. Check with stats and list before running the command again
  130  interrupted (Ctrl-C, SIGINT), at the confirmation prompt too
  143  terminated (SIGTERM), at the confirmation prompt too
       On either signal a replay or purge finishes the script call in
       progress (milliseconds), sends no other, and prints what it changed
       so far ("stopped_early": true in -o json; confirmed ids it did not
       reach in "not_reached"); run it again to go on. Before the change
       starts (preview, prompt) nothing was changed.
  With -o json a replay or purge prints one document on every exit but 2:
  a failure (1, 3, 4, 5) or a signal too, with what was changed so far,
  "error" (null on success, else one sentence saying why, exit 1 included)
  and "outcome_unknown" (true with exit 5). Every action's output (table
  or JSON "note") says when nothing was found and no key of the queue
  exists on the database: check --queue and the URL's database.

environment:
  STALLEDPOLICY_REDIS_URL  default for --redis-url
  STALLEDPOLICY_QUEUE      default for --queue
"""


class UsageError(Exception):
    """Bad input found after argparse (env values, cross-option rules)."""


# ------------------------------------------------------------------ parser


def _int_between(minimum: int, maximum: int):
    """An argparse type: a whole number from ``minimum`` to ``maximum`` (>= 0).
    A number of any length is judged by its digits (int() refuses 4,300 digits
    and more) and never echoed whole."""

    def parse(text: str) -> int:
        try:
            value = whole_number(text, maximum)
        except NumberOutOfRange as exc:
            if exc.negative:
                raise argparse.ArgumentTypeError(f"must be at least {minimum} (got {_shown_number(text)})") from None
            value = maximum + 1
        if value is None:
            raise argparse.ArgumentTypeError(f"{_shown_number(text)} is not a whole number")
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
    return shown(text, 40, quoted=True, keep=20)


def _duration(text: str) -> float:
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(
            f"{shown(text, 40, quoted=True)}: the duration must be positive; write how long ago, "
            "e.g. 30m, 12h or 7d")
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be longer than zero")
    return seconds


def _add_common_options(parser: argparse.ArgumentParser) -> None:
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


def _add_change_options(parser: argparse.ArgumentParser, verb: str) -> None:
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
        _add_common_options(sub)
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
    _add_change_options(replay, "replay")

    purge = leaf("purge", "permanently delete dead jobs (rows and morgue entries)")
    purge.add_argument(
        "--older-than", type=_duration, metavar="DURATION",
        help="only jobs dead for longer than this (30m, 12h, 7d); an entry with no recorded "
        "time of death is kept and gets one (now), so a later purge can age it out",
    )
    _add_change_options(purge, "purge")


# ------------------------------------------------------- after the parser


def resolve_settings(args: argparse.Namespace) -> None:
    """Fill --redis-url/--queue from the environment and validate; UsageError names the setting.
    As the sweeper reads the same variables: whitespace around a value is
    dropped (a URL from a Secret often ends in a newline; redis_url.validation.stored_url)
    and an empty variable counts as unset, except the URL: given but blank
    (the flag, or the variable) is refused, never replaced by the other."""
    source = "--redis-url" if args.redis_url is not None else ENV_REDIS_URL
    given = args.redis_url if args.redis_url is not None else os.environ.get(ENV_REDIS_URL)
    args.redis_url = stored_url(given) if given is not None else None
    queue = args.queue.strip() if args.queue is not None else _from_env(ENV_QUEUE)
    if given is None:
        raise UsageError(f"--redis-url is required (or set {ENV_REDIS_URL}), e.g. redis://host:6379/0")
    if not args.redis_url:
        raise UsageError(f"{source} is set but empty (or only whitespace); set it to the Redis URL, "
                         "e.g. redis://host:6379/0")
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
        raise UsageError(f"--queue (or {ENV_QUEUE}): {str(exc).removeprefix('queue: ')}") from None
    _refuse_credentials("--lane", "a lane name", [args.lane] if getattr(args, "lane", None) is not None else [])
    _refuse_credentials("--id", "a job id", getattr(args, "ids", None) or [])


def _refuse_credentials(flag: str, what: str, values: list[str]) -> None:
    """A value holding a URL with a password (the Redis URL pasted into the wrong
    flag) is refused, quoted redacted: echoed back in a table, a note or the JSON,
    it would show the password. No lane or job id holds one."""
    for value in values:
        if holds_password(value):
            masked = redact_value(value)
            raise UsageError(f"{flag}: {masked!r} holds a URL with a password, which {what} never does "
                             "(the Redis URL goes in --redis-url)")


def _from_env(name: str) -> str | None:
    """The variable's value without the whitespace around it; None when unset or blank."""
    return (os.environ.get(name) or "").strip() or None


def change_selection(args: argparse.Namespace) -> dict[str, Any]:
    """The engine's filter keywords for a replay or purge; refuses an empty or
    contradictory selection."""
    ids = list(dict.fromkeys(args.ids)) if args.ids else None
    if ids is not None and "" in ids:
        raise UsageError("--id: a job id cannot be empty")
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
