"""The default drain at 100,000 and at 1,000,000 jobs in turn: its rate at the
larger size as a share of the smaller one's (issue 24's scale target, 80 %).

    python bench/scale.py [--pairs 5] [--small 100000] [--large 1000000] [--nice -10]

Each run is bench/sweep.py's default row (one pass of the shipped Sweeper, calls
sized by time within batchSize 1,000, a PING client in its own process; every
job checked afterwards), all on one redis-server. Two separate invocations of
bench/peers/run.py minutes apart, each on a fresh server, put this host's drift
into the ratio (66 % to 84 % across such runs); here the two sizes alternate
(which goes first alternates too), each pair gives a ratio, and the median of
the pairs is printed last, with each size's server time per call and PING p99.
bench/peers/run.py --scale-pairs K runs the same pairs after its own rows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sweep  # noqa: E402

from stalledpolicy.devenv.redis_server import start_redis  # noqa: E402
from stalledpolicy.sweeper.config import BATCH_DEFAULT  # noqa: E402


def alternate_sizes(client, port: int, small: int, large: int, pairs: int,
                    say: Callable[[str], None] = print, ping_interval_s: float = 0.0) -> dict:
    """``pairs`` pairs of default rows at ``small`` and ``large`` jobs in turn (which
    goes first alternates) on the server at ``port``; the runs and each pair's ratio
    (large's rate over small's), with their median. ``ping_interval_s``: the PING
    client's pace (0: a tight loop)."""
    runs: dict[int, list[sweep.SweepRun]] = {small: [], large: []}
    ratios: list[float] = []
    for pair in range(pairs):
        order = (small, large) if pair % 2 == 0 else (large, small)
        for n in order:
            run = sweep.run_one(client, port, n, BATCH_DEFAULT, sized=True, ping_interval_s=ping_interval_s)
            runs[n].append(run)
            say(f"pair {pair + 1}: N={n:>9,} {run.jobs_per_s:9,.0f} jobs/s  {run.calls} calls  server per "
                f"call {run.server_usec_per_call / 1000:.2f} ms (p99 {run.server_p99_call_ms:.2f}, max "
                f"{run.server_max_call_ms:.2f})  PING p99 {run.ping_p99_ms:.2f} ms; {sweep.load_line()}")
        ratios.append(runs[large][-1].jobs_per_s / runs[small][-1].jobs_per_s)
        say(f"pair {pair + 1}: {large:,} at {ratios[-1]:.1%} of the {small:,} rate")
    return {"small": small, "large": large, "ratios": ratios, "median_ratio": statistics.median(ratios),
            "runs": {str(n): [asdict(run) for run in mine] for n, mine in runs.items()}}


def print_scale(scale: dict, say: Callable[[str], None] = print) -> None:
    """The medians of :func:`alternate_sizes`' runs, and the ratio."""
    small, large = scale["small"], scale["large"]
    say(f"\nmedians of {len(scale['ratios'])} pairs:")
    say("| N | jobs/s | server per call: mean / p99 / max ms | PING p99 ms |")
    say("| --- | --- | --- | --- |")
    for n in (small, large):
        mine = scale["runs"][str(n)]

        def med(key: str, mine: list[dict] = mine) -> float:
            return statistics.median(run[key] for run in mine)

        say(f"| {n:,} | {med('jobs_per_s'):,.0f} | {med('server_usec_per_call') / 1000:.2f} / "
            f"{med('server_p99_call_ms'):.2f} / {med('server_max_call_ms'):.2f} | {med('ping_p99_ms'):.2f} |")
    say(f"\n{large:,} at {scale['median_ratio']:.1%} of the {small:,} rate (median of the pairs' ratios: "
        f"{', '.join(f'{r:.1%}' for r in scale['ratios'])})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--small", type=int, default=100_000)
    parser.add_argument("--large", type=int, default=1_000_000)
    parser.add_argument("--nice", type=int, default=0,
                        help="run the whole benchmark (redis-server, PING client, the drain) at this niceness, as "
                             "bench/peers/run.py --nice does (below 0: root only)")
    args = parser.parse_args(argv)
    if args.nice:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)  # inherited by redis-server and the PING client
    server = start_redis()
    try:
        print(f"redis-server on 127.0.0.1:{server.port}; {sweep.load_line()}", flush=True)
        scale = alternate_sizes(server.client(), server.port, args.small, args.large, args.pairs,
                                lambda line: print(line, flush=True))
    finally:
        server.stop()
    print_scale(scale)
    return 0


if __name__ == "__main__":
    sys.exit(main())
