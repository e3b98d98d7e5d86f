"""Issue 21's benchmark: does the stall budget hold beside EchoMQ's reaping
consumers, and what does the lease-timed loop cost in Redis commands?

    python bench/stalls.py --trials 5 --peer-trials 2           # smoke run (~2 min)
    python bench/stalls.py --trials 100 --nice -10 --json bench/out/stalls.json --results bench/results/stalls.md

One ``redis-server`` of its own (loopback, no persistence). Three parts:

1. **Budget beside reaping consumers**, for each K of ``--consumers``: per
   trial a queue of its own with one poison job (its worker dies holding the
   lease, every time) and healthy jobs flowing in (``--healthy-rate`` a second,
   each completed at once), K model EchoMQ consumers
   (``devenv.consumers.ConsumerPool``: lease 2 s, beat 1 s, a dead consumer
   restarts at once and reaps first; every consumer reaps at the top of every
   loop) and the sweeper's own loop (``sweeper.loop.Sweeper.run_forever``) with
   the DEFAULT settings (maxStalled 1, interval 30 s, batch 25, holds on).
   A trial ends when the poison is in the morgue. ``--parallel`` trials run at
   once (each its own queue, pool and sweeper thread).
2. **The peer, same run**: the same trials with the sweeper of before issue 21:
   ``NO_HOLDS`` and a pass every interval only (the real loop, with its
   lease-timed waits taken out: ``FixedIntervalSweeper`` below), at
   ``--peer-interval`` (default: the default interval, 30 s; a list runs each).
   A peer trial also ends at ``--peer-cap-claims`` poison claims or
   ``--peer-cap-s`` seconds: "not in the morgue after N claims".
3. **Scheduling cost**: the sweeper loop alone (default settings), then the
   fixed-interval peer, each for ``--cost-window`` seconds, on (a) an empty
   queue, (b) 100,000 healthy leases far in the future (static), (c) 100,000
   leases of 2 s renewed every beat (1 s) by a bench thread (``ZADD XX`` in
   chunks; its own commands are counted and subtracted). Figures are ``INFO
   commandstats`` deltas over the window: ``EVALSHA`` calls (the script calls),
   the commands those scripts ran inside (commandstats counts them too, by
   name) and the other commands (the gauges' snapshot pipeline once an interval).

Per trial, from the model and the queue: the poison's claims (one lease each;
each claim's lease lapses, since its worker dies), the lapses the sweep counted
(the row's ``stalled``), the lapses the consumers' reaps returned uncounted
(the model's ``reaped``), the sweeper's own ``uncounted`` (holds it lost, from
``sweeper:totals``) and the time from the pool's start to the poison's
``dead_at`` (server clock). Checked per trial (a failed check is printed and
kept in the JSON, never dropped): claims = counted + reaped (+1 for a lease
still in flight at a peer's cap), sweeper totals = counted, the queue's audit
clean. No timing is asserted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import redisstats  # noqa: E402

from stalledpolicy import engine  # noqa: E402
from stalledpolicy.devenv.consumers import BEAT_MS, LEASE_MS, ConsumerPool, die_on  # noqa: E402
from stalledpolicy.devenv.echomq import EchoMQ, seed_stalled, server_now_ms  # noqa: E402
from stalledpolicy.devenv.redis_server import start_redis  # noqa: E402
from stalledpolicy.keyspace import QueueKeys  # noqa: E402
from stalledpolicy.sweeper import loop  # noqa: E402
from stalledpolicy.sweeper.config import SweeperConfig  # noqa: E402
from stalledpolicy.sweeper.metrics import SweeperMetrics  # noqa: E402

DEFAULTS = SweeperConfig(queue="defaults")  # maxStalled, interval, batch as a policy leaves them
GROUP = "GRPbench"


class FixedIntervalSweeper(loop.Sweeper):
    """The sweeper before issue 21: the same loop and passes, but a pass every
    interval only (no pass timed by a lease's deadline, no lease watch); run it
    with ``holds=engine.NO_HOLDS``."""

    def _sleep_before_next_pass(self, to_full: float, succeeded: bool) -> float:
        return max(0.0, to_full)


def make_sweeper(url: str, queue: str, mode: str, interval: float | None = None) -> loop.Sweeper:
    settings: dict[str, Any] = {"queue": queue, "redis_url": url}
    if interval is not None:
        settings["interval"] = interval
    config = SweeperConfig(**settings)
    metrics = SweeperMetrics(queue, ())
    if mode == "holds":
        return loop.Sweeper(config, metrics)
    return FixedIntervalSweeper(config, metrics, holds=engine.NO_HOLDS)


# -- parts 1 and 2: the budget beside reaping consumers ------------------------

@dataclass
class Trial:
    mode: str            # "holds" (the shipped loop) or "fixed-<interval>s" (the peer)
    consumers: int
    trial: int
    interval_s: float
    budget: int
    claims: int = 0      # the poison's claims (each a lease that lapses: its worker dies)
    counted: int = 0     # lapses the sweep counted (the row's `stalled`)
    reaped: int = 0      # lapses the consumers' reaps returned uncounted (the model's count)
    uncounted: int = 0   # the sweeper's own count of holds it lost (sweeper:totals uncounted)
    held: int = 0        # leases the sweeper held (its metric)
    in_morgue: bool = False
    to_morgue_s: float | None = None  # pool start -> the poison's dead_at, server clock
    elapsed_s: float = 0.0
    passes: int = 0
    healthy_completed: int = 0
    consumer_restarts: int = 0
    consumer_reaps: int = 0
    consumer_errors: int = 0
    checks: list[str] = field(default_factory=list)  # failed checks; empty = every check held


def _delete_queue(client: Any, queue: str) -> None:
    pattern = f"emq:{{{queue}}}:*"
    batch: list[str] = []
    for key in client.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) >= 500:
            client.unlink(*batch)
            batch = []
    if batch:
        client.unlink(*batch)


def run_trial(server: Any, mode: str, k: int, index: int, args: argparse.Namespace,
              interval: float | None = None) -> Trial:
    queue = f"stalls-{mode}-k{k}-{index}-{uuid.uuid4().hex[:6]}"
    client = server.client(decode_responses=True)
    connect = lambda: server.client(decode_responses=True, socket_timeout=10)  # noqa: E731
    mq = EchoMQ(client, queue)
    group = None if args.flat else GROUP
    poison = mq.enqueue("poison", group=group)  # the first id: claimed at once
    mq.enqueue_many(args.healthy_backlog, group=group)
    sweeper = make_sweeper(server.url, queue, "holds" if mode == "holds" else "fixed", interval)
    result = Trial(mode=mode, consumers=k, trial=index, interval_s=sweeper.config.interval,
                   budget=sweeper.config.max_stalled)
    stop_producing = threading.Event()

    def produce() -> None:
        producer = EchoMQ(connect(), queue, ledger=mq.ledger)
        period = 1.0 / args.healthy_rate
        while not stop_producing.wait(period):
            producer.enqueue("healthy", group=group)
        producer.client.close()

    sweeping = threading.Thread(target=sweeper.run_forever, name=f"sweeper-{queue}", daemon=True)
    producing = threading.Thread(target=produce, name=f"producer-{queue}", daemon=True)
    pool = ConsumerPool(connect, queue, die_on({poison}), k, ledger=mq.ledger, lease_ms=LEASE_MS, beat_ms=BEAT_MS)
    sweeping.start()
    time.sleep(0.2)  # the sweeper's first pass (full) is behind it, as in a running pod
    started_ms = server_now_ms(client)
    started = time.monotonic()
    cap_s = args.peer_cap_s if mode != "holds" else args.holds_cap_s
    pool.start()
    if args.healthy_rate > 0:
        producing.start()
    try:
        while True:
            if client.zscore(mq.keys.dead, poison) is not None:
                result.in_morgue = True
                break
            if time.monotonic() - started > cap_s:
                break
            if mode != "holds" and pool.stats.claims[poison] >= args.peer_cap_claims:
                break
            time.sleep(0.05)
    finally:
        stop_producing.set()
        pool.stop()
        sweeper.stop.set()
        sweeping.join(timeout=15)
        if producing.is_alive() or args.healthy_rate > 0:
            producing.join(timeout=5)
    result.elapsed_s = time.monotonic() - started
    stats = pool.stats.snapshot()
    row = client.hgetall(mq.keys.job(poison))
    totals = client.hgetall(mq.keys.sweeper_totals)
    result.claims = stats.claims[poison]
    result.counted = int(row.get("stalled") or 0)
    result.reaped = stats.reaped.get(poison, 0)
    result.uncounted = int(totals.get("uncounted") or 0)
    result.held = int(sweeper.metrics.registry.get_sample_value(
        "stalledpolicy_leases_held_total", {"queue": queue}) or 0)
    result.passes = sweeper.passes
    if result.in_morgue and row.get("dead_at"):
        result.to_morgue_s = (int(row["dead_at"]) - started_ms) / 1000
    result.healthy_completed = sum(n for job, n in stats.completions.items() if job != poison)
    t = stats.totals()
    result.consumer_restarts, result.consumer_reaps, result.consumer_errors = t["restarts"], t["reaps"], t["errors"]
    # checks
    lapses = result.counted + result.reaped
    in_flight = 0 if result.in_morgue else 1
    if not (lapses <= result.claims <= lapses + in_flight):
        result.checks.append(f"claims {result.claims} != counted {result.counted} + reaped {result.reaped}"
                             + (" (+1 in flight)" if in_flight else ""))
    swept = int(totals.get("recovered") or 0) + int(totals.get("dead_lettered") or 0)
    if swept != result.counted:
        result.checks.append(f"sweeper totals {swept} != the poison's stalled {result.counted} "
                             "(a healthy job lapsed?)")
    if stats.deaths[poison] != result.claims:
        result.checks.append(f"deaths {stats.deaths[poison]} != claims {result.claims}")
    if result.in_morgue and row.get("state") != "dead":
        result.checks.append(f"in the morgue with state {row.get('state')!r}")
    if stats.errors:
        result.checks.append(f"consumer errors: {stats.errors[-1]}")
    problems = mq.audit()
    if problems:
        result.checks.append(f"audit: {problems[:3]}")
    _delete_queue(client, queue)
    client.close()
    return result


def summarize(trials: list[Trial]) -> dict[str, Any]:
    budget = trials[0].budget
    claims = [t.claims for t in trials]
    dead = [t for t in trials if t.in_morgue]
    within = sum(1 for t in trials if t.in_morgue and t.claims <= budget + 1)
    happened = sum(t.counted + t.reaped for t in trials)
    counted = sum(t.counted for t in trials)
    times = sorted(t.to_morgue_s for t in dead if t.to_morgue_s is not None)
    return {
        "mode": trials[0].mode, "consumers": trials[0].consumers, "trials": len(trials), "budget": budget,
        "interval_s": trials[0].interval_s,
        "in_morgue": len(dead), "within_budget_plus_1": within,
        "claims_max": max(claims), "claims_hist": dict(sorted(Counter(claims).items())),
        "lapses_happened": happened, "lapses_counted": counted,
        "reaped": sum(t.reaped for t in trials), "uncounted": sum(t.uncounted for t in trials),
        "held": sum(t.held for t in trials),
        "counted_pct": 100.0 * counted / happened if happened else float("nan"),
        "to_morgue_p50_s": statistics.median(times) if times else None,
        "to_morgue_max_s": times[-1] if times else None,
        "elapsed_max_s": max(t.elapsed_s for t in trials),
        "not_in_morgue_claims": sorted(t.claims for t in trials if not t.in_morgue),
        "checks_failed": sum(1 for t in trials if t.checks),
    }


def print_table(header: list[str], rows: list[list[str]], out: Any = sys.stdout) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |", file=out)
    print("| " + " | ".join("-" * w for w in widths) + " |", file=out)
    for r in rows:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |", file=out)


def budget_table(summaries: list[dict[str, Any]], out: Any = sys.stdout) -> None:
    header = ["sweeper", "K", "trials", "in morgue", "<= budget+1 claims", "claims (count: trials)",
              "lapses counted / happened", "reaped uncounted", "sweeper's uncounted", "leases held",
              "to morgue p50 / max s",
              "checks"]
    rows = []
    for s in summaries:
        name = "lease-timed + holds" if s["mode"] == "holds" else f"fixed {s['interval_s']:g} s, no holds"
        hist = ", ".join(f"{c}: {n}" for c, n in s["claims_hist"].items())
        morgue = f"{s['in_morgue']} / {s['trials']}"
        if s["not_in_morgue_claims"]:
            morgue += f" (not after {min(s['not_in_morgue_claims'])}-{max(s['not_in_morgue_claims'])} claims)"
        times = ("-" if s["to_morgue_p50_s"] is None
                 else f"{s['to_morgue_p50_s']:.2f} / {s['to_morgue_max_s']:.2f}")
        rows.append([name, str(s["consumers"]), str(s["trials"]), morgue,
                     f"{s['within_budget_plus_1']} / {s['trials']}", hist,
                     f"{s['lapses_counted']} / {s['lapses_happened']} ({s['counted_pct']:.1f} %)",
                     str(s["reaped"]), str(s["uncounted"]), str(s["held"]), times,
                     "ok" if not s["checks_failed"] else f"{s['checks_failed']} FAILED"])
    print_table(header, rows, out)


def run_budget(server: Any, args: argparse.Namespace) -> tuple[list[Trial], list[dict[str, Any]]]:
    trials: list[Trial] = []
    summaries: list[dict[str, Any]] = []
    for k in args.consumers:
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            peer_futures: dict[float, list[Any]] = {iv: [] for iv in args.peer_interval}
            futures = []
            # interleaved, so that both sweepers' trials run beside the same load
            for i in range(max(args.trials, args.peer_trials)):
                for iv in args.peer_interval:
                    if i < args.peer_trials:
                        peer_futures[iv].append(pool.submit(run_trial, server, f"fixed-{iv:g}s", k, i, args, iv))
                if i < args.trials:
                    futures.append(pool.submit(run_trial, server, "holds", k, i, args))
            mine = [f.result() for f in futures]
            peers = {iv: [f.result() for f in fs] for iv, fs in peer_futures.items()}
        for group in [mine, *peers.values()]:
            if not group:
                continue
            trials += group
            summaries.append(summarize(group))
            for t in group:
                if t.checks:
                    print(f"  check failed: {t.mode} K={k} trial {t.trial}: {'; '.join(t.checks)}", file=sys.stderr)
        print(f"K={k}: {time.monotonic() - started:.0f} s, {load_line()}", file=sys.stderr, flush=True)
    return trials, summaries


# -- part 3: what the loop costs in Redis commands ------------------------------

@dataclass
class Cost:
    scenario: str
    sweeper: str
    window_s: float
    passes: int
    evalsha_per_s: float
    inner_per_s: float     # commands run inside the scripts (by name, the script's commands)
    other_per_s: float     # the sweeper's commands outside scripts (the gauges' pipeline)
    total_per_s: float     # the sweeper's commands in all (EVALSHA + inner + looks + other)
    held: int
    looks_per_s: float = 0.0  # the loop's looks for a new lease between passes (one ZCOUNT each)
    renewer_zadd: int = 0
    renewer_late_max_s: float = 0.0  # the renewer's longest delay past a slice's planned time, in the window
    mix: dict = field(default_factory=dict)


# commands the sweep script runs (scripts/sweep.lua and lib/*); everything else the
# sweeper sends outside a script (queue_snapshot: ZCARD, HGETALL)
SNAPSHOT_COMMANDS = {"zcard", "hgetall"}


def seed_leases(client: Any, queue: str, n: int, *, renewed: bool) -> list[str]:
    """n claimed jobs with healthy leases: an hour ahead (static), or 2 s ahead
    spread evenly over the next beat..lease (renewed)."""
    seeded = seed_stalled(client, queue, n, budget=1, at_budget_fraction=0.0, lease_past_ms=-3_600_000)
    if renewed:
        keys = QueueKeys(queue)
        now = server_now_ms(client)
        ids = seeded.ids
        for start in range(0, n, 5_000):
            chunk = ids[start:start + 5_000]
            client.zadd(keys.active, {job: now + BEAT_MS + (start + i) * BEAT_MS // n
                                      for i, job in enumerate(chunk)}, xx=True)
    return seeded.ids


def renew(client: Any, queue: str, ids: list[str], stop: threading.Event, counter: list[Any],
          slices: int = 10, chunk: int = 1_000) -> None:
    """Every lease renewed once a beat, when about a beat of it is left (EchoMQ's
    worker heartbeat): a tenth of the ids every beat/10, to now + lease."""
    keys = QueueKeys(queue)
    n = len(ids)
    period = BEAT_MS / 1000 / slices
    part = 0
    next_at = time.monotonic()
    while not stop.is_set():
        counter[2] = max(counter[2], time.monotonic() - next_at)  # late by (a lease is renewed with a beat
        now = server_now_ms(client)                             # minus this left)
        counter[1] += 1  # TIME
        lo, hi = part * n // slices, (part + 1) * n // slices
        for start in range(lo, hi, chunk):
            client.zadd(keys.active, {job: now + LEASE_MS for job in ids[start:min(hi, start + chunk)]}, xx=True)
            counter[0] += 1
        part = (part + 1) % slices
        next_at += period
        stop.wait(max(0.0, next_at - time.monotonic()))


def measure_cost(server: Any, scenario: str, mode: str, leases: int, window: float, warmup: float,
                 interval: float | None) -> Cost:
    client = server.client(decode_responses=True)
    client.flushall()
    queue = f"cost-{scenario.split()[0]}"
    renewed = scenario.startswith("renewed")
    ids = seed_leases(client, queue, leases, renewed=renewed) if leases else []
    stop_renewing = threading.Event()
    renewer_counts: list[Any] = [0, 0, 0.0]  # ZADD, TIME, the renewer's longest lateness (s)
    renewer = None
    if renewed:
        renewer = threading.Thread(target=renew, args=(server.client(decode_responses=True), queue, ids,
                                                       stop_renewing, renewer_counts), daemon=True)
        renewer.start()
    sweeper = make_sweeper(server.url, queue, mode, interval)
    thread = threading.Thread(target=sweeper.run_forever, daemon=True)
    thread.start()
    time.sleep(warmup)
    passes0, looks0 = sweeper.passes, sweeper.lease_watch_reads
    zadd0, time0, _ = renewer_counts
    renewer_counts[2] = 0.0
    before = redisstats.commandstats(client)
    t0 = time.monotonic()
    time.sleep(window)
    after = redisstats.commandstats(client)
    seconds = time.monotonic() - t0
    zadd1, time1, renewer_late = renewer_counts
    passes, looks = sweeper.passes - passes0, sweeper.lease_watch_reads - looks0
    sweeper.stop.set()
    thread.join(timeout=15)
    stop_renewing.set()
    if renewer is not None:
        renewer.join(timeout=10)
    delta: dict[str, int] = {}
    for name, stats in after.items():
        calls = int(stats.get("calls", 0)) - int(before.get(name, {}).get("calls", 0))
        if calls > 0 and name not in ("info",):
            delta[name] = calls
    # the renewer's own commands, counted on its side, are not the sweeper's
    # (sampled around the window: off by at most one slice's chunks)
    renewer_zadd = zadd1 - zadd0
    if renewer_zadd:
        delta["zadd"] = delta.get("zadd", 0) - renewer_zadd
    if time1 - time0:
        delta["time"] = delta.get("time", 0) - (time1 - time0)
    # the loop's looks are ZCOUNTs outside the scripts (the sweep script's own
    # ZCOUNTs, settling holds, stay under inside)
    if looks:
        delta["zcount"] = delta.get("zcount", 0) - looks
    delta = {name: n for name, n in delta.items() if n > 0}
    evalsha = delta.get("evalsha", 0)
    other = sum(n for name, n in delta.items() if name in SNAPSHOT_COMMANDS)
    inner = sum(n for name, n in delta.items() if name != "evalsha" and name not in SNAPSHOT_COMMANDS)
    held = int(sweeper.metrics.registry.get_sample_value("stalledpolicy_leases_held_total", {"queue": queue}) or 0)
    client.close()
    name = "lease-timed + holds" if mode == "holds" else f"fixed {sweeper.config.interval:g} s, no holds"
    return Cost(scenario=scenario, sweeper=name, window_s=seconds, passes=passes,
                evalsha_per_s=evalsha / seconds, inner_per_s=inner / seconds, other_per_s=other / seconds,
                total_per_s=(evalsha + inner + looks + other) / seconds, looks_per_s=looks / seconds, held=held,
                renewer_zadd=renewer_zadd,
                renewer_late_max_s=renewer_late,
                mix={n: round(c / seconds, 2) for n, c in sorted(delta.items())})


def run_cost(server: Any, args: argparse.Namespace) -> list[Cost]:
    costs = []
    scenarios = [(name if name == "idle" else f"{name} {args.cost_leases:,}", 0 if name == "idle" else args.cost_leases)
                 for name in args.cost_scenario or ["idle", "static", "renewed"]]
    for scenario, leases in scenarios:
        for mode, interval in [("holds", None), *(("fixed", iv) for iv in args.peer_interval)]:
            cost = measure_cost(server, scenario, mode, leases, args.cost_window, args.cost_warmup, interval)
            costs.append(cost)
            print(f"cost {scenario} / {cost.sweeper}: {cost.total_per_s:.2f} commands/s "
                  f"({cost.evalsha_per_s:.2f} EVALSHA/s, {cost.looks_per_s:.2f} looks/s), {load_line()}",
                  file=sys.stderr, flush=True)
    return costs


def cost_table(costs: list[Cost], out: Any = sys.stdout) -> None:
    header = ["queue", "sweeper", "window s", "passes", "commands per pass", "EVALSHA/s", "inside scripts /s",
              "looks (ZCOUNT) /s", "outside (gauges) /s", "commands/s in all", "vs peer", "leases held",
              "renewer late max s", "inside-script mix /s"]
    rows = []
    for c in costs:
        peers = [p for p in costs
                 if p.scenario == c.scenario and p.sweeper != c.sweeper and c.sweeper.startswith("lease")]
        ratio = " / ".join((f"{c.total_per_s / p.total_per_s:.{0 if c.total_per_s >= 10 * p.total_per_s else 1}f}x "
                            f"({p.sweeper.split(',')[0]})") if p.total_per_s else "inf" for p in peers)
        mix = ", ".join(f"{n} {v:g}" for n, v in c.mix.items() if n not in ("evalsha", *SNAPSHOT_COMMANDS))
        per_pass = f"{(c.total_per_s - c.looks_per_s) * c.window_s / c.passes:.1f}" if c.passes else "-"
        rows.append([c.scenario, c.sweeper, f"{c.window_s:.1f}", str(c.passes), per_pass, f"{c.evalsha_per_s:.2f}",
                     f"{c.inner_per_s:.2f}", f"{c.looks_per_s:.2f}", f"{c.other_per_s:.2f}",
                     f"{c.total_per_s:.2f}", ratio,
                     str(c.held), f"{c.renewer_late_max_s:.2f}" if c.scenario.startswith("renewed") else "-", mix])
    print_table(header, rows, out)


# -- main ----------------------------------------------------------------------

def load_line() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min) / {five:.2f} (5 min) on {os.cpu_count()} cores"


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({cpu}), Linux {platform.release()}, Python {platform.python_version()}"


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--consumers", type=_ints, default=[2, 8, 16], help="K, comma-separated (default 2,8,16)")
    parser.add_argument("--trials", type=int, default=20, help="trials per K of the shipped loop (default 20)")
    parser.add_argument("--peer-trials", type=int, default=5, help="trials per K and peer interval (default 5)")
    parser.add_argument("--peer-interval", type=_floats, default=[DEFAULTS.interval],
                        help=f"the peer's fixed intervals, s, comma-separated (default {DEFAULTS.interval:g}, "
                             "the default interval)")
    parser.add_argument("--peer-cap-claims", type=int, default=20,
                        help="a peer trial ends after this many poison claims")
    parser.add_argument("--peer-cap-s", type=float, default=90.0, help="... or after this many seconds")
    parser.add_argument("--holds-cap-s", type=float, default=60.0,
                        help="a trial of the shipped loop ends after this many seconds (reported, never expected)")
    parser.add_argument("--parallel", type=int, default=8, help="trials at once, each its own queue (default 8)")
    parser.add_argument("--healthy-rate", type=float, default=5.0, help="healthy jobs enqueued per second per trial")
    parser.add_argument("--healthy-backlog", type=int, default=20,
                        help="healthy jobs queued behind the poison at start")
    parser.add_argument("--flat", action="store_true",
                        help=f"jobs in the flat pending (default: one lane, {GROUP}, as EchoMQ.Consumer claims "
                             "through lanes; a lane job reaped or enqueued also pushes wake)")
    parser.add_argument("--cost-window", type=float, default=30.0, help="seconds of each cost measurement")
    parser.add_argument("--cost-warmup", type=float, default=3.0)
    parser.add_argument("--cost-leases", type=int, default=100_000)
    parser.add_argument("--cost-scenario", action="append", choices=["idle", "static", "renewed"],
                        help="repeatable (default: all three)")
    parser.add_argument("--skip-budget", action="store_true")
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument("--nice", type=int, default=0, help="niceness of the whole benchmark and its redis-server")
    parser.add_argument("--json", type=Path, help="also write every trial and cost as JSON here")
    parser.add_argument("--results", type=Path, help="prepend a dated markdown section to this file")
    args = parser.parse_args(argv)
    if args.nice:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    logging.getLogger("stalledpolicy").setLevel(logging.ERROR)  # the loop's warnings per lost lapse: counted below

    started_at = dt.datetime.now(dt.UTC)
    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    server = start_redis()
    version = server.client().info("server")["redis_version"]
    t0 = time.monotonic()
    summaries: list[dict[str, Any]] = []
    trials: list[Trial] = []
    costs: list[Cost] = []
    try:
        if not args.skip_budget:
            trials, summaries = run_budget(server, args)
        if not args.skip_cost:
            costs = run_cost(server, args)
    finally:
        server.stop()
    uptime_after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    head = (f"{machine()}, Redis {version}; niceness {args.nice}; {len(args.consumers)} K values, "
            f"lease {LEASE_MS} ms, beat {BEAT_MS} ms; sweeper defaults: maxStalled {DEFAULTS.max_stalled}, "
            f"interval {DEFAULTS.interval:g} s, batch {DEFAULTS.batch_size}; jobs "
            f"{'flat' if args.flat else 'in lane ' + GROUP}, {args.healthy_rate:g} healthy/s per trial; "
            f"{args.parallel} trials at once; {time.monotonic() - t0:.0f} s in all")
    command = "python bench/stalls.py " + " ".join(sys.argv[1:] if argv is None else argv)

    def report(out: Any) -> None:
        if summaries:
            print("\nBudget beside reaping consumers (poison: every claim kills its worker; budget "
                  f"{summaries[0]['budget']} = dead-lettered at its first counted stall):\n", file=out)
            budget_table(summaries, out)
        if costs:
            print("\nScheduling cost, the sweeper alone (INFO commandstats deltas; inside scripts = the commands "
                  "the EVALSHAs ran):\n", file=out)
            cost_table(costs, out)

    print(f"\n{head}\nuptime before: {uptime_before}\nuptime after:  {uptime_after}")
    report(sys.stdout)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "command": command, "started": started_at.isoformat(), "machine": head,
            "uptime_before": uptime_before, "uptime_after": uptime_after,
            "summaries": summaries, "trials": [asdict(t) for t in trials], "costs": [asdict(c) for c in costs],
        }, indent=2))
    if args.results:
        import io
        body = io.StringIO()
        print(f"## {started_at:%Y-%m-%d %H:%M} UTC\n\nCommand: `{command}`\n", file=body)
        print(f"- {head}\n- before: `{uptime_before}`\n- after: `{uptime_after}`", file=body)
        commit = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h %cI", "--", "operator/"],
                                capture_output=True, text=True).stdout.strip()
        print(f"- last change to operator/: {commit}", file=body)
        report(body)
        title = "# Stalls beside EchoMQ's reaping consumers (issue 21)\n\n" \
                "Made by `bench/stalls.py` (its docstring says what each figure is). The newest run is first.\n\n"
        old = args.results.read_text() if args.results.exists() else ""
        old = old.split("\n## ", 1)[1] if "\n## " in old else ""
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(title + body.getvalue() + ("\n## " + old if old else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
