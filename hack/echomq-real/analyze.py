"""Read one trial of hack/echomq-real (the driver's log, Redis MONITOR's log,
the server's end state) and print one JSON line; or, with ``summary``, read
those lines and print per-K tables.

    analyze.py trial --driver-log F --monitor-log F --redis-url URL --queue Q \
        --mode holds|fixed --k K --trial N --max-stalled 3
    analyze.py summary RESULTS.jsonl

Who moved the poison job out of ``active`` is read from MONITOR: Redis logs
each script call (``EVALSHA sha nkeys keys... args...``) followed by the
commands the script ran (``[0 lua] ...``), so the poison's leaving
``active`` is attributed to the script that did it: EchoMQ's reap (keys:
active, pending; ``ZREM active <poison>``), or our sweep (its keys name
``sweeper:holds``; it removes by rank, so its take is the ``HSET <poison row>
stalled ...`` of the same call). Every lease the
poison got is the ``ZADD active <deadline>`` of EchoMQ's claim (keys: ring,
active).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import sys
from collections import Counter, defaultdict

import redis

LINE = re.compile(r'^(\d+\.\d+) \[\d+ ([^\]]+)\] (.*)$')


def classify(args: list[str], queue: str) -> str:
    """Which script an EVALSHA line runs, from its keys."""
    if len(args) < 3 or args[0].upper() not in ("EVALSHA", "EVAL"):
        return "other"
    keys = args[3:3 + int(args[2])]
    pre = f"emq:{{{queue}}}:"
    if f"{pre}sweeper:holds" in keys:
        return "sweep"
    if keys == [f"{pre}active", f"{pre}pending"]:
        return "reap"
    if keys == [f"{pre}ring", f"{pre}active"]:
        return "claim"
    return "other"


def _score(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def parse_monitor(path: str, queue: str, poison: str) -> dict:
    active = f"emq:{{{queue}}}:active"
    row = f"emq:{{{queue}}}:job:{poison}"
    ctx = "other"
    reap_calls = 0
    first = last = None
    reaped_ids = Counter()
    counted_ids = Counter()  # jobs whose stall our sweep counted (HSET row stalled)
    held_ids = Counter()     # leases our sweep held (ZADD active XX <x.5>)
    job_prefix = f"emq:{{{queue}}}:job:"
    events: list[tuple[float, str, object]] = []  # (t_s, kind, value) for the poison
    with open(path, encoding="utf-8", errors="replace") as fh:
        for raw in fh:
            m = LINE.match(raw.rstrip("\n"))
            if not m:
                continue
            t, source, rest = float(m.group(1)), m.group(2), m.group(3)
            try:
                args = shlex.split(rest)
            except ValueError:
                continue
            if not args:
                continue
            if source != "lua":
                ctx = classify(args, queue)
                continue
            cmd = args[0].upper()
            if ctx == "reap" and cmd == "ZRANGEBYSCORE" and args[1] == active:
                reap_calls += 1
                first = t if first is None else first
                last = t
            if cmd == "ZREM" and len(args) >= 3 and args[1] == active:
                if ctx == "reap":
                    reaped_ids.update(args[2:])
                if poison in args[2:]:
                    events.append((t, f"zrem:{ctx}", None))
            if ctx == "sweep" and cmd == "HSET" and args[1].startswith(job_prefix) and "stalled" in args[2::2]:
                counted_ids[args[1][len(job_prefix):]] += 1
            if ctx == "sweep" and cmd == "ZADD" and args[1] == active and _score(args[-2]) % 1:
                held_ids[args[-1]] += 1
            if ctx == "sweep" and cmd == "HSET" and args[1] == row and "stalled" in args[2::2]:
                # our sweep takes its batch out of active by rank (ZREMRANGEBYRANK, no ids
                # named); the job it took is the row whose `stalled` it writes
                events.append((t, "zrem:sweep", None))
            if cmd == "ZADD" and args[1] == active and args[-1] == poison:
                score = args[-2]
                if ctx == "claim":
                    events.append((t, "lease", float(score)))
                elif ctx == "sweep":
                    events.append((t, "hold" if float(score) % 1 else "restore", float(score)))
                else:
                    events.append((t, f"zadd:{ctx}", float(score)))
    return {"reap_calls": reap_calls, "reaped_ids": reaped_ids, "events": events, "counted_ids": counted_ids,
            "span_s": (last - first) if first is not None else 0.0,  # first reap to last
            "held_ids": held_ids}


def lapses(events: list) -> list[dict]:
    """One record per lease of the poison: its deadline, whether the sweep held
    it (and how long before the deadline), and who took it out of active, how
    long after the deadline (ms)."""
    out: list[dict] = []
    cur: dict | None = None
    for t, kind, value in events:
        if kind == "lease":
            cur = {"deadline": value, "held_ms_before": None, "by": None, "after_ms": None}
            out.append(cur)
        elif cur is None:
            continue
        elif kind == "hold":
            cur["held_ms_before"] = round(cur["deadline"] - t * 1000, 1)
        elif kind.startswith("zrem:") and cur["by"] is None:
            cur["by"] = kind[5:]
            cur["after_ms"] = round(t * 1000 - cur["deadline"], 1)
    return out


def trial(ns: argparse.Namespace) -> None:
    enq: dict[str, str] = {}
    claims: dict[str, list[tuple[int, int]]] = defaultdict(list)
    end = None
    exts: Counter = Counter()
    pauses: list[dict] = []
    with open(ns.driver_log, encoding="utf-8") as fh:
        for line in fh:
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "ENQ":
                enq[parts[2]] = parts[3]
            elif parts[0] == "CLAIM":
                claims[parts[2]].append((int(parts[1]), int(parts[3])))
            elif parts[0] == "PAUSE":
                pauses.append({"stopped_us": int(parts[1]), "continued_us": int(parts[2]), "held_score": parts[3]})
            elif parts[0] == "EXT":
                exts[parts[4]] += 1
            elif parts[0] == "END":
                end = {"outcome": parts[2], "t_enq": int(parts[3]), "t_dead": int(parts[4])}
    poison = next(i for i, kind in enq.items() if kind == "poison")
    r = redis.Redis.from_url(ns.redis_url, decode_responses=True)
    pre = f"emq:{{{ns.queue}}}:"
    row = r.hgetall(f"{pre}job:{poison}")
    totals = r.hgetall(f"{pre}sweeper:totals")
    dead = set(r.zrange(f"{pre}dead", 0, -1))
    active = set(r.zrange(f"{pre}active", 0, -1))
    lane_pending: set[str] = set()
    for key in r.scan_iter(match=f"{pre}g:*:pending"):
        lane_pending |= set(r.zrange(key, 0, -1))
    flat_pending = set(r.zrange(f"{pre}pending", 0, -1))
    completed_count = int(r.hget(f"{pre}metrics:completed", "count") or 0)

    lost, dup, completed, where = [], [], 0, Counter()
    for job, kind in enq.items():
        places = [name for name, s in (("dead", dead), ("active", active), ("lane", lane_pending),
                                        ("pending", flat_pending)) if job in s]
        exists = r.exists(f"{pre}job:{job}")
        if kind != "poison":
            if len(claims[job]) > 1:
                dup.append(job)
            if not places and not exists and claims[job]:
                completed += 1
            else:
                lost.append(job)
                where[",".join(places) or ("row only" if exists else "nowhere")] += 1
        else:
            if len(places) != 1:
                lost.append(job)
    mon = parse_monitor(ns.monitor_log, ns.queue, poison)
    laps = lapses(mon["events"])
    by = Counter(lapse["by"] for lapse in laps)
    poison_claims = len(claims[poison])
    dead_at = int(row.get("dead_at", 0) or 0) if row.get("state") == "dead" else None
    result = {
        "mode": ns.mode, "k": ns.k, "trial": ns.trial, "outcome": end["outcome"] if end else "?",
        "poison_claims": poison_claims,
        "morgue_within_budget": bool(end and end["outcome"] == "morgue" and poison_claims <= ns.max_stalled + 1),
        "time_to_morgue_s": round((dead_at - end["t_enq"] / 1000) / 1000, 2) if dead_at and end else None,
        "crashes": poison_claims,  # every poison claim killed its consumer: one lapse each
        "lapses_taken": by["sweep"] + by["reap"],
        "counted_by_sweep": by["sweep"],
        "reaped_uncounted": by["reap"],
        "still_leased": by[None],
        "stalled_field": int(row.get("stalled", 0) or 0),
        "poison_state": row.get("state"),
        "totals": {k: int(totals.get(k, 0)) for k in ("recovered", "dead_lettered", "uncounted")},
        "holds_taken": sum(1 for lapse in laps if lapse["held_ms_before"] is not None),
        "reap_calls": mon["reap_calls"],
        "reaps_per_s": round(mon["reap_calls"] / mon["span_s"], 1) if mon["span_s"] else None,
        "reaps_of_poison": mon["reaped_ids"][poison],
        "reaps_of_others": sum(mon["reaped_ids"].values()) - mon["reaped_ids"][poison],
        "healthy_enqueued": sum(1 for k in enq.values() if k != "poison"),
        "slow_enqueued": sum(1 for k in enq.values() if k == "slow"),
        "extensions": dict(exts),
        "sweeper_paused_ms": [round((p["continued_us"] - p["stopped_us"]) / 1000) for p in pauses],
        "holds_of_others": sum(n for i, n in mon["held_ids"].items() if i != poison),
        "counted_others": sum(n for i, n in mon["counted_ids"].items() if i != poison),
        "healthy_completed": completed, "completed_metric": completed_count,
        "lost": len(lost), "lost_where": dict(where), "duplicated": len(dup),
        "conserved": not lost and not dup,
        "lapse_detail": [{"held_before_ms": lapse["held_ms_before"], "by": lapse["by"],
                          "after_deadline_ms": lapse["after_ms"]}
                         for lapse in laps],
    }
    print(json.dumps(result))


def summary(ns: argparse.Namespace) -> None:
    rows = [json.loads(line) for line in open(ns.results, encoding="utf-8") if line.strip()]
    groups: dict[tuple, list] = defaultdict(list)
    for row in rows:
        groups[(row["mode"], row["k"])].append(row)
    print("| sweeper | K | trials | morgue within budget+1 claims | poison claims (each trial) "
          "| time to morgue s (median) "
          "| lapses taken: counted / reaped uncounted | stalled field | totals rec/dead/uncounted (sum) "
          "| reap calls (median) | reaps/s (median) | conserved |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (mode, k), rs in sorted(groups.items(), key=lambda kv: (kv[0][0] != "holds", kv[0][1])):
        ttm = [r["time_to_morgue_s"] for r in rs if r["time_to_morgue_s"] is not None]
        tot = Counter()
        for r in rs:
            tot.update(r["totals"])
        print(f"| {mode} | {k} | {len(rs)} | {sum(r['morgue_within_budget'] for r in rs)}/{len(rs)} "
              f"| {','.join(str(r['poison_claims']) + ('' if r['outcome'] == 'morgue' else '*') for r in rs)} "
              f"| {statistics.median(ttm) if ttm else '-'} "
              f"| {sum(r['counted_by_sweep'] for r in rs)} / {sum(r['reaped_uncounted'] for r in rs)} "
              f"| {','.join(str(r['stalled_field']) for r in rs)} "
              f"| {tot['recovered']}/{tot['dead_lettered']}/{tot['uncounted']} "
              f"| {statistics.median(r['reap_calls'] for r in rs)} "
              f"| {statistics.median(r.get('reaps_per_s') or 0 for r in rs)} "
              f"| {sum(r['conserved'] for r in rs)}/{len(rs)} |")
    print("\n(* = the bound ended the trial; the poison job was still cycling)")


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("trial")
    for name in ("--driver-log", "--monitor-log", "--redis-url", "--queue", "--mode"):
        t.add_argument(name, required=True)
    t.add_argument("--k", type=int, required=True)
    t.add_argument("--trial", type=int, required=True)
    t.add_argument("--max-stalled", type=int, default=3)
    s = sub.add_parser("summary")
    s.add_argument("results")
    ns = p.parse_args(argv)
    (trial if ns.cmd == "trial" else summary)(ns)


if __name__ == "__main__":
    main(sys.argv[1:])
