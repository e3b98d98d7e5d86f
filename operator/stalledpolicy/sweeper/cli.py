"""``stalledpolicy sweep``: flags (each also read from ``STALLEDPOLICY_<NAME>``) and the run.

Kept light at import time: the loop, redis-py and prometheus_client load in
:func:`run`, so ``stalledpolicy morgue`` does not pay for them.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Mapping

from stalledpolicy.sweeper.config import (
    BATCH_DEFAULT, BATCH_MAX, BATCH_MIN, LOG_FORMATS, LOG_LEVELS, SETTINGS, ConfigError, load_config,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

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
        help=f"stall budget: dead-letter on the stall that reaches N; 0 = never [{_env('max_stalled')}] "
             "(default 1)")
    add("--lane", dest="lanes", metavar="NAME=BUDGET", action="append",
        help=f"a lane's own budget; repeat for more lanes [{_env('lanes')} as a=3,b=0]")
    add("--interval", metavar="DURATION",
        help=f"time between passes, 1s..1h, e.g. 30s or 2m [{_env('interval')}] (default 30s)")
    add("--batch-size", metavar="N",
        help=f"jobs per script call, {BATCH_MIN}..{BATCH_MAX} [{_env('batch_size')}] (default {BATCH_DEFAULT})")
    add("--metrics-port", metavar="PORT",
        help=f"port of /metrics, /healthz and /readyz; 0 disables [{_env('metrics_port')}] (default 9090)")
    add("--metrics-address", metavar="ADDR",
        help=f"address the metrics server listens on [{_env('metrics_address')}] (default 0.0.0.0)")
    add("--once", action="store_true", default=None,
        help=f"one pass (drain), print its result, exit [{_env('once')}=true]")
    add("--log-format", choices=LOG_FORMATS, help=f"[{_env('log_format')}] (default text)")
    add("--log-level", choices=LOG_LEVELS, help=f"[{_env('log_level')}] (default info)")


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    flags = {field: getattr(args, field, None) for field in SETTINGS}
    try:
        config = load_config(flags, os.environ if environ is None else environ)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"stalledpolicy sweep: error: {problem}", file=sys.stderr)
        print("stalledpolicy sweep: see --help for every setting", file=sys.stderr)
        return EXIT_USAGE

    from stalledpolicy.logs import configure

    configure(config.log_format, config.log_level)
    return _serve(config)


def _serve(config) -> int:
    from stalledpolicy.sweeper.loop import Sweeper, result_summary
    from stalledpolicy.sweeper.metrics import StatusServer, SweeperMetrics

    metrics = SweeperMetrics(config.queue, tuple(config.lanes))
    sweeper = Sweeper(config, metrics)
    received: list[int] = []

    def on_signal(signum, _frame):
        # Only flag it: the engine finishes the script call in progress first.
        received.append(signum)
        sweeper.stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if config.once:
            log.info("sweeping once", extra=_start_fields(config))
            ok = sweeper.sweep_pass()
            sweeper.close()
            if not ok:
                return EXIT_FAILED
            print(result_summary(config.queue, sweeper.last_result, bool(received)), flush=True)
            return EXIT_OK

        server = None
        if config.metrics_port:
            try:
                server = StatusServer(config.metrics_address, config.metrics_port, metrics, sweeper.health).start()
            except OSError as exc:
                print(f"stalledpolicy sweep: error: --metrics-port ({SETTINGS['metrics_port'].env}): "
                      f"cannot listen on {config.metrics_address}:{config.metrics_port}: {exc.strerror}; "
                      "choose a free port or 0 to disable", file=sys.stderr)
                return EXIT_USAGE
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


def _start_fields(config) -> dict:
    fields = config.describe()
    # Set by the operator on the Deployment it makes: which policy this sweeper serves.
    policy = os.environ.get("STALLEDPOLICY_POLICY")
    if policy:
        fields["policy"] = policy
    return fields
