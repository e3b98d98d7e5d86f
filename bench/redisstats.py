"""Redis's own view of a run: INFO commandstats / latencystats and SLOWLOG."""

from __future__ import annotations

from dataclasses import dataclass

# Every call slower than this lands in SLOWLOG, so its maximum is the server's
# longest call (PINGs and the like stay far below it).
SLOWLOG_THRESHOLD_US = 200
SLOWLOG_LEN = 200_000

# Commands the benchmark itself sends around a run; not part of the work measured.
HARNESS_COMMANDS = {"ping", "info", "config|resetstat", "config|set", "slowlog|reset", "slowlog|get",
                    "slowlog|len", "time", "client|setinfo", "select", "hello", "config|get",
                    "script|load", "client|setname", "eval", "evalsha", "exec", "multi"}


def reset(client) -> None:
    # The latency monitor also sees MULTI/EXEC as one event (SLOWLOG does not).
    client.config_set("latency-monitor-threshold", 1)
    client.execute_command("LATENCY", "RESET")
    client.config_set("slowlog-log-slower-than", SLOWLOG_THRESHOLD_US)
    client.config_set("slowlog-max-len", SLOWLOG_LEN)
    client.slowlog_reset()
    client.config_resetstat()


def commandstats(client) -> dict[str, dict]:
    return {name.lower().removeprefix("cmdstat_"): dict(stats)
            for name, stats in client.info("commandstats").items()}


def _as_str(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def latency_percentiles(client, command: str) -> dict[str, float]:
    """Redis 7's latency tracking: ``{'p50': usec, 'p99': usec, 'p99.9': usec}``."""
    raw = client.execute_command("INFO", "latencystats")
    text = _as_str(raw) if not isinstance(raw, dict) else ""
    if isinstance(raw, dict):
        value = raw.get(f"latency_percentiles_usec_{command}")
        if value is None:
            return {}
        if isinstance(value, dict):
            return {k: float(v) for k, v in value.items()}
        text = f"latency_percentiles_usec_{command}:{value}"
    for line in text.splitlines():
        if line.startswith(f"latency_percentiles_usec_{command}:"):
            pairs = line.split(":", 1)[1].split(",")
            return {k: float(v) for k, v in (p.split("=") for p in pairs)}
    return {}


def logged_durations_us(client, commands: set[str]) -> list[int]:
    """Durations (usec) of the logged calls among ``commands`` (lower case)."""
    durations = []
    for entry in client.slowlog_get(SLOWLOG_LEN):
        name = _as_str(entry["command"]).split(" ", 1)[0].lower()
        if name in commands:
            durations.append(int(entry["duration"]))
    return durations


def slowest_us(client, commands: set[str]) -> int:
    """The longest logged call (usec) among ``commands``, 0 when none logged."""
    return max(logged_durations_us(client, commands), default=0)


def longest_event_ms(client) -> int:
    """The latency monitor's worst ``command`` event (ms resolution): the longest
    any single command, script or MULTI/EXEC held the server; 0 under 1 ms."""
    longest = 0
    for event in client.execute_command("LATENCY", "LATEST"):
        if _as_str(event[0]) in {"command", "fast-command"}:
            longest = max(longest, int(event[3]))
    return longest


@dataclass
class ServerSide:
    calls: int
    usec_per_call: float
    p99_us: float
    p999_us: float
    max_us: int
    over_5ms: int


def server_side(client, command: str) -> ServerSide:
    stats = commandstats(client).get(command, {})
    percentiles = latency_percentiles(client, command)
    durations = logged_durations_us(client, {command})
    return ServerSide(
        calls=int(stats.get("calls", 0)),
        usec_per_call=float(stats.get("usec_per_call", 0.0)),
        p99_us=percentiles.get("p99", float("nan")),
        p999_us=percentiles.get("p99.9", float("nan")),
        max_us=max(durations, default=0),
        over_5ms=sum(1 for d in durations if d > 5_000),
    )


def work_commands(before: dict[str, dict], after: dict[str, dict]) -> dict[str, int]:
    """Calls per command between two snapshots, harness commands left out."""
    delta = {}
    for name, stats in after.items():
        calls = int(stats.get("calls", 0)) - int(before.get(name, {}).get("calls", 0))
        if calls > 0 and name not in HARNESS_COMMANDS:
            delta[name] = calls
    return delta
