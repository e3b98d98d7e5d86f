"""Issue 6: our sweep side by side with BullMQ's and RQ's own stalled-job recovery.

    python bench/peers/run.py            # N = 10,000, 100,000, 1,000,000
    python bench/peers/run.py --quick    # N = 10,000 only (smoke)

Installs the peers into bench/peers/work/ (BullMQ and ioredis from the npm
registry with `npm ci` from the committed lockfile, RQ from PyPI into a venv;
nothing global), starts its own redis-server on a free loopback port and, for
each system and N: flushes, prepares N stalled jobs in that system's own layout,
starts a second client PINGing in a tight loop (its own process and connection;
``--ping-interval-ms``: paced), triggers that system's own recovery, stops the
PING client, and checks that every job really moved (a run that fails its check
aborts: no figure without it). Ours runs on our mix (a third of the jobs in 20
lanes, a tenth dead-lettered) and, at the default settings, also on the peers'
(``ours-like-peers``: every job back to its queue, as theirs do), and with a
subscriber of the events channel (``ours-heard``: the sweep sends no event no
one can receive; the other rows have no subscriber). Then: repeated
drains of 1,000 expired jobs among 0 / 100,000 / 1,000,000 healthy active ones
(and 10,000 among 1,000,000), and the ceiling (the same work without Lua).
``--scale-pairs K``: before those, K pairs of our default row at 100,000 and
``--scale-large`` jobs in turn (bench/scale.py), the scale ratio.

Writes bench/out/peers.json (read by bench/plot.py) and prints one table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
sys.path.insert(0, str(BENCH))

import ceiling  # noqa: E402
import redisstats  # noqa: E402
import scale  # noqa: E402
import sweep  # noqa: E402
from pinger import Pinger  # noqa: E402

from stalledpolicy.sweeper.config import BATCH_DEFAULT  # noqa: E402

WORK = HERE / "work"
BULLMQ_DIR = WORK / "bullmq"
RQ_VENV = WORK / "rq-venv"
PEER_LIMIT_S = 600.0
# Ours at the default settings (each call sized to ~1 ms within batchSize, as
# the sweeper runs), and at fixed batches of 25 (the default before), 100 and
# 1,000, beside each peer: on our own mix (a third of the jobs in 20 lanes, a
# tenth dead-lettered), and at the default settings also on the peers' (every
# job recovered to its queue, no lanes: what BullMQ's and RQ's recovery do), the
# like-for-like row (echomq_seed.SHAPES); at the default settings on our mix
# also with a subscriber of the events channel (the sweep sends no event no one
# can receive: ours-heard is a queue someone watches). (batch, shape, heard)
OUR_ROWS = (("default", "ours", False), ("default", "peers", False), ("default", "ours", True),
            (25, "ours", False), (100, "ours", False), (1000, "ours", False))
# Commands whose duration is one blocking call of a peer (Lua script, MULTI/EXEC).
BLOCKING_COMMANDS = {"evalsha", "eval", "exec"}


def log(message: str) -> None:
    print(message, flush=True)


def _digest(*paths: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def install_bullmq() -> None:
    if not shutil.which("node") or not shutil.which("npm"):
        raise SystemExit("node and npm are needed for the BullMQ peer (apt-get install -y nodejs npm)")
    BULLMQ_DIR.mkdir(parents=True, exist_ok=True)
    sources = [HERE / "bullmq" / "package.json", HERE / "bullmq" / "package-lock.json"]
    stamp = BULLMQ_DIR / ".installed"
    wanted = _digest(*sources)
    for source in sources + [HERE / "bullmq" / "bench.cjs"]:
        shutil.copy2(source, BULLMQ_DIR / source.name)
    if stamp.exists() and stamp.read_text() == wanted and (BULLMQ_DIR / "node_modules").exists():
        return
    log("installing BullMQ (npm ci) into bench/peers/work/bullmq ...")
    subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=BULLMQ_DIR, check=True)
    stamp.write_text(wanted)


def install_rq() -> None:
    requirements = HERE / "rq" / "requirements.txt"
    stamp = RQ_VENV / ".installed"
    wanted = _digest(requirements)
    if stamp.exists() and stamp.read_text() == wanted:
        return
    log("installing RQ (pip) into bench/peers/work/rq-venv ...")
    subprocess.run([sys.executable, "-m", "venv", str(RQ_VENV)], check=True)
    subprocess.run([str(RQ_VENV / "bin" / "pip"), "install", "-q", "-r", str(requirements)], check=True)
    stamp.write_text(wanted)


def _peer_command(system: str, *args: str) -> tuple[list[str], Path | None]:
    if system == "bullmq":
        return ["node", "bench.cjs", *args], BULLMQ_DIR
    return [str(RQ_VENV / "bin" / "python"), str(HERE / "rq" / "bench_rq.py"), *args], None


def _peer_json(system: str, port: int, *args: str) -> dict:
    command, cwd = _peer_command(system, *args)
    done = subprocess.run(command, cwd=cwd, env=dict(os.environ, BENCH_REDIS_PORT=str(port)),
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{system} {' '.join(args)} failed ({done.returncode}):\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


class PeerCheckFailed(AssertionError):
    """A peer's own recovery left its jobs wrong (a finding about the peer): its row
    says so, with no figure, and the run goes on."""


def run_peer(system: str, client, port: int, n: int, nice: int = 0, ping_interval_s: float = 0.0) -> dict:
    client.flushall()
    started = time.perf_counter()
    _peer_json(system, port, "seed", str(n))
    log(f"    {system}: seeded {n:,} stalled jobs in {time.perf_counter() - started:.1f} s")
    redisstats.reset(client)
    command, cwd = _peer_command(system, "recover")
    process = subprocess.Popen(command, cwd=cwd, env=dict(os.environ, BENCH_REDIS_PORT=str(port)),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready = process.stdout.readline().strip()
    if ready != "ready":
        process.kill()
        raise RuntimeError(f"{system} recover did not get ready: {ready!r} {process.stderr.read()[-4000:]}")
    with Pinger(port, nice=nice, interval_s=ping_interval_s) as pinger:
        process.stdin.write("go\n")
        process.stdin.flush()
        out, err = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"{system} recover failed ({process.returncode}):\n{out[-2000:]}\n{err[-4000:]}")
    timings = json.loads(out.strip().splitlines()[-1])
    # Scripts are in SLOWLOG (usec); a MULTI/EXEC only in the latency monitor (ms).
    server_max_us = max(redisstats.slowest_us(client, BLOCKING_COMMANDS),
                        redisstats.longest_event_ms(client) * 1000)
    check = _peer_json(system, port, "verify", str(n))
    if not check.get("ok"):
        raise PeerCheckFailed(f"its recovery did not leave every job queued once: {check}")
    seconds = timings["seconds"]
    if system == "bullmq":
        longest_client = max(p["seconds"] for p in timings["passes"])
        recovered = sum(p["recovered"] for p in timings["passes"])
        if recovered != n:
            raise AssertionError(f"bullmq reported {recovered} stalled jobs of {n}")
    else:
        longest_client = timings["longest_call_s"]
    stats = pinger.stats
    return {
        "system": system, "n": n, "seconds": seconds, "jobs_per_s": n / seconds,
        "client_max_call_ms": longest_client * 1000, "server_max_call_ms": server_max_us / 1000,
        "ping_p50_ms": stats.p50_ms, "ping_p99_ms": stats.p99_ms, "ping_max_ms": stats.max_ms,
        "busy_errors": stats.busy_errors, "longest_without_pong_ms": stats.longest_without_pong_ms,
        "detail": timings, "verified": check, "load": os.getloadavg()[0],
    }


def _label(batch: int | str, shape: str = "ours", heard: bool = False) -> str:
    if shape == "peers":
        return "ours-like-peers"
    if heard:
        return "ours-heard"
    return "ours-default" if batch == "default" else f"ours-b{batch}"


def run_ours(client, port: int, n: int, batch: int | str, healthy: int = 0, nice: int = 0,
             shape: str = "ours", ping_interval_s: float = 0.0, heard: bool = False) -> dict:
    """``batch`` "default": the sweeper's default settings (sized calls);
    ``shape``: the seeded mix (echomq_seed.SHAPES); ``heard``: with a
    subscriber of the events channel."""
    sized = batch == "default"
    run = sweep.run_one(client, port, n, BATCH_DEFAULT if sized else int(batch), healthy=healthy, nice=nice,
                        sized=sized, shape=shape, ping_interval_s=ping_interval_s, heard=heard)
    row = asdict(run)
    row.update(system=_label(batch, shape, heard), shape=shape, heard=heard, load=os.getloadavg()[0],
               longest_without_pong_ms=float("nan"))
    return row


def _projected_seconds(system: str, rows: list[dict], n: int) -> float | None:
    """From this run's largest measured N: BullMQ's recovering pass is quadratic
    (one LREM over the active list per job), RQ's cleanup linear."""
    measured = [r for r in rows if r["system"] == system and not r.get("skipped")]
    if not measured:
        return None
    last = max(measured, key=lambda r: r["n"])
    power = 2 if system == "bullmq" else 1
    return last["seconds"] * (n / last["n"]) ** power


def fmt_ms(value: float) -> str:
    if value != value:  # nan
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


def print_table(rows: list[dict]) -> None:
    header = ("system", "N", "jobs/s", "longest call ms (client / server)", "PING p50 / p99 / max ms", "BUSY",
              "ours " + " / ".join(_label(*spec)[5:] for spec in OUR_ROWS) + " vs it")
    ours = {(r["system"], r["n"]): r for r in rows if r["system"].startswith("ours") and not r.get("skipped")}
    lines = []
    for r in rows:
        if r.get("skipped"):
            lines.append((r["system"], f"{r['n']:,}", "failed" if r.get("failed") else "skipped", r["reason"],
                          "", "", ""))
            continue
        ratio = ""
        if not r["system"].startswith("ours"):
            parts = []
            for spec in OUR_ROWS:
                mine = ours.get((_label(*spec), r["n"]))
                parts.append(f"{mine['jobs_per_s'] / r['jobs_per_s']:,.0f}x" if mine else "-")
            ratio = " / ".join(parts)
        lines.append((
            r["system"], f"{r['n']:,}", f"{r['jobs_per_s']:,.0f}",
            f"{fmt_ms(r['client_max_call_ms'])} / {fmt_ms(r['server_max_call_ms'])}",
            f"{r['ping_p50_ms']:.3f} / {fmt_ms(r['ping_p99_ms'])} / {fmt_ms(r['ping_max_ms'])}",
            f"{r['busy_errors']:,}", ratio,
        ))
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    log("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    log("| " + " | ".join("-" * w for w in widths) + " |")
    for line in lines:
        log("| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                              enumerate(zip(line, widths))) + " |")


def main(argv: list[str] | None = None) -> int:
    # SIGTERM unwinds like Ctrl-C, so the redis-server we started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="N = 10,000 only")
    parser.add_argument("--n", type=int, action="append", help="sizes (repeatable; default 10k, 100k, 1M)")
    parser.add_argument("--systems", default="ours,bullmq,rq", help="comma-separated subset")
    parser.add_argument("--no-extras", action="store_true", help="skip the healthy-active and ceiling runs")
    parser.add_argument("--nice", type=int, default=0,
                        help="run the whole benchmark (redis-server, PING client, every system's driver) at "
                             "this niceness, e.g. -10 on a machine shared with other work (root only)")
    parser.add_argument("--scale-pairs", type=int, default=0, metavar="K",
                        help="then K pairs of our default row at 100,000 and --scale-large jobs in turn on the "
                             "same server: the scale ratio without the host's drift between two runs (bench/scale.py)")
    parser.add_argument("--scale-large", type=int, default=1_000_000)
    parser.add_argument("--ping-interval-ms", type=float, default=0.0,
                        help="the PING client's pace: the next PING that long after the last one was sent; 0 (the "
                             "default): a tight loop, which keeps one of this machine's two cores busy")
    parser.add_argument("--json", type=Path, default=BENCH / "out" / "peers.json")
    args = parser.parse_args(argv)
    sizes = [10_000] if args.quick else (args.n or [10_000, 100_000, 1_000_000])
    systems = args.systems.split(",")

    if args.nice:
        # Inherited by everything started from here on: redis-server, the PING
        # client, our drain and the peers' drivers alike.
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    if "bullmq" in systems:
        install_bullmq()
    if "rq" in systems:
        install_rq()

    from stalledpolicy.devenv.redis_server import start_redis

    server = start_redis()
    rows: list[dict] = []
    extras: dict = {}
    try:
        client = server.client(decode_responses=True)
        info = client.info("server")
        machine = {"redis": info["redis_version"], "cores": os.cpu_count(), "node": _version(["node", "--version"]),
                   "python": sys.version.split()[0], "started_load": os.getloadavg(), "nice": args.nice,
                   "bullmq": "6.7.0", "rq": "3.0.0", "ping_interval_ms": args.ping_interval_ms}
        pace = f"every {args.ping_interval_ms:g} ms" if args.ping_interval_ms else "in a tight loop"
        log(f"redis-server {info['redis_version']} on 127.0.0.1:{server.port} (nice {args.nice}); PING client "
            f"{pace}; {sweep.load_line()}")
        ping_interval_s = args.ping_interval_ms / 1000
        for n in sorted(sizes):
            log(f"N = {n:,}")
            for system in systems:
                if system == "ours":
                    for batch, shape, heard in OUR_ROWS:
                        row = run_ours(client, server.port, n, batch, nice=args.nice, shape=shape,
                                       ping_interval_s=ping_interval_s, heard=heard)
                        rows.append(row)
                        _say(row)
                    continue
                projected = _projected_seconds(system, rows, n)
                if projected is not None and projected > PEER_LIMIT_S:
                    reason = (f"projected {projected:,.0f} s from this run's largest N "
                              f"({'quadratic' if system == 'bullmq' else 'linear'}) > {PEER_LIMIT_S:.0f} s")
                    rows.append({"system": system, "n": n, "skipped": True, "reason": reason})
                    log(f"    {system}: skipped at N={n:,}: {reason}")
                    continue
                try:
                    row = run_peer(system, client, server.port, n, nice=args.nice, ping_interval_s=ping_interval_s)
                except PeerCheckFailed as exc:
                    rows.append({"system": system, "n": n, "skipped": True, "failed": True, "reason": str(exc)})
                    log(f"    {system}: failed at N={n:,}: {exc}")
                    continue
                rows.append(row)
                _say(row)
            _save(args.json, machine, rows, extras)
        if "ours" in systems and args.scale_pairs > 0:
            log(f"scale: {args.scale_pairs} pairs of ours-default at 100,000 and {args.scale_large:,} in turn")
            extras["scale"] = scale.alternate_sizes(client, server.port, 100_000, args.scale_large, args.scale_pairs,
                                                    lambda line: log("    " + line), ping_interval_s)
            _save(args.json, machine, rows, extras)
        if "ours" in systems and not args.no_extras:
            extras["healthy"] = sweep.healthy_scaling(client)
            extras["ceiling"] = []
            ceiling_n = 10_000 if args.quick else 100_000
            for mode in ("naive", "script-mix"):
                result = ceiling.run_ceiling(client, server.port, ceiling_n, mode)
                extras["ceiling"].append(result)
                log(f"    ceiling {mode}: {result['jobs_per_s']:,.0f} jobs/s at N={ceiling_n:,}")
        machine["finished_load"] = os.getloadavg()
        _save(args.json, machine, rows, extras)
    finally:
        server.stop()

    log("")
    print_table(rows)
    _print_extras(rows, extras)
    log(f"\nJSON: {args.json}")
    return 0


def _say(row: dict) -> None:
    log(f"    {row['system']}: {row['jobs_per_s']:,.0f} jobs/s, longest call {fmt_ms(row['client_max_call_ms'])} ms "
        f"client / {fmt_ms(row['server_max_call_ms'])} ms server, PING p99 {fmt_ms(row['ping_p99_ms'])} ms "
        f"max {fmt_ms(row['ping_max_ms'])} ms, BUSY {row['busy_errors']}, verified; load {row['load']:.2f}")


def _print_extras(rows: list[dict], extras: dict) -> None:
    if extras.get("scale"):
        scale.print_scale(extras["scale"], log)
    if extras.get("healthy"):
        log("")
        sweep.print_healthy(extras["healthy"])
    if extras.get("ceiling"):
        n = extras["ceiling"][0]["n"]
        log(f"\nCeiling at N={n:,} (same work without Lua, redis-cli --pipe):")
        for result in extras["ceiling"]:
            parts = []
            for spec in OUR_ROWS:
                label = _label(*spec)
                mine = [r for r in rows if r["system"] == label and r["n"] == n]
                if mine:
                    parts.append(f"{label} = {mine[0]['jobs_per_s'] / result['jobs_per_s']:.0%}")
            log(f"  {result['mode']:>10}: {result['jobs_per_s']:,.0f} jobs/s "
                f"({result['commands_per_job']:.2f} commands/job); " + ", ".join(parts))


def _version(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True).stdout.strip()
    except OSError:
        return "-"


def _save(path: Path, machine: dict, rows: list[dict], extras: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine, "rows": rows, "extras": extras}, indent=2, default=str))


if __name__ == "__main__":
    sys.exit(main())
