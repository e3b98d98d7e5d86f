"""Instructions per job of the sweep script, counted by callgrind: a comparison without timing noise.

    python bench/instructions.py [--n 20000] [--batch 100 --batch 1000] [--variant NAME ...]
                                 [--script path/to/candidate/sweep.lua ...] [--shape ours --shape peers]
                                 [--json PATH]

Times on this shared 2-core machine wobble by +-20 % from run to run; the
number of instructions redis-server executes for the same commands does not,
once its random seeds and its wall clock are fixed (SAME_SEEDS_AND_CLOCK_C).
For each variant and batch a fresh redis-server (the same start every time)
runs under ``valgrind --tool=callgrind`` with instrumentation off (about 4x
slower rather than 50x+), then: FLUSHALL, seed exactly as bench/profile_script.py
does, instrumentation on, drain by EVALSHA in calls of ``batch`` until the
script reports no more, instrumentation off, dump, read the dump's total
``Ir``. Every drain is checked as profile_script checks it (``active`` empty,
every job moved); a failed check aborts the run.

Counted: what redis-server executes inside processCommand() during the drain,
i.e. every EVALSHA: the script, the commands it calls, the replies built.
Not counted: the socket reads/writes, the event loop and the timer (see
Callgrind.__init__ for why).

Variants are profile_script's (``--variant all`` for all of them; "as
shipped", the script the package loads now, is always measured: it is the
baseline). ``--script PATH`` adds a candidate sweep.lua, expanded by the
package loader's ``-- @include`` (the libraries come from the installed
package's scripts/lib, not from next to PATH). Without ``--variant``: only
"as shipped" when a ``--script`` is given, else all. ``--shape peers`` seeds the
peers' mix instead of ours (echomq_seed.SHAPES; repeatable): what the lanes cost.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import echomq_seed  # noqa: E402
import profile_script  # noqa: E402

from stalledpolicy.devenv.ports import free_port  # noqa: E402
from stalledpolicy.devenv.redis_server import RedisServer, _wait_ready, redis_server_binary  # noqa: E402
from stalledpolicy.lua import expand, script  # noqa: E402

BASELINE = "as shipped"
STARTUP_TIMEOUT_S = 120  # valgrind takes seconds to start redis-server on a loaded machine
CONTROL_TIMEOUT_S = 300

# The same commands do not cost the same instructions in two redis-server
# processes: the dict hash seed comes from /dev/urandom, skiplist levels from
# random() seeded with time and pid (0.3-1 % apart, tried), and the clock
# gets into the data (TIME's microseconds vary in length, and the Lua heap
# and its garbage collector with them: 0.05 %). This library, preloaded into
# the benchmark's redis-server only, fixes both seeds and stops the wall clock
# (gettimeofday, time, CLOCK_REALTIME) at one instant; the monotonic clock,
# which drives redis's timer and event loop, runs on. The seeded leases lapse
# a minute before that instant, so every job is still expired.
SAME_SEEDS_AND_CLOCK_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#define REAL(name, type) ((type)dlsym(RTLD_NEXT, name))
static char zeros[64];
static FILE *opened(const char *real_name, const char *path, const char *mode) {
  if (strcmp(path, "/dev/urandom") == 0) return fmemopen(zeros, sizeof zeros, "r");
  return REAL(real_name, FILE *(*)(const char *, const char *))(path, mode);
}
FILE *fopen(const char *path, const char *mode) { return opened("fopen", path, mode); }
FILE *fopen64(const char *path, const char *mode) { return opened("fopen64", path, mode); }
void srandom(unsigned seed) { REAL("srandom", void (*)(unsigned))(1); }
void srand(unsigned seed) { REAL("srand", void (*)(unsigned))(1); }
#define NOW 1767225600 /* 2026-01-01 00:00:00 UTC */
int gettimeofday(struct timeval *tv, void *tz) { tv->tv_sec = NOW; tv->tv_usec = 0; return 0; }
time_t time(time_t *t) { if (t) *t = NOW; return NOW; }
int clock_gettime(clockid_t id, struct timespec *ts) {
  if (id != CLOCK_REALTIME) return REAL("clock_gettime", int (*)(clockid_t, struct timespec *))(id, ts);
  ts->tv_sec = NOW; ts->tv_nsec = 0; return 0;
}
"""


def build_preload(folder: Path) -> Path | None:
    source, library = folder / "same_seeds_and_clock.c", folder / "same_seeds_and_clock.so"
    source.write_text(SAME_SEEDS_AND_CLOCK_C)
    try:
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(library), str(source), "-ldl"],
                       check=True, capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as failed:
        print(f"  cannot build the preload library ({failed}): seeds and clock not fixed, "
              "counts will differ by up to 1 % between runs", file=sys.stderr)
        return None
    return library


class Callgrind:
    """A fresh redis-server under callgrind on a free loopback port; counts only inside counting()."""

    def __init__(self, preload: Path | None) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="stalledpolicy-callgrind-"))
        port = free_port()
        # Instrumentation (`callgrind_control -i on/off`) brackets the drain and
        # keeps seeding fast. Within it only processCommand() is counted
        # (collection off at start, toggled on entry and off on exit): the
        # commands' own work. Outside it are reading requests, writing replies,
        # the event loop and the 10 Hz timer, whose share depends on how long
        # the drain took (each tick refreshes jemalloc's stats, about 110,000
        # instructions): counting them too, the same drain differed by up to
        # 0.2 % between runs (tried); the timer was about 1 % of the total, the
        # rest 0.25 %. processCommand is never re-entered (scripts call
        # commands through call()), so the toggle cannot flip twice.
        valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                    "--collect-atstart=no", "--toggle-collect=processCommand",
                    f"--callgrind-out-file={self.tmp}/cg.%p", f"--log-file={self.tmp}/valgrind.log"]
        # start_redis() takes no command prefix: its minimal config (no
        # persistence, loopback only) is repeated here. The rest removes work
        # driven by the clock rather than by the commands: rehashing the
        # keyspace 1 ms per timer tick (the commands then rehash it, the same
        # steps every time), jemalloc's background and decay-driven purging,
        # and BUSY handling should a call under valgrind outlast 5 s.
        redis = [redis_server_binary(),
                 "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(self.tmp), "--logfile", str(self.tmp / "redis.log"), "--daemonize", "no",
                 "--activerehashing", "no", "--jemalloc-bg-thread", "no", "--busy-reply-threshold", "600000"]
        env = {**os.environ, "MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1"}
        if preload:
            env["LD_PRELOAD"] = str(preload)
        try:
            process = subprocess.Popen(valgrind + redis, env=env,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        self.server = RedisServer(port=port, workdir=self.tmp, process=process)
        try:
            _wait_ready(port, process, timeout=STARTUP_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise

    def _control(self, *args: str) -> None:
        # valgrind's pid is redis-server's: valgrind runs the program in its own process
        done = subprocess.run(["callgrind_control", *args, str(self.server.process.pid)],
                              capture_output=True, text=True, timeout=CONTROL_TIMEOUT_S)
        if done.returncode != 0 or "OK" not in done.stdout:
            raise RuntimeError(f"callgrind_control {' '.join(args)} failed: {done.stdout}{done.stderr}")

    @contextlib.contextmanager
    def counting(self):
        self._control("-z")  # nothing is counted while instrumentation is off; zero anyway
        self._control("-i", "on")
        try:
            yield
        finally:
            self._control("-i", "off")

    def dump_ir(self, keep_as: Path | None = None) -> int:
        """Dump, read the dump's total Ir (the dump is copied to ``keep_as`` when
        given, for ``callgrind_annotate``), zero the counters."""
        pattern = f"cg.{self.server.process.pid}.*"
        before = set(self.tmp.glob(pattern))
        self._control("-d")
        new = sorted(set(self.tmp.glob(pattern)) - before)
        if len(new) != 1:
            raise RuntimeError(f"callgrind: expected one new dump, found {new}")
        text = new[0].read_text()
        if keep_as is not None:
            shutil.copyfile(new[0], keep_as)
        self._control("-z")
        # totals: is the sum over the dump; summary: stays 0 when instrumentation
        # is switched on at run time (valgrind 3.19, tried), so it is not read.
        found = re.search(r"^totals:\s*(\d+)", text, re.MULTILINE)
        if not found:
            raise RuntimeError(f"callgrind: no totals line in {new[0]}")
        return int(found.group(1))

    def stop(self) -> None:
        """SHUTDOWN NOSAVE, wait (valgrind writes its last dump), kill on timeout; remove the tmp dir."""
        process = self.server.process
        try:
            if process.poll() is None:
                with contextlib.suppress(Exception):
                    self.server.client(socket_timeout=10).shutdown(nosave=True)
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)


def measure(preload: Path | None, body: str, n: int, batch: int, keep_as: Path | None = None,
            shape: str = "ours") -> dict:
    cg = Callgrind(preload)
    try:
        client = cg.server.client(decode_responses=True)

        @contextlib.contextmanager
        def quiet_then_count():
            # run_variant's redisstats.reset() logs every call over 200 us and
            # every event over 1 ms: under valgrind every call, natively few,
            # and the latency monitor's work depends on the clock. Both off.
            client.config_set("slowlog-log-slower-than", -1)
            client.config_set("latency-monitor-threshold", 0)
            with cg.counting():
                yield

        run = profile_script.run_variant(client, body, n, batch, around_drain=quiet_then_count, shape=shape)
        ir = cg.dump_ir(keep_as)
    finally:
        cg.stop()
    return {"instructions": ir, "instructions_per_job": ir / n, "calls": run["calls"],
            "commands_per_job": run["commands_per_job"], "mix": run["mix"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20_000, help="expired jobs per drain (default 20,000)")
    parser.add_argument("--batch", type=int, action="append", help="jobs per call (default: 100 and 1000)")
    parser.add_argument("--variant", action="append",
                        help=f"a profile_script variant ({', '.join(profile_script.VARIANTS)}), or 'all'")
    parser.add_argument("--script", type=Path, action="append", default=[],
                        help="a candidate sweep.lua, measured as a variant named after the file")
    parser.add_argument("--shape", action="append", choices=sorted(echomq_seed.SHAPES),
                        help="the seeded mix (repeatable; default: ours): ours (a third of the jobs in 20 lanes, a "
                             "tenth dead-lettered) or peers (every job back to its queue, no lanes)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep-dumps", type=Path, metavar="DIR",
                        help="keep each drain's callgrind dump there (callgrind_annotate --inclusive=yes DUMP)")
    args = parser.parse_args(argv)
    if not shutil.which("valgrind"):
        raise SystemExit("valgrind is needed to count instructions (apt-get install -y valgrind)")
    if args.keep_dumps is not None:
        args.keep_dumps.mkdir(parents=True, exist_ok=True)
    batches = args.batch or [100, 1000]

    known = list(profile_script.VARIANTS)
    wanted = args.variant or ([BASELINE] if args.script else ["all"])
    names = known if "all" in wanted else [BASELINE] + [v for v in wanted if v != BASELINE]
    unknown = [v for v in names if v not in known]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; known: {known}")
    shipped = script("sweep").body
    bodies = {}
    for name in names:
        try:
            bodies.update(profile_script.variants(shipped, [name]))
        except SystemExit as moved:  # the ablation's anchor is no longer in the script
            if "all" not in wanted:
                raise
            print(f"  skipped {name!r}: {moved}", file=sys.stderr)
    for path in args.script:
        bodies[path.name if path.name not in bodies else str(path)] = expand(path.name, path.read_text("utf-8"))

    started = time.monotonic()
    rows = []
    with tempfile.TemporaryDirectory(prefix="stalledpolicy-preload-") as folder:
        preload = build_preload(Path(folder))
        for shape in args.shape or ["ours"]:
            for batch in batches:
                for name, body in bodies.items():
                    dump = None if args.keep_dumps is None else \
                        args.keep_dumps / f"{name.replace(' ', '-')}.{shape}.batch{batch}.callgrind"
                    rows.append({"variant": name, "shape": shape, "batch": batch, "n": args.n,
                                 "sha1": hashlib.sha1(body.encode()).hexdigest(),
                                 **measure(preload, body, args.n, batch, dump, shape)})
                    print(f"  {name!r} {shape} batch {batch}: {rows[-1]['instructions']:,} Ir "
                          f"({time.monotonic() - started:.0f} s)", file=sys.stderr)

    base = {(r["shape"], r["batch"]): r["instructions_per_job"] for r in rows if r["variant"] == BASELINE}
    width = max(len(r["variant"]) for r in rows)
    print(f"\nredis-server instructions (callgrind Ir) while draining N={args.n:,} expired jobs")
    print(f"| {'variant':<{width}} | shape | batch | instr/job | total (M) | vs {BASELINE} | commands/job "
          "| script sha1 |")
    print(f"| {'-' * width} | ----- | ----- | --------- | --------- | {'-' * (3 + len(BASELINE))} "
          "| ------------ | ----------- |")
    for r in rows:
        ratio = r["instructions_per_job"] / base[(r["shape"], r["batch"])]
        print(f"| {r['variant']:<{width}} | {r['shape']:<5} | {r['batch']:>5} | {r['instructions_per_job']:>9,.0f} "
              f"| {r['instructions'] / 1e6:>9,.1f} | {ratio:>{3 + len(BASELINE)}.3f} "
              f"| {r['commands_per_job']:>12.2f} | {r['sha1'][:11]} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
