"""``stalledpolicy morgue``: the entry point (``add_arguments`` and ``run``,
what ``stalledpolicy.cli`` expects of a command) and how every failure
becomes an exit code and a message without a traceback or a password.

SIGINT (Ctrl-C) and SIGTERM are honoured whatever disposition the process
inherited: a background job started with SIGINT ignored still exits 130 on
Ctrl-C at the confirmation prompt (``stopping``)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import IO, TYPE_CHECKING, Any, cast

from stalledpolicy.lazy import lazy_module
from stalledpolicy.morgue.arguments import UsageError, add_arguments, change_selection, resolve_settings
from stalledpolicy.morgue.change import ChangeRun, run_change
from stalledpolicy.morgue.exit_codes import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OUTCOME_UNKNOWN,
    EXIT_TERMINATED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
)
from stalledpolicy.morgue.render import jobs_phrase
from stalledpolicy.morgue.report import PAST_TENSE, report_unfinished
from stalledpolicy.morgue.stopping import Terminated, terminate_like_interrupt
from stalledpolicy.morgue.views import report_view_failure, show_list, show_stats
from stalledpolicy.redis_url.connecting import connect, single_attempt
from stalledpolicy.redis_url.errors import (
    CREDENTIALS_ADVICE,
    is_credentials_refusal,
    is_missing_database,
    is_read_only_refusal,
    is_slot_migrating,
    is_tls_handshake_timeout,
    missing_database_problem,
    not_redis_problem,
    tls_mismatch_problem,
    unreachable_errors,
)
from stalledpolicy.redis_url.redaction import redact_url, scrub
from stalledpolicy.streams import ReaderMayLeave

if TYPE_CHECKING:
    import redis
else:
    # deferred: every stalledpolicy command imports this module (for its arguments), only a morgue
    # command that runs pays for redis-py (0.1 s)
    redis = lazy_module("redis")

__all__ = ["add_arguments", "run"]

CONNECT_TIMEOUT_S = 5.0
# a morgue script call is bounded (milliseconds each): an on-call engineer facing
# a server that does not answer wants to know in seconds, not a minute
SOCKET_TIMEOUT_S = 10.0

# the actions that only read; the others are changes (run_change)
READ_ONLY_ACTIONS = {"stats": show_stats, "list": show_list}


def open_client(url: str, *, changing: bool = False) -> Any:
    """A decoded client for ``url`` (a RedisCluster on a cluster node).

    Job ids, lanes and errors are written by other programs and need not be
    UTF-8. ``surrogateescape`` decodes every byte (an undecodable one becomes a
    lone surrogate, which ``tables.printable`` shows as ``\\xNN`` and JSON as
    ``\\udcNN``) and encodes it back to the same byte, so such a job can be
    listed, replayed and purged by the id the preview pinned (``errors="replace"``
    would turn it into another id, not in the morgue)."""
    # A read gets one quick retry on a dropped connection (an on-call engineer
    # facing an outage wants exit 3 now, not after a backoff schedule), none
    # after a timeout (a server that did not answer in time will not answer
    # the same question sooner); a change is never sent twice.
    retry = single_attempt() if changing else redis.retry.Retry(
        redis.backoff.NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
    return connect(url, retry=retry, decode_responses=True,
                   encoding_errors="surrogateescape",
                   socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=SOCKET_TIMEOUT_S)


def _timeout_s(url: str, exc: BaseException) -> float:
    """The timeout ``exc`` ran out: connecting (redis-py says "Timeout
    connecting") or waiting for an answer; the URL's own setting wins, as in redis-py.
    A TLS handshake is "connecting" to redis-py but waits the answer's timeout
    (the socket's timeout is set before the handshake)."""
    options = redis.connection.parse_url(url)  # checked by check_redis_url before any connection
    if "connect" in str(exc).lower() and not is_tls_handshake_timeout(exc):
        return float(options.get("socket_connect_timeout", CONNECT_TIMEOUT_S))
    return float(options.get("socket_timeout", SOCKET_TIMEOUT_S))


def _report_migration(err: IO[str], prog: str, args: argparse.Namespace, url: str, exc: BaseException,
                      changing: bool, run: ChangeRun) -> str:
    """Says on stderr why nothing (more) could be done; returns the one-line error of the JSON document."""
    err.write(f"{prog}: the slot of queue {args.queue} is being migrated between Redis Cluster nodes "
              f"(resharding), so the morgue cannot be {'changed' if changing else 'read'} safely now; run "
              f"the command again once the slot has moved (Redis: {scrub(str(exc), url)})\n")
    if changing and not args.dry_run:
        err.write("nothing was changed\n" if not run.answered else
                  "the script calls before this one were applied, this one changed nothing; check with "
                  "'stalledpolicy morgue stats' and 'list'\n")
    return (f"the slot of queue {args.queue} is being migrated between Redis Cluster nodes; run the "
            f"command again once it has moved ({scrub(str(exc), url)})")


def may_have_run(exc: BaseException) -> bool:
    """Whether a script call that failed with ``exc`` was sent and may have
    run: no answer came in time, or the connection was lost while waiting for
    it. A connection that could not be made (redis-py says "connecting"),
    refused credentials or a server still loading its data ran nothing."""
    if isinstance(exc, (redis.AuthenticationError, redis.BusyLoadingError)):
        return False
    if not isinstance(exc, (redis.TimeoutError, redis.ConnectionError, TimeoutError, ConnectionError)):
        return False
    return "connecting" not in str(exc).lower()


def _report_outcome_unknown(err: IO[str], prog: str, args: argparse.Namespace, where: str, url: str,
                            exc: BaseException, run: ChangeRun) -> None:
    """A real replay or purge call went unanswered (EXIT_OUTCOME_UNKNOWN)."""
    verb = args.morgue_action
    past = PAST_TENSE[verb]
    if isinstance(exc, TimeoutError | redis.TimeoutError):
        err.write(f"{prog}: a {verb} call got no answer from Redis at {where} within {_timeout_s(url, exc):g} s\n")
    else:
        reason = scrub(str(exc), url) or type(exc).__name__
        err.write(f"{prog}: lost the connection to Redis at {where} while waiting for the answer to a "
                  f"{verb} call: {reason}\n")
    err.write("the call may have run on the server: its outcome is unknown (it is not sent again, and no "
              "further call was sent)\n")
    if run.changed:
        err.write(f"{jobs_phrase(run.changed)} {past} by the calls answered before it\n")
    err.write(f"check what it did before running the command again: stalledpolicy morgue stats --queue "
              f"{args.queue} (and 'list'), with the same Redis URL\n")


def _report_unreachable(err: IO[str], prog: str, where: str, url: str, exc: BaseException, *,
                        connected: bool) -> None:
    reason = scrub(str(exc), url) or type(exc).__name__
    # a scheme that does not match the server's TLS fails as the connection is made
    mismatch = not_redis_problem(exc) or (None if connected else tls_mismatch_problem(exc, url, _timeout_s(url, exc)))
    if mismatch:
        err.write(f"{prog}: cannot reach Redis at {where}: {mismatch}\n")
    elif isinstance(exc, TimeoutError | redis.TimeoutError):
        err.write(f"{prog}: no answer from Redis at {where} within {_timeout_s(url, exc):g} s\n")
    elif not connected:
        err.write(f"{prog}: cannot reach Redis at {where}: {reason}\n")
    else:
        err.write(f"{prog}: lost the connection to Redis at {where}: {reason}\n")


def run(args: argparse.Namespace, *, stdin: IO[str] | None = None, stdout: IO[str] | None = None,
        stderr: IO[str] | None = None) -> int:
    stdin = stdin or sys.stdin
    # a stream closed before we start (`morgue stats >&-`) is None in sys: discarded, not a traceback
    out = stdout or sys.stdout or open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    err = stderr or sys.stderr or open(os.devnull, "w")  # noqa: SIM115
    for stream in (out, err):
        if stream in (sys.stdout, sys.stderr) and hasattr(stream, "reconfigure"):
            # the last guard for text from Redis that is not UTF-8 (kept as lone
            # surrogates, see open_client): shown escaped, never a UnicodeEncodeError
            stream.reconfigure(errors="backslashreplace")
    # a reader that goes away (`morgue purge ... | head -1`) loses the rest of the output,
    # never the exit code: that says what happened to the data
    out, err = cast(IO[str], ReaderMayLeave(out)), cast(IO[str], ReaderMayLeave(err))  # the writes of an IO[str]
    try:
        return _run(args, stdin, out, err)
    finally:
        # the buffered output meets a closed pipe here, not in the interpreter's
        # final flush (which would print a traceback and exit 120)
        out.flush()
        err.flush()


def _run(args: argparse.Namespace, stdin: IO[str], out: IO[str], err: IO[str]) -> int:
    prog = f"stalledpolicy morgue {args.morgue_action}"
    changing = args.morgue_action not in READ_ONLY_ACTIONS
    try:
        resolve_settings(args)
        # a bad selection is refused before Redis is even contacted
        selection = change_selection(args) if changing else None
    except UsageError as exc:
        err.write(f"{prog}: error: {exc}\n")
        return EXIT_USAGE

    url = args.redis_url
    where = redact_url(url)
    run = ChangeRun()  # how far a change's real calls got (run_change sets it)
    try:
        with terminate_like_interrupt():
            return _run_action(args, prog, url, where, changing, selection, run, out, err, stdin)
    except (KeyboardInterrupt, Terminated) as exc:
        # outside a change's calls (run_change stops those between calls itself)
        terminated = isinstance(exc, Terminated)
        err.write(f"\n{prog}: {'terminated (SIGTERM)' if terminated else 'interrupted'}\n")
        if changing and not args.dry_run:
            err.write("nothing was changed\n" if not run.started else
                      "the change may have been partly applied; check with 'stalledpolicy morgue stats' and 'list'\n")
        if changing:
            # the document of every stopped run: here, before the change (preview,
            # prompt), nothing changed; a stop inside the calls is the engine's to say
            stopped = run.outcome()
            stopped.stopped_by = "SIGTERM" if terminated else "SIGINT"
            changed = "the change may have been partly applied" if run.started and not args.dry_run \
                else "nothing was changed"
            how = "terminated (SIGTERM)" if terminated else "interrupted (SIGINT)"
            report_unfinished(args, out, stopped, error=f"{how}: {changed}", outcome_unknown=run.started)
        else:
            report_view_failure(args, out, "terminated (SIGTERM)" if terminated else "interrupted (SIGINT)")
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED


def _run_action(args: argparse.Namespace, prog: str, url: str, where: str, changing: bool,
                selection: dict[str, Any] | None, run: ChangeRun, out: IO[str], err: IO[str],
                stdin: IO[str]) -> int:
    from stalledpolicy import engine  # deferred: it imports redis-py (see the top of this module)

    client = None

    def failed(code: int, error: str, outcome_unknown: bool = False) -> int:
        # -o json: a change that ends on an error still prints its document
        # (what the calls answered before it changed), but for bad usage (2)
        if code == EXIT_USAGE:
            return code
        if changing:
            report_unfinished(args, out, run.outcome(), error=error, outcome_unknown=outcome_unknown)
        else:
            report_view_failure(args, out, error)  # stats, list: the same promise
        return code

    redis_errors: tuple[type[BaseException], ...] = (*unreachable_errors(), redis.ResponseError)
    try:
        client = open_client(url, changing=changing)
        if not changing:
            return READ_ONLY_ACTIONS[args.morgue_action](client, args, engine, out)
        assert selection is not None  # made whenever changing (_run)
        return run_change(client, args, selection, engine, out, err, stdin, run)
    except ValueError as exc:
        # before a client exists: redis-py's URL parser (bad port, db, option);
        # after: the engine refusing an argument (it names the field)
        subject = f"--redis-url {where}: " if client is None else ""
        err.write(f"{prog}: error: {subject}{scrub(str(exc), url)}\n")
        return EXIT_USAGE
    except redis_errors as exc:
        if run.started and may_have_run(exc):
            _report_outcome_unknown(err, prog, args, where, url, exc, run)
            return failed(EXIT_OUTCOME_UNKNOWN, "outcome unknown: a call was sent and got no answer "
                          f"({scrub(str(exc), url) or type(exc).__name__})", outcome_unknown=True)
        if is_slot_migrating(exc):
            return failed(EXIT_FAILED, _report_migration(err, prog, args, url, exc, changing, run))
        if is_missing_database(exc):
            # SELECT refused when the connection is made (a database the server lacks, or
            # any but 0 on a Redis Cluster): the URL is wrong, not the server
            err.write(f"{prog}: error: --redis-url {where}: {missing_database_problem(url, exc=exc)}\n")
            return EXIT_USAGE
        if engine.is_acl_refusal(exc):
            # the user of the URL lacks a key or command: a credentials problem (exit 3)
            message = f"Redis at {where} refused this user: {scrub(str(exc), url)}"
            err.write(f"{prog}: {message}\n")
            if changing and not args.dry_run and not run.answered:
                err.write("nothing was changed\n")
            elif run.answered:
                err.write("the script calls before this one were applied, this one changed nothing; check "
                          "with 'stalledpolicy morgue stats' and 'list'\n")
            return failed(EXIT_UNREACHABLE, message)
        if is_read_only_refusal(exc):
            # a reader endpoint, or a primary demoted by a failover: reachable, but refuses writes
            message = (f"Redis at {where} is a read-only replica and refused the change; "
                       "point --redis-url at the primary (the server that takes writes)")
            err.write(f"{prog}: {message}\n")
            if not run.answered:
                err.write("nothing was changed\n")
                return failed(EXIT_UNREACHABLE, message)
        elif is_credentials_refusal(exc):
            message = f"Redis at {where} requires a password (or refused this user/password): {CREDENTIALS_ADVICE}"
            err.write(f"{prog}: {message}\n")
        elif not isinstance(exc, unreachable_errors()):  # a plain ResponseError: the server answered
            message = f"failed: {scrub(str(exc), url)}"
            err.write(f"{prog}: {message}\n")
            return failed(EXIT_FAILED, message)
        else:
            message = f"Redis at {where} unreachable: {scrub(str(exc), url) or type(exc).__name__}"
            _report_unreachable(err, prog, where, url, exc, connected=client is not None)
        if run.started:
            err.write("the change may have been partly applied (it is not sent twice); check with "
                      "'stalledpolicy morgue stats' and 'list'\n")
        return failed(EXIT_UNREACHABLE, message)
    except redis.RedisError as exc:
        if is_slot_migrating(exc):
            return failed(EXIT_FAILED, _report_migration(err, prog, args, url, exc, changing, run))
        err.write(f"{prog}: failed: {scrub(str(exc), url)}\n")
        return failed(EXIT_FAILED, f"failed: {scrub(str(exc), url)}")
    finally:
        if client is not None:
            client.close()
