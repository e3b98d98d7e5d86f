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
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sweep  # noqa: E402

from stalledpolicy.devenv.redis_server import start_redis  # noqa: E402
from stalledpolicy.sweeper.config import BATCH_DEFAULT  # noqa: E402


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
    runs: dict[int, list[sweep.SweepRun]] = {args.small: [], args.large: []}
    ratios: list[float] = []
    try:
        client = server.client()
        print(f"redis-server on 127.0.0.1:{server.port}; {sweep.load_line()}", flush=True)
        for pair in range(args.pairs):
            order = (args.small, args.large) if pair % 2 == 0 else (args.large, args.small)
            for n in order:
                run = sweep.run_one(client, server.port, n, BATCH_DEFAULT, sized=True)
                runs[n].append(run)
                print(f"pair {pair + 1}: N={n:>9,} {run.jobs_per_s:9,.0f} jobs/s  {run.calls} calls  server per "
                      f"call {run.server_usec_per_call / 1000:.2f} ms (p99 {run.server_p99_call_ms:.2f}, max "
                      f"{run.server_max_call_ms:.2f})  PING p99 {run.ping_p99_ms:.2f} ms; {sweep.load_line()}",
                      flush=True)
            ratios.append(runs[args.large][-1].jobs_per_s / runs[args.small][-1].jobs_per_s)
            print(f"pair {pair + 1}: {args.large:,} at {ratios[-1]:.1%} of the {args.small:,} rate", flush=True)
    finally:
        server.stop()
    print(f"\nmedians of {args.pairs} pairs:")
    print("| N | jobs/s | server per call: mean / p99 / max ms | PING p99 ms |")
    print("| --- | --- | --- | --- |")
    for n, mine in runs.items():
        def med(key: str) -> float:
            return statistics.median(getattr(run, key) for run in mine)

        print(f"| {n:,} | {med('jobs_per_s'):,.0f} | {med('server_usec_per_call') / 1000:.2f} / "
              f"{med('server_p99_call_ms'):.2f} / {med('server_max_call_ms'):.2f} | {med('ping_p99_ms'):.2f} |")
    print(f"\n{args.large:,} at {statistics.median(ratios):.1%} of the {args.small:,} rate (median of the pairs' "
          f"ratios: {', '.join(f'{r:.1%}' for r in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
