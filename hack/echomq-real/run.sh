#!/usr/bin/env bash
# Our sweeper beside REAL EchoMQ consumers (a hand harness; not run by make test).
# See README.md. Every process it starts (redis-server, redis-cli monitor, the
# BEAM driver, the sweeper) is stopped on exit, failure or signal.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PY=${PYTHON:-/work/main/.venv/bin/python}
CACHE=${STALLEDPOLICY_CACHE:-$HOME/.cache/stalledpolicy}/echomq-real
MIRROR_DEFAULT=/work/.mirror/jonny-novikov+fiberfx/repo

ECHOMQ=""            # a checkout holding echo/apps/{echo_mq,echo_wire,echo_data}
ECHOMQ_GIT=""        # or a git dir (bare mirror) to take them from, ref $ECHOMQ_REF
ECHOMQ_REF=echo_mq
KS=2,8,16
TRIALS=1
DURATION=60          # seconds after the poison is enqueued before giving up
SWEEPER=holds        # holds: `sweep` as shipped; fixed: `sweep --once` every FIXED_INTERVAL s
FIXED_INTERVAL=1
MAX_STALLED=3
RATE=5               # healthy jobs per second
SLOW_EVERY=0         # every Nth healthy job extends its lease inside our hold window (0: none)
PAUSE_AT=0           # holds only: SIGSTOP the sweeper for 1.6 s once it holds the poison's Nth lease (0: never)
OUT=""

usage() {
  cat <<EOF
usage: $0 [--echomq PATH | --echomq-git GITDIR [--ref REF]] [--k 2,8,16] [--trials N]
          [--duration S] [--sweeper holds|fixed] [--fixed-interval S] [--max-stalled N]
          [--rate JOBS_PER_S] [--slow-every N] [--pause-at N] [--out DIR]
EOF
}

while [ $# -gt 0 ]; do
  case "$1" in
    --echomq) ECHOMQ=$2; shift 2 ;;
    --echomq-git) ECHOMQ_GIT=$2; shift 2 ;;
    --ref) ECHOMQ_REF=$2; shift 2 ;;
    --k) KS=$2; shift 2 ;;
    --trials) TRIALS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --sweeper) SWEEPER=$2; shift 2 ;;
    --fixed-interval) FIXED_INTERVAL=$2; shift 2 ;;
    --max-stalled) MAX_STALLED=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --slow-every) SLOW_EVERY=$2; shift 2 ;;
    --pause-at) PAUSE_AT=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done
case "$SWEEPER" in holds|fixed) ;; *) echo "--sweeper: holds or fixed" >&2; exit 2 ;; esac
OUT=${OUT:-/tmp/echomq-real-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT" "$CACHE"

# -- every process we start, stopped on the way out --------------------------------
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]:-}"; do
    [ -n "$pid" ] || continue
    kill -CONT "$pid" 2>/dev/null || true
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]:-}"; do
    [ -n "$pid" ] || continue
    wait "$pid" 2>/dev/null || true
  done
  PIDS=()
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

stop_pid() {  # stop one process we started, and forget it
  local pid=$1 keep=() p
  kill -CONT "$pid" 2>/dev/null || true
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  for p in "${PIDS[@]}"; do [ "$p" = "$pid" ] || keep+=("$p"); done
  PIDS=("${keep[@]:-}")
}

# -- EchoMQ: the sources, then the compiled .beam files (cached by content) ---------
if [ -z "$ECHOMQ" ]; then
  ECHOMQ=$CACHE/src
  if [ ! -d "$ECHOMQ/echo/apps/echo_mq" ]; then
    GITDIR=${ECHOMQ_GIT:-$MIRROR_DEFAULT}
    if [ ! -d "$GITDIR" ]; then
      echo "no EchoMQ checkout: pass --echomq PATH (a checkout of github.com/jonny-novikov/fiberfx," >&2
      echo "branch $ECHOMQ_REF) or --echomq-git GITDIR (see README.md)" >&2
      exit 2
    fi
    rm -rf "$ECHOMQ.tmp" && mkdir -p "$ECHOMQ.tmp"
    # (a mirror missing some large file elsewhere in the tree makes git archive print an
    # error about it; the three app directories come out whole, checked below)
    git --git-dir="$GITDIR" archive "$ECHOMQ_REF" echo/apps/echo_mq echo/apps/echo_wire echo/apps/echo_data \
      2> "$CACHE/archive.err" | tar -x -C "$ECHOMQ.tmp" || true
    for app in echo_mq echo_wire echo_data; do
      want=$(git --git-dir="$GITDIR" ls-tree -r --name-only "$ECHOMQ_REF" "echo/apps/$app" | wc -l)
      got=$(cd "$ECHOMQ.tmp" && find "echo/apps/$app" -type f | wc -l)
      [ "$want" = "$got" ] || { echo "$app: $got of $want files extracted" >&2; cat "$CACHE/archive.err" >&2; exit 1; }
    done
    git --git-dir="$GITDIR" rev-parse "$ECHOMQ_REF" > "$ECHOMQ.tmp/COMMIT"
    rm -rf "$ECHOMQ" && mv "$ECHOMQ.tmp" "$ECHOMQ"
  fi
fi
[ -d "$ECHOMQ/echo/apps/echo_mq/lib" ] || { echo "$ECHOMQ: no echo/apps/echo_mq/lib" >&2; exit 2; }
APPS=$ECHOMQ/echo/apps
mapfile -t SOURCES < <(find "$APPS/echo_data/lib" "$APPS/echo_wire/lib" "$APPS/echo_mq/lib" -name '*.ex' \
  -not -path '*/lib/mix/*' | LC_ALL=C sort)
BUILD_ID=$(cat "${SOURCES[@]}" | sha1sum | cut -c1-12)
EBIN=$CACHE/ebin-$BUILD_ID
if [ ! -f "$EBIN/.done" ]; then
  echo "compiling EchoMQ (${#SOURCES[@]} files) into $EBIN"
  rm -rf "$EBIN" && mkdir -p "$EBIN"
  elixirc --ignore-module-conflict -o "$EBIN" "${SOURCES[@]}" > "$EBIN/compile.log" 2>&1 \
    || { cat "$EBIN/compile.log" >&2; exit 1; }
  touch "$EBIN/.done"
fi

# -- a loopback redis-server on a free port, no persistence -------------------------
PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
  > "$OUT/redis.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
URL=redis://127.0.0.1:$PORT/0
export PYTHONPATH=$ROOT/operator

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "uptime: $(uptime)"
  echo "echomq: $ECHOMQ ($(cat "$ECHOMQ/COMMIT" 2>/dev/null || echo 'commit unknown')), build $BUILD_ID"
  echo "redis: $(redis-server --version)"
  echo "elixir: $(elixir --version 2>&1 | tail -1)"
  echo "sweeper: $SWEEPER$([ "$SWEEPER" = fixed ] && echo " (sweep --once every ${FIXED_INTERVAL}s)")," \
       "max-stalled $MAX_STALLED, ks $KS, trials $TRIALS, duration ${DURATION}s, rate ${RATE}/s," \
       "slow every $SLOW_EVERY, pause at $PAUSE_AT"
} | tee "$OUT/run-info.txt"

RESULTS=$OUT/results.jsonl
MODE=$SWEEPER
DRIVER_EXTRA=()
if [ "$SLOW_EVERY" -gt 0 ]; then
  MODE=$SWEEPER+slow
  # a slow job runs ~5.6 s: the drain at the end waits for it
  DRIVER_EXTRA=(--slow-every "$SLOW_EVERY" --drain-s 12)
fi
if [ "$PAUSE_AT" -gt 0 ]; then
  [ "$SWEEPER" = holds ] || { echo "--pause-at: with --sweeper holds only" >&2; exit 2; }
  MODE=$MODE+pause
fi
IFS=, read -r -a KLIST <<< "$KS"
for K in "${KLIST[@]}"; do
  for T in $(seq "$TRIALS"); do
    Q="real${MODE/+/}k${K}t${T}"
    D=$OUT/$Q && mkdir -p "$D"
    redis-cli -p "$PORT" flushall >/dev/null
    redis-cli -p "$PORT" monitor > "$D/monitor.log" 2>&1 &
    MON=$!; PIDS+=($MON)
    if [ "$SWEEPER" = holds ]; then
      # the sweeper's real loop, default interval; no metrics port (a shared machine)
      "$PY" -m stalledpolicy sweep --redis-url "$URL" --queue "$Q" --max-stalled "$MAX_STALLED" \
        --metrics-port 0 --log-level debug > "$D/sweeper.log" 2>&1 &
    else
      # the old behaviour: a pass on a fixed cadence, no holds (--once holds nothing: cli.py)
      ( c=""
        trap '[ -n "$c" ] && kill "$c" 2>/dev/null; exit 0' TERM
        while :; do
          "$PY" -m stalledpolicy sweep --once --redis-url "$URL" --queue "$Q" --max-stalled "$MAX_STALLED" \
            --log-level warning & c=$!
          wait "$c" || true
          sleep "$FIXED_INTERVAL" & c=$!
          wait "$c" || true
        done ) > "$D/sweeper.log" 2>&1 &
    fi
    SW=$!; PIDS+=($SW)
    PAUSE=()
    [ "$PAUSE_AT" -gt 0 ] && PAUSE=(--pause-pid "$SW" --pause-at "$PAUSE_AT")
    sleep 1  # the sweeper is up before the poison is enqueued (the driver waits 1.5 s more)
    timeout --kill-after=5 $((DURATION + 40)) \
      elixir -pa "$EBIN" "$HERE/driver.exs" --port "$PORT" --queue "$Q" --k "$K" --bound "$DURATION" \
        --rate "$RATE" "${DRIVER_EXTRA[@]}" "${PAUSE[@]}" --out "$D/driver.log" > "$D/driver.out" 2> "$D/driver.err" &
    DRV=$!; PIDS+=($DRV)
    wait "$DRV" || echo "driver exited $? (see $D/driver.err)" >&2
    stop_pid "$DRV"
    stop_pid "$SW"
    stop_pid "$MON"
    "$PY" "$HERE/analyze.py" trial --driver-log "$D/driver.log" --monitor-log "$D/monitor.log" \
      --redis-url "$URL" --queue "$Q" --mode "$MODE" --k "$K" --trial "$T" --max-stalled "$MAX_STALLED" \
      | tee -a "$RESULTS" \
      | "$PY" -c 'import json,sys; r=json.loads(sys.stdin.read()); d={k:v for k,v in r.items() if k!="lapse_detail"}; print(json.dumps(d)); print("  lapses:", r["lapse_detail"])'
  done
done

echo
"$PY" "$HERE/analyze.py" summary "$RESULTS" | tee "$OUT/summary.md"
echo "logs and results: $OUT"
