"""The default row of two trees, alternating: is a change to the sweeper faster?

    python bench/alternate.py --before /tmp/old-checkout --after . [--pairs 7] [--n 100000]

Each run is bench/sweep.py's default row (one pass of the shipped Sweeper, calls
sized by time within batchSize 1,000, a PING client in its own process; every
job checked afterwards) in a fresh process whose ``stalledpolicy`` comes from
that tree's ``operator/`` (PYTHONPATH), on its own redis-server. The runs
alternate, so a host that speeds up or slows down during the comparison
weighs on both; the medians are printed last. ``--before`` is typically a
``git worktree add /tmp/old-checkout <commit>``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent

# One run, in the child: the tree's package on sys.path first (PYTHONPATH).
_CHILD = """
import json, sys
sys.path.insert(0, {bench!r})
import sweep
from stalledpolicy.devenv.redis_server import start_redis
server = start_redis()
try:
    run = sweep.run_one(server.client(), server.port, {n}, 1000, sized=True)
finally:
    server.stop()
print(json.dumps({{"jobs_per_s": run.jobs_per_s, "calls": run.calls, "server_ms": run.server_usec_per_call / 1000,
                  "server_max_ms": run.server_max_call_ms, "ping_p99_ms": run.ping_p99_ms}}))
"""


def run_once(tree: Path, n: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree / "operator")}
    done = subprocess.run([sys.executable, "-c", _CHILD.format(bench=str(BENCH), n=n)], env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="the tree before the change (has operator/)")
    parser.add_argument("--after", type=Path, default=BENCH.parent, help="the tree with it (default: this one)")
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--n", type=int, default=100_000, help="expired jobs per run")
    args = parser.parse_args(argv)
    rates: dict[str, list[float]] = {"before": [], "after": []}
    for pair in range(args.pairs):
        # which goes first alternates too
        order = ("before", "after") if pair % 2 == 0 else ("after", "before")
        for which in order:
            tree = args.before if which == "before" else args.after
            run = run_once(tree.resolve(), args.n)
            rates[which].append(run["jobs_per_s"])
            print(f"{which:>6}: {run['jobs_per_s']:9,.0f} jobs/s, {run['calls']} calls, server "
                  f"{run['server_ms']:.2f} ms a call (longest {run['server_max_ms']:.2f}), "
                  f"PING p99 {run['ping_p99_ms']:.2f} ms", flush=True)
    before, after = statistics.median(rates["before"]), statistics.median(rates["after"])
    print(f"medians: before {before:,.0f} jobs/s, after {after:,.0f} jobs/s ({after / before - 1:+.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
