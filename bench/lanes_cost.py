"""What the lanes' bookkeeping and the totals cost the default drain, in jobs/s.

    python bench/lanes_cost.py [--rounds 4] [--n 100000]

bench/sweep.py's default row (one pass of the shipped Sweeper, calls sized by
time within batchSize 1,000, a PING client; 20 lanes, a third of the jobs in
them) with the shipped sweep script, and with bench/profile_script.py's
in-memory ablations of it that skip part of each call's fixed work
(``no-settle``, ``no-lane-totals``, ``no-lane-bookkeeping``: NOT correct
scripts, cost only; the jobs still move, and every run's sets are checked as
sweep.py checks them).

The variants run in turn (the order reverses every round) on one redis-server;
the medians are printed last, with the jobs a call held: a call is sized to
about 1 ms of server time, so what its fixed work costs shows as jobs a call.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import profile_script  # noqa: E402
import sweep  # noqa: E402

from stalledpolicy.devenv.redis_server import start_redis  # noqa: E402
from stalledpolicy.engine import calls  # noqa: E402
from stalledpolicy.lua import LuaScript, script  # noqa: E402
from stalledpolicy.sweeper.config import BATCH_DEFAULT  # noqa: E402

_SCRIPT_OF_CALLS = calls.script  # engine.calls' own lookup, put back when done
VARIANTS = ("as shipped", "no-settle", "no-lane-totals", "no-lane-bookkeeping")


def variants() -> dict[str, str]:
    return profile_script.variants(script("sweep").body, VARIANTS)


def _use(body: str) -> None:
    """The engine's calls (engine.calls looks its scripts up by name) get ``body`` as sweep."""
    if body == script("sweep").body:
        calls.script = _SCRIPT_OF_CALLS
        return
    chosen = LuaScript(name="sweep", body=body, sha=hashlib.sha1(body.encode()).hexdigest())
    calls.script = lambda name, *rest: chosen if name == "sweep" else _SCRIPT_OF_CALLS(name, *rest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--n", type=int, default=100_000)
    args = parser.parse_args(argv)
    bodies = variants()
    rates: dict[str, list[float]] = {name: [] for name in bodies}
    per_call: dict[str, list[float]] = {name: [] for name in bodies}
    server = start_redis()
    try:
        client = server.client()
        print(f"redis-server on 127.0.0.1:{server.port}; {sweep.load_line()}", flush=True)
        for round_ in range(args.rounds):
            names = list(bodies) if round_ % 2 == 0 else list(reversed(bodies))
            for name in names:
                _use(bodies[name])
                run = sweep.run_one(client, server.port, args.n, BATCH_DEFAULT, sized=True)
                rates[name].append(run.jobs_per_s)
                per_call[name].append(args.n / run.calls)
                print(f"round {round_ + 1}: {name:20} {run.jobs_per_s:9,.0f} jobs/s  {args.n / run.calls:5.0f} jobs a "
                      f"call  server per call {run.server_usec_per_call / 1000:.2f} ms", flush=True)
    finally:
        calls.script = _SCRIPT_OF_CALLS
        server.stop()
    base = statistics.median(rates["as shipped"])
    print(f"\nmedians of {args.rounds} rounds, N={args.n:,}:")
    print("| variant | jobs/s | vs shipped | jobs a call |")
    print("| --- | --- | --- | --- |")
    for name in bodies:
        rate = statistics.median(rates[name])
        print(f"| {name} | {rate:,.0f} | {rate / base:.2f} | {statistics.median(per_call[name]):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
