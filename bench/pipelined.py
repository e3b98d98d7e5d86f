"""Why the drain never has two calls in flight: the shipped drain beside two
pipelined ones, with a second client's PING latency.

    python bench/pipelined.py [--n 100000] [--rounds 3] [--lead-us 250] [--arrival-target-ms 0.8 ...]

Between two calls of the shipped drain Redis is idle for about 0.15-0.3 ms
(the reply's way to the client, the client's wake-up, the next call's way
back): 15-20 % of a drain's wall time at the default call size. Sending the
next call before the last one ends would fill that gap. Two ways are tried,
each sending the next call ``--lead-us`` before the running one is expected to
end (the last calls' median server time after it started), then reading the
replies in order:

- ``early, one connection``: the next call on the same connection;
- ``early, two connections``: on a second connection, so that a client whose
  request came in during the running call is ahead of it in the server's
  event loop.

A third never has two calls on the server: ``on arrival, <t> ms`` sends the
next call as soon as the running call's reply has arrived, before reading it
(sized from the calls before; the drain ends with one call that finds
nothing), with calls sized to ``--arrival-target-ms`` (repeatable; default
1.0). The gap it removes is where other clients are served: their requests
then wait for a whole call, not part of one.

Every mode drains a freshly seeded queue (bench/echomq_seed: 20 lanes, a
tenth at the budget) with calls sized by time as shipped (engine.CallSizer,
batchSize 1,000); each run is checked afterwards (every job where the
contract puts it). Not a test: a table of jobs/s and PING p50/p99/max.
"""

from __future__ import annotations

import argparse
import select
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import echomq_seed  # noqa: E402
from pinger import Pinger  # noqa: E402

from stalledpolicy.devenv.redis_server import start_redis  # noqa: E402
from stalledpolicy.engine import Budgets, drain  # noqa: E402
from stalledpolicy.engine.sizing import CallSizer  # noqa: E402
from stalledpolicy.engine.sweep import SweepCall  # noqa: E402
from stalledpolicy.lua import script  # noqa: E402
from stalledpolicy.sweeper.config import BATCH_DEFAULT  # noqa: E402

QUEUE = "bench"
BUDGET = 3


def early_drain(client: Any, lead_s: float, connections: int) -> int:
    """Drain with the next call sent ``lead_s`` before the running one is
    expected to end, on ``connections`` (1 or 2) connections in turn; the
    number of calls made."""
    call = SweepCall(QUEUE, Budgets(default=BUDGET))
    sizer = CallSizer(BATCH_DEFAULT)
    sha = script("sweep").sha
    pool = client.connection_pool
    held = [pool.get_connection() for _ in range(connections)]
    in_flight: list[Any] = []  # connections whose reply comes next, in order
    took_us: list[int] = []
    turn = 0

    def send() -> None:
        nonlocal turn
        connection = held[turn % connections]
        turn += 1
        connection.send_command("EVALSHA", sha, len(call.key_names), *call.key_names, *call.args(sizer.size))
        in_flight.append(connection)

    calls = 0
    try:
        send()
        started = time.perf_counter()  # when the running call began on the server, about
        more = True
        while in_flight:
            if more and len(in_flight) == 1 and took_us:
                due = started + statistics.median(took_us[-3:]) / 1e6 - lead_s
                wait = due - time.perf_counter()
                replied = wait > 0 and bool(select.select([in_flight[0]._sock], [], [], wait)[0])
                if not replied:
                    send()
            reply = in_flight.pop(0).read_response()
            ended = time.perf_counter()
            moved, more, took = call.head(reply)
            took_us.append(took)
            sizer.observe(moved, took / 1e6)
            call.result(reply)
            calls += 1
            if in_flight:
                started = ended  # the queued call runs as soon as this one ends
            elif more:
                send()
                started = time.perf_counter()
    finally:
        for connection in held:
            if in_flight:
                connection.disconnect()  # a reply may still come: no later user may read it
            pool.release(connection)
    return calls


def arrival_drain(client: Any, target_s: float) -> int:
    """Drain with each next call sent when the running call's reply has
    arrived, before it is read (while the drain goes on: more in the reply
    before); calls sized to ``target_s``; the number of calls made."""
    call = SweepCall(QUEUE, Budgets(default=BUDGET))
    sizer = CallSizer(BATCH_DEFAULT, target_s=target_s)
    sha = script("sweep").sha
    pool = client.connection_pool
    connection = pool.get_connection()

    def send() -> None:
        connection.send_command("EVALSHA", sha, len(call.key_names), *call.key_names, *call.args(sizer.size))

    calls, in_flight, draining = 0, 0, False
    try:
        send()
        in_flight = 1
        while in_flight:
            if not connection.can_read(timeout=60):
                raise TimeoutError("no reply in 60 s")
            if draining:
                send()
                in_flight += 1
            reply = connection.read_response()
            in_flight -= 1
            calls += 1
            moved, more, took = call.head(reply)
            sizer.observe(moved, took / 1e6)
            call.result(reply)
            if more and not in_flight:
                send()
                in_flight += 1
            draining = more
    finally:
        if in_flight:
            connection.disconnect()  # a reply may still come: no later user may read it
        pool.release(connection)
    return calls


def run(client: Any, port: int, n: int, mode: str, lead_s: float, arrival_target_s: float | None = None) -> dict:
    """One drain in ``mode``; ``arrival_target_s``: the call size of an 'on arrival' mode."""
    client.flushall()
    expected = echomq_seed.seed(client, QUEUE, n, budget=BUDGET)
    with Pinger(port) as pinger:
        started = time.perf_counter()
        if mode == "shipped":
            calls = drain(client, QUEUE, Budgets(default=BUDGET), CallSizer(BATCH_DEFAULT)).calls
        elif arrival_target_s is not None:
            calls = arrival_drain(client, arrival_target_s)
        else:
            calls = early_drain(client, lead_s, 1 if mode == "early, one connection" else 2)
        seconds = time.perf_counter() - started
    echomq_seed.verify(client, QUEUE, expected)
    stats = pinger.stats
    assert stats is not None
    return {"mode": mode, "jobs_per_s": n / seconds, "calls": calls, "ping_p50_ms": stats.p50_ms,
            "ping_p99_ms": stats.p99_ms, "ping_max_ms": stats.max_ms}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000, help="expired jobs per run")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every mode, interleaved")
    parser.add_argument("--lead-us", type=int, default=250, help="how early the next call goes out")
    parser.add_argument("--arrival-target-ms", type=float, action="append",
                        help="call size (server ms) of an 'on arrival' mode (repeatable; default 1.0)")
    args = parser.parse_args(argv)
    # mode -> the call size of an 'on arrival' mode (None: the others)
    modes: dict[str, float | None] = {"shipped": None, "early, one connection": None, "early, two connections": None}
    modes.update({f"on arrival, {ms:.2f} ms": ms / 1000 for ms in args.arrival_target_ms or [1.0]})
    server = start_redis()
    try:
        client = server.client()
        rows = []
        for round_ in range(args.rounds):
            for mode, arrival_target_s in modes.items():
                row = run(client, server.port, args.n, mode, args.lead_us / 1e6, arrival_target_s)
                rows.append(row)
                print(f"round {round_ + 1}: {mode:24} {row['jobs_per_s']:9,.0f} jobs/s  {row['calls']} calls  "
                      f"PING p50 {row['ping_p50_ms']:.2f} p99 {row['ping_p99_ms']:.2f} "
                      f"max {row['ping_max_ms']:.2f} ms", flush=True)
    finally:
        server.stop()
    print(f"\nmedians of {args.rounds} rounds, N={args.n:,}, lead {args.lead_us} us:")
    print("| mode | jobs/s | PING p50 | PING p99 | PING max |")
    print("| --- | --- | --- | --- | --- |")
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]

        def med(key: str, mine: list[dict] = mine) -> float:
            return statistics.median(r[key] for r in mine)

        print(f"| {mode} | {med('jobs_per_s'):,.0f} | {med('ping_p50_ms'):.2f} ms | {med('ping_p99_ms'):.2f} ms | "
              f"{med('ping_max_ms'):.2f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
