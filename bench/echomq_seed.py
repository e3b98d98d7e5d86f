"""Seed an EchoMQ queue the way dead workers leave it (the wire contract), fast.

Every expired job is in ``active`` with a lease deadline in the past, its row
says ``state=active``; grouped jobs count in ``gactive``. The mix is fixed by
the job's index so the expected outcome of a sweep is known exactly:

- ``grouped_every``: every k-th job belongs to a lane ``g00``..``gNN`` (0: none);
- ``at_budget_every``: every k-th job already carries ``stalled = budget - 1``
  so this sweep dead-letters it (0: none); the others carry no mark or
  ``stalled = 1`` (the budget is at least 3, so they are recovered).

``SHAPES`` names the two mixes the benchmarks use: ``ours`` (the defaults: a
third of the jobs in 20 lanes, a tenth at the budget) and ``peers`` (every job
recovered to the queue, no lanes: the work BullMQ's and RQ's own recovery do,
bench/peers).

Keys come from ``QueueKeys`` only. Pipelined, no transaction: this is set-up.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from stalledpolicy.keyspace import QueueKeys

CHUNK = 5_000
SHAPES = {"ours": {}, "peers": {"grouped_every": 0, "at_budget_every": 0}}
PAYLOAD = '{"to":"user@example.com","template":"welcome","locale":"en"}'


@dataclass
class Expected:
    expired: int
    healthy: int
    dead: int
    flat_recovered: int
    lanes_recovered: Counter = field(default_factory=Counter)

    @property
    def recovered(self) -> int:
        return self.flat_recovered + sum(self.lanes_recovered.values())


def server_now_ms(client) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def job_id(index: int) -> str:
    return f"JOB{index:012d}"


def seed(client, queue: str, expired: int, *, healthy: int = 0, budget: int = 3, lanes: int = 20,
         grouped_every: int = 3, at_budget_every: int = 10) -> Expected:
    """``expired`` stalled jobs plus ``healthy`` active jobs whose leases run for another hour."""
    if budget < 3:
        raise ValueError("budget: the seeded mix needs a budget of at least 3")
    keys = QueueKeys(queue)
    now = server_now_ms(client)
    expected = Expected(expired=expired, healthy=healthy, dead=0, flat_recovered=0)
    gactive: Counter = Counter()
    total = expired + healthy
    for start in range(0, total, CHUNK):
        pipe = client.pipeline(transaction=False)
        scores: dict[str, int] = {}
        for index in range(start, min(total, start + CHUNK)):
            jid = job_id(index)
            row = {"state": "active", "attempts": 1 + index % 3, "payload": PAYLOAD}
            group = f"g{index % lanes:02d}" if grouped_every and index % grouped_every == 0 else None
            if group:
                row["group"] = group
                gactive[group] += 1
            is_expired = index < expired
            if is_expired:
                if at_budget_every and index % at_budget_every == 1:
                    row["stalled"] = budget - 1
                    expected.dead += 1
                else:
                    if index % 2:
                        row["stalled"] = 1
                    if group:
                        expected.lanes_recovered[group] += 1
                    else:
                        expected.flat_recovered += 1
                # Oldest lease first, all lapsed a minute or more ago.
                scores[jid] = now - 60_000 - (expired - index)
            else:
                scores[jid] = now + 3_600_000 + index
            pipe.hset(keys.job(jid), mapping=row)
        pipe.zadd(keys.active, scores)
        pipe.execute()
    if gactive:
        client.hset(keys.gactive, mapping=dict(gactive))
    return expected


@dataclass
class Observed:
    active: int
    pending: int
    dead: int
    lanes: dict[str, int]


def observe(client, queue: str, lanes: int = 20) -> Observed:
    keys = QueueKeys(queue)
    pipe = client.pipeline(transaction=False)
    pipe.zcard(keys.active)
    pipe.zcard(keys.pending)
    pipe.zcard(keys.dead)
    names = [f"g{i:02d}" for i in range(lanes)]
    for name in names:
        pipe.zcard(keys.lane_pending(name))
    active, pending, dead, *lane_sizes = pipe.execute()
    return Observed(active=active, pending=pending, dead=dead,
                    lanes={n: s for n, s in zip(names, lane_sizes) if s})


def verify(client, queue: str, expected: Expected, lanes: int = 20) -> Observed:
    """Every seeded job moved exactly as the contract says, or AssertionError."""
    seen = observe(client, queue, lanes)
    problems = []
    if seen.active != expected.healthy:
        problems.append(f"active {seen.active} != healthy {expected.healthy}")
    if seen.pending != expected.flat_recovered:
        problems.append(f"pending {seen.pending} != {expected.flat_recovered}")
    if seen.dead != expected.dead:
        problems.append(f"dead {seen.dead} != {expected.dead}")
    if seen.lanes != dict(expected.lanes_recovered):
        problems.append(f"lanes {seen.lanes} != {dict(expected.lanes_recovered)}")
    if problems:
        raise AssertionError("; ".join(problems))
    return seen
