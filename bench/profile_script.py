"""Profile the sweep script: commands per job, and what each part of it costs.

    python bench/profile_script.py [--n 100000] [--batch 100] [--rounds 2]

The shipped script (never edited here) is compared with variants made in
memory by textual ablation, each run by EVAL on the same seeded queue:

- ``heard``: as with a subscriber of the events channel (these runs have
  none, so the shipped script sends no event: scripts/lib/listeners.lua);
- ``no-publish``: heard, but the PUBLISH commands become a no-op (the JSON is
  still built);
- ``no-json-scan``: heard, but ids are quoted without the batch's escaping scan;
- ``hmget-call``: HMGET by redis.call instead of redis.pcall;
- ``no-lane-checks``: the ring/wake checks of lib/lanes.lua (SMISMEMBER,
  ZCARD, HMGET glimit, LRANGE or LPOS) skipped after gactive is settled; no
  lane is put on the ring (NOT correct, cost only);
- ``no-lane-totals``: the per-lane fields of sweeper:totals and the reply's
  lanes text skipped (the four queue-wide totals are still counted);
- ``no-settle``: lib/lanes.lua's settle_lanes (gactive, ring, wake) skipped
  (NOT correct, cost only);
- ``no-lane-bookkeeping``: both, and the queue-wide totals too (NOT correct);
- ``lua-floor``: not the script at all: the same per-job commands (HMGET,
  HSET, PUBLISH) and per-batch ZRANGEBYSCORE/ZREMRANGEBYRANK/ZADD with none of its logic
  (every job to pending): the floor of this work inside one Lua script (heard:
  it publishes).

Each variant's figure is the server's time (INFO commandstats eval usec) per
job, minimum over ``--rounds`` interleaved rounds (the machine is shared).
Variants that drop effects still must move every job: counts are checked.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import echomq_seed  # noqa: E402
import redisstats  # noqa: E402

from stalledpolicy.engine import Budgets  # noqa: E402
from stalledpolicy.engine.sweep import sweep_call  # noqa: E402
from stalledpolicy.keyspace import QueueKeys  # noqa: E402
from stalledpolicy.lua import script  # noqa: E402

QUEUE = "bench"
BUDGET = 3

NOOP = "local function __noop(...) return 0 end\n"


def _replace(body: str, old: str, new: str) -> str:
    if old not in body:
        raise SystemExit(f"profile: the script changed, cannot find {old!r}; update bench/profile_script.py")
    return body.replace(old, new)


# The same commands as the sweep with none of its logic: the floor of doing
# this work inside one Lua script (no budget, lanes, quarantine or escaping).
LUA_FLOOR = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local limit = tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit + 1)
local more = 0
if #ids > limit then more = 1; ids[#ids] = nil end
if #ids == 0 then return {0, 0, 0, 0, 0, {}} end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #ids - 1)
local zargs = {}
for _, id in ipairs(ids) do
  local row = ARGV[1] .. 'job:' .. id
  local f = redis.call('HMGET', row, 'group', 'stalled', 'attempts', 'state')
  redis.call('HSET', row, 'stalled', string.format('%d', (tonumber(f[2]) or 0) + 1), 'state', 'pending')
  redis.call('PUBLISH', ARGV[4], '{"event":"stalled","job":"' .. id .. '"}')
  zargs[#zargs + 1] = '0' -- a string: Redis formats a Lua number as a double
  zargs[#zargs + 1] = id
end
redis.call('ZADD', KEYS[2], unpack(zargs))
return {#ids, 0, 0, 0, more, {}}
"""


def _heard(body: str) -> str:
    # as listened() answers when someone subscribes: every event is sent
    return _replace(body, "local publishing = can_publish and listened(channel)", "local publishing = can_publish")


def _no_lane_totals(body: str) -> str:
    # both loops over the call's lanes: their totals' fields and the reply's text
    return _replace(body, "for i = 1, #lanes_out, 3 do", "for i = 1, 0, 3 do")


def _shadowed(body: str, *functions: str) -> str:
    """``body`` with each of ``functions`` (a library function the sweep calls)
    redefined, before the sweep's own code, as one that does nothing."""
    no_ops = "".join(f"local function {name}() end\n" for name in functions)
    return _replace(body, "local prefix = ARGV[1]\n", no_ops + "local prefix = ARGV[1]\n")


# Each variant is built from the shipped body by one textual edit; kept as
# builders so a caller can build only the variants it runs (an edit whose
# anchor the engine has since moved then fails only for that variant).
VARIANTS = {
    "as shipped": lambda body: body,
    "heard": _heard,
    "no-publish": lambda body: NOOP + _replace(_replace(_heard(body), "redis.call('PUBLISH', channel, ",
                                                        "__noop(channel, "),
                                               "redis_call('PUBLISH', channel, ", "__noop(channel, "),
    "no-json-scan": lambda body: _replace(
        _heard(body), "  escape_ids = string.find(all_ids, '^[ -~]*$') == nil "
                      "or string.find(all_ids, '\"', 1, true) ~= nil\n"
                      "    or string.find(all_ids, '\\\\', 1, true) ~= nil",
        "  escape_ids = false"),
    "hmget-call": lambda body: _replace(body, "redis.pcall('HMGET'", "redis.call('HMGET'"),
    "no-lane-checks": lambda body: _replace(body, "  if #ringable == 0 then return end\n",
                                            "  do return end -- ring/wake skipped\n"),
    "no-lane-totals": _no_lane_totals,
    "no-settle": lambda body: _shadowed(body, "settle_lanes"),
    "no-lane-bookkeeping": lambda body: _no_lane_totals(_shadowed(body, "settle_lanes", "add_counts")),
    "lua-floor": lambda body: LUA_FLOOR,
}


def variants(body: str, names=None) -> dict[str, str]:
    """The variants of ``body`` (all, or only ``names``), by name."""
    return {name: build(body) for name, build in VARIANTS.items() if names is None or name in names}


def run_variant(client, body: str, n: int, batch: int, around_drain=contextlib.nullcontext,
                shape: str = "ours") -> dict:
    """Seed (``shape``: one of echomq_seed.SHAPES), drain with ``body``, check.
    ``around_drain()`` is a context manager entered just before the first call
    and left just after the last (stats reset and script load are outside it):
    bench/instructions.py counts instructions inside it."""
    client.flushall()
    expected = echomq_seed.seed(client, QUEUE, n, budget=BUDGET, **echomq_seed.SHAPES[shape])
    keys, args = sweep_call(QueueKeys(QUEUE), batch, Budgets(default=BUDGET))
    sha = client.script_load(body)
    redisstats.reset(client)
    before = redisstats.commandstats(client)
    calls = 0
    with around_drain():
        while True:
            reply = client.evalsha(sha, len(keys), *keys, *args)
            calls += 1
            if not int(reply[4]):
                break
    after = redisstats.commandstats(client)
    seen = echomq_seed.observe(client, QUEUE)
    moved = seen.pending + sum(seen.lanes.values()) + seen.dead  # lua-floor: all to pending
    if seen.active != 0 or moved != n:
        raise AssertionError(f"variant left active={seen.active}, moved {moved} of {n}")
    usec = int(after["evalsha"]["usec"]) - int(before.get("evalsha", {}).get("usec", 0))
    mix = redisstats.work_commands(before, after)
    return {"usec_per_job": usec / n, "calls": calls, "commands_per_job": sum(mix.values()) / n,
            "mix": {k: round(v / n, 3) for k, v in sorted(mix.items())},
            "dead": seen.dead, "expected_dead": expected.dead}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--batch", type=int, action="append")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--nice", type=int, default=0, help="redis-server niceness (root only)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    batches = args.batch or [100, 1000]
    from stalledpolicy.devenv.redis_server import start_redis

    body = script("sweep").body
    server = start_redis()
    results: dict = {}
    try:
        if args.nice:
            import os

            os.setpriority(os.PRIO_PROCESS, server.process.pid, args.nice)
        client = server.client(decode_responses=True)
        for batch in batches:
            for _ in range(args.rounds):
                for name, variant in variants(body).items():
                    run = run_variant(client, variant, args.n, batch)
                    best = results.setdefault(batch, {}).get(name)
                    if best is None or run["usec_per_job"] < best["usec_per_job"]:
                        results[batch][name] = run
    finally:
        server.stop()
    for batch, by_name in results.items():
        base = by_name["as shipped"]["usec_per_job"]
        print(f"\nbatch {batch}, N={args.n:,} (server usec per job, min of {args.rounds} rounds):")
        for name, run in by_name.items():
            print(f"  {name:>15}: {run['usec_per_job']:6.2f} us/job ({run['usec_per_job'] / base:5.0%}), "
                  f"{run['commands_per_job']:.2f} commands/job")
        print("  commands per job as shipped:", json.dumps(by_name["as shipped"]["mix"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
