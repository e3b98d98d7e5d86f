"""What the PING client's pace does to the figures it sits beside: our default
row and RQ's recovery with a tight-loop PING client and a paced one, in turn.

    python bench/ping_pace.py [--rounds 2] [--n 100000] [--interval-ms 0.5] [--nice -10]

bench/peers/run.py measures every system beside a second client that PINGs
(bench/pinger.py); in a tight loop that client is a CPU-bound process of its
own on this 2-core machine. Here, on one redis-server, each round runs our
default row (bench/sweep.py's, our mix) and RQ's recovery (bench/peers/run.py's,
verified) once with each pace, the order reversed every round; printed: each
run, then the medians and our ratio to RQ with either pace. RQ is installed
by bench/peers/run.py's installer (into bench/peers/work/).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "peers"))

import run as peers  # noqa: E402  (bench/peers/run.py)
import sweep  # noqa: E402

from stalledpolicy.devenv.redis_server import start_redis  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--interval-ms", type=float, default=0.5, help="the paced client's interval")
    parser.add_argument("--nice", type=int, default=0, help="as bench/peers/run.py --nice (below 0: root only)")
    args = parser.parse_args(argv)
    if args.nice:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    peers.install_rq()
    paces = {"tight": 0.0, f"every {args.interval_ms:g} ms": args.interval_ms / 1000}
    rates: dict[tuple[str, str], list[float]] = {}
    server = start_redis()
    try:
        client = server.client(decode_responses=True)
        print(f"redis-server on 127.0.0.1:{server.port} (nice {args.nice}); {sweep.load_line()}", flush=True)
        for round_ in range(args.rounds):
            order = list(paces) if round_ % 2 == 0 else list(reversed(paces))
            for pace in order:
                ours = peers.run_ours(client, server.port, args.n, "default", nice=args.nice,
                                      ping_interval_s=paces[pace])
                rq = peers.run_peer("rq", client, server.port, args.n, nice=args.nice, ping_interval_s=paces[pace])
                rates.setdefault(("ours", pace), []).append(ours["jobs_per_s"])
                rates.setdefault(("rq", pace), []).append(rq["jobs_per_s"])
                print(f"round {round_ + 1}, PING {pace:>13}: ours {ours['jobs_per_s']:9,.0f} jobs/s (PING p99 "
                      f"{ours['ping_p99_ms']:.2f} ms)  RQ {rq['jobs_per_s']:7,.0f} jobs/s  ours/RQ "
                      f"{ours['jobs_per_s'] / rq['jobs_per_s']:.1f}x; {sweep.load_line()}", flush=True)
    finally:
        server.stop()
    print(f"\nmedians of {args.rounds} rounds, N={args.n:,}:")
    print("| PING client | ours jobs/s | RQ jobs/s | ours / RQ |")
    print("| --- | --- | --- | --- |")
    for pace in paces:
        ours, rq = statistics.median(rates[("ours", pace)]), statistics.median(rates[("rq", pace)])
        print(f"| {pace} | {ours:,.0f} | {rq:,.0f} | {ours / rq:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
