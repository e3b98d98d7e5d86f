"""Time the morgue's read paths on a large morgue: stats, list --lane, purge --dry-run.

    python bench/morgue.py [--n 300000] [--stats-batches 500,1000,2000] [--no-old]

Starts its own redis-server (stalledpolicy.devenv.redis_server.start_redis),
fills ``--n`` dead entries with a realistic mix (20 lanes and flat jobs, a
few undated entries, rows that are missing or not a hash, errors of 40-400
bytes), then times what the CLI runs for each command:

- ``stats``: morgue_stats;
- ``list --lane nosuch``: morgue_page(lane=...), the page and the lane's
  total from one walk, as ``show_list`` does (``2walks``: the page from
  morgue_list, then the total from a second walk, morgue_stats, as it did
  before);
- ``purge --dry-run --all``: morgue_purge(dry_run=True).

``old`` is the path before the scan aggregated and filtered in the script:
every row of the morgue came back (morgue_scan ``lex`` mode, 500 ids a call)
and Python counted and filtered them; it is rebuilt here from that mode, which
the script still serves (list pages use it). ``new`` is the shipped engine.
Both results are checked equal. The longest single script call is the
server's own figure (SLOWLOG at a 1 ms threshold, EVALSHA/EVALSHA_RO only; the
mean from INFO commandstats).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import Any

from stalledpolicy import engine
from stalledpolicy.devenv.redis_server import start_redis
from stalledpolicy.engine import morgue as morgue_engine
from stalledpolicy.keyspace import QueueKeys

QUEUE = "bench"
LANES = [f"tenant-{i:02d}" for i in range(20)]


def fill(client: Any, n: int, seed: int = 1) -> None:
    rnd = random.Random(seed)
    keys = QueueKeys(QUEUE)
    now_ms = int(time.time() * 1000)
    pipe = client.pipeline(transaction=False)
    members: dict[str, int] = {}
    for i in range(n):
        job_id = f"{1733230000000 + i:013d}-{i:07d}"
        members[job_id] = 0
        roll = rnd.random()
        if roll < 0.005:  # row gone: in no lane
            pass
        elif roll < 0.006:  # not a hash
            pipe.set(keys.job(job_id), "x")
        else:
            attempts = str(rnd.randint(1, 9))
            row = {"state": "dead", "attempts": attempts, "stalled": str(rnd.randint(1, 5)),
                   "payload": "p" * rnd.randint(50, 500),
                   "last_error": "stalled: lease lapsed " + "e" * rnd.randint(20, 380)}
            if rnd.random() < 0.9:
                row["group"] = rnd.choice(LANES)
            if rnd.random() < 0.95:  # the rest dead-lettered by EchoMQ itself: undated
                row["dead_at"] = str(now_ms - rnd.randint(0, 30 * 86400 * 1000))
                row["dead_attempts"] = attempts
            pipe.hset(keys.job(job_id), mapping=row)
        if len(members) >= 5000:
            pipe.zadd(keys.dead, members)
            members = {}
            pipe.execute()
    if members:
        pipe.zadd(keys.dead, members)
    pipe.execute()


# ----------------------------------------------------------- the path before


def _scan_all_old(client: Any):
    keys = QueueKeys(QUEUE)
    cursor: Any = ""
    while True:
        jobs, cursor = morgue_engine._scan(client, keys, "lex", cursor, 500)
        yield from jobs
        if not cursor:
            return


def old_stats(client: Any) -> engine.MorgueStats:
    lanes: dict[str, int] = {}
    unreadable = 0
    oldest = None
    for job in _scan_all_old(client):
        name = engine.lane_of(job)
        if name is None:
            unreadable += 1
            continue
        lanes[name] = lanes.get(name, 0) + 1
        if job.dead_at_ms is not None and (oldest is None or job.dead_at_ms < oldest):
            oldest = job.dead_at_ms
    return engine.MorgueStats(size=int(client.zcard(QueueKeys(QUEUE).dead)), lanes=lanes,
                              oldest_dead_at_ms=oldest, unreadable=unreadable)


def old_list_lane(client: Any, lane: str, limit: int = 100, offset: int = 0):
    page, skipped = [], 0
    for job in _scan_all_old(client):
        if engine.lane_of(job) != lane:
            continue
        if skipped < offset:
            skipped += 1
            continue
        page.append(job)
        if len(page) >= limit:
            break
    return page, old_stats(client).lanes.get(lane, 0)


def two_walks_list_lane(client: Any, lane: str, limit: int = 100, offset: int = 0):
    page = engine.morgue_list(client, QUEUE, lane=lane, limit=limit, offset=offset)
    return page, engine.morgue_stats(client, QUEUE).lanes.get(lane, 0)


def new_list_lane(client: Any, lane: str, limit: int = 100, offset: int = 0):
    page = engine.morgue_page(client, QUEUE, lane=lane, limit=limit, offset=offset)
    return page.jobs, page.total


# ---------------------------------------------------------------- measuring


def _script_stats(client: Any) -> tuple[int, int]:
    """(calls, usec) of EVALSHA and EVALSHA_RO so far (INFO commandstats)."""
    stats = client.info("commandstats")
    calls = usec = 0
    for name in ("cmdstat_evalsha", "cmdstat_evalsha_ro", "cmdstat_eval", "cmdstat_eval_ro"):
        if name in stats:
            calls += int(stats[name]["calls"])
            usec += int(stats[name]["usec"])
    return calls, usec


def timed(client: Any, fn: Callable[[], Any]) -> tuple[float, Any, float, int, float]:
    """(wall seconds, result, longest script call in ms, script calls, mean call
    in ms), the calls' figures from the server: INFO commandstats, and SLOWLOG
    at a 1 ms threshold for the longest (Redis 7 also logs the commands a script
    runs, each far below 1 ms: a 0 threshold floods the log and drops calls)."""
    client.slowlog_reset()
    calls_before, usec_before = _script_stats(client)
    start = time.perf_counter()
    result = fn()
    wall = time.perf_counter() - start
    calls_after, usec_after = _script_stats(client)
    calls = calls_after - calls_before
    entries = [e for e in client.slowlog_get(100_000)
               if (e["command"] if isinstance(e["command"], str) else e["command"].decode()).lower()
               .startswith("eval")]
    longest = max((e["duration"] for e in entries), default=0) / 1000
    return wall, result, longest, calls, (usec_after - usec_before) / max(calls, 1) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300_000)
    parser.add_argument("--stats-batches", default="500,1000,2000",
                        help="ids per stats call to try (the shipped MORGUE_STATS_BATCH is "
                             f"{morgue_engine.MORGUE_STATS_BATCH})")
    parser.add_argument("--no-old", action="store_true", help="skip the path before (slow)")
    args = parser.parse_args()

    server = start_redis()
    try:
        client = server.client(decode_responses=True, encoding_errors="surrogateescape")
        client.config_set("slowlog-log-slower-than", 1000)
        client.config_set("slowlog-max-len", 100_000)
        t0 = time.perf_counter()
        fill(client, args.n)
        print(f"filled {args.n:,} dead entries in {time.perf_counter() - t0:.1f} s "
              f"(redis-server {client.info('server')['redis_version']})\n")

        rows = []

        def run(label: str, path: str, fn: Callable[[], Any]) -> Any:
            wall, result, longest, calls, median = timed(client, fn)
            rows.append((label, path, wall, calls, median, longest))
            return result

        new_stats = run("stats", "new", lambda: engine.morgue_stats(client, QUEUE))
        if not args.no_old:
            assert run("stats", "old", lambda: old_stats(client)) == new_stats, "stats differ"
        for lane in ("nosuch", LANES[3]):
            new = run(f"list --lane {lane}", "new", lambda lane=lane: new_list_lane(client, lane))
            two = run(f"list --lane {lane}", "2walks", lambda lane=lane: two_walks_list_lane(client, lane))
            assert two == new, f"list --lane {lane} differs (2 walks)"
            if not args.no_old:
                old = run(f"list --lane {lane}", "old", lambda lane=lane: old_list_lane(client, lane))
                assert old == new, f"list --lane {lane} differs"
        run("purge --dry-run --all", "as is", lambda: engine.morgue_purge(client, QUEUE, dry_run=True))

        print(f"{'command':<26} {'path':<6} {'seconds':>8} {'calls':>6} {'mean call ms':>13} {'longest call ms':>16}")
        for label, path, wall, calls, median, longest in rows:
            print(f"{label:<26} {path:<6} {wall:>8.2f} {calls:>6} {median:>13.2f} {longest:>16.2f}")

        print(f"\nstats by ids per call (MORGUE_STATS_BATCH; shipped: {morgue_engine.MORGUE_STATS_BATCH})")
        print(f"{'batch':>6} {'seconds':>8} {'calls':>6} {'mean call ms':>13} {'longest call ms':>16}")
        shipped = morgue_engine.MORGUE_STATS_BATCH
        try:
            for batch in (int(b) for b in args.stats_batches.split(",")):
                morgue_engine.MORGUE_STATS_BATCH = batch
                wall, result, longest, calls, median = timed(client, lambda: engine.morgue_stats(client, QUEUE))
                assert result == new_stats
                print(f"{batch:>6} {wall:>8.2f} {calls:>6} {median:>13.2f} {longest:>16.2f}")
        finally:
            morgue_engine.MORGUE_STATS_BATCH = shipped
        client.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
