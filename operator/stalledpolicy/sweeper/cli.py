"""``stalledpolicy sweep``: flags (each also read from ``STALLEDPOLICY_<NAME>``) and the run.

Kept light at import time: the loop, redis-py and prometheus_client load in
:func:`run`, so ``stalledpolicy morgue`` does not pay for them.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import socket
import sys
from collections.abc import Mapping

from stalledpolicy.listen import listening_socket
from stalledpolicy.logs import configure
from stalledpolicy.redis_url.redaction import redact_value
from stalledpolicy.streams import discard
from stalledpolicy.sweeper.config import (
    BATCH_DEFAULT,
    BATCH_MAX,
    BATCH_MIN,
    BUDGET_MAX,
    LOG_FORMATS,
    LOG_LEVELS,
    SETTINGS,
    ConfigError,
    load_config,
    requested_log_format,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
# --once stopped by a signal before its pass finished: the shell's 128 + signal
# number (130 for SIGINT, 143 for SIGTERM). The long-running mode exits 0 on
# either: stopping it is its normal end.
EXIT_SIGNALLED_BASE = 128

log = logging.getLogger("stalledpolicy.sweeper")


def _env(field: str) -> str:
    return SETTINGS[field].env


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Every flag can also be set with its environment variable (shown in brackets); "
        "a flag beats its variable."
    )
    # Defaults are None so load_config can tell "not given" from a value and
    # fall back to the variable; the real defaults live in SweeperConfig.
    add = parser.add_argument
    add("--redis-url", metavar="URL",
        help=f"redis://[:password@]host[:port][/db] or rediss:// for TLS [{_env('redis_url')}] "
             "(default redis://127.0.0.1:6379/0)")
    add("--queue", metavar="NAME", help=f"the EchoMQ queue to sweep [{_env('queue')}] (required)")
    add("--max-stalled", metavar="N",
        help=f"stall budget, 0..{BUDGET_MAX}: dead-letter on the stall that reaches N; 0 = never "
             f"[{_env('max_stalled')}] "
             "(default 1)")
    add("--lane", dest="lanes", metavar="NAME=BUDGET", action="append", type=_one_lane,
        help=f"a lane's own budget; repeat for more lanes: --lane a=3 --lane b=0 "
             f"[{_env('lanes')} as a=3,b=0]")
    add("--interval", metavar="DURATION",
        help=f"time between passes, 1s..1h, e.g. 30s or 2m [{_env('interval')}] (default 30s)")
    add("--batch-size", metavar="N",
        help=f"the most jobs one script call takes (calls are sized to about 1 ms within it), "
             f"{BATCH_MIN}..{BATCH_MAX} [{_env('batch_size')}] (default {BATCH_DEFAULT})")
    add("--metrics-port", metavar="PORT",
        help=f"port of /metrics, /healthz and /readyz; 0 disables [{_env('metrics_port')}] (default 9090)")
    add("--metrics-address", metavar="ADDR",
        help=f"address the metrics server listens on: IPv4 (0.0.0.0 = every IPv4 address) or IPv6 "
             f"(:: = every address, IPv4 too where the host allows; every IPv4 address on a host "
             f"without IPv6) [{_env('metrics_address')}] (default ::)")
    add("--once", action="store_true", default=None,
        help=f"one pass (drain), print its result, exit: 0 done, 1 the pass failed, 2 a bad setting "
             f"(also a database the server does not have), 130/143 stopped by SIGINT/SIGTERM before it "
             f"finished (after the script call in flight); serves no metrics, but --metrics-address "
             f"is still checked [{_env('once')}=true]")
    add("--log-format", choices=LOG_FORMATS, help=f"[{_env('log_format')}] (default text)")
    add("--log-level", choices=LOG_LEVELS, help=f"[{_env('log_level')}] (default info)")


def _one_lane(text: str) -> str:
    """--lane takes one NAME=BUDGET (lane names cannot hold a comma)."""
    if "," in text:
        raise argparse.ArgumentTypeError(
            f"{text!r} holds more than one lane; --lane takes one NAME=BUDGET and is repeatable: "
            f"--lane a=1 --lane b=2 ({_env('lanes')} takes the comma list a=1,b=2)")
    return text


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    flags = {field: getattr(args, field, None) for field in SETTINGS}
    try:
        config = load_config(flags, environ)
    except ConfigError as exc:
        if requested_log_format(flags, environ) == "json":
            # a pod whose logs are parsed as JSON gets its only lines as JSON too
            configure("json", "info")
            for problem in exc.problems:
                log.error(problem, extra={"exit_code": EXIT_USAGE, "help": "see --help for every setting"})
            return EXIT_USAGE
        for problem in exc.problems:
            print(f"stalledpolicy sweep: error: {problem}", file=sys.stderr)
        print("stalledpolicy sweep: see --help for every setting", file=sys.stderr)
        return EXIT_USAGE

    configure(config.log_format, config.log_level)
    return _serve(config)


def _listen_problem(exc: OSError, address: str, port: int) -> str:
    """Why the metrics server could not listen, naming the setting to change."""
    port_names, address_names = SETTINGS["metrics_port"].names, SETTINGS["metrics_address"].names
    address = redact_value(address)  # a URL put here by mistake is quoted without its password
    where = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
    if isinstance(exc, socket.gaierror):
        return (f"{address_names}: {address!r} is not an IP address or a name this host can resolve; "
                "use 0.0.0.0 (every IPv4 address), :: (every address) or one of this host's addresses")
    if exc.errno == errno.EADDRINUSE:
        return f"{port_names}: port {port} is already in use on {address}; choose a free port or 0 to disable"
    if exc.errno == errno.EADDRNOTAVAIL:
        return (f"{address_names}: {address} is not an address of this host; use 0.0.0.0 "
                "(every IPv4 address), :: (every address) or one of this host's addresses")
    if exc.errno == errno.EAFNOSUPPORT:
        return f"{address_names}: {address} is an IPv6 address and this host has no IPv6; use 0.0.0.0"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (f"{port_names}: not allowed to listen on {where} (ports below 1024 need privileges); "
                "choose a port from 1024 to 65535")
    return f"{address_names}/{port_names}: cannot listen on {where}: {exc.strerror or exc}"


def _address_problem(address: str) -> str | None:
    """Why the metrics server could not listen on ``address``, whatever the port
    (it listens on a free one, closed at once), or None. For the modes that serve
    no metrics (--once, --metrics-port 0): the same address is refused with the same words."""
    try:
        listening_socket(address, 0).close()
    except OSError as exc:
        return _listen_problem(exc, address, 0)
    return None


def _fatal(config, problem: str) -> int:
    """The last line of a run refused for a bad setting found after start (exit 2):
    the usage-style line on stderr, or with --log-format json a JSON log line
    (every line on stderr is then JSON)."""
    if config.log_format == "json":
        log.error(problem, extra={"queue": config.queue, "exit_code": EXIT_USAGE})
    else:
        print(f"stalledpolicy sweep: error: {problem}", file=sys.stderr)
    return EXIT_USAGE


def _serve(config) -> int:
    # deferred, these three: they import redis-py and prometheus_client, which every stalledpolicy
    # command would pay for (this module gives the parser its arguments), --help and usage errors included
    from stalledpolicy.engine import NO_HOLDS, Holds
    from stalledpolicy.sweeper.loop import Sweeper, result_summary  # deferred: see above
    from stalledpolicy.sweeper.metrics import StatusServer, SweeperMetrics  # deferred: see above

    metrics = SweeperMetrics(config.queue, tuple(config.lanes))
    # --once holds no lease: no pass of its own would come to count the lapse
    sweeper = Sweeper(config, metrics, holds=NO_HOLDS if config.once else Holds())
    received: list[int] = []

    def on_signal(signum, _frame):
        # Only flag it: the engine finishes the script call in progress first.
        received.append(signum)
        sweeper.stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if config.once:
            # --once serves no metrics, but a --metrics-address the long-running mode
            # would refuse is refused here too (exit 2, the setting named)
            problem = _address_problem(config.metrics_address)
            if problem is not None:
                return _fatal(config, problem)
            # --once serves no metrics: its start line names no port
            log.info("sweeping once", extra={k: v for k, v in _start_fields(config).items() if k != "metrics_port"})
            ok = sweeper.sweep_pass()
            sweeper.close()
            if not ok and sweeper.bad_setting:
                return _fatal(config, f"{SETTINGS['redis_url'].names} {config.redis_url_redacted}: "
                                      f"{sweeper.bad_setting}")
            # stopped by a signal before the pass finished: it stopped between two calls
            # with work left, or the call in flight when the signal came failed (no
            # retry is made after a signal: client.StoppableRedisCluster; a single server's client makes one attempt)
            interrupted = bool(received) and (not ok or sweeper.last_stopped_early)
            if not ok and not interrupted:
                # the one JSON line on failure too (`| jq` gets a document): the error, and
                # what the calls answered before it moved
                _print_line(result_summary(config.queue, sweeper.so_far, False, sweeper.last_error))
                return EXIT_FAILED
            if ok:
                _print_line(result_summary(config.queue, sweeper.last_result, interrupted))
            else:
                _print_line(result_summary(config.queue, sweeper.so_far, True, sweeper.last_error))
            if interrupted:
                code = EXIT_SIGNALLED_BASE + received[0]
                log.warning("sweep --once stopped by a signal before the pass finished; jobs still "
                            "expired are left for the next pass", extra={
                                "queue": config.queue, "signal": signal.Signals(received[0]).name,
                                "exit_code": code})
                return code
            return EXIT_OK

        server = None
        if config.metrics_port:
            try:
                server = StatusServer(config.metrics_address, config.metrics_port, metrics, sweeper.health).start()
            except OSError as exc:
                return _fatal(config, _listen_problem(exc, config.metrics_address, config.metrics_port))
        else:
            # no server, but the address is judged as when there is one
            problem = _address_problem(config.metrics_address)
            if problem is not None:
                return _fatal(config, problem)
        log.info("sweeper started", extra=_start_fields(config))
        try:
            sweeper.run_forever()
        finally:
            if server is not None:
                server.stop()
        log.info("sweeper stopped", extra={
            "queue": config.queue, "passes": sweeper.passes,
            "signal": signal.Signals(received[0]).name if received else "-"})
        return EXIT_OK
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _print_line(line: str) -> None:
    try:
        print(line, flush=True)
    except BrokenPipeError:
        discard(sys.stdout)


def _start_fields(config) -> dict:
    fields = config.describe()
    # Set by the operator on the Deployment it makes: which policy this sweeper serves.
    policy = os.environ.get("STALLEDPOLICY_POLICY")
    if policy:
        fields["policy"] = policy
    return fields
